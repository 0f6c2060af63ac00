"""Engine — reading a schema's keywords: each value checked for its shape and returned typed,
or a ValueError naming the keyword and its JSON pointer (`json schema: 'required' at #/items
must be a list of strings`).

    count({"maxItems": 3}, "maxItems", "#", None)   # 3
    schema_map({"properties": {"a": True}}, "properties", "#")   # {"a": True}

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from ..limits import MAX_REPEAT
from .values import fraction
from .vocabulary import ANNOTATIONS, FORMATS, SCHEMA_LISTS, SCHEMA_MAPS, SINGLE_SCHEMAS, TYPES, UNSUPPORTED

MAX_DIGITS = 16  # digits after the point of a number under constraints


def pointer(key: str) -> str:
    """`key` as one token of a JSON pointer."""
    return key.replace("~", "~0").replace("/", "~1")


def trivial(schema: Any) -> bool:
    """Whether `schema` allows every value (true, or annotations only)."""
    return schema is True or isinstance(schema, dict) and all(isinstance(k, str) and k in ANNOTATIONS
                                                              for k in schema)


def only_ref(schema: Any) -> bool:
    """Whether `schema` is a `$ref` and annotations only."""
    return isinstance(schema, dict) and "$ref" in schema and all(
        k == "$ref" or (isinstance(k, str) and k in ANNOTATIONS) for k in schema)


def constrains(schema: dict, key: str) -> bool:
    """Whether `key` is in `schema` and narrows the language (an unknown `format` does not)."""
    return key in schema and (key != "format" or schema[key] in FORMATS)


def check_schema(value: Any, path: str) -> None:
    """ValueError unless `value` is a schema: an object or a boolean."""
    if not isinstance(value, (dict, bool)):
        raise ValueError(f"json schema: the schema at {path} is of type {type(value).__name__}, "
                         "not an object or a boolean")


def check_keywords(schema: dict, path: str) -> None:
    """ValueError for keywords of older drafts, and unless each keyword that holds schemas
    holds them in its shape (checked whatever types the schema allows, so a non-schema such as
    `{"$defs": false}` is refused even where the keyword has no effect)."""
    for key, hint in UNSUPPORTED.items():
        if key in schema:
            raise ValueError(f"json schema: {key!r} at {path} is not supported: {hint}")
    if isinstance(schema.get("items"), list):
        raise ValueError(f"json schema: 'items' at {path} is a list (the tuple form of older "
                         "drafts); write 'prefixItems' instead")
    for key in SCHEMA_MAPS:
        if key in schema:
            schema_map(schema, key, path, check=True)
    for key in SINGLE_SCHEMAS:
        if key in schema:
            check_schema(schema[key], f"{path}/{key}")
    for key in SCHEMA_LISTS:
        if key in schema:
            schema_list(schema, key, path, empty=key == "prefixItems")
    if not isinstance(schema.get("format", ""), str):
        raise ValueError(f"json schema: 'format' at {path} must be a string")
    for low, high in (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"),
                      ("minContains", "maxContains"), ("minimum", "maximum")):
        if low in schema and high in schema:
            check = bound if low == "minimum" else lambda s, k, p: count(s, k, p, 0)
            if check(schema, low, path) > check(schema, high, path):
                raise ValueError(f"json schema: {low!r} at {path} is greater than {high!r}")
    if "uniqueItems" in schema and not isinstance(schema["uniqueItems"], bool):
        raise ValueError(f"json schema: 'uniqueItems' at {path} must be true or false")


def schema_map(schema: dict, key: str, path: str, check: bool = False) -> dict:
    """The object of schemas under `key` ({} if absent); `check`: each value is checked too."""
    value = schema.get(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"json schema: {key!r} at {path} must be an object whose values are "
                         f"schemas (objects or booleans), got {type(value).__name__}")
    if check:
        for name, sub in value.items():
            if not isinstance(sub, (dict, bool)):
                check_schema(sub, f"{path}/{key}/{pointer(name)}")
    return value


def schema_list(schema: dict, key: str, path: str, empty: bool = True) -> list:
    """The list of schemas under `key` ([] if absent); `empty=False`: it may not be empty."""
    if key not in schema:
        return []
    value = schema[key]
    if not isinstance(value, list) or (not value and not empty):
        raise ValueError(f"json schema: {key!r} at {path} must be a {'' if empty else 'non-empty '}list of "
                         f"schemas, got {type(value).__name__ if not isinstance(value, list) else 'an empty list'}")
    for i, sub in enumerate(value):
        check_schema(sub, f"{path}/{key}/{i}")
    return value


def required(schema: dict, path: str) -> list[str]:
    value = schema.get("required", [])
    if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
        raise ValueError(f"json schema: 'required' at {path} must be a list of strings")
    return value


def dependent_required(schema: dict, path: str) -> dict[str, list[str]]:
    value = schema.get("dependentRequired", {})
    if not isinstance(value, dict) or not all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in value.values()):
        raise ValueError(f"json schema: 'dependentRequired' at {path} must be an object of lists of strings")
    return value


def declared(schema: dict, path: str) -> tuple[set[str], bool]:
    """The kinds `type` allows, and whether its numbers must be integers."""
    types = schema["type"]
    names = [types] if isinstance(types, str) else types
    if not isinstance(names, list) or not names or not all(isinstance(t, str) for t in names):
        raise ValueError(f"json schema: 'type' at {path} must be a type name or a non-empty list of them")
    for t in names:
        if t not in TYPES:
            raise ValueError(f"json schema: 'type' at {path} names an unknown type {t!r}")
    kinds = {"number" if t == "integer" else t for t in names}
    return kinds, "integer" in names and "number" not in names


def enum_values(schema: dict, path: str) -> list:
    values = schema["enum"]
    if not isinstance(values, list) or not values:
        raise ValueError(f"json schema: 'enum' at {path} must be a non-empty list")
    return values


def count(schema: dict, key: str, path: str, default: int | None) -> int | None:
    """A non-negative integer keyword (`minLength`, `maxItems`, ...)."""
    if key not in schema:
        return default
    value = schema[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"json schema: {key!r} at {path} must be a non-negative integer")
    if value > MAX_REPEAT:  # each counted item becomes grammar rules
        raise ValueError(f"json schema: {key!r} at {path} is {value}, above the limit of {MAX_REPEAT}")
    return value


def bound(schema: dict, key: str, path: str) -> int | float:
    value = schema[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"json schema: {key!r} at {path} must be a finite number")
    return value


def step(schema: dict, path: str) -> Fraction:
    value = bound(schema, "multipleOf", path)
    if value <= 0:
        raise ValueError(f"json schema: 'multipleOf' at {path} must be greater than 0, got {value!r}")
    return fraction(value)


def read_bound(value: int | float, exclusive: bool, up: bool) -> list[tuple[Fraction, bool]]:
    """A lower (`up`) or upper bound as constraints on the exact decimal a text spells, such
    that the text also passes where JSON parsers read numbers as binary doubles: its decimal
    reading; for a float beyond 2**53 its binary value (integers are compared with it exactly);
    and for an exclusive bound, the double next to it (a decimal just past the bound may read
    as the bound itself) where decimals of at most MAX_DIGITS fraction digits lie between."""
    bounds = [(fraction(value), exclusive)]
    if isinstance(value, float) and abs(value) >= 2**53:
        bounds.append((Fraction(value), exclusive))
    if exclusive:
        nearest = math.nextafter(float(value), math.inf if up else -math.inf)
        if math.isfinite(nearest):
            grid = Fraction(1, 10**MAX_DIGITS)
            between = (math.floor(Fraction(float(value)) / grid) + 1) * grid if up else \
                (math.ceil(Fraction(float(value)) / grid) - 1) * grid
            if between < Fraction(nearest) if up else between > Fraction(nearest):
                bounds.append((Fraction(repr(nearest)), False))
    return bounds
