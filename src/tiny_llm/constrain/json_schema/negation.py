"""Engine — `not` as a positive schema: the negation of each keyword, joined by `anyOf`.

    negate = Negation(resources, made)
    negate(Part({"type": "string", "minLength": 2}, base, "#"))
    # {"anyOf": [{"type": [...every kind but string]}, {"type": "string", "maxLength": 1}]}

A keyword whose complement has no such form (`oneOf`, `patternProperties`, ...) is a
ValueError naming the keyword that asks for the complement (`not`, or `if` for its `else`).
The negation of a negation's own keywords (`NOT_PATTERN`, ...) gives the keyword back.

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

from typing import Any

from .keywords import (bound, check_keywords, check_schema, count, declared, dependent_required, enum_values,
                       pointer, required, schema_list, schema_map, step)
from .part import Made, Part
from .references import Resources
from .vocabulary import KINDS, NO_COMPLEMENT, NOT_INTEGER, NOT_MULTIPLE, NOT_PATTERN, NOT_VALUES

# A bound's complement is the opposite bound, exclusive where it was inclusive.
FLIPPED_BOUNDS = {"minimum": "exclusiveMaximum", "exclusiveMinimum": "maximum", "maximum": "exclusiveMinimum",
                  "exclusiveMaximum": "minimum"}
# A negation's own keyword -> the kind and keyword it negates back to.
UNDO = {NOT_PATTERN: ("string", "pattern"), NOT_MULTIPLE: ("number", "multipleOf"), NOT_VALUES: (None, "enum"),
        NOT_INTEGER: ("integer", None)}


class Negation:
    """Negates the parts of one document (resolving their references) into schemas it makes."""

    def __init__(self, resources: Resources, made: Made):
        self._resources = resources
        self._make = made.make

    def __call__(self, part: Part, active: frozenset[int] = frozenset(), via: str = "not") -> Any:
        """A schema for the values `part` rejects (made of `anyOf` and plain keywords), or
        ValueError (naming `via`, the keyword that needs the complement) where the complement
        has no such form."""
        schema = part.schema
        if isinstance(schema, bool):
            return not schema
        check_schema(schema, part.path)
        check_keywords(schema, part.path)
        if id(schema) in active:
            raise ValueError(f"json schema: {via!r} at {part.path} leads back to itself through '$ref'")
        active = active | {id(schema)}
        path = part.path
        options: list[Any] = []  # the negation is the anyOf of these
        for keyword in ("$ref", "$dynamicRef"):
            if keyword in schema:
                options.append(self(self._resources.target(part, keyword), active, via))
        for i, sub in enumerate(schema_list(schema, "allOf", path)):
            options.append(self(part.child(sub, f"{path}/allOf/{i}"), active, via))
        if "anyOf" in schema:
            negations = [self(part.child(s, f"{path}/anyOf/{i}"), active, via)
                         for i, s in enumerate(schema_list(schema, "anyOf", path))]
            options.append(self._make({"allOf": negations}))
        if "not" in schema:
            options.append(schema["not"])
        for keyword in NO_COMPLEMENT:
            if keyword in schema and not (keyword == "uniqueItems" and schema[keyword] is False):
                raise ValueError(f"json schema: {via!r} at {path} holds {keyword!r}, whose complement a "
                                 "grammar cannot write")
        options += self._keywords(schema, part)
        options = [o for o in options if o is not False]
        if any(o is True for o in options):
            return True
        if not options:
            return False
        return options[0] if len(options) == 1 else self._make({"anyOf": options})

    def _keywords(self, schema: dict, part: Part) -> list[Any]:
        """The negations of `schema`'s own keywords, one schema each."""
        path = part.path
        make = self._make
        out: list[Any] = []
        kinds = declared(schema, path) if "type" in schema else None
        if kinds is not None:
            types, integer = kinds
            rest = [k for k in KINDS if k not in types]
            if integer:
                out.append(make({"type": "number", NOT_INTEGER: True}))
            if rest:
                out.append(make({"type": rest}))
        if "const" in schema:
            out.append(make({NOT_VALUES: [schema["const"]]}))
        if "enum" in schema:
            out.append(make({NOT_VALUES: list(enum_values(schema, path))}))
        for key, flipped in FLIPPED_BOUNDS.items():
            if key in schema:
                out.append(make({"type": "number", flipped: bound(schema, key, path)}))
        if "multipleOf" in schema:
            out.append(make({"type": "number", NOT_MULTIPLE: step(schema, path)}))
        for low, high, kind in (("minLength", "maxLength", "string"), ("minItems", "maxItems", "array"),
                                ("minProperties", "maxProperties", "object")):
            if low in schema and count(schema, low, path, 0) > 0:
                out.append(make({"type": kind, high: count(schema, low, path, 0) - 1}))
            if high in schema:
                out.append(make({"type": kind, low: count(schema, high, path, None) + 1}))
        if "pattern" in schema:
            out.append(make({"type": "string", NOT_PATTERN: schema["pattern"]}))
        # `format` asserts nothing to a validator that reads it as an annotation (the default):
        # its complement is empty, so a negated format adds no alternative.
        for key in required(schema, path):
            out.append(make({"type": "object", "properties": {key: False}}))
        for key, sub in schema_map(schema, "properties", path).items():
            negated = self(part.child(sub, f"{path}/properties/{pointer(key)}"))
            if negated is not False:
                out.append(make({"type": "object", "required": [key], "properties": {key: negated}}))
        for key, needed in dependent_required(schema, path).items():
            for other in needed:
                out.append(make({"type": "object", "required": [key], "properties": {other: False}}))
        if "items" in schema:
            negated = self(part.child(schema["items"], f"{path}/items"))
            if negated is not False:
                out.append(make({"type": "array", "contains": negated}))
        if "contains" in schema:
            low = count(schema, "minContains", path, 1)
            high = count(schema, "maxContains", path, None)
            if low > 0:
                out.append(make({"type": "array", "contains": schema["contains"], "minContains": 0,
                                 "maxContains": low - 1}))
            if high is not None:
                out.append(make({"type": "array", "contains": schema["contains"], "minContains": high + 1}))
        for key, value in schema.items():
            if key in UNDO:  # a negation's own keyword, negated back
                kind, keyword = UNDO[key]
                out.append(make({**({"type": kind} if kind else {}), **({keyword: value} if keyword else {})}))
        return out
