"""Engine — a schema as a conjunction multiplied out into alternatives.

A schema at one place of the instance means its own keywords and all it implies there: its
`allOf` members, what its `$ref` and `$dynamicRef` point to, and its `not` (as a positive
schema, `negation.py`). Its choices (`anyOf`, `oneOf`, `if`/`then`/`else`,
`dependentSchemas`) multiply the conjunction out into alternatives, each a flat list of parts
with no choice left:

    {"allOf": [{"type": "string"}], "anyOf": [{"minLength": 1}, {"maxLength": 0}]}
    # two alternatives: [the schema, allOf/0, anyOf/0] and [the schema, allOf/0, anyOf/1]

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .keywords import check_keywords, check_schema, only_ref, pointer, schema_list, schema_map
from .negation import Negation
from .part import Alternative, Made, Part
from .references import Resources
from .vocabulary import KINDS

MAX_ALTERNATIVES = 256  # alternatives of one schema once its choices are multiplied out
MAX_SUBSET_BRANCHES = 5  # an anyOf beside unevaluated* is written per set of matching branches up to this


class Expander:
    """Multiplies conjunctions out; `check_one_of(options, where)` refuses a `oneOf` whose
    options (each a list of alternatives) may overlap."""

    def __init__(self, resources: Resources, negate: Negation, made: Made,
                 check_one_of: Callable[[list[list[Alternative]], str], None]):
        self._resources = resources
        self._negate = negate
        self._make = made.make
        self._check_one_of = check_one_of

    def expand(self, parts: list[Part], active: frozenset[int] = frozenset()) -> list[Alternative]:
        """The conjunction as alternatives, each a flat list of parts with no choice left;
        `active`: the schemas being expanded around it (a `$ref` back to one is refused)."""
        items: list = []  # parts and choices, in the order the schemas list them
        seen: set[tuple] = set()
        for part in parts:
            if not self._flatten(part, active, items, items, seen):
                return []
        alternatives: list[Alternative] = [[]]
        for item in items:
            if isinstance(item, Part):
                for alternative in alternatives:
                    alternative.append(item)
                continue
            keyword, where, options, inner = item
            if keyword == "anyOf" and 1 < len(options) <= MAX_SUBSET_BRANCHES and any(
                    isinstance(p, Part) and isinstance(p.schema, dict) and p.annotating
                    and ("unevaluatedProperties" in p.schema or "unevaluatedItems" in p.schema) for p in items):
                # `unevaluated*` sees what every matching branch evaluated: one alternative per
                # set of branches that match together.
                options = [[p for i, option in enumerate(options) if subset >> i & 1 for p in option]
                           for subset in range(1, 1 << len(options))]
            expanded = [self.expand(option, inner) for option in options]
            if keyword == "oneOf":
                self._check_one_of(expanded, where)
            alternatives = [alt + branch for alt in alternatives for option in expanded for branch in option]
            if len(alternatives) > MAX_ALTERNATIVES:
                raise ValueError(f"json schema: {keyword!r} at {where} multiplies the schema into more than "
                                 f"{MAX_ALTERNATIVES} alternatives")
        return alternatives

    def _flatten(self, part: Part, active: frozenset[int], leaves: list[Part], choices: list,
                 seen: set[tuple]) -> bool:
        """Add `part` and the parts it implies at the same place to `leaves`, and its choices
        to `choices`; False if `part` is the false schema."""
        schema = part.schema
        if schema is True:
            return True
        if schema is False:
            return False
        check_schema(schema, part.path)
        base = self._resources.base_of(schema, part.base)
        if base != part.base:  # a schema with its own `$id`: a resource of its own
            part = replace(part, base=base, scope=part.scope if base in part.scope else (*part.scope, base))
        if only_ref(schema):
            self._resources.follow(part)
        if id(schema) in active:
            raise ValueError("json schema: a '$ref' leads back to a schema that holds it before any "
                             f"character of a value is read (at {part.path})")
        key = (id(schema), part.base, part.annotating)
        if key in seen:
            return True
        seen.add(key)
        check_keywords(schema, part.path)
        leaves.append(part)
        inner = active | {id(schema)}
        path = part.path
        implied: list[Part] = []
        for keyword in ("$ref", "$dynamicRef"):
            if keyword in schema:
                implied.append(self._resources.target(part, keyword))
        implied += [part.child(s, f"{path}/allOf/{i}") for i, s in enumerate(schema_list(schema, "allOf", path))]
        if "not" in schema:
            negated = self._negate(part.child(schema["not"], f"{path}/not"))
            implied.append(part.child(negated, f"{path}/not", annotating=False))
        for sub in implied:
            if not self._flatten(sub, inner, leaves, choices, seen):
                return False
        for keyword in ("anyOf", "oneOf"):
            if keyword in schema:
                options = [[part.child(s, f"{path}/{keyword}/{i}")]
                           for i, s in enumerate(schema_list(schema, keyword, path))]
                choices.append((keyword, f"{path}/{keyword}", options, inner))
        if "if" in schema and ("then" in schema or "else" in schema):
            condition = part.child(schema["if"], f"{path}/if")
            otherwise = part.child(self._negate(condition, via="if"), f"{path}/if", annotating=False)
            options = [[condition, part.child(schema.get("then", True), f"{path}/then")],
                       [otherwise, part.child(schema.get("else", True), f"{path}/else")]]
            choices.append(("if", path, options, inner))
        for key, sub in schema_map(schema, "dependentSchemas", path).items():
            where = f"{path}/dependentSchemas/{pointer(key)}"
            others = [k for k in KINDS if k != "object"] + ["integer"]
            options = [[part.child(self._make({"type": others}), where)],
                       [part.child(self._make({"type": "object", "required": [key]}), where),
                        part.child(sub, where)],
                       [part.child(self._make({"type": "object", "properties": {key: False}}), where,
                                   annotating=False)]]
            choices.append(("dependentSchemas", where, options, inner))
        return True
