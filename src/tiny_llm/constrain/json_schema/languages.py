"""Engine — the regular languages of one compilation, built once each: a `pattern`'s strings,
a `format`'s, and the keys a `propertyNames` allows.

    languages = Languages()
    languages.pattern("^a+$", "#/pattern").accepts("aa")   # True (searched, as JSON Schema does)

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..automata import DFA
from .vocabulary import FORMATS


class Languages:
    """Automata by key, built on first use (a schema may name a pattern many times)."""

    def __init__(self):
        self._cache: dict[tuple, DFA] = {}

    def cached(self, key: tuple, build: Callable[[], DFA]) -> DFA:
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def pattern(self, pattern: Any, path: str) -> DFA:
        """The strings in which the `pattern` at `path` finds a match."""
        if not isinstance(pattern, str):
            raise ValueError(f"json schema: 'pattern' at {path} must be a string")

        def build() -> DFA:
            try:
                return DFA.from_search(pattern, portable=True)
            except ValueError as e:
                raise ValueError(f"json schema: 'pattern' at {path}: {str(e).removeprefix('json schema: ')}") from e

        return self.cached(("pattern", pattern), build)

    def format(self, name: str) -> DFA:
        """The strings of an enforced format (a key of `FORMATS`)."""
        return self.cached(("format", name), lambda: DFA.from_regex(FORMATS[name]))
