"""Engine — compiling a JSON schema into GBNF: from a conjunction of parts to its alternatives
(`conjunction.py`), from an alternative to its facts per JSON type (`facts.py`), and from the
facts of one type to rules (`scalars.py`, `objects.py`, `arrays.py`), written into one table
(`rules.py`).

    json_schema_to_gbnf({"type": "integer", "minimum": 0})

A conjunction is compiled once and gets a rule named by its place (`root-name`,
`defs-Node`), so a recursive schema refers back to the rule being written.

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

import json
from typing import Any

from ..automata import DFA
from ..limits import MAX_NESTING
from .arrays import ArrayShape
from .conjunction import Expander
from .facts import Facts, finite_values, names_language
from .keywords import check_keywords, only_ref, trivial
from .languages import Languages
from .negation import Negation
from .objects import ObjectShape
from .oneof import OneOf
from .part import Alternative, Made, Part, at_made
from .recursion import recursion_limit
from .references import Resources
from .rules import NAME, Rules, slug
from .scalars import number_rule, string_rule, values_rule
from .vocabulary import KINDS

RECURSION_LIMIT = 20 * MAX_NESTING + 1000  # each level of nesting takes a dozen frames


def read_schema(text: str) -> Any:
    """The schema a JSON text spells; ValueError if it is not JSON or nests too deeply to read."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"json schema: not valid JSON: {e}") from e
    except RecursionError:
        raise ValueError(f"json schema: the JSON text is nested too deeply to read (the limit for a "
                         f"schema is {MAX_NESTING} levels)") from None


def json_schema_to_gbnf(schema: dict | bool | str, *, compact: bool = False) -> str:
    """GBNF text (start rule `root`) for the JSON texts that validate against `schema`;
    with `compact`, JSON on one line (a model cannot spend its tokens on whitespace).

    `schema` is a dict, a boolean schema, or JSON text of one. Raises ValueError for a
    malformed schema or a keyword the conversion cannot write exactly; the message names the
    keyword and its JSON pointer (`#/properties/age`). See the package's docstring."""
    if isinstance(schema, str):
        schema = read_schema(schema)
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"json schema: a schema is an object or a boolean, got {type(schema).__name__}")
    with recursion_limit(RECURSION_LIMIT):
        return Compiler(schema, compact).rules.text()


class Compiler:
    """One schema document compiled into `rules`; the hub the shapes ask for their members'
    rules (`members.Values`)."""

    def __init__(self, document: dict | bool, compact: bool = False):
        self.rules = Rules(compact)
        self._made = Made()
        self._resources = Resources(document)
        self._languages = Languages()
        self._negate = Negation(self._resources, self._made)
        self._expander = Expander(self._resources, self._negate, self._made, OneOf(self.facts_of,
                                                                                   self.finite_values).check)
        self._done: dict[tuple, str | None] = {}  # a conjunction's key -> its rule
        self._depth = 0
        self._recursive: set[str] = set()  # rules named inside their own definition
        self.rules.primitive("space")  # every grammar uses it
        root_base = self._resources.root_base
        root = Part(document, root_base, "#", (root_base,))
        expression = self.value([root], "root", "#", top=True)
        if expression is None:
            raise ValueError("json schema: no JSON value validates against the schema at # (its keywords "
                             "contradict each other)" if document is not False else
                             "json schema: the schema at # is false, so nothing matches")
        self.rules.define("root", expression)

    # ---- what the shapes ask (members.Values) -------------------------------------------

    def value(self, parts: list[Part], name: str, path: str, top: bool = False) -> str | None:
        """A rule (or expression) for the values valid under every part; None if none is."""
        rules = self.rules
        if all(trivial(p.schema) for p in parts):
            for p in parts:
                if isinstance(p.schema, dict):
                    check_keywords(p.schema, p.path)
            return rules.primitive("value")
        if len(parts) == 1 and only_ref(parts[0].schema):  # a reference alone: its target's rule
            check_keywords(parts[0].schema, parts[0].path)
            ref = parts[0].schema["$ref"]
            target = self._resources.target(parts[0], "$ref")
            if target.schema is not parts[0].schema and only_ref(target.schema):
                self._resources.follow(parts[0])
            if target.schema is not parts[0].schema:
                label = slug(ref[2:]) or "ref" if isinstance(ref, str) and ref.startswith("#") else name
                return self.value([target], label, target.path)
        path = parts[0].path if parts else path
        key = tuple((id(p.schema), p.base, p.scope, p.annotating) for p in parts)
        if key in self._done:
            rule = self._done[key]
            if rule is not None and rules.writing(rule):
                self._recursive.add(rule)  # named while it is being written
            return rule
        if self._depth == MAX_NESTING:
            shown = path if len(path) <= 80 else path[:80] + "..."
            raise ValueError(f"json schema: the schema at {shown} is nested more than {MAX_NESTING} deep")
        rule = "root" if top else rules.reserve(name)
        self._done[key] = rule
        self._depth += 1
        try:
            expression = self._alternatives(self._expander.expand(parts), rule, path)
        finally:
            self._depth -= 1
        if expression is None:
            self._done[key] = None
            if not top:
                rules.drop(rule)
            return None
        if top:
            return expression
        if NAME.fullmatch(expression) and rule not in self._recursive:
            rules.drop(rule)  # another rule's name: no alias needed
            self._done[key] = expression
            return expression
        rules.define(rule, expression)
        return rule

    def negation(self, part: Part) -> Part:
        return at_made(part, self._negate(part))

    def finite_values(self, parts: list[Part]) -> list | None:
        return finite_values(self.facts_of(a) for a in self._expander.expand(parts))

    def pattern(self, pattern: Any, path: str) -> DFA:
        return self._languages.pattern(pattern, path)

    def key_names(self, names: Part) -> DFA:
        return self._languages.cached(("names", id(names.schema), names.base), lambda: names_language(
            self.facts_of(a) for a in self._expander.expand([names])))

    def made(self, schema: Any) -> bool:
        return schema in self._made

    def facts_of(self, alternative: Alternative) -> Facts | None:
        return Facts.of(self._languages, alternative)

    # ---- alternatives and kinds ---------------------------------------------------------

    def _alternatives(self, alternatives: list[Alternative], name: str, path: str) -> str | None:
        expressions = []
        for i, leaves in enumerate(alternatives):
            label = name if len(alternatives) == 1 else f"{name}-{i}"
            expression = self._leaves(leaves, label, path)
            if expression is not None:
                expressions.append(expression if len(alternatives) == 1 else self.rules.named(expression, label))
        if not expressions:
            return None
        return " | ".join(dict.fromkeys(expressions))

    def _leaves(self, leaves: Alternative, name: str, path: str) -> str | None:
        """An expression for the values valid under every leaf (no choices among them)."""
        facts = self.facts_of(leaves)
        if facts is None:
            return None
        out = []
        for kind in KINDS:
            if kind not in facts.kinds:
                continue
            label = name if len(facts.kinds) == 1 else f"{name}-{kind}"
            expression = self._kind(facts, kind, label, path)
            if expression is not None:
                out.append(expression if len(facts.kinds) == 1 else self.rules.named(expression, label))
        return " | ".join(out) if out else None

    def _kind(self, facts: Facts, kind: str, name: str, path: str) -> str | None:
        if facts.values is not None:
            return values_rule(facts, kind, path)
        if kind in ("null", "boolean"):
            return self.rules.primitive(kind)
        if kind == "string":
            return string_rule(self.rules, facts, name)
        if kind == "number":
            return number_rule(self.rules, facts, name)
        shape = ObjectShape if kind == "object" else ArrayShape
        return shape(self.rules, self, facts.leaves, name, path).expression()
