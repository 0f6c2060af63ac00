"""Engine — JSON values as JSON Schema sees them: equality, kind, and the one spelling written.

    json_equal(1, 1.0)                    # True
    json_equal(True, 1)                   # False
    json_equal({"a": [1]}, {"a": [1.0]})  # True

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any


def json_equal(a: Any, b: Any) -> bool:
    """Whether two JSON values are equal as JSON Schema defines it (`const`, `enum`,
    `uniqueItems`): numbers by mathematical value (1 == 1.0), booleans are not numbers
    (true != 1), strings by code points, arrays element by element in order, objects as maps
    from key to value whatever the order of their keys."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def kind_of(value: Any) -> str:
    """The JSON type of a value (integers are numbers)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def integral(value: Any) -> bool:
    return isinstance(value, int) or isinstance(value, float) and value.is_integer()


def fraction(value: Any) -> Fraction:
    """A JSON number as the exact decimal it was written as (floats by their shortest repr)."""
    return Fraction(value) if isinstance(value, (int, Fraction)) else Fraction(repr(float(value)))


def canonical_number(value: Any) -> str:
    """A number's plain spelling, the one the grammar writes (see `numbers.canonical`)."""
    from ..numbers import canonical

    return canonical(value)


def compact_text(value: Any, path: str) -> str:
    """The compact JSON text of an `enum` or `const` value (at `path`)."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError as e:
        raise ValueError(f"json schema: a value of 'enum' or 'const' at {path} is not JSON: {e}") from e
