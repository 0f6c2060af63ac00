"""Engine — a schema's keywords read into typed specs: what one leaf says about scalars and its
kinds (`LeafSpec`), about objects (`ObjectSpec`), about arrays (`ArraySpec`, and `ContainsSpec`
for `contains` and its counts). `facts`, `objects` and `arrays` read a schema only through
these specs; the readers use those of `keywords`, so a bad value is a ValueError naming the
keyword and its JSON pointer.

    LeafSpec.read({"type": "integer", "minimum": 1}, "#").low      # (Fraction(1), False)
    ObjectSpec.read({"required": ["a"]}, "#").required             # ("a",)

Tests: tests/test_json_schema_keywords.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .keywords import (bound, constrains, count, declared, dependent_required, enum_values, read_bound, required,
                       schema_list, schema_map, step)
from .values import fraction, json_equal
from .vocabulary import (ARRAY_KEYWORDS, EXTRA_KEYWORDS, FORMATS, KIND_KEYWORDS, NOT_INTEGER, NOT_MULTIPLE,
                         NOT_PATTERN, NOT_VALUES, OBJECT_KEYWORDS)

Edge = tuple[Fraction, bool]  # a number bound and whether it is exclusive


def tighter(edge: Edge, current: Edge | None, up: bool) -> bool:
    """Whether `edge` bounds more than `current` does: a lower bound (`up`) or an upper one."""
    if current is None:
        return True
    beyond = edge[0] > current[0] if up else edge[0] < current[0]
    return beyond or edge[0] == current[0] and edge[1]


def _tightest(schema: dict, path: str, keys: tuple[str, str], up: bool) -> Edge | None:
    """The tightest of the bounds `keys` (inclusive, then exclusive) say, as `read_bound` reads them."""
    out = None
    for key in keys:
        if key in schema:
            for edge in read_bound(bound(schema, key, path), key != keys[0], up=up):
                if tighter(edge, out, up):
                    out = edge
    return out


@dataclass(frozen=True, slots=True)
class LeafSpec:
    """What one schema says of its kinds and scalars (a negation's own keywords too)."""

    kinds: frozenset[str] | None  # the kinds `type` (or, without it, the keywords) allows; None: any
    integer: bool  # `type` asks for integers
    values: tuple | None  # what `enum` and `const` allow (both: the `enum` values equal to `const`)
    excluded: tuple  # values a negation excludes
    not_integer: bool
    low: Edge | None  # from `minimum` and `exclusiveMinimum`
    high: Edge | None  # from `maximum` and `exclusiveMaximum`
    multiple: Fraction | None
    not_multiple: Fraction | None
    min_length: int
    max_length: int | None
    pattern: tuple[Any, str] | None  # (pattern, its schema's path)
    not_pattern: tuple[Any, str] | None
    format: str | None  # an enforced format (others are annotations)
    structures: frozenset[str]  # "object", "array": the kinds whose keywords the schema holds

    @classmethod
    def read(cls, schema: dict, path: str) -> LeafSpec:
        if "type" in schema:
            kinds, integer = declared(schema, path)
        else:
            implied = {k for k, keys in KIND_KEYWORDS.items() if any(constrains(schema, key) for key in keys)}
            implied |= {"string" for key in (NOT_PATTERN,) if key in schema}
            implied |= {"number" for key in (NOT_MULTIPLE, NOT_INTEGER) if key in schema}
            kinds, integer = implied or None, False
        values = tuple(enum_values(schema, path)) if "enum" in schema else None
        if "const" in schema:
            const = schema["const"]
            values = (const,) if values is None else tuple(v for v in values if json_equal(v, const))
        low = _tightest(schema, path, ("minimum", "exclusiveMinimum"), up=True)
        high = _tightest(schema, path, ("maximum", "exclusiveMaximum"), up=False)
        multiple = step(schema, path) if "multipleOf" in schema else None
        min_length = count(schema, "minLength", path, 0)
        max_length = count(schema, "maxLength", path, None)
        if not isinstance(schema.get("format", ""), str):
            raise ValueError(f"json schema: 'format' at {path} must be a string")
        return cls(
            kinds=None if kinds is None else frozenset(kinds), integer=integer, values=values,
            excluded=tuple(schema.get(NOT_VALUES, ())), not_integer=bool(schema.get(NOT_INTEGER)),
            low=low, high=high, multiple=multiple,
            not_multiple=fraction(schema[NOT_MULTIPLE]) if NOT_MULTIPLE in schema else None,
            min_length=min_length, max_length=max_length,
            pattern=(schema["pattern"], path) if "pattern" in schema else None,
            not_pattern=(schema[NOT_PATTERN], path) if NOT_PATTERN in schema else None,
            format=schema["format"] if schema.get("format") in FORMATS else None,
            structures=frozenset(kind for kind, keys in (("object", OBJECT_KEYWORDS), ("array", ARRAY_KEYWORDS))
                                 if any(k in schema for k in keys)))


@dataclass(frozen=True, slots=True)
class ObjectSpec:
    """What one schema says of objects. Schemas are as written (an object or a boolean)."""

    properties: dict | None  # None when `properties` is absent
    required: tuple[str, ...]
    dependent_required: dict[str, list[str]]
    min_properties: int
    max_properties: int | None
    pattern_properties: dict
    additional: Any  # `additionalProperties`; None when absent
    unevaluated: Any  # `unevaluatedProperties`; None when absent
    property_names: Any  # `propertyNames`; None when absent
    says_extras: bool  # a keyword says what keys beyond the named ones may be

    @classmethod
    def read(cls, schema: dict, path: str) -> ObjectSpec:
        properties = schema_map(schema, "properties", path)
        return cls(
            properties=properties if "properties" in schema else None,
            required=tuple(required(schema, path)),
            dependent_required=dependent_required(schema, path),
            min_properties=count(schema, "minProperties", path, 0),
            max_properties=count(schema, "maxProperties", path, None),
            pattern_properties=schema_map(schema, "patternProperties", path),
            additional=schema.get("additionalProperties"), unevaluated=schema.get("unevaluatedProperties"),
            property_names=schema.get("propertyNames"), says_extras=any(k in schema for k in EXTRA_KEYWORDS))


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """What one schema says of arrays, `contains` aside (`ContainsSpec`)."""

    min_items: int
    max_items: int | None
    prefix_items: tuple | None  # None when `prefixItems` is absent
    items: Any  # None when absent
    unique: bool  # `uniqueItems` is true
    unevaluated: Any  # `unevaluatedItems`; None when absent

    @classmethod
    def read(cls, schema: dict, path: str) -> ArraySpec:
        min_items = count(schema, "minItems", path, 0)
        max_items = count(schema, "maxItems", path, None)
        prefix = tuple(schema_list(schema, "prefixItems", path)) if "prefixItems" in schema else None
        return cls(min_items=min_items, max_items=max_items, prefix_items=prefix, items=schema.get("items"),
                   unique=schema.get("uniqueItems") is True, unevaluated=schema.get("unevaluatedItems"))


@dataclass(frozen=True, slots=True)
class ContainsSpec:
    """`contains` and how many items must match it (`minContains` defaults to 1). Read only
    where an array can be written at all, so its counts are checked there."""

    schema: Any
    low: int
    high: int | None

    @classmethod
    def read(cls, schema: dict, path: str) -> ContainsSpec | None:
        """The clause, or None without `contains`."""
        if "contains" not in schema:
            return None
        return cls(schema["contains"], count(schema, "minContains", path, 1), count(schema, "maxContains", path, None))
