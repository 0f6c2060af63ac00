"""Engine — `oneOf` as a grammar: its branches must be disjoint, since a grammar cannot say
"exactly one". Branches are disjoint when their languages do not intersect per type, or a
property every branch requires has disjoint values (a discriminator).

    {"oneOf": [{"type": "string"}, {"type": "integer"}]}             # compiles
    {"oneOf": [{"type": "number"}, {}]}                              # ValueError: may both match numbers

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .facts import Facts
from .keywords import count, required, schema_map
from .part import Alternative, Part, at
from .values import compact_text, json_equal, kind_of
from .vocabulary import KINDS


class OneOf:
    """Tells `oneOf` branches apart, by the facts of their alternatives (`facts_of`) and, for
    a discriminator, the few values a conjunction allows (`finite_values`)."""

    def __init__(self, facts_of: Callable[[Alternative], Facts | None],
                 finite_values: Callable[[list[Part]], list | None]):
        self._facts_of = facts_of
        self._finite_values = finite_values

    def check(self, options: list[list[Alternative]], where: str) -> None:
        """ValueError unless no value is valid under two of the options."""
        summaries = [[self._facts_of(alt) for alt in option] for option in options]
        for i in range(len(options)):
            for j in range(i + 1, len(options)):
                for a in summaries[i]:
                    for b in summaries[j]:
                        if a is None or b is None:
                            continue
                        overlap = self._overlap(a, b)
                        if overlap:
                            raise ValueError(f"json schema: 'oneOf' at {where}: branches {i} and {j} may both "
                                             f"match {overlap} (a grammar cannot say 'exactly one'; make the "
                                             "branches disjoint, e.g. by type, const or a discriminator property)")

    def _overlap(self, a: Facts, b: Facts) -> str:
        """'' if no value is valid under both, else what may be."""
        for kind in KINDS:
            if kind not in a.kinds or kind not in b.kinds:
                continue
            if a.values is not None or b.values is not None:
                mine = [v for v in (a.values if a.values is not None else b.values) if kind_of(v) == kind]
                theirs = b if a.values is not None else a
                for value in mine:
                    if theirs.admits(value, formats=False):
                        return f"the value {compact_text(value, '')}"
                continue
            if kind in ("null", "boolean"):
                return f"{kind}s" if kind == "boolean" else "null"
            if kind == "string":
                both = a.string_language(True, formats=False).intersect(b.string_language(True, formats=False))
                if not both.is_empty():
                    return "strings"
            elif kind == "number":
                if not numbers_apart(a, b):
                    return "numbers"
            elif kind == "object":
                if not self._discriminated(a.leaves, b.leaves):
                    return "objects"
            elif not arrays_apart(a, b):
                return "arrays"
        return ""

    def _discriminated(self, mine: list[Part], theirs: list[Part]) -> bool:
        """Whether a property both sides require takes values on one side that it cannot take
        on the other (a discriminator), or one side forbids a property the other requires."""
        def required_keys(leaves: list[Part]) -> set[str]:
            return {k for leaf in leaves for k in required(leaf.schema, leaf.path)}

        def schemas(leaves: list[Part], key: str) -> list[Part]:
            return [at(leaf, schema_map(leaf.schema, "properties", leaf.path)[key], leaf.path)
                    for leaf in leaves if key in schema_map(leaf.schema, "properties", leaf.path)]

        for a, b in ((mine, theirs), (theirs, mine)):
            for key in required_keys(a):
                if any(p.schema is False for p in schemas(b, key)):
                    return True
        for key in required_keys(mine) & required_keys(theirs):
            left, right = schemas(mine, key), schemas(theirs, key)
            if not left or not right:
                continue
            a, b = self._finite_values(left), self._finite_values(right)
            if a is not None and b is not None and not any(json_equal(x, y) for x in a for y in b):
                return True
        return False


def numbers_apart(a: Facts, b: Facts) -> bool:
    """Whether no number is valid under both (one side integers, the other none; or bounds
    that do not meet)."""
    if a.integer and b.not_integer or b.integer and a.not_integer:
        return True
    for x, y in ((a, b), (b, a)):
        if x.high and y.low and (x.high[0] < y.low[0] or x.high[0] == y.low[0] and (x.high[1] or y.low[1])):
            return True
    return False


def arrays_apart(a: Facts, b: Facts) -> bool:
    """Whether the item counts of the two sides do not meet."""
    def counts(facts: Facts) -> tuple[int, float]:
        low = max([count(l.schema, "minItems", l.path, 0) for l in facts.leaves] or [0])
        highs = [count(l.schema, "maxItems", l.path, None) for l in facts.leaves]
        return low, min([h for h in highs if h is not None] or [math.inf])

    (a_low, a_high), (b_low, b_high) = counts(a), counts(b)
    return a_high < b_low or b_high < a_low
