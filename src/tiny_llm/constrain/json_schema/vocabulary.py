"""Engine — the JSON Schema vocabulary the compiler knows: types, keywords by what they hold and
what they are about, the keywords it refuses (and what to write instead), and the formats it
enforces.

Keywords not named here are annotations or unknown, and constrain nothing.

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

KINDS = ("null", "boolean", "object", "array", "string", "number")
TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")

NUMBER_KEYWORDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "multipleOf")
STRING_KEYWORDS = ("minLength", "maxLength", "pattern", "format")
OBJECT_KEYWORDS = ("properties", "required", "additionalProperties", "patternProperties", "propertyNames",
                   "minProperties", "maxProperties", "dependentRequired", "unevaluatedProperties")
ARRAY_KEYWORDS = ("items", "prefixItems", "minItems", "maxItems", "contains", "minContains", "maxContains",
                  "uniqueItems", "unevaluatedItems")
# The keywords that make an untyped schema describe values of one kind.
KIND_KEYWORDS = {"object": OBJECT_KEYWORDS, "array": ARRAY_KEYWORDS, "string": STRING_KEYWORDS,
                 "number": NUMBER_KEYWORDS}
# Keywords of older drafts, refused with what to write instead.
UNSUPPORTED = {
    "dependencies": "write 'dependentRequired' or 'dependentSchemas' (draft 2019-09 and later)",
    "additionalItems": "write 'items' after 'prefixItems' (draft 2020-12)",
    "$recursiveRef": "write '$dynamicRef' (draft 2020-12)",
}
# The keywords a negation refuses: the complement of what they say is no grammar the
# compiler can write (`uniqueItems: false` says nothing, so it has one).
NO_COMPLEMENT = ("oneOf", "if", "dependentSchemas", "additionalProperties", "patternProperties",
                 "propertyNames", "prefixItems", "unevaluatedProperties", "unevaluatedItems", "uniqueItems")
# The keywords that say what keys an object may have beyond those it names.
EXTRA_KEYWORDS = ("additionalProperties", "patternProperties", "unevaluatedProperties", "propertyNames")
# The keywords whose value is an object of schemas, by name.
SCHEMA_MAPS = ("$defs", "definitions", "properties", "patternProperties", "dependentSchemas")
SINGLE_SCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
                  "propertyNames", "unevaluatedProperties", "unevaluatedItems")
SCHEMA_LISTS = ("prefixItems", "allOf", "anyOf", "oneOf")
# The keywords that say nothing about the value.
ANNOTATIONS = frozenset({"title", "description", "examples", "default", "$schema", "$id", "$comment",
                         "deprecated", "readOnly", "writeOnly", "$anchor", "$dynamicAnchor", "$defs",
                         "definitions", "$vocabulary", "contentEncoding", "contentMediaType", "contentSchema"})

# Keywords only a negation makes (tuples, so no schema text can spell them).
NOT_PATTERN = ("not", "pattern")
NOT_MULTIPLE = ("not", "multipleOf")
NOT_VALUES = ("not", "enum")
NOT_INTEGER = ("not", "integer")

# The formats that are enforced, as regexes (full match, ASCII).
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_DATE = (r"[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
         r"|02-(0[1-9]|1[0-9]|2[0-9]))")
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "email": rf"[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~-]+)*@({_LABEL}\.)+[A-Za-z]{{2,63}}",
    "ipv4": rf"{_OCTET}(\.{_OCTET}){{3}}",
    "hostname": rf"{_LABEL}(\.{_LABEL})*",
}
