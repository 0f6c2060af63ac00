r"""JSON Schema keywords one at a time: the grammar accepts an instance's canonical text exactly
when JSON Schema's reference validator says the instance is valid.

A case is `(schema, valid instances, invalid instances)`. Each test first checks the case's own
expectation against `jsonschema` (so wrong case data fail as such, not as a compiler bug), then
asks the compiled grammar about the instance's canonical text: compact JSON, keys named under
`properties` first in schema order, numbers in plain decimal, strings as
`json.dumps(s, ensure_ascii=False)` writes them. String-length cases also write every string
with `\u` escapes (astral characters as surrogate pairs), which must count as the characters
they spell. Refusals name the keyword and the JSON pointer of the schema that holds it. The
readers that turn a schema's keywords into typed specs are checked value by value at the end.

The helpers here (`canonical_text`, `text_is_valid`, `escape_all`, ...) are shared with the
hypothesis and pydantic tests of the same compiler.
"""

import functools
import json
import re
from decimal import Decimal
from fractions import Fraction

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from tiny_llm.constrain import Grammar
from tiny_llm.constrain.json_schema.specs import ArraySpec, ContainsSpec, LeafSpec, ObjectSpec

# ---- the oracle and the canonical texts -----------------------------------------------------


def is_valid(schema, instance) -> bool:
    return Draft202012Validator(schema).is_valid(instance)


def text_is_valid(schema, text: str) -> bool:
    """Whether `text` is JSON (as Python reads it) whose value validates against `schema`."""
    try:
        instance = json.loads(text)
    except json.JSONDecodeError:
        return False
    return is_valid(schema, instance)


def plain_number(x: int | float) -> str:
    """Canonical plain decimal: no exponent, no leading or trailing zeros, no `-0`, no `.0`.
    A float is written with the digits of its shortest repr, which read back as the same float."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise TypeError(f"not a number: {x!r}")
    if isinstance(x, int):
        return str(x)
    d = Decimal(repr(x))
    if d == d.to_integral_value():
        return str(int(d))
    text = format(d, "f")
    return text.rstrip("0") if "." in text else text


def raw(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def escape_non_ascii(s: str) -> str:
    return json.dumps(s, ensure_ascii=True)


def escape_all(s: str) -> str:
    r"""Every character as `\uXXXX`, characters past U+FFFF as a surrogate pair."""
    units = s.encode("utf-16-be")
    return '"' + "".join(f"\\u{int.from_bytes(units[i:i + 2], 'big'):04x}" for i in range(0, len(units), 2)) + '"'


def canonical_text(instance, schema, *, string=raw) -> str:
    """The instance's canonical text under `schema` (issue 31's design): compact, keys named
    under `properties` of the schemas that apply to an object first (the schema itself, then
    its `allOf` members, `$ref`/`$dynamicRef` targets, the `anyOf`/`oneOf` branches, `if` and
    the branch taken, and `dependentSchemas` the object triggers, depth first), other keys after
    them in the instance's order; numbers in plain decimal. `string` writes string values
    (keys are always written raw)."""
    resolver = Registry().resolver_with_root(DRAFT202012.create_resource(schema))
    return _Writer(Draft202012Validator(schema), string).value(instance, _applicable(instance, schema, resolver))


def _applicable(value, schema, resolver, validator=None, depth=0, out=None) -> list:
    """The (schema, resolver) pairs that apply to `value`, in the order above."""
    out = [] if out is None else out
    if not isinstance(schema, dict) or depth > 64:
        return out
    resolver = resolver.in_subresource(DRAFT202012.create_resource(schema))
    validator = validator or Draft202012Validator(schema)
    out.append((schema, resolver))

    def add(sub, res=resolver):
        _applicable(value, sub, res, validator, depth + 1, out)

    def holds(sub) -> bool:
        res = resolver.in_subresource(DRAFT202012.create_resource(sub)) if isinstance(sub, dict) else resolver
        return next(validator.descend(value, sub, resolver=res), None) is None

    for sub in schema.get("allOf", ()):
        add(sub)
    for key in ("$ref", "$dynamicRef"):
        if isinstance(schema.get(key), str):
            try:
                resolved = resolver.lookup(schema[key])
            except Unresolvable:
                continue
            add(resolved.contents, resolved.resolver)
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key, ()):
            if holds(sub):
                add(sub)
    if "if" in schema:
        taken = holds(schema["if"])
        if taken:
            add(schema["if"])
        branch = schema.get("then" if taken else "else")
        if branch is not None:
            add(branch)
    if isinstance(value, dict):
        for name, sub in schema.get("dependentSchemas", {}).items():
            if name in value:
                add(sub)
    return out


class _Writer:
    def __init__(self, validator, string):
        self.validator = validator
        self.string = string

    def value(self, value, applicable) -> str:
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int | float):
            return plain_number(value)
        if isinstance(value, str):
            return self.string(value)
        if isinstance(value, list):
            return "[" + ",".join(self.value(item, self.item_schemas(i, item, applicable))
                                  for i, item in enumerate(value)) + "]"
        if isinstance(value, dict):
            named: list[str] = []
            for s, _ in applicable:
                for key in s.get("properties", {}):
                    if key not in named:
                        named.append(key)
            keys = [k for k in named if k in value] + [k for k in value if k not in named]
            return "{" + ",".join(raw(k) + ":" + self.value(value[k], self.member_schemas(k, value[k], applicable))
                                  for k in keys) + "}"
        raise TypeError(f"not a JSON value: {value!r}")

    def member_schemas(self, key, value, applicable) -> list:
        out: list = []
        named = any(key in s.get("properties", {}) or any(re.search(p, key) for p in s.get("patternProperties", {}))
                    for s, _ in applicable)
        for s, res in applicable:
            matched = False
            if key in s.get("properties", {}):
                _applicable(value, s["properties"][key], res, self.validator, 0, out)
                matched = True
            for pattern, sub in s.get("patternProperties", {}).items():
                if re.search(pattern, key):
                    _applicable(value, sub, res, self.validator, 0, out)
                    matched = True
            if not matched and "additionalProperties" in s:
                _applicable(value, s["additionalProperties"], res, self.validator, 0, out)
            if not named and "unevaluatedProperties" in s:
                _applicable(value, s["unevaluatedProperties"], res, self.validator, 0, out)
        return out

    def item_schemas(self, i, item, applicable) -> list:
        out: list = []
        for s, res in applicable:
            prefix = s.get("prefixItems", [])
            if i < len(prefix):
                _applicable(item, prefix[i], res, self.validator, 0, out)
            elif "items" in s:
                _applicable(item, s["items"], res, self.validator, 0, out)
            elif "unevaluatedItems" in s:
                _applicable(item, s["unevaluatedItems"], res, self.validator, 0, out)
            if "contains" in s and next(self.validator.descend(item, s["contains"], resolver=res), None) is None:
                _applicable(item, s["contains"], res, self.validator, 0, out)
        return out


@functools.cache
def _compiled(schema_text: str) -> Grammar:
    return Grammar.from_json_schema(json.loads(schema_text))


def compiled(schema) -> Grammar:
    """The schema's grammar, compiled once per test process."""
    return _compiled(json.dumps(schema))


def refusal(keyword: str, pointer: str) -> str:
    """The start of a refusal's message: the keyword and the pointer of the schema that holds it
    (or of the keyword itself), and nothing deeper."""
    return rf"json schema: '{re.escape(keyword)}' at {re.escape(pointer)}(/{re.escape(keyword)})?(?![\w/~])"


# ---- the cases ------------------------------------------------------------------------------

NUMBER_BOUNDS = [
    ("integer-inclusive", {"type": "integer", "minimum": -5, "maximum": 12},
     [-5, 0, 7, 12], [-6, 13, 3.5, "3", None]),
    ("integer-exclusive", {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 100},
     [-2, 0, 99], [-3, 100, -100, 1000]),
    ("integer-decimal-bounds", {"type": "integer", "minimum": 2.5, "maximum": 7.5},
     [3, 5, 7], [2, 8, 5.5, -3]),
    # A side without a bound stops at 16 digits (a narrowing), so 20-digit values are not written.
    ("integer-at-least", {"type": "integer", "minimum": 10},
     [10, 11, 99, 100, 1234567890123456], [9, 0, -10, -12345678901234567890]),
    ("integer-at-most-negative", {"type": "integer", "exclusiveMaximum": -9},
     [-10, -11, -100, -10**15], [-9, -1, 0, 9, 10**20]),
    ("decimal-inclusive", {"type": "number", "minimum": 0.25, "maximum": 1.5},
     [0.25, 0.3, 1, 1.4999999, 1.5], [0.2499, 1.5000001, -1, 2, 0]),
    ("decimal-exclusive", {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
     [0.5, 0.000001, 0.999999, 0.1], [0, 1, -0.5, 1.0000001, 10]),
    ("negative", {"type": "number", "minimum": -2.75, "exclusiveMaximum": -1},
     [-2.75, -1.5, -1.0001, -2], [-1, -2.76, 0, -0.5, 1.5, -3]),
    ("crossing-zero", {"type": "number", "minimum": -0.5, "maximum": 0.5},
     [-0.5, -0.1, 0, 0.25, 0.5], [-0.51, 0.51, -1, 1]),
    ("crossing-zero-exclusive", {"type": "number", "exclusiveMinimum": -10, "exclusiveMaximum": 10},
     [-9.99, -1, 0, 0.001, 9.5], [-10, 10, 10.5, -100]),
    ("magnitude-1e300", {"type": "number", "minimum": -1e300, "maximum": 1e300},
     [0, 123.5, -0.001, 10**299, -10**299, 10**300, -10**300], [10**301, -10**301, 2 * 10**300]),
    ("integer-within-1e15", {"type": "integer", "minimum": -10**15, "maximum": 10**15},
     [-10**15, 0, 999999999999999, 10**15, -123456789], [10**15 + 1, -10**15 - 1, 10**16, 0.5]),
    ("number-within-1e15", {"type": "number", "minimum": -10**15, "maximum": 10**15},
     [10**15, 0.5, -999999999999999.5, -10**15], [1000000000000000.5, -1000000000000000.5, 10**16]),
    # A float bound is the float's exact value (the validator compares Python numbers exactly):
    # float(1e300) is 10**300 + 5.25...e283, so 10**300 is below it.
    ("float-bound-is-exact", {"type": "integer", "minimum": 1e300},
     [2 * 10**300, 10**300 + 10**284], [10**300, 10**300 + 10**283, 0]),
]

MULTIPLE_OF = [
    ("integer-3", {"type": "integer", "multipleOf": 3},
     [0, 3, -3, 999, 123456789012, 10**12 + 2], [1, -2, 1000, 10**12 + 1]),
    ("integer-7-bounded", {"type": "integer", "multipleOf": 7, "minimum": -20, "maximum": 50},
     [-14, 0, 7, 49], [-21, 56, 48, 1, -20]),
    ("number-3", {"type": "number", "multipleOf": 3},
     [0, 6, -9, 300], [1, 1.5, -0.3]),
    ("decimal-0.5", {"type": "number", "multipleOf": 0.5},
     [0, 0.5, -1.5, 2, 1000000, 12.5], [0.25, 1.1, -0.75, 0.001]),
    # Instances whose quotient the validator's float division computes exactly: for 0.07 and
    # others (0.07 / 0.01 == 7.000000000000001) it disagrees with decimal arithmetic.
    ("decimal-0.01-bounded", {"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 1},
     [0, 0.01, 0.05, 0.1, 0.12, 0.25, 0.5, 0.99, 1], [0.005, 0.123, 1.01, -0.01, 2]),
    ("decimal-2.5-bounded", {"type": "number", "multipleOf": 2.5, "exclusiveMinimum": -5, "maximum": 10},
     [-2.5, 0, 7.5, 10], [-5, 12.5, 1, 3.75, -7.5]),
    ("integer-multiple-of-decimal", {"type": "integer", "multipleOf": 1.5},
     [0, 3, -6, 300], [1, 2, 1.5, -4.5]),
]

PROPERTY_COUNTS = [
    ("min-max-closed", {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
        "additionalProperties": False, "minProperties": 1, "maxProperties": 2,
    }, [{"a": 1}, {"c": 3}, {"b": 1, "c": 2}, {"a": 1, "c": 3}], [{}, {"a": 1, "b": 2, "c": 3}, {"d": 1}]),
    ("min-with-required", {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a"], "minProperties": 2, "additionalProperties": False,
    }, [{"a": 1, "b": 2}], [{"a": 1}, {"b": 2}, {}]),
    ("max-counts-extra-pairs", {
        "type": "object", "properties": {"a": {"type": "integer"}}, "maxProperties": 2,
        "additionalProperties": {"type": "integer"},
    }, [{}, {"a": 1}, {"a": 1, "x": 2}, {"x": 1, "y": 2}], [{"x": 1, "y": 2, "z": 3}, {"a": 1, "x": 2, "y": 3}]),
    ("max-zero", {"type": "object", "maxProperties": 0}, [{}], [{"a": 1}, {"": None}]),
]

PATTERN_PROPERTIES = [
    ("closed", {
        "type": "object", "patternProperties": {"^x-": {"type": "integer"}, "^y": {"type": "string"}},
        "additionalProperties": False,
    }, [{}, {"x-a": 1}, {"y": "s", "x-": 2}, {"yes": "no"}], [{"x-a": "1"}, {"z": 1}, {"y1": 2}, {"xa": 1}]),
    ("open", {"type": "object", "patternProperties": {"^n_": {"type": "number"}}},
     [{}, {"n_a": 1.5}, {"other": "x"}, {"n": "x", "n_": -2}], [{"n_a": "x"}, {"other": 1, "n_b": None}]),
    ("with-properties-and-additional", {
        "type": "object", "properties": {"id": {"type": "integer"}},
        "patternProperties": {"^s_": {"type": "string"}}, "additionalProperties": {"type": "boolean"},
    }, [{"id": 1, "s_x": "a", "flag": True}, {"s_": "", "b": False}, {}],
     [{"s_x": 1}, {"flag": "no"}, {"id": "1"}, {"id": 1, "ids": 2}]),
    ("overlapping", {
        "type": "object",
        "patternProperties": {"^a": {"type": "integer"}, "b$": {"type": "number", "minimum": 10}},
        "additionalProperties": False,
    }, [{"ab": 10}, {"a": 1}, {"b": 10.5}, {"xb": 20, "a": -3}], [{"ab": 5}, {"ab": 10.5}, {"b": 3}, {"c": 1}]),
    ("overlapping-a-named-property", {
        "type": "object", "properties": {"aa": {"type": "integer"}},
        "patternProperties": {"^a": {"type": "number", "minimum": 0}}, "additionalProperties": False,
    }, [{"aa": 3, "ab": 0.5}, {}, {"aa": 0}], [{"aa": -1}, {"ab": -0.5}, {"aa": 1.5}, {"b": 1}]),
]

PROPERTY_NAMES = [
    ("pattern", {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"},
                 "additionalProperties": {"type": "integer"}},
     [{}, {"abc": 1, "z": 2}], [{"aB": 1}, {"1": 1}, {"": 1}, {"abc": "1"}]),
    ("max-length", {"type": "object", "propertyNames": {"maxLength": 3}},
     [{}, {"abc": [1]}, {"é😀": 1, "": None}], [{"abcd": 1}, {"a": 1, "😀😀😀😀": 2}]),
    ("enum", {"type": "object", "propertyNames": {"enum": ["a", "b"]}, "additionalProperties": {"type": "boolean"}},
     [{}, {"a": True}, {"b": False, "a": True}], [{"c": True}, {"a": 1}, {"ab": True}]),
    ("with-properties", {
        "type": "object", "properties": {"name": {"type": "string"}, "toolong": {"type": "integer"}},
        "propertyNames": {"maxLength": 4}, "additionalProperties": {"type": "integer"},
    }, [{"name": "x", "ab": 1}, {}, {"abcd": 2}], [{"name": "x", "abcde": 1}, {"toolong": 1}, {"name": 1}]),
]

DEPENDENCIES = [
    ("required-listed", {
        "type": "object",
        "properties": {"card": {"type": "string"}, "billing": {"type": "string"}, "name": {"type": "string"}},
        "dependentRequired": {"card": ["billing"]}, "additionalProperties": False,
    }, [{}, {"name": "x"}, {"card": "1", "billing": "a"}, {"billing": "a"}],
     [{"card": "1"}, {"card": "1", "name": "x"}]),
    ("required-unlisted", {
        "type": "object", "properties": {"a": {"type": "integer"}},
        "dependentRequired": {"a": ["b"]}, "additionalProperties": {"type": "integer"},
    }, [{"a": 1, "b": 2}, {"b": 2}, {"c": 1}, {}], [{"a": 1}, {"a": 1, "c": 2}, {"a": 1, "b": "2"}]),
    ("required-both-ways", {
        "type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
        "dependentRequired": {"lat": ["lon"], "lon": ["lat"]}, "additionalProperties": False,
    }, [{}, {"lat": 1.5, "lon": -2}], [{"lat": 1}, {"lon": 1}]),
    ("schemas", {
        "type": "object", "properties": {"kind": {"type": "string"}, "size": {"type": "integer"}},
        "dependentSchemas": {"size": {"required": ["kind"], "properties": {"kind": {"const": "box"}}}},
        "additionalProperties": False,
    }, [{}, {"kind": "bag"}, {"kind": "box", "size": 3}], [{"size": 3}, {"kind": "bag", "size": 3}]),
    ("schemas-bounding-another-property", {
        "type": "object", "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}},
        "dependentSchemas": {"min": {"properties": {"max": {"minimum": 0}}}}, "additionalProperties": False,
    }, [{"max": -5}, {"min": 1, "max": 0}, {"min": 1}], [{"min": 1, "max": -1}]),
]

CONTAINS = [
    ("contains", {"type": "array", "contains": {"type": "integer"}},
     [[1], ["a", 2, "b"], [1, 2]], [[], ["a"], [1.5], [None, True]]),
    ("min-max-contains", {
        "type": "array", "items": {"type": "integer"}, "contains": {"type": "integer", "minimum": 10},
        "minContains": 2, "maxContains": 3,
    }, [[10, 11], [1, 10, 2, 20, 30], [10, 10, 10]], [[10], [10, 11, 12, 13], [], [1, 2], [10, "x", 11]]),
    ("with-prefix-items-and-max-items", {
        "type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"},
        "contains": {"const": 0}, "maxItems": 3,
    }, [["a", 0], ["a", 1, 0], ["a", 0, 0]], [["a"], ["a", 1, 2], ["a", 0, 1, 2], [0], ["a", "0"]]),
    ("min-contains-zero", {"type": "array", "contains": {"type": "string"}, "minContains": 0, "maxContains": 1},
     [[], [1, 2], ["a", 1]], [["a", "b"], ["a", 1, "b"]]),
    ("contains-in-prefix-only", {
        "type": "array", "prefixItems": [{"type": "boolean"}, {"type": "boolean"}], "items": False,
        "contains": {"const": True},
    }, [[True], [False, True], [True, True]], [[], [False], [False, False], [True, True, True]]),
]

ALL_OF = [
    ("objects-merged", {"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]},
    ]}, [{"a": 1, "b": "x"}, {"a": -1, "b": ""}],  # closed: no other keys (a narrowing)
     [{"a": 1}, {"b": "x"}, {"a": "1", "b": "x"}, {}]),
    ("same-property-in-both", {"allOf": [
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}, "required": ["n"],
         "additionalProperties": False},
        {"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}}},
    ]}, [{"n": 0}, {"n": 9}], [{"n": 10}, {"n": -1}, {}]),
    ("types-intersected", {"allOf": [{"type": ["integer", "string"]}, {"type": ["number", "null"]}]},
     [1, -3, 0], ["a", None, 1.5]),
    ("bounds-combined", {"allOf": [
        {"type": "number", "minimum": 0}, {"type": "number", "exclusiveMaximum": 10},
        {"type": "integer", "multipleOf": 2},
    ]}, [0, 2, 8], [10, -2, 3, 2.5, 12]),
    ("string-keywords-combined", {"allOf": [
        {"type": "string", "minLength": 2}, {"type": "string", "maxLength": 4}, {"type": "string", "pattern": "^a"},
    ]}, ["ab", "abcd", "a😀"], ["a", "abcde", "bc"]),
    ("beside-own-keywords", {
        "type": "array", "maxItems": 3,
        "allOf": [{"items": {"type": "integer"}}, {"minItems": 1}, {"contains": {"const": 5}}],
    }, [[5], [1, 5, 2]], [[], [1], [5, 5, 5, 5], [5, "x"]]),
    ("of-refs", {
        "allOf": [{"$ref": "#/$defs/named"}, {"$ref": "#/$defs/dated"}],
        "$defs": {
            "named": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
            "dated": {"type": "object", "properties": {"year": {"type": "integer", "minimum": 1900}},
                      "required": ["year"]},
        },
    }, [{"name": "x", "year": 1900}], [{"name": "x", "year": 1899}, {"year": 2000}]),
]

NOT = [
    ("types", {"not": {"type": "string"}}, [1, None, [], {}, True, 2.5], ["a", ""]),
    ("type-list", {"not": {"type": ["object", "array", "null"]}}, [1, "x", False], [None, [1], {"a": 1}]),
    ("const", {"type": "integer", "not": {"const": 3}}, [2, 4, -3, 30, 33], [3]),
    ("enum", {"type": "string", "not": {"enum": ["a", "b"]}}, ["c", "", "ab", "A"], ["a", "b"]),
    ("bounds", {"type": "number", "not": {"minimum": 0, "maximum": 1}}, [-0.5, 1.5, -1, 1.0001], [0, 0.5, 1]),
    ("exclusive-bound", {"type": "integer", "not": {"exclusiveMaximum": 0}}, [0, 1, 100], [-1, -100]),
    ("multiple-of", {"type": "integer", "not": {"multipleOf": 2}}, [1, -3, 99], [0, 2, -4]),
    ("required", {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "additionalProperties": False, "not": {"required": ["a", "b"]},
    }, [{}, {"a": 1}, {"b": 2}], [{"a": 1, "b": 2}]),
    ("string-pattern", {"type": "string", "not": {"pattern": "^x"}}, ["a", "", "yx", "Xy"], ["x", "xyz"]),
    ("string-length", {"type": "string", "not": {"minLength": 3}}, ["", "ab", "😀😀"], ["abc", "😀😀😀"]),
    ("item-count", {"type": "array", "items": {"type": "integer"}, "not": {"maxItems": 1}},
     [[1, 2], [1, 2, 3]], [[], [1]]),
    ("property-count", {
        "type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}},
        "additionalProperties": False, "not": {"minProperties": 1},
    }, [{}], [{"a": None}, {"a": None, "b": None}]),
    ("of-any-of", {
        "type": ["integer", "string", "null"],
        "not": {"anyOf": [{"type": "integer", "minimum": 5}, {"type": "string", "maxLength": 1}]},
    }, [4, -1, "ab", None], [5, 100, "", "a"]),
    ("of-all-of", {"type": "integer", "not": {"allOf": [{"minimum": 0}, {"maximum": 9}]}}, [-1, 10], [0, 5, 9]),
    ("of-not", {"type": "integer", "not": {"not": {"minimum": 3}}}, [3, 10], [2, -3]),
    # The complement of `items` is a grammar too: any value but an array whose items all match.
    ("of-items", {"not": {"items": {"type": "string"}}}, [[1], ["a", 1], [None, "b"]], [[], ["a"], 1, "x", None, {}]),
    ("of-items-beside-type", {
        "type": "object", "properties": {"l": {"type": "array", "not": {"items": {"type": "integer"}}}},
        "additionalProperties": False,
    }, [{"l": ["a"]}, {"l": [1, "a"]}, {}], [{"l": []}, {"l": [1]}, {"l": [1, 2]}]),
]

IF_THEN_ELSE = [
    ("object-by-const", {
        "type": "object", "properties": {"country": {"type": "string"}, "zip": {"type": "string"}},
        "additionalProperties": False,
        "if": {"properties": {"country": {"const": "US"}}, "required": ["country"]},
        "then": {"properties": {"zip": {"pattern": "^[0-9]{5}$"}}},
        "else": {"properties": {"zip": {"pattern": "^[A-Z0-9 ]+$"}}},
    }, [{"country": "US", "zip": "12345"}, {"country": "NL", "zip": "1234 AB"}, {"zip": "ABC"}, {}],
     [{"country": "US", "zip": "1234"}, {"country": "NL", "zip": "1234ab"}, {"zip": "abc"}]),
    ("numbers", {"type": "integer", "if": {"minimum": 0}, "then": {"multipleOf": 2}, "else": {"maximum": -10}},
     [0, 4, -10, -11], [3, -5, -1]),
    ("no-else", {"type": "string", "if": {"maxLength": 2}, "then": {"pattern": "^a"}},
     ["ab", "a", "xyz"], ["b", "xy", ""]),
    ("no-then", {"type": "integer", "if": {"const": 0}, "else": {"minimum": 10}}, [0, 10, 11], [5, -1]),
    ("by-type", {"if": {"type": "string"}, "then": {"maxLength": 1}, "else": {"type": "integer"}},
     ["", "a", 3, -7], ["ab", 1.5, None, [], True]),
]

REFERENCES = [
    ("anchor", {
        "type": "object", "properties": {"a": {"$ref": "#pos"}}, "additionalProperties": False,
        "$defs": {"p": {"$anchor": "pos", "type": "integer", "minimum": 1}},
    }, [{"a": 1}, {}], [{"a": 0}, {"a": "1"}]),
    ("id-relative", {
        "$id": "https://example.com/root.json", "type": "array", "items": {"$ref": "item.json"},
        "$defs": {"item": {"$id": "item.json", "type": "string", "maxLength": 2}},
    }, [["ab"], [], ["", "é"]], [["abc"], [1]]),
    ("id-relative-to-an-enclosing-id", {
        "$id": "https://example.com/schemas/root", "$ref": "a/b",
        "$defs": {"a": {"$id": "a/", "$defs": {"b": {"$id": "b", "type": "integer", "minimum": 5}}}},
    }, [5, 6], [4, "5"]),
    ("nested-resource", {
        "$id": "https://example.com/root", "$ref": "https://example.com/inner",
        "$defs": {
            "inner": {"$id": "https://example.com/inner", "$ref": "#/$defs/v", "$defs": {"v": {"type": "string"}}},
            "v": {"type": "integer"},
        },
    }, ["x", ""], [1, None]),
    ("pointer-into-a-nested-resource", {
        "$id": "https://example.com/root", "$ref": "inner#/$defs/v",
        "$defs": {"inner": {"$id": "inner", "$defs": {"v": {"type": "boolean"}}}},
    }, [True, False], [1, "true"]),
    ("anchor-in-a-nested-resource", {
        "$id": "https://example.com/r", "$ref": "other#x",
        "$defs": {"o": {"$id": "other", "$defs": {"x": {"$anchor": "x", "type": "null"}}}},
    }, [None], [0, "null"]),
    ("definitions-and-id-together", {
        "$id": "https://example.com/a/b.json",
        "type": "object", "properties": {"p": {"$ref": "#/definitions/pos"}, "q": {"$ref": "c.json"}},
        "additionalProperties": False,
        "definitions": {"pos": {"type": "integer", "exclusiveMinimum": 0},
                        "c": {"$id": "c.json", "type": "string", "minLength": 1}},
    }, [{"p": 1, "q": "x"}, {}], [{"p": 0}, {"q": ""}]),
]

TREE = {
    "$id": "https://example.com/tree", "$dynamicAnchor": "node", "type": "object",
    "properties": {"data": True, "children": {"type": "array", "items": {"$dynamicRef": "#node"}}},
}
STRICT_TREE = {
    "$id": "https://example.com/strict-tree", "$dynamicAnchor": "node", "$ref": "tree",
    "unevaluatedProperties": False, "$defs": {"tree": TREE},
}

DYNAMIC = [
    ("strict-tree", STRICT_TREE,
     [{"data": 1}, {"children": [{"data": 2}]}, {"data": {"x": 1}, "children": [{"children": []}]}, {}],
     [{"daat": 1}, {"children": [{"daat": 1}]}, {"children": [{"children": [{"x": None}]}]}, {"children": {}}]),
    # Without strict-tree's unevaluatedProperties, tree's listed properties close it (a narrowing).
    ("tree", {"$ref": "https://example.com/tree", "$defs": {"tree": TREE}},
     [{"children": [{"data": 1}]}, {}, {"data": [1]}], [{"children": [1]}, {"children": {}}, []]),
]

UNEVALUATED = [
    ("properties-with-all-of", {
        "type": "object", "properties": {"b": {"type": "string"}},
        "allOf": [{"properties": {"a": {"type": "integer"}}}], "unevaluatedProperties": False,
    }, [{}, {"a": 1}, {"b": "x", "a": 1}], [{"c": 1}, {"a": "x"}, {"b": "x", "z": None}]),
    ("properties-with-any-of", {
        "type": "object", "unevaluatedProperties": False,
        "anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                  {"properties": {"b": {"type": "integer"}}, "required": ["b"]}],
    }, [{"a": 1}, {"b": 2}, {"a": 1, "b": 2}], [{"a": 1, "c": 3}, {}, {"a": "x", "b": 2}]),
    ("properties-with-if", {
        "type": "object", "properties": {"t": {"type": "string"}}, "unevaluatedProperties": False,
        "if": {"properties": {"t": {"const": "x"}}, "required": ["t"]},
        "then": {"properties": {"x": {"type": "integer"}}},
        "else": {"properties": {"y": {"type": "integer"}}},
    }, [{"t": "x", "x": 1}, {"t": "z", "y": 1}, {}, {"y": 2}], [{"t": "x", "y": 1}, {"t": "z", "x": 1}, {"x": 1}]),
    ("properties-schema", {
        "type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": {"type": "string"},
    }, [{"a": 1, "z": "s"}, {}, {"z": ""}], [{"z": 1}, {"a": 1, "b": None}]),
    ("items", {"type": "array", "prefixItems": [{"type": "integer"}], "unevaluatedItems": False},
     [[], [1]], [[1, 2], ["a"]]),
    ("items-with-all-of", {
        "type": "array", "allOf": [{"prefixItems": [{"type": "string"}, {"type": "integer"}]}],
        "unevaluatedItems": {"type": "boolean"},
    }, [["a", 1, True, False], ["a"], []], [["a", 1, 2], ["a", "b"], ["a", 1, True, None]]),
    ("items-with-any-of", {
        "type": "array", "unevaluatedItems": False,
        "anyOf": [{"prefixItems": [{"const": 1}]}, {"prefixItems": [{"const": 2}, {"const": 3}]}],
    }, [[1], [2, 3], [2], []], [[1, 3], [2, 3, 4], [3]]),
    ("items-with-if", {
        "type": "array", "unevaluatedItems": False, "if": {"maxItems": 1},
        "then": {"prefixItems": [{"type": "string"}]},
        "else": {"prefixItems": [{"type": "integer"}, {"type": "integer"}]},
    }, [[], ["a"], [1, 2]], [[1], ["a", "b"], [1, 2, 3]]),
]

ONE_OF = [
    ("types", {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
     ["a", 1, None, -5], [1.5, True, [], {}]),
    ("consts", {"oneOf": [{"const": "a"}, {"const": "b"}, {"enum": [1, 2]}]}, ["a", "b", 1, 2], ["c", 3, None]),
    ("numeric-ranges", {"oneOf": [{"type": "number", "maximum": 0}, {"type": "number", "exclusiveMinimum": 0}]},
     [-1, 0, 1, 0.5], ["a", None]),
    ("discriminator", {
        "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
        "discriminator": {"propertyName": "pet_type", "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}},
        "$defs": {
            "Cat": {"type": "object", "properties": {"pet_type": {"const": "cat", "type": "string"},
                                                     "meows": {"type": "integer"}}, "required": ["pet_type", "meows"]},
            "Dog": {"type": "object", "properties": {"pet_type": {"const": "dog", "type": "string"},
                                                     "barks": {"type": "number"}}, "required": ["pet_type", "barks"]},
        },
    }, [{"pet_type": "cat", "meows": 3}, {"pet_type": "dog", "barks": 1.5}],
     [{"pet_type": "cat", "barks": 1.5}, {"pet_type": "bird"}, {"meows": 3}, {"pet_type": "dog", "barks": "x"}]),
    ("discriminator-enum", {"oneOf": [
        {"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "v": {"type": "integer"}}, "required": ["k"],
         "additionalProperties": False},
        {"type": "object", "properties": {"k": {"enum": ["c"]}, "v": {"type": "string"}}, "required": ["k"],
         "additionalProperties": False},
    ]}, [{"k": "a", "v": 1}, {"k": "b"}, {"k": "c", "v": "x"}], [{"k": "a", "v": "x"}, {"k": "c", "v": 1}, {"v": 1}]),
]

UNIQUE_ITEMS = [
    ("enum-items", {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True},
     [[], ["a"], ["c", "a", "b"]], [["a", "a"], ["a", "b", "a"], ["d"]]),
    ("boolean-items", {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True},
     [[], [True, False], [False]], [[True, True], [True, False, True]]),
    ("at-most-one-item", {"type": "array", "maxItems": 1, "uniqueItems": True}, [[], [{"a": 1}]], [[1, 1]]),
    ("false", {"type": "array", "items": {"type": "integer"}, "uniqueItems": False}, [[1, 1], []], [["a"]]),
]

STRING_LENGTHS = [
    ("min-2", {"type": "string", "minLength": 2}, ["ab", "é😀", "💩💩", "\n\t"], ["", "a", "💩", "é"]),
    ("max-2", {"type": "string", "maxLength": 2}, ["", "💩", "💩💩", "aé"], ["abc", "💩💩💩", "a💩b"]),
    ("exactly-3", {"type": "string", "minLength": 3, "maxLength": 3}, ["abc", "ü😀x", "\u2028\"\\"],
     ["ab", "abcd", "😀😀"]),
    ("property-values", {
        "type": "object", "properties": {"s": {"type": "string", "minLength": 1, "maxLength": 2}},
        "additionalProperties": {"type": "string", "maxLength": 1},
    }, [{"s": "😀"}, {"s": "éé", "k": "𝄞"}], [{"s": ""}, {"s": "😀😀😀"}, {"k": "😀😀"}]),
    ("array-items", {"type": "array", "items": {"type": "string", "maxLength": 1}}, [["😀", "", "é"]],
     [["😀😀"], ["ab"]]),
    ("unconstrained", {"type": "string"}, ["", "😀", "é\u0000"], [1]),
]

GROUPS = {
    "number-bounds": NUMBER_BOUNDS, "multiple-of": MULTIPLE_OF, "property-counts": PROPERTY_COUNTS,
    "pattern-properties": PATTERN_PROPERTIES, "property-names": PROPERTY_NAMES, "dependencies": DEPENDENCIES,
    "contains": CONTAINS, "all-of": ALL_OF, "not": NOT, "if-then-else": IF_THEN_ELSE, "references": REFERENCES,
    "dynamic-ref": DYNAMIC, "unevaluated": UNEVALUATED, "one-of": ONE_OF, "unique-items": UNIQUE_ITEMS,
    "string-lengths": STRING_LENGTHS,
}
CASES = {f"{group}/{name}": schema for group, cases in GROUPS.items() for name, schema, _, _ in cases}


def instance_params(groups):
    for group in groups:
        for name, _, valid, invalid in GROUPS[group]:
            for expected, instances in ((True, valid), (False, invalid)):
                for i, instance in enumerate(instances):
                    verdict = "valid" if expected else "invalid"
                    yield pytest.param(f"{group}/{name}", instance, expected, id=f"{group}/{name}-{verdict}-{i}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_case_schemas_are_draft_2020_12_schemas(case):
    Draft202012Validator.check_schema(CASES[case])


@pytest.mark.parametrize("case, instance, expected", list(instance_params(GROUPS)))
def test_canonical_text_accepted_exactly_when_valid(case, instance, expected):
    schema = CASES[case]
    valid = is_valid(schema, instance)
    assert valid == expected, f"the case's data disagree with jsonschema on {instance!r}"
    text = canonical_text(instance, schema)
    assert text_is_valid(schema, text) == valid, f"{text!r} does not read back as {instance!r}"
    assert compiled(schema).accepts(text) == valid, text


@pytest.mark.parametrize("case, instance, expected", list(instance_params(["string-lengths"])))
@pytest.mark.parametrize("spelling", [escape_non_ascii, escape_all], ids=["non-ascii-escaped", "all-escaped"])
def test_escaped_strings_count_the_characters_they_spell(case, instance, expected, spelling):
    r"""`\u` escapes count as the characters they spell, a surrogate pair as one."""
    schema = CASES[case]
    text = canonical_text(instance, schema, string=spelling)
    assert text_is_valid(schema, text) == expected, f"the case's data disagree with jsonschema on {text!r}"
    assert compiled(schema).accepts(text) == expected, text


@pytest.mark.parametrize("text, expected", [
    ('"\\uD83D\\uDCA9"', False),
    ('"\\ud83d\\udca9\\ud83d\\udca9"', True),
    ('"\\u00E9\\u00e9"', True),
    ('"\\ud83d\\udca9"', False),
    ('"\\ud83d"', False),  # a lone surrogate: not accepted whatever its length
    ('"a\\udca9"', False),
    ('"\\ud83da"', False),
    ('"\\udca9\\ud83d"', False),
])
def test_surrogate_escapes_with_min_length_2(text, expected):
    schema = {"type": "string", "minLength": 2}
    if expected:
        assert text_is_valid(schema, text)
    assert compiled(schema).accepts(text) == expected


@pytest.mark.parametrize("schema, text", [
    # Each text is in range as a decimal, but json.loads rounds it to a float that is not:
    # accepting it would let an invalid instance through.
    ({"type": "number", "exclusiveMaximum": 1}, "0.99999999999999999999"),
    ({"type": "number", "exclusiveMinimum": 0}, "0." + "0" * 400 + "1"),
    ({"type": "number", "exclusiveMinimum": 9007199254740992}, "9007199254740992.5"),
    ({"type": "number", "exclusiveMaximum": -0.5}, "-0.50000000000000000001"),
    ({"type": "number", "maximum": 9007199254740995}, "9007199254740995.0"),  # a tie, rounded up
    ({"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 2}, "1.00000000000000000001"),
])
def test_texts_json_rounds_out_of_range_are_rejected(schema, text):
    assert not text_is_valid(schema, text)
    assert not compiled(schema).accepts(text)


# ---- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("schema, keyword, pointer", [
    ({"oneOf": [{"type": "number"}, {}]}, "oneOf", "#"),
    ({"oneOf": [True, True]}, "oneOf", "#"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf", "#"),
    ({"oneOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 0}]}, "oneOf", "#"),
    ({"type": "object", "properties": {"x": {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]}}},
     "oneOf", "#/properties/x"),
    ({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}},
                {"type": "object", "properties": {"k": {"const": "b"}}}]}, "oneOf", "#"),  # 'k' not required
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems", "#"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems", "#"),
    ({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}},
     "uniqueItems", "#/properties/tags"),
    ({"$ref": "https://example.com/s.json"}, "$ref", "#"),
    ({"type": "object", "properties": {"p": {"$ref": "other.json#/x"}}}, "$ref", "#/properties/p"),
    ({"$id": "https://example.com/a", "items": {"$ref": "https://example.com/b"}, "type": "array"}, "$ref", "#/items"),
    # The complement of distinct items (some two items equal) is not context-free.
    ({"type": "array", "items": {"type": "string"}, "not": {"uniqueItems": True}}, "not", "#"),
    ({"type": "object", "properties": {"l": {"type": "array", "not": {"uniqueItems": True}}}},
     "not", "#/properties/l"),
    ({"type": "array", "if": {"uniqueItems": True}, "then": {"maxItems": 2}}, "if", "#"),
    ({"type": "object", "properties": {"a": {}}, "minProperties": 2}, "minProperties", "#"),
])
def test_refusals_name_the_keyword_and_pointer(schema, keyword, pointer):
    with pytest.raises(ValueError, match=refusal(keyword, pointer)):
        Grammar.from_json_schema(schema)


def test_overlapping_one_of_names_the_two_branches():
    with pytest.raises(ValueError, match=r"'oneOf' at #/\$defs/u.*\b1\b.*\b2\b"):
        Grammar.from_json_schema({"$ref": "#/$defs/u", "$defs": {"u": {"oneOf": [
            {"type": "string"}, {"type": "integer", "maximum": 0}, {"type": "integer", "minimum": 0}]}}})


@pytest.mark.parametrize("schema", [
    {"allOf": [{"type": "string"}, {"type": "integer"}]},
    {"allOf": [{"type": "integer", "minimum": 5}, {"type": "integer", "maximum": 4}]},
    {"allOf": [{"const": 1}, {"const": 2}]},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
               {"type": "object", "properties": {"a": {"type": "string"}}}]},
])
def test_conflicting_all_of_is_refused(schema):
    """No value validates: a ValueError that names where (the schema or its `allOf`)."""
    with pytest.raises(ValueError, match=r"json schema: .*\bat #(/allOf(/\d+)?)?(?![\w/~])"):
        Grammar.from_json_schema(schema)


# ---- compile cost: large schemas compile (their time is not asserted) ---------------------------

WIDE = {
    "type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1000)},
    "required": ["p0", "p999"], "additionalProperties": False,
}
BRANCH_TYPES = [{"type": "integer"}, {"type": "string", "maxLength": 8}, {"type": "boolean"}]
FIFTY = {"oneOf": [
    {"type": "object", "properties": {"kind": {"const": f"k{i}"}, "value": BRANCH_TYPES[i % 3]},
     "required": ["kind", "value"], "additionalProperties": False}
    for i in range(50)
]}
WIDE_BOUNDS = {"type": "integer", "minimum": -10**15, "maximum": 10**15}


@pytest.mark.parametrize("schema, valid, invalid", [
    pytest.param(WIDE, [{"p0": 1, "p999": 2}, {f"p{i}": i for i in [*range(0, 1000, 10), 999]}, {"p0": 0, "p999": 0}],
                 [{"p0": 1}, {"p0": 1, "p999": "2"}, {"p0": 1, "p999": 2, "p1000": 3}], id="1000-properties"),
    pytest.param(FIFTY, [{"kind": "k0", "value": 1}, {"kind": "k7", "value": "x"}, {"kind": "k49", "value": "y"}],
                 [{"kind": "k50", "value": 1}, {"kind": "k7", "value": 1}, {"kind": "k0"}], id="50-branch-one-of"),
    pytest.param(WIDE_BOUNDS, [10**15, -10**15, 0, 123456789012345],
                 [10**15 + 1, -10**15 - 1, 2 * 10**15], id="bounds-1e15"),
])
def test_large_schemas_compile(schema, valid, invalid):
    grammar = Grammar.from_json_schema(schema)
    for instance in valid + invalid:
        text = canonical_text(instance, schema)
        assert grammar.accepts(text) == is_valid(schema, instance) == (instance in valid), text


# ---- the specs: keywords read into typed values -----------------------------------------------


def test_leaf_spec_reads_number_bounds_as_exact_edges():
    spec = LeafSpec.read({"type": "integer", "exclusiveMinimum": 1, "maximum": 3}, "#")
    assert spec.kinds == frozenset({"number"})
    assert spec.integer is True
    # Past an exclusive 1 the text must also read as a double above 1: at least the next double.
    assert spec.low == (Fraction("1.0000000000000002"), False)
    assert spec.high == (Fraction(3), False)
    assert LeafSpec.read({"exclusiveMaximum": 1e-20}, "#").high == (Fraction("1e-20"), True)
    assert LeafSpec.read({"minimum": 1e-20, "exclusiveMinimum": 1e-20}, "#").low == (Fraction("1e-20"), True)


def test_leaf_spec_reads_values_strings_and_kinds():
    spec = LeafSpec.read({"enum": [1, "a", 2.0], "const": 2}, "#")
    assert spec.values == (2.0,) and type(spec.values[0]) is float
    assert spec.kinds is None
    spec = LeafSpec.read({"minLength": 2, "maxLength": 5, "pattern": "^a", "format": "date"}, "#/properties/d")
    assert (spec.kinds, spec.min_length, spec.max_length) == (frozenset({"string"}), 2, 5)
    assert spec.pattern == ("^a", "#/properties/d")
    assert spec.format == "date"
    assert LeafSpec.read({"format": "color"}, "#").format is None
    assert LeafSpec.read({"multipleOf": 0.1}, "#").multiple == Fraction(1, 10)
    assert LeafSpec.read({"required": ["a"], "items": {}}, "#").structures == frozenset({"object", "array"})


def test_object_spec_reads_names_and_counts():
    spec = ObjectSpec.read({"properties": {"a": {"type": "string"}}, "required": ["a", "b"],
                            "dependentRequired": {"a": ["c"]}, "maxProperties": 4.0,
                            "additionalProperties": False}, "#")
    assert spec.properties == {"a": {"type": "string"}}
    assert spec.required == ("a", "b")
    assert spec.dependent_required == {"a": ["c"]}
    assert (spec.min_properties, spec.max_properties) == (0, 4)
    assert spec.additional is False and spec.says_extras is True
    spec = ObjectSpec.read({"required": ["x"]}, "#")
    assert (spec.properties, spec.additional, spec.says_extras) == (None, None, False)


def test_array_specs_read_positions_and_counts():
    spec = ArraySpec.read({"prefixItems": [{"type": "string"}], "items": False, "minItems": 1, "uniqueItems": True},
                          "#")
    assert (spec.prefix_items, spec.items, spec.min_items, spec.max_items) == (({"type": "string"},), False, 1, None)
    assert spec.unique is True
    assert ArraySpec.read({"prefixItems": []}, "#").prefix_items == ()
    assert ContainsSpec.read({"contains": {"const": 1}, "maxContains": 2}, "#") == ContainsSpec({"const": 1}, 1, 2)
    assert ContainsSpec.read({"minContains": 3}, "#") is None


@pytest.mark.parametrize("reader, schema, message", [
    (LeafSpec.read, {"minLength": -1}, "json schema: 'minLength' at #/properties/a must be a non-negative integer"),
    (LeafSpec.read, {"maximum": "3"}, "json schema: 'maximum' at #/properties/a must be a finite number"),
    (LeafSpec.read, {"enum": []}, "json schema: 'enum' at #/properties/a must be a non-empty list"),
    (ObjectSpec.read, {"required": "a"}, "json schema: 'required' at #/properties/a must be a list of strings"),
    (ArraySpec.read, {"maxItems": 1.5}, "json schema: 'maxItems' at #/properties/a must be a non-negative integer"),
    (ContainsSpec.read, {"contains": {}, "minContains": -2},
     "json schema: 'minContains' at #/properties/a must be a non-negative integer"),
])
def test_spec_readers_name_the_keyword_and_pointer(reader, schema, message):
    with pytest.raises(ValueError) as raised:
        reader(schema, "#/properties/a")
    assert str(raised.value) == message
