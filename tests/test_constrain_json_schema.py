"""JSON schema to GBNF: the grammar's verdict on many texts, checked against JSON Schema itself.

Every text in the table has an expected verdict for `Grammar.accepts`; the same verdict must
come from `json.loads` + a JSON Schema validator (with format checks), unless the row names a
reason why the grammar knowingly differs (property order, closed objects, bounded digits and
whitespace, ...). A reason also has to be right: for such rows the validator must disagree.
"""

import functools
import json
import re
import sys
import threading
from fractions import Fraction

import jsonschema
import pytest

from tiny_llm.constrain import Grammar
from tiny_llm.constrain.json_schema import json_equal, json_schema_to_gbnf
from tiny_llm.constrain.json_schema.recursion import recursion_limit

# ---- the oracle: json.loads + jsonschema --------------------------------------------------

FORMAT_CHECKER = jsonschema.FormatChecker(["date", "uuid"])
RFC3339_TIME = re.compile(r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)",
                          re.ASCII)


@FORMAT_CHECKER.checks("time")
def _is_time(text) -> bool:
    return not isinstance(text, str) or RFC3339_TIME.fullmatch(text) is not None


@FORMAT_CHECKER.checks("date-time")
def _is_date_time(text) -> bool:
    if not isinstance(text, str):
        return True
    return (len(text) > 11 and text[10] in "Tt" and FORMAT_CHECKER.conforms(text[:10], "date")
            and RFC3339_TIME.fullmatch(text[11:]) is not None)


def schema_valid(schema, text: str) -> bool:
    """Whether `text` is JSON (as Python reads it) that validates against `schema`."""
    try:
        instance = json.loads(text)
    except json.JSONDecodeError:
        return False
    return jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER).is_valid(instance)


def forms(value) -> list[str]:
    """`value` as json.dumps writes it: default separators, indented, compact."""
    return [json.dumps(value), json.dumps(value, indent=2), json.dumps(value, separators=(",", ":"))]


# ---- why a verdict may differ from JSON Schema's -------------------------------------------

ORDER = "stricter: properties come in the listed order, extra pairs after them"
CLOSED = "stricter: no other keys when 'properties' has no 'additionalProperties'"
DIGITS = "stricter: integer and fraction parts have at most 16 digits"
EXPONENT = "stricter: exponents are written without leading zeros"
LEADING = "stricter: no whitespace before the top-level value"
SPACE = "stricter: whitespace is one blank or a newline and at most 20 blanks or tabs"
SPELLING = "stricter: enum and const values only in their compact json.dumps spelling"
FRACTION = "stricter: an integer is written without a fraction"
MINUS_ZERO = "stricter: -0 is not written where only non-negative numbers are allowed"
KEY_ESCAPE = "stricter: keys of extra pairs use no \\/ or \\u escapes"
DUPLICATE = "stricter: a listed key is written once (json.loads keeps the last)"
NAN = "stricter: NaN is not JSON (json.loads reads it anyway)"
UNTYPED = "stricter: without 'type' the keywords' own type is the only one allowed"
CANONICAL = "stricter: a constrained number is written in plain decimal, no exponent or trailing zero"
LONE_SURROGATE = "stricter: a lone surrogate escape is not written (it is no character)"
DAY = "looser: February 29 is not checked against leap years"
TIME_DIGITS = "stricter: at most 9 digits of fractions of a second"
LEAP = "stricter: no leap second 60"

# ---- schemas and texts --------------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z.]+@[a-z]+\\.[a-z]{2,3}$"},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
            "required": ["city"],
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
TREE = {
    "$ref": "#/$defs/node",
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["value"],
            "additionalProperties": False,
        },
    },
}
LINKED_LIST = {  # recursion through the whole document, '#'
    "type": "object",
    "properties": {"head": {"type": "string"}, "tail": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
    "required": ["head", "tail"],
    "additionalProperties": False,
}
POSITIVE_LIST = {
    "definitions": {"positive": {"type": "integer", "exclusiveMinimum": 0}},
    "type": "array",
    "items": {"allOf": [{"$ref": "#/definitions/positive"}], "description": "a count"},
}
OPTIONAL_ONLY = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "null"}},
}
EXTRA_NUMBERS = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "label": {"type": "string"}},
    "required": ["id"],
    "additionalProperties": {"type": "number"},
}
EXTRA_ANY = {
    "type": "object",
    "properties": {"a": {"type": "boolean"}, "secret": False},
    "additionalProperties": True,
}

TABLE = [
    ("person", PERSON, [
        {"name": "Ada Lovelace", "age": 36, "email": "ada@math.org",
         "address": {"street": "12 St James's Sq", "city": "London"}, "tags": ["math", "poet"]},
        {"name": "A", "age": 0},
        {"name": "Bob", "age": 150, "tags": []},
        {"name": "Zoë", "age": 7, "address": {"city": "Köln"}},
        {"name": 'Tab\there "q"', "age": 1, "email": "a.b@c.de"},
        {"name": "x" * 20, "age": 99, "tags": ["abcdefgh", "", "z"]},
    ], [
        ('{"name": "Zoë", "age": 7}', True),
        ('{"name": "A", "age": 1}\n', True),
        ('{"name": "A",\n\t"age": 1}', True),
        ('{"age": 36}', False),
        ('{"name": "Ada"}', False),
        ('{"name": "Ada", "age": "36"}', False),
        ('{"name": "Ada", "age": 36.5}', False),
        ('{"name": "Ada", "age": 151}', False),
        ('{"name": "Ada", "age": -1}', False),
        ('{"name": "", "age": 1}', False),
        ('{"name": "' + "x" * 21 + '", "age": 1}', False),
        ('{"name": "Ada", "age": 36, "tags": ["a", "b", "c", "d"]}', False),
        ('{"name": "Ada", "age": 36, "tags": ["abcdefghi"]}', False),
        ('{"name": "Ada", "age": 36, "tags": [1]}', False),
        ('{"name": "Ada", "age": 36, "nick": "A"}', False),
        ('{"name": "Ada", "age": 36,}', False),
        ('{name: "Ada", "age": 36}', False),
        ('{"name": "Ada", "age": 036}', False),
        ("{'name': 'Ada', 'age': 36}", False),
        ('{"name": "Ada", "age": 36, "email": "ADA@x.org"}', False),
        ('{"name": "Ada", "age": 36, "email": "ada@x.info"}', False),
        ('{"name": "Ada", "age": 36, "address": {"street": "Main"}}', False),
        ('{"name": "Ada", "age": 36, "address": {"city": 5}}', False),
        ('{"name": "a\x01", "age": 1}', False),
        ('{"name": "a\\q", "age": 1}', False),
        ('{"name": "A", "age": 1} x', False),
        ('{"name": "A", "age": 1}{}', False),
        ("", False),
        ('{"age": 36, "name": "Ada"}', False, ORDER),
        ('{"name": "A", "age": 1, "address": {"city": "X", "zip": "1"}}', False, CLOSED),
        ('{"name": "A", "age": 36.0}', False, FRACTION),
        (' {"name": "A", "age": 1}', False, LEADING),
        ('{"name": "A",\n' + " " * 21 + '"age": 1}', False, SPACE),
        ('{"name": "A",\r\n"age": 1}', False, SPACE),
        ('{"name": "A",\n\n"age": 1}', False, SPACE),
        ('{"name": "A" ,  "age": 1}', False, SPACE),
    ]),
    ("tree", TREE, [
        {"value": 1},
        {"value": 1, "children": []},
        {"value": -5, "children": [{"value": 2}, {"value": 3, "children": [{"value": 4, "children": []}]}]},
    ], [
        ('{"value": 1, "children": [{}]}', False),
        ('{"children": []}', False),
        ('{"value": 1, "children": [{"value": "x"}]}', False),
        ('{"value": 1, "children": [{"value": 2},]}', False),
        ('{"value": 1, "children": {"value": 2}}', False),
    ]),
    ("linked-list", LINKED_LIST, [
        {"head": "a", "tail": None},
        {"head": "a", "tail": {"head": "b", "tail": {"head": "c", "tail": None}}},
    ], [
        ('{"head": "a"}', False),
        ('{"head": "a", "tail": {"head": "b"}}', False),
        ('{"head": "a", "tail": []}', False),
    ]),
    ("positive-list", POSITIVE_LIST, [[], [1, 2, 3], [9999999999999999]], [
        ("[0]", False),
        ("[-1]", False),
        ("[1.5]", False),
        ("[10000000000000000]", False, DIGITS),
        ("[1.0]", False, FRACTION),
    ]),
    ("optional-only", OPTIONAL_ONLY, [
        {}, {"a": 1}, {"b": "x"}, {"c": None}, {"a": 1, "c": None}, {"a": 1, "b": "x", "c": None},
    ], [
        ("{ }", True),
        ('{"a": null}', False),
        ("{,}", False),
        ('{"a": 1,}', False),
        ('{"c": null, "a": 1}', False, ORDER),
        ('{"d": 1}', False, CLOSED),
        ('{"a": 1, "a": 2}', False, DUPLICATE),
    ]),
    ("extra-numbers", EXTRA_NUMBERS, [
        {"id": 1}, {"id": 1, "label": "x"}, {"id": 1, "x": 1.5, "y": -2},
        {"id": 1, "label": "a", "idx": 3}, {"id": 2, "i": 0, "": 0.25},
        {"id": 3, "lab": 2, "labels": 3, "Label": 4, "la\"bel": 5},
    ], [
        ('{"id": 1, "x": 1e-07}', False, EXPONENT),  # json.dumps(1e-7)
        ('{"id": 1, "x": "s"}', False),
        ('{"label": "x"}', False),
        ('{"id": 1, "labe\\u006c": 5}', False),
        ('{"id": 1, "label": "x", "label": 2}', False),
        ('{"id": 1, "x": 1, "label": "a"}', False, ORDER),
        ('{"id": 1, "id": 2}', False, DUPLICATE),
        ('{"id": 1, "la\\/bel": 2}', False, KEY_ESCAPE),
        ('{"id": 1, "\\u00e9": 2}', False, KEY_ESCAPE),
    ]),
    ("extra-any", EXTRA_ANY, [
        {}, {"a": True}, {"a": False, "b": [1, {"c": None}], "d": "e"}, {"z": 1}, {"secrets": 0},
    ], [
        ('{"a": 1}', False),
        ('{"secret": 1}', False),
        ('{"a": true, "secret": null}', False),
        ('{"b": 1, "a": true}', False, ORDER),
    ]),
    ("map", {"type": "object", "additionalProperties": {"type": "integer"}}, [
        {}, {"x": 1, "y": -2}, {"": 0, "é": 5},
    ], [
        ('{"x": "1"}', False),
        ('{"x": 1.5}', False),
        ("[]", False),
    ]),
    ("required-unlisted", {"type": "object", "required": ["id"]}, [
        {"id": 5}, {"id": "x", "more": [1]},
    ], [
        ("{}", False),
        ('{"more": 1}', False),
        ('{"more": 1, "id": 2}', False, ORDER),
    ]),
    ("any-object", {"type": "object"}, [{}, {"a": {"b": [None]}}], [("[]", False), ('"{}"', False)]),
    ("any-array", {"type": "array"}, [[], [1, "a", [None, {}]]], [("{}", False), ("[1,,2]", False)]),
    ("any", {}, [1, -2.5, "x", None, True, [], {"a": [1, {"b": None}]}], [
        ("1E+2", True),
        ("-0", True),
        ("0.5e-3", True),
        ("01", False),
        ("nul", False),
        ("[1,]", False),
        ('{"a"}', False),
        ("'a'", False),
        ("NaN", False, NAN),
        ("Infinity", False, NAN),
        ("1e05", False, EXPONENT),
        ("12345678901234567", False, DIGITS),
        ("0.12345678901234567", False, DIGITS),
    ]),
    ("annotations", {
        "title": "T", "description": "d", "examples": [1], "default": 1, "$comment": "c",
        "$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "https://example.com/t",
        "deprecated": False, "readOnly": True, "writeOnly": False, "x-custom": {"not": {}},
        "type": "integer", "format": "int32",
    }, [1, -7], [('"1"', False), ("1.5", False)]),
    ("enum", {"enum": ["red", "green", "blue", 42, None, True, [1, 2], {"a": "b"}, "é", 'say "hi"\n']}, [
        "red", 42, None, True, 'say "hi"\n',
    ], [
        ("[1,2]", True),
        ('{"a":"b"}', True),
        ('"é"', True),
        ('"Red"', False),
        ("43", False),
        ("false", False),
        ('"red green"', False),
        ("[1, 2]", False, SPELLING),
        ('{"a": "b"}', False, SPELLING),
        ('"\\u00e9"', False, SPELLING),
        ("42.0", False, SPELLING),
    ]),
    ("typed-enum", {"type": "string", "enum": ["a", 1, "b"]}, ["a", "b"], [("1", False), ('"c"', False)]),
    ("enum-and-const", {"enum": [True, 1, 2], "const": 1.0}, [1], [("true", False), ("2", False)]),
    ("const", {"const": {"x": [1, "two"]}}, [], [
        ('{"x":[1,"two"]}', True),
        ('{"x":[1,"two"]} ', True),
        ('{"x":[1]}', False),
        ('{"x": [1, "two"]}', False, SPELLING),
    ]),
    ("any-of", {"anyOf": [
        {"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 10}, {"type": "null"},
    ]}, [
        "abc", "", 10, 9999999, None,
    ], [
        ('"abcd"', False),
        ("9", False),
        ("-10", False),
        ("true", False),
        ("10.5", False),
    ]),
    ("one-of", {"oneOf": [{"type": "integer", "maximum": -1}, {"type": "number", "minimum": 0}]},
     [-1, 2.5, 0.001, 5], [
        ("-2.5", False),
        ('"1"', False),
        ("-0.5", False),
    ]),
    ("type-list", {"type": ["string", "null"], "maxLength": 2}, ["ab", "", None], [
        ('"abc"', False),
        ("1", False),
    ]),
    ("integer-or-boolean", {"type": ["integer", "boolean"]}, [3, -3, False, True], [
        ('"3"', False),
        ("null", False),
        ("3.5", False),
        ("True", False),
    ]),
    ("number", {"type": "number"}, [0, -1, 3.25, 1e10, -0.5, 123456789012345.6], [
        ("1E-7", True),
        ("1e+10", True),
        ("9999999999999999", True),
        ("1.", False),
        (".5", False),
        ("+1", False),
        ("- 1", False),
        ("0x10", False),
        ('"1"', False),
        ("1e05", False, EXPONENT),
        ("12345678901234567", False, DIGITS),
        ("0.12345678901234567", False, DIGITS),
    ]),
    ("non-negative-number", {"type": "number", "minimum": 0}, [0, 0.5, 12, 0.001], [
        ("0.0", False, CANONICAL),
        ("1e-5", False, CANONICAL),
        ("0.50", False, CANONICAL),
        ("-1", False),
        ("-0.5", False),
        ("-1e-5", False),
        ("-0", False, MINUS_ZERO),
    ]),
    ("integer-range", {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 1000}, [-2, 0, 999], [
        ("-3", False),
        ("1000", False),
        ("5.5", False),
        ("-0", False, MINUS_ZERO),
        ("5.0", False, FRACTION),
    ]),
    ("bounded-array", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4}, [
        [1, 2], [1, 2, 3, 4],
    ], [
        ("[1]", False),
        ("[]", False),
        ("[1,2,3,4,5]", False),
        ('[1, "2"]', False),
        ("[1,2,]", False),
        ("[,1,2]", False),
        ("[1 2]", False),
    ]),
    ("tuple", {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False}, [
        [], ["a"], ["a", 1],
    ], [
        ('["a", 1, 2]', False),
        ("[1]", False),
        ('["a", "b"]', False),
    ]),
    ("tuple-rest", {
        "type": "array", "prefixItems": [{"const": "cmd"}], "items": {"type": "boolean"}, "minItems": 2,
    }, [
        ["cmd", True], ["cmd", True, False, True],
    ], [
        ('["cmd"]', False),
        ("[]", False),
        ('["x", true]', False),
        ('["cmd", 1]', False),
    ]),
    ("string-length", {"type": "string", "minLength": 2, "maxLength": 3}, ["ab", "a\n", "éé1"], [
        ('"\\u00e9\\u00e9x"', True),
        ('"a"', False),
        ('"abcd"', False),
        ('"\\u00e9"', False),
        ('"😀"', False),
        ('"😀😀"', True),
        ('"\\ud83d\\ude00"', False),  # a surrogate pair is one character
        ('"\\ud83d\\ude00\\ud83d\\ude00"', True),
        ('"\\ud83d\\ude00\\ud83d\\ude00\\ud83d\\ude00\\ud83d\\ude00"', False),
        ('"\\ud83dx"', False, LONE_SURROGATE),
    ]),
    ("pattern", {"type": "string", "pattern": "[0-9]{3}"}, ["123", "ab123cd", "x1234"], [
        ('"12"', False),
        ('"ab12c3"', False),
        ("123", False),
    ]),
    ("pattern-anchors", {"pattern": "^ab|cd$"}, ["ab", "abx", "xcd", "cd"], [
        ('"xab"', False),
        ('"cdx"', False),
        ('"a"', False),
        ("5", False, UNTYPED),
    ]),
    ("date", {"type": "string", "format": "date"}, ["2024-02-29", "1999-12-31"], [
        ('"2024-13-01"', False),
        ('"2024-1-01"', False),
        ('"24-01-01"', False),
        ('"2024-02-30"', False),
        ('"2023-04-31"', False),
        ('"2023-02-29"', True, DAY),
    ]),
    ("time", {"type": "string", "format": "time"}, ["23:59:59Z", "00:00:00.123+05:30", "12:00:00.5-01:00"], [
        ('"24:00:00Z"', False),
        ('"12:00:00"', False),
        ('"12:60:00Z"', False),
        ('"12:00:00.1234567890Z"', False, TIME_DIGITS),
        ('"23:59:60Z"', False, LEAP),
    ]),
    ("date-time", {"type": "string", "format": "date-time"}, [
        "2024-02-29T12:00:00Z", "1999-12-31T23:59:59.9+01:00",
    ], [
        ('"2024-02-29 12:00:00Z"', False),
        ('"2024-02-29T12:00Z"', False),
        ('"2024-02-29"', False),
    ]),
    ("uuid", {"type": "string", "format": "uuid"}, [
        "123e4567-e89b-12d3-a456-426614174000", "123E4567-E89B-12D3-A456-426614174000",
    ], [
        ('"123e4567e89b12d3a456426614174000"', False),
        ('"123e4567-e89b-12d3-a456-42661417400g"', False),
    ]),
    ("boolean-or-null", {"type": ["boolean", "null"]}, [True, False, None], [
        ('"true"', False),
        ("0", False),
    ]),
    ("true", True, [1, "x", None, [{}]], [("", False), ("tru", False)]),
]
SCHEMAS = {name: schema for name, schema, _, _ in TABLE}


def _rows():
    for name, _, values, texts in TABLE:
        rows = [(text, True, None) for value in values for text in forms(value)]
        rows += [(t[0], t[1], t[2] if len(t) > 2 else None) for t in texts]
        for i, (text, expected, why) in enumerate(rows):
            yield pytest.param(name, text, expected, why, id=f"{name}-{i}")


@functools.cache
def grammar(name: str) -> Grammar:
    return Grammar.from_json_schema(SCHEMAS[name])


@pytest.mark.parametrize("name, text, expected, why", list(_rows()))
def test_verdicts_match_json_schema(name, text, expected, why):
    assert grammar(name).accepts(text) == expected
    assert schema_valid(SCHEMAS[name], text) == (expected if why is None else not expected), why


@pytest.mark.parametrize("bounds", [
    {"minimum": 0},
    {"maximum": 100},
    {"minimum": -15, "maximum": 123},
    {"exclusiveMinimum": -1000, "exclusiveMaximum": -13},
    {"minimum": 7, "maximum": 7},
    {"minimum": 3, "maximum": 1234567},
    {"minimum": 2.5, "exclusiveMaximum": 99.5},
    {"minimum": 99, "maximum": 1001, "exclusiveMaximum": 1000},
    {"minimum": -10**20},
    {"minimum": -10**20, "maximum": 10**18 + 7},
])
def test_integer_ranges_match_brute_force(bounds):
    schema = {"type": "integer", **bounds}
    accepts = Grammar.from_json_schema(schema).accepts
    validator = jsonschema.Draft202012Validator(schema)
    edges = [s * (10**k + d) for k in range(1, 18) for d in (-1, 0, 1) for s in (1, -1)]
    for n in [*range(-1100, 1100), 1234566, 1234567, 1234568, *edges]:
        # A bound of any magnitude is honoured; a side without one stops at 16 digits, or at
        # the digits of the largest bound if that has more.
        digits = max([16] + [len(str(abs(int(v)))) for v in bounds.values()])
        assert accepts(str(n)) == (validator.is_valid(n) and len(str(abs(n))) <= digits), n


def test_integer_range_grammar_is_exact_text():
    """One rule per state of the digits' automaton: -15..123 without leading zeros."""
    assert json_schema_to_gbnf({"type": "integer", "minimum": -15, "maximum": 123}) == (
        'root ::= root-0 space\n'
        'root-0 ::= "-" root-1 | "0" | "1" root-3 | [2-9] root-4\n'
        'root-1 ::= "1" root-5 | [2-9]\n'
        'root-3 ::= [01] root-4 | "2" root-6 | [3-9] | ""\n'
        'root-4 ::= [0-9] | ""\n'
        'root-5 ::= [0-5] | ""\n'
        'root-6 ::= [0-3] | ""\n'
        'space ::= | " " | "\\n" [ \\t]{0,20}\n'
    )


def test_exact_gbnf_for_a_required_property():
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    assert json_schema_to_gbnf(schema) == (
        'root ::= "{" space root-name-kv "}" space\n'
        'char ::= [^"\\x5C\\x7F\\x00-\\x1F] | "\\\\" (["\\x5C/bfnrt] | "u" unicode-escape)\n'
        'root-name-kv ::= "\\"name\\"" space ":" space string\n'
        'space ::= | " " | "\\n" [ \\t]{0,20}\n'
        'string ::= "\\"" char* "\\"" space\n'
        'unicode-escape ::= [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} "\\\\u" [dD] [c-fC-F] [0-9a-fA-F]{2}\n'
    )


def test_exact_gbnf_for_optional_properties_and_extra_pairs():
    """Members are written by one rule per state (next property, a pair written before); the
    keys of extra pairs are an automaton of every key but `n` and `tag`, spelled one way."""
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 12}, "tag": {"enum": ["a", "b"]}},
        "additionalProperties": {"type": "boolean"},
    }
    assert json_schema_to_gbnf(schema) == (
        'root ::= "{" space ( root-members-1 | root-n-kv root-members-2 ) "}" space\n'
        'boolean ::= ("true" | "false") space\n'
        'json-control ::= "\\\\" [bfnrt] | "\\\\u00" ( "0" [0-7] | "0" [bef] | "1" [0-9a-f] )\n'
        'root-additional-k-0 ::= [^\\x00-\\x1F"\\x5Cnt\\uD800-\\uDFFF] root-additional-k-1 | json-control root-additional-k-1 | "\\\\\\"" root-additional-k-1 | "\\\\\\\\" root-additional-k-1 | "n" root-additional-k-2 | "t" root-additional-k-3 | ""\n'
        'root-additional-k-1 ::= [^\\x00-\\x1F"\\x5C\\uD800-\\uDFFF] root-additional-k-1 | json-control root-additional-k-1 | "\\\\\\"" root-additional-k-1 | "\\\\\\\\" root-additional-k-1 | ""\n'
        'root-additional-k-2 ::= [^\\x00-\\x1F"\\x5C\\uD800-\\uDFFF] root-additional-k-1 | json-control root-additional-k-1 | "\\\\\\"" root-additional-k-1 | "\\\\\\\\" root-additional-k-1\n'
        'root-additional-k-3 ::= [^\\x00-\\x1F"\\x5Ca\\uD800-\\uDFFF] root-additional-k-1 | json-control root-additional-k-1 | "\\\\\\"" root-additional-k-1 | "\\\\\\\\" root-additional-k-1 | "a" root-additional-k-4 | ""\n'
        'root-additional-k-4 ::= [^\\x00-\\x1F"\\x5Cg\\uD800-\\uDFFF] root-additional-k-1 | json-control root-additional-k-1 | "\\\\\\"" root-additional-k-1 | "\\\\\\\\" root-additional-k-1 | "g" root-additional-k-2 | ""\n'
        'root-additional-key ::= "\\"" root-additional-k-0 "\\"" space\n'
        'root-additional-kv ::= root-additional-key ":" space boolean\n'
        'root-members-1 ::= root-members-3 | root-tag-kv root-members-4\n'
        'root-members-2 ::= root-members-4 | "," space root-tag-kv root-members-4\n'
        'root-members-3 ::= root-additional-kv root-members-4 | ""\n'
        'root-members-4 ::= "," space root-additional-kv root-members-4 | ""\n'
        'root-n ::= root-n-0 space\n'
        'root-n-0 ::= "1" root-n-1 | [2-9]\n'
        'root-n-1 ::= [0-2] | ""\n'
        'root-n-kv ::= "\\"n\\"" space ":" space root-n\n'
        'root-tag ::= ( "\\"a\\"" | "\\"b\\"" ) space\n'
        'root-tag-kv ::= "\\"tag\\"" space ":" space root-tag\n'
        'space ::= | " " | "\\n" [ \\t]{0,20}\n'
    )


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_output_is_deterministic_and_well_formed(name):
    text = json_schema_to_gbnf(SCHEMAS[name])
    assert text == json_schema_to_gbnf(json.loads(json.dumps(SCHEMAS[name])))
    names = [line.split(" ::= ")[0] for line in text.splitlines()]
    assert names[0] == "root" and names[1:] == sorted(names[1:])
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[a-zA-Z0-9-]+", n) for n in names)


def test_json_text_and_true_schema():
    assert json_schema_to_gbnf(json.dumps(PERSON)) == json_schema_to_gbnf(PERSON)
    assert json_schema_to_gbnf(True) == json_schema_to_gbnf({}) == json_schema_to_gbnf("{}")
    assert json_schema_to_gbnf(TREE).splitlines()[0] == "root ::= defs-node"
    assert "defs-node ::= " in json_schema_to_gbnf(TREE)


NOTHING = "no JSON value validates against the schema at #"


@pytest.mark.parametrize("schema, message", [
    ({"oneOf": [{"type": "number"}, {}]}, "'oneOf' at #/oneOf: branches 0 and 1 may both match numbers"),
    ({"oneOf": [True, True]}, "'oneOf' at #/oneOf: branches 0 and 1 may both match"),
    ({"properties": {"p": {"oneOf": [{"type": "string"}, {"maxLength": 3}]}}},
     "'oneOf' at #/properties/p/oneOf: branches 0 and 1 may both match strings"),
    ({"type": "array", "items": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
     "'uniqueItems' at #/items: the items can take more than 8 values"),
    ({"$ref": "#/$defs/a", "$defs": {"a": {"type": "array", "uniqueItems": True}}},
     "'uniqueItems' at #/$defs/a: the items can take more than 8 values"),
    ({"type": "array", "contains": {"type": "null"}, "uniqueItems": True}, "'uniqueItems' next to 'contains' at #"),
    ({"not": {"type": "array", "prefixItems": [{}]}}, "'not' at #/not holds 'prefixItems', whose complement"),
    ({"if": {"additionalProperties": False}, "then": {"minProperties": 1}},
     "'if' at #/if holds 'additionalProperties', whose complement"),
    ({"type": "object", "dependencies": {"a": ["b"]}}, "'dependencies' at # is not supported: write"),
    ({"type": "array", "additionalItems": False}, "'additionalItems' at # is not supported"),
    ({"$ref": "https://example.com/s.json"}, "'$ref' at # is 'https://example.com/s.json', which is outside"),
    ({"properties": {"p": {"$ref": "other.json#/a"}}}, "'$ref' at #/properties/p is 'other.json#/a', which is outside"),
    ({"properties": {"p": {"$ref": "#/$defs/missing"}}, "$defs": {}},
     "'$ref' at #/properties/p ('#/$defs/missing') does not resolve"),
    ({"properties": {"p": {"$ref": "#nowhere"}}}, "'$ref' at #/properties/p ('#nowhere') names no anchor"),
    ({"anyOf": [{"$ref": "#/definitions/a"}],
      "definitions": {"a": {"$ref": "#/definitions/b"}, "b": {"$ref": "#/definitions/a"}}},
     "'$ref' at #/anyOf/0 leads back to itself"),
    ({"$ref": 5}, "'$ref' at # must be a string"),
    (5, "a schema is an object or a boolean, got int"),
    ([{"type": "string"}], "a schema is an object or a boolean, got list"),
    (None, "a schema is an object or a boolean, got NoneType"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "a schema is an object or a boolean, got list"),
    (False, "the schema at # is false"),
    ({"properties": {"a": 5}}, "the schema at #/properties/a is of type int"),
    ({"type": "strng"}, "'type' at # names an unknown type 'strng'"),
    ({"type": []}, "'type' at # must be a type name"),
    ({"properties": {"s": {"type": "string", "minLength": 5, "maxLength": 2}}},
     "'minLength' at #/properties/s is greater than 'maxLength'"),
    ({"type": "string", "maxLength": -1}, "'maxLength' at # must be a non-negative integer"),
    ({"type": "string", "maxLength": 10**6}, "'maxLength' at # is 1000000, above the limit of 10000"),
    ({"type": "array", "items": {"minItems": 20000, "type": "array"}},
     "'minItems' at #/items is 20000, above the limit of 10000"),
    ({"type": "array", "minItems": 3, "maxItems": 2}, "'minItems' at # is greater than 'maxItems'"),
    ({"type": "object", "minProperties": 3, "maxProperties": 2}, "'minProperties' at # is greater than"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "'minimum' at # is greater than 'maximum'"),
    ({"type": "array", "prefixItems": [{}, False], "minItems": 2}, NOTHING),
    ({"type": "array", "items": [{"type": "string"}]}, "'items' at # is a list"),
    ({"type": "object", "properties": {"a": {}}, "required": ["a", "b"], "additionalProperties": False}, NOTHING),
    ({"type": "object", "properties": {"a": False}, "required": ["a"]}, NOTHING),
    ({"allOf": [{"type": "string"}, {"type": "number"}]}, NOTHING),
    ({"type": "integer", "minimum": 4.1, "maximum": 4.9}, NOTHING),
    ({"type": "string", "enum": [1, 2]}, NOTHING),
    ({"type": "object", "required": "a"}, "'required' at # must be a list of strings"),
    ({"type": "object", "properties": []}, "'properties' at # must be an object"),
    ({"type": "object", "additionalProperties": 3},
     "the schema at #/additionalProperties is of type int, not an object or a boolean"),
    ({"anyOf": []}, "'anyOf' at # must be a non-empty list"),
    ({"type": "integer", "exclusiveMinimum": True}, "'exclusiveMinimum' at # must be a finite number"),
    ({"type": "number", "multipleOf": 0}, "'multipleOf' at # must be greater than 0"),
    ({"enum": []}, "'enum' at # must be a non-empty list"),
    ({"type": "object", "properties": {"code": {"type": "string", "pattern": "(?=a)b"}}},
     "'pattern' at #/properties/code: regex:"),
    ({"type": "string", "format": 5}, "'format' at # must be a string"),
    ({"type": "object", "minProperties": 1}, "'minProperties' at # is 1, more than the 0 properties"),
    ({"type": "array", "contains": True, "minContains": 2, "maxContains": 1},
     "'minContains' at # is greater than 'maxContains'"),
    ({"type": "string", "pattern": "b{4000}"}, "steps to turn into an automaton"),
    ({"type": "string", "pattern": "^[ab]*a[ab]{15}$"}, "more than 10000 automaton states"),
    ({"anyOf": [{"type": "integer", "minimum": i} for i in range(20)],
      "allOf": [{"anyOf": [{"maximum": i} for i in range(20)]}]}, "more than 256 alternatives"),
])
def test_errors_name_the_keyword_and_path(schema, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        json_schema_to_gbnf(schema)


OF_SCHEMAS = "must be an object whose values are schemas (objects or booleans), got"


@pytest.mark.parametrize("schema, message", [
    ({"$defs": False}, f"'$defs' at # {OF_SCHEMAS} bool"),
    ({"type": "integer", "definitions": [{"type": "string"}]}, f"'definitions' at # {OF_SCHEMAS} list"),
    ({"type": "array", "items": {"$defs": None}}, f"'$defs' at #/items {OF_SCHEMAS} NoneType"),
    ({"$defs": {"a": {}, "b": 5}}, "the schema at #/$defs/b is of type int, not an object or a boolean"),
    ({"$ref": "#/definitions/a", "definitions": {"a": {}, "b/c~": "string"}},
     "the schema at #/definitions/b~1c~0 is of type str, not an object or a boolean"),
    ({"type": "object", "properties": []}, f"'properties' at # {OF_SCHEMAS} list"),
    ({"type": "string", "properties": 5}, f"'properties' at # {OF_SCHEMAS} int"),
    ({"type": "object", "additionalProperties": None},
     "the schema at #/additionalProperties is of type NoneType, not an object or a boolean"),
    ({"type": "null", "additionalProperties": []}, "the schema at #/additionalProperties is of type list"),
    ({"type": "array", "items": 5, "maxItems": 0}, "the schema at #/items is of type int, not an object or a boolean"),
    ({"type": "boolean", "items": "string"}, "the schema at #/items is of type str, not an object or a boolean"),
    ({"type": "integer", "items": [{}]}, "'items' at # is a list (the tuple form of older drafts)"),
    ({"type": "array", "prefixItems": {"type": "string"}}, "'prefixItems' at # must be a list of schemas, got dict"),
    ({"type": "array", "prefixItems": [{}, 5], "maxItems": 1},
     "the schema at #/prefixItems/1 is of type int, not an object or a boolean"),
])
def test_keywords_that_hold_schemas_must_hold_schemas(schema, message):
    """Checked whatever types the schema allows, and also where the subschema is never
    converted (an unreferenced definition, items past `maxItems`)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        json_schema_to_gbnf(schema)


def test_definitions_of_schemas_are_accepted():
    schema = {"type": "integer", "maximum": 3, "$defs": {"t": True, "f": False, "s": {"type": "string"}},
              "definitions": {}, "properties": {"p": False}, "prefixItems": [False], "items": False}
    assert Grammar.from_json_schema(schema).accepts("3") and not Grammar.from_json_schema(schema).accepts("4")


def nested_arrays(depth: int) -> dict:
    schema: dict = {}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def test_nesting_has_a_limit_of_100():
    """100 schemas one inside the other compile; one more is a ValueError naming the path
    (deeper ones used to end in RecursionError or MemoryError)."""
    assert Grammar.from_json_schema(nested_arrays(100)).accepts("[" * 99 + "]" * 99)
    for depth in (101, 5000):
        with pytest.raises(ValueError, match=r"the schema at #/items/items/.*\.\.\. is nested more than 100 deep"):
            json_schema_to_gbnf(nested_arrays(depth))
    with pytest.raises(ValueError, match="the JSON text is nested too deeply to read"):
        json_schema_to_gbnf("[" * 100_000)


@pytest.mark.parametrize("schema, message", [
    ({"$ref": "#"}, "'$ref' at # leads back to itself without a value"),
    ({"allOf": [{"$ref": "#"}]}, "a '$ref' leads back to a schema that holds it before any character of a value is read"),
    ({"anyOf": [{"type": "null"}, {"$ref": "#"}]}, "a '$ref' leads back"),
    ({"type": "array", "minItems": 1, "items": {"$ref": "#"}}, "no finite JSON value validates"),
])
def test_ref_cycles_that_never_end_are_named_in_schema_terms(schema, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Grammar.from_json_schema(schema)
    assert Grammar.from_json_schema({"type": "array", "items": {"$ref": "#"}}).accepts("[[],[[]]]")


@pytest.mark.parametrize("schema, text, near", [
    ({"type": "number", "exclusiveMinimum": 9007199254740992}, "9007199254740992.5", "9007199254740994"),
    ({"type": "number", "exclusiveMaximum": -9007199254740992}, "-9007199254740992.5", "-9007199254740994"),
    ({"type": "number", "exclusiveMinimum": 0.9}, "0.90000000000000001", "0.9000000000000001"),
    ({"type": "integer", "minimum": 1e300}, "1" + "0" * 300, str(int(Fraction(1e300)))),
])
def test_bounds_hold_for_parsers_that_read_binary_doubles(schema, text, near):
    """A text just past an exclusive bound can read back as the bound itself, and a float
    bound beyond 2**53 is compared as its binary value: such texts are not written, although
    their exact decimal value is in range; the nearest text that holds either way is."""
    grammar = Grammar.from_json_schema(schema)
    assert not schema_valid(schema, text) and not grammar.accepts(text)
    assert schema_valid(schema, near) and grammar.accepts(near)


@pytest.mark.parametrize("schema, text", [
    ({"type": "string", "pattern": "^\\S$"}, '"\u00a0"'),  # a space to Python's re and to ECMA-262
    ({"type": "string", "pattern": "^\\D$"}, '"\u0663"'),  # a digit to Python's re
    ({"type": "string", "pattern": "^\\W$"}, '"é"'),  # a word character to Python's re
    ({"type": "string", "pattern": "^.$"}, '"\\r"'),  # a line terminator to ECMA-262
    ({"type": "string", "pattern": "^.$"}, '"\u2028"'),
    ({"type": "object", "propertyNames": {"pattern": "^\\S+$"}}, '{"a\u00a0": 1}'),
])
def test_patterns_mean_what_both_regex_flavours_agree_on(schema, text):
    """JSON Schema's patterns are ECMA-262 regexes, and validators in Python read them with
    Python's Unicode `re`: where the two differ, the grammar writes only what both accept."""
    assert not Grammar.from_json_schema(schema).accepts(text)


@pytest.mark.parametrize("schema, message", [
    ({"not": {"format": "date"}}, NOTHING),
    ({"oneOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "uuid"}]},
     "'oneOf' at #/oneOf: branches 0 and 1 may both match strings"),
    ({"oneOf": [{"const": "x"}, {"type": "string", "format": "date"}]}, "may both match the value \"x\""),
])
def test_formats_are_annotations_where_a_complement_or_overlap_depends_on_them(schema, message):
    """A validator reads `format` as an annotation by default: the grammar writes formatted
    strings, but never relies on a format to exclude a value."""
    with pytest.raises(ValueError, match=re.escape(message)):
        json_schema_to_gbnf(schema)


# ---- JSON equality and the recursion limit ---------------------------------------------------


@pytest.mark.parametrize("a, b, equal", [
    (1, 1.0, True), (0, -0.0, True), (10**20, 1e20, True), (True, 1, False), (False, 0, False),
    ("a", "a", True), ("\u00e9", "e\u0301", False), ("1", 1, False), (None, None, True), (None, False, False),
    ([1, [2.0]], [1.0, [2]], True), ([1, 2], [2, 1], False), ([1], [1, 1], False), ([], {}, False),
    ({"a": 1, "b": [True]}, {"b": [True], "a": 1.0}, True), ({"a": 1}, {"a": 1, "b": 1}, False),
    ({"a": True}, {"a": 1}, False),
])
def test_json_equal_is_json_schema_equality(a, b, equal):
    """Numbers by value, booleans apart from numbers, strings by code points, arrays in order,
    objects whatever the order of their keys."""
    assert json_equal(a, b) is equal and json_equal(b, a) is equal


@pytest.fixture
def low_recursion_limit():
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(1500)
    yield 1500
    sys.setrecursionlimit(before)


def test_compiling_puts_the_recursion_limit_back(low_recursion_limit):
    """A deeply nested schema needs a higher recursion limit while it compiles; the limit is
    the same after, also when compilation fails."""
    assert json_schema_to_gbnf(nested_arrays(100)).startswith("root ::= ")
    assert sys.getrecursionlimit() == low_recursion_limit
    with pytest.raises(ValueError, match="is nested more than 100 deep"):
        json_schema_to_gbnf(nested_arrays(101))
    assert sys.getrecursionlimit() == low_recursion_limit
    with pytest.raises(ValueError, match="'oneOf' at #/oneOf: branches 0 and 1 may both match numbers"):
        json_schema_to_gbnf({"oneOf": [{"type": "number"}, {}]})
    assert sys.getrecursionlimit() == low_recursion_limit


def test_the_recursion_limit_is_put_back_when_the_last_block_ends(low_recursion_limit):
    """Blocks nest and run at once in threads: the limit stays raised until the last one ends."""
    with recursion_limit(3000):
        with recursion_limit(2000):
            assert sys.getrecursionlimit() == 3000
        with pytest.raises(KeyError):
            with recursion_limit(4000):
                assert sys.getrecursionlimit() == 4000
                raise KeyError("compilation failed")
        assert sys.getrecursionlimit() == 4000
    assert sys.getrecursionlimit() == low_recursion_limit
    inside, leave = threading.Event(), threading.Event()

    def other_thread():
        with recursion_limit(3000):
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=other_thread)
    thread.start()
    assert inside.wait(10)
    with recursion_limit(3000):
        pass
    assert sys.getrecursionlimit() == 3000  # the other thread still compiles
    leave.set()
    thread.join()
    assert sys.getrecursionlimit() == low_recursion_limit
    with pytest.raises(ValueError, match="limit must be at least 1, got 0"):
        with recursion_limit(0):
            pass
