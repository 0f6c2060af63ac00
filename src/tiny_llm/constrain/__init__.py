"""Engine — constrained decoding: grammars (GBNF, JSON schema, regular expressions) as token masks.

    grammar = Grammar.from_json_schema(schema)
    params = SamplingParams(temperature=0.7, grammar=grammar)   # the sampler masks tokens

`Grammar` parses and runs a grammar over text; `TokenMatcher` turns its states into masks
over a tokenizer's vocabulary (`TokenTable`).

Tests: tests/test_constrain_grammar.py, tests/test_constrain_regex.py, tests/test_constrain_json_schema.py
"""

from .grammar import Grammar
from .tokens import TokenMatcher, TokenTable

__all__ = ["Grammar", "TokenMatcher", "TokenTable", "json_schema_to_gbnf", "regex_to_gbnf"]


def json_schema_to_gbnf(schema, *, compact: bool = False) -> str:
    """GBNF text for JSON that validates against `schema` (`compact`: on one line)."""
    from .json_schema import json_schema_to_gbnf as convert

    return convert(schema, compact=compact)


def regex_to_gbnf(pattern: str) -> str:
    """GBNF text for the texts the regular expression matches in full."""
    from .regex import regex_to_gbnf as convert

    return convert(pattern)
