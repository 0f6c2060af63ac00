"""Engine — what one alternative says, merged per JSON type: the kinds it allows, its values
(`enum`, `const`) and excluded values, number bounds and steps, string lengths, patterns and
formats; the strings and numbers it allows as automata.

    facts = Facts.of(languages, [Part({"type": "integer", "minimum": 1}, base, "#"),
                                 Part({"maximum": 3}, base, "#/allOf/0")])
    facts.kinds                                  # {"number"}
    facts.number_language().accepts("2")         # True; "4" and "1.5" are not accepted

`finite_values` and `names_language` read the facts of a conjunction's alternatives.

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from ..automata import DFA
from .languages import Languages
from .part import Part
from .specs import LeafSpec, tighter
from .values import canonical_number, fraction, integral, json_equal, kind_of
from .vocabulary import KINDS

MAX_UNIQUE_VALUES = 8  # `uniqueItems` holds over items drawn from at most this many values


class Facts:
    """What every leaf of one alternative says, merged per JSON type."""

    def __init__(self, languages: Languages):
        self.languages = languages
        self.kinds = set(KINDS)
        self.integer = False
        self.not_integer = False
        self.values: list | None = None
        self.excluded: list = []
        self.low: tuple[Fraction, bool] | None = None  # (bound, exclusive)
        self.high: tuple[Fraction, bool] | None = None
        self.multiples: list[Fraction] = []
        self.not_multiples: list[Fraction] = []
        self.lengths: list = [0, None]
        self.patterns: list[tuple[str, str]] = []  # (pattern, path)
        self.not_patterns: list[tuple[str, str]] = []
        self.formats: list[str] = []
        self.leaves: list[Part] = []
        self.structures: set[str] = set()  # the kinds whose keywords a leaf holds
        self._strings: DFA | None = None
        self._numbers: Any = ...

    @classmethod
    def of(cls, languages: Languages, leaves: list[Part]) -> Facts | None:
        """The facts of `leaves` (a conjunction with no choice); None if no value is valid."""
        facts = cls(languages)
        for leaf in leaves:
            facts.add(leaf, leaf.spec)
        if facts.values is not None:
            facts.kinds &= {kind_of(v) for v in facts.values}
        if facts.low and facts.high and (facts.low[0] > facts.high[0] or facts.low[0] == facts.high[0]
                                         and (facts.low[1] or facts.high[1])):
            facts.kinds.discard("number")
        return facts if facts.kinds else None

    def add(self, leaf: Part, spec: LeafSpec) -> None:
        """Merge what `leaf` says (`spec`, read from it)."""
        self.leaves.append(leaf)
        if spec.kinds is not None:
            self.kinds &= spec.kinds
        self.integer |= spec.integer
        if spec.values is not None:
            self.values = list(spec.values) if self.values is None else [
                v for v in self.values if any(json_equal(v, w) for w in spec.values)]
        self.excluded += spec.excluded
        self.not_integer |= spec.not_integer
        if spec.low is not None and tighter(spec.low, self.low, up=True):
            self.low = spec.low
        if spec.high is not None and tighter(spec.high, self.high, up=False):
            self.high = spec.high
        if spec.multiple is not None:
            self.multiples.append(spec.multiple)
        if spec.not_multiple is not None:
            self.not_multiples.append(spec.not_multiple)
        self.lengths[0] = max(self.lengths[0], spec.min_length)
        if spec.max_length is not None:
            self.lengths[1] = spec.max_length if self.lengths[1] is None else min(self.lengths[1], spec.max_length)
        if spec.pattern is not None:
            self.patterns.append(spec.pattern)
        if spec.not_pattern is not None:
            self.not_patterns.append(spec.not_pattern)
        if spec.format is not None:
            self.formats.append(spec.format)
        self.structures |= spec.structures

    # -- strings --

    def string_language(self, force: bool, formats: bool = True) -> DFA | None:
        """The strings allowed, as an automaton; None (unless `force`) when only lengths
        constrain them (those are written with any escapes). `formats=False`: formats read as
        annotations, as validators do by default (for telling `oneOf` branches apart)."""
        if self._strings is not None and formats:
            return self._strings
        excluded = [v for v in self.excluded if isinstance(v, str)]
        if not (force or self.patterns or self.not_patterns or self.formats or excluded):
            return None
        languages = self.languages
        language = DFA.everything()
        for pattern, path in self.patterns:
            language = language.intersect(languages.pattern(pattern, path))
        for name in self.formats if formats else ():
            language = language.intersect(languages.format(name))
        for pattern, path in self.not_patterns:
            language = language.difference(languages.pattern(pattern, path))
        if excluded:
            language = language.difference(DFA.of_strings(excluded))
        low, high = self.lengths
        if (low, high) != (0, None) and not language.is_empty():
            language = language.intersect(DFA.length(low, high))
        if formats:
            self._strings = language
        return language

    # -- numbers --

    def number_language(self) -> DFA | None:
        """The numbers allowed, as an automaton over their plain spelling; None when nothing
        constrains them (the shared `number` or `integer` rule is written)."""
        if self._numbers is not ...:
            return self._numbers
        from ..numbers import number_dfa, value_dfa

        excluded = [v for v in self.excluded if kind_of(v) == "number"]
        if not (self.low or self.high or self.multiples or self.not_multiples or self.not_integer or excluded):
            self._numbers = None
            return None
        bounds = dict(low=self.low and self.low[0], low_exclusive=bool(self.low and self.low[1]),
                      high=self.high and self.high[0], high_exclusive=bool(self.high and self.high[1]))
        language = number_dfa(integer=self.integer, multiples=tuple(self.multiples), **bounds)
        for multiple in self.not_multiples:
            language = language.difference(number_dfa(integer=self.integer, multiples=(multiple,), **bounds))
        if self.not_integer:
            language = language.difference(number_dfa(integer=True, **bounds))
        for value in excluded:
            language = language.difference(value_dfa(fraction(value)))
        self._numbers = language
        return language

    # -- objects and arrays --

    def has_structure(self, kind: str) -> bool:
        return kind in self.structures

    def admits(self, value: Any, formats: bool = True) -> bool:
        """Whether `value` may be valid here (exact for scalars; objects and arrays: maybe);
        `formats=False`: formats read as annotations."""
        kind = kind_of(value)
        if kind not in self.kinds or any(json_equal(value, v) for v in self.excluded):
            return False
        if self.values is not None and not any(json_equal(value, v) for v in self.values):
            return False
        if kind == "string":
            return self.string_language(True, formats).accepts(value)
        if kind == "number":
            if self.integer and not integral(value):
                return False
            language = self.number_language()
            return language is None or language.accepts(canonical_number(value))
        return True


def finite_values(alternatives: Iterable[Facts | None]) -> list | None:
    """Every value valid under one of the `alternatives`, if there are at most
    MAX_UNIQUE_VALUES; None if there are more, or may be."""
    out: list = []
    for facts in alternatives:
        if facts is None:
            continue
        if facts.values is not None:
            candidates = facts.values
        else:
            candidates = []
            for kind in facts.kinds:
                if kind == "null":
                    candidates.append(None)
                elif kind == "boolean":
                    candidates += [False, True]
                elif kind == "string":
                    strings = facts.string_language(True).finite_strings(MAX_UNIQUE_VALUES)
                    if strings is None:
                        return None
                    candidates += strings
                elif kind == "number":
                    numbers = facts.number_language()
                    spelled = numbers.finite_strings(MAX_UNIQUE_VALUES) if numbers is not None else None
                    if spelled is None:
                        return None
                    candidates += [json.loads(t) for t in spelled]
                else:
                    return None
        for value in candidates:
            if facts.admits(value) and not any(json_equal(value, v) and type(value) is type(v) for v in out):
                out.append(value)
        if len(out) > MAX_UNIQUE_VALUES:
            return None
    return out


def names_language(alternatives: Iterable[Facts | None]) -> DFA:
    """The strings valid under one of the `alternatives` (the keys a `propertyNames` allows)."""
    language = DFA.empty()
    for facts in alternatives:
        if facts is not None and "string" in facts.kinds:
            if facts.values is not None:
                strings = [v for v in facts.values if isinstance(v, str) and facts.admits(v)]
                language = language.union(DFA.of_strings(strings))
            else:
                language = language.union(facts.string_language(True))
    return language
