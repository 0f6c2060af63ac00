"""Engine — scalars as rules: `enum`/`const` values as literals, strings and numbers as the
shared rules or, under constraints, one rule per state of their automaton.

    {"type": "string", "maxLength": 2}     # "\\"" char{0,2} "\\"" space
    {"enum": ["a", 1]}                      # "\\"a\\"" space | "1" space (a rule per kind)

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

import json

from ..automata import JSON_CONTROL, json_string, plain
from ..escape import gbnf_literal
from .facts import Facts
from .rules import Rules, group, repeat, sequence
from .values import canonical_number, compact_text, integral, kind_of


def values_rule(facts: Facts, kind: str, path: str) -> str | None:
    """The `enum`/`const` values of one kind that the other facts admit, as literals."""
    texts = []
    for value in facts.values:
        if kind_of(value) != kind:
            continue
        if kind == "number":
            if facts.integer and not integral(value):
                continue
            text = canonical_number(value)
            if facts.number_language() is not None and not facts.number_language().accepts(text):
                continue
        elif kind == "string":
            language = facts.string_language(force=True)
            if not language.accepts(value):
                continue
            text = json.dumps(value, ensure_ascii=False)
        else:
            if kind in ("object", "array") and facts.has_structure(kind):
                raise ValueError(f"json schema: 'enum' or 'const' with {kind} values next to {kind} keywords "
                                 f"at {path} is not supported")
            text = compact_text(value, path)
        texts.append(text)
    if not texts:
        return None
    return f"{group(' | '.join(gbnf_literal(t) for t in dict.fromkeys(texts)))} space"


def string_rule(rules: Rules, facts: Facts, name: str) -> str | None:
    language = facts.string_language(force=False)
    if language is None:  # lengths at most: any spelling, escapes too
        low, high = facts.lengths
        if low == 0 and high is None:
            return rules.primitive("string")
        rules.primitive("char"), rules.primitive("space")
        return sequence(r'"\""', repeat("char", low, high), r'"\""', "space")
    if language.is_empty():
        return None
    rules.primitive("space"), rules.primitive(JSON_CONTROL)
    body = language.rules(rules.reserve, rules.define, name, json_string)
    return sequence(r'"\""', body if body != '""' else "", r'"\""', "space")


def number_rule(rules: Rules, facts: Facts, name: str) -> str | None:
    language = facts.number_language()
    if language is None:
        return rules.primitive("integer" if facts.integer else "number")
    if language.is_empty():
        return None
    rules.primitive("space")
    return sequence(language.rules(rules.reserve, rules.define, name, plain), "space")
