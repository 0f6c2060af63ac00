"""Engine — a schema in its place: the `Part` the compiler works on (a schema with the base URI,
dynamic scope and JSON pointer it sits at), and the schemas the compiler makes itself.

    root = Part(schema, "https://schema.invalid/root.json", "#")
    root.child(schema["allOf"][0], "#/allOf/0")               # same place of the instance
    at(root, schema["properties"]["a"], "#/properties/a")     # a value inside it

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .specs import LeafSpec


@dataclass(frozen=True)
class Part:
    """One schema of a conjunction, where it sits: the base URI its references resolve
    against, the dynamic scope (resources entered, outermost first), its JSON pointer, whether
    what it evaluates counts for `unevaluated*` (not for the schemas a negation makes), and the
    schemas around it at this place of the instance (whose `unevaluated*` see its evaluations)."""

    schema: Any
    base: str
    path: str
    scope: tuple[str, ...] = ()
    annotating: bool = True
    owners: frozenset[int] = frozenset()

    def child(self, schema: Any, path: str, *, annotating: bool | None = None) -> Part:
        """A subschema of this one at the same place of the instance (`allOf`, a branch)."""
        return Part(schema, self.base, path, self.scope, self.annotating if annotating is None else annotating,
                    self.owners | {id(self.schema)})

    @cached_property
    def spec(self) -> LeafSpec:
        """What this schema says of its kinds and scalars, read once (a part sits in many
        alternatives)."""
        return LeafSpec.read(self.schema, self.path)

    def evaluated_by(self, leaf: Part) -> bool:
        """Whether `leaf`'s `unevaluated*` sees what this part evaluates (it is the leaf, or
        sits inside it at the same place)."""
        return self.annotating and (self is leaf or id(leaf.schema) in self.owners)


Alternative = list[Part]  # a conjunction with no choice left


def at(leaf: Part, schema: Any, path: str) -> Part:
    """A subschema of `leaf` at a new place of the instance (a property's value, an item)."""
    return Part(schema, leaf.base, path, leaf.scope, leaf.annotating)


def at_made(part: Part, schema: Any) -> Part:
    """A schema the compiler made for `part` (a negation of it), at its place."""
    return Part(schema, part.base, part.path, part.scope, False, part.owners)


class Made:
    """The schemas the compiler makes (negations, the options of `dependentSchemas`), kept
    alive: their ids are keys of the compiler's tables."""

    def __init__(self):
        self._schemas: list[Any] = []
        self._ids: set[int] = set()

    def make(self, schema: dict) -> dict:
        self._schemas.append(schema)
        self._ids.add(id(schema))
        return schema

    def __contains__(self, schema: Any) -> bool:
        return id(schema) in self._ids
