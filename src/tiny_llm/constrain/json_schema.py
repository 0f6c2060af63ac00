r"""Engine — JSON schemas to GBNF: a grammar whose texts are JSON documents that validate.

    json_schema_to_gbnf({"type": "object", "properties": {"name": {"type": "string"}},
                         "required": ["name"]})

gives (root first, the other rules in alphabetical order)

    root ::= "{" space root-name-kv "}" space
    char ::= [^"\x5C\x7F\x00-\x1F] | "\\" (["\x5C/bfnrt] | "u" [0-9a-fA-F]{4})
    root-name-kv ::= "\"name\"" space ":" space string
    space ::= | " " | "\n" [ \t]{0,20}
    string ::= "\"" char* "\"" space

The conventions are llama.cpp's (`examples/json_schema_to_grammar.py`): every value rule ends in
`space`, the top-level value has no whitespace before it, shared rules have fixed names (`space`,
`char`, `string`, `number`, `integer`, `integral-part`, `decimal-part`, `boolean`, `null`, `value`,
`object`, `array`, `date`, `time`, `date-time`, `uuid` and their `-string` forms), and a
subschema's rule is named by its place: `root-name`, `root-address-city`, `root-tags-item`,
`root-tuple-0`, `root-0` (the first `anyOf` alternative), `root-string` (a `type` list entry),
`root-name-kv` (a property's `"key": value` pair), `root-additional-kv` (extra pairs), and
`defs-Node` for `{"$ref": "#/$defs/Node"}` (one rule per referenced definition, so recursive
schemas work).

Supported keywords:

- `type` (one name or a list), `enum`, `const` (each value is written as its compact
  `json.dumps`; `type` next to them keeps the values of those types).
- objects: `properties` (in the order listed), `required` (other properties are optional: any
  of them may appear, in the listed order), `additionalProperties` (false: no other keys; true:
  extra `"key": value` pairs after the listed ones, with keys that are not listed properties; a
  schema: the same, with values of that schema). A name in `required` that is not a listed
  property is written after them, with the `additionalProperties` schema (any value if absent).
- arrays: `items`, `prefixItems`, `minItems`, `maxItems`.
- strings: `minLength`, `maxLength`, `pattern` (through `regex.regex_to_gbnf_expression`, with
  Python `re` syntax and ASCII classes; a side without `^` or `$` matches any characters, as
  JSON Schema patterns are searched, not matched in full), `format` `date`, `time`,
  `date-time` and `uuid` (RFC 3339 / RFC 4122 shapes, like llama.cpp).
- integers: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (exact integer ranges);
  numbers: `minimum: 0` only.
- `anyOf`, `oneOf` (both become an alternation: a grammar cannot say "exactly one of", so a text
  valid under several `oneOf` branches is accepted), `allOf` with one schema, and local `$ref`
  (`#`, `#/$defs/...`, `#/definitions/...`, any JSON pointer into the document); `$defs` and
  `definitions` hold schemas for `$ref` to point to and constrain nothing themselves.
- boolean schemas (`true` anywhere; `false` for a property, for `items`, for a `prefixItems`
  entry and for `additionalProperties`).

Ignored: annotations (`title`, `description`, `examples`, `default`, `$schema`, `$id`,
`$comment`, `deprecated`, `readOnly`, `writeOnly`, `$anchor`, the `content...` keywords),
`format` values other than the four above (JSON Schema treats `format` as an annotation by
default), and words that are not JSON Schema keywords, which JSON Schema ignores as well. Every
other keyword (`not`, `if`/`then`/`else`, `patternProperties`, `propertyNames`,
`dependentRequired`, `dependentSchemas`, `dependencies`, `uniqueItems`, `multipleOf`,
`minProperties`, `maxProperties`, `contains`, `unevaluated...`, `additionalItems`,
`$dynamicRef`, remote `$ref`, ...) raises ValueError naming the keyword and its JSON pointer,
e.g. `json schema: 'not' at #/properties/age is not supported`; so do malformed schemas and
keyword combinations that would need an intersection of languages (`anyOf` next to `type`,
`pattern` next to `maxLength`). The keywords that hold schemas must hold them in their shape in
every schema that is converted, whatever types it allows: `$defs`, `definitions` and
`properties` an object of schemas, `items` and `additionalProperties` a schema, `prefixItems` a
list of schemas (`json schema: '$defs' at # must be an object whose values are schemas (objects
or booleans), got bool`).

Where the grammar is stricter than JSON Schema, and why:

- Properties come in the order listed and, when `properties` is given without
  `additionalProperties`, no other keys are allowed: a model then writes exactly the described
  object, and the grammar stays small (any order would need every permutation).
- No leading whitespace, bounded whitespace (`space`: nothing, one blank, or one newline and at
  most 20 blanks or tabs), integers of at most 16 digits, fractions of at most 16 digits and
  exponents written like integers (`1e05` and Python's `1e-07` are out), so that every stretch
  of output ends and generation cannot run away.
- No `1.0` for an integer, no `-0` under a lower bound of 0, and `enum`/`const` values only in
  their compact `json.dumps` spelling (no inner whitespace, no `\u` escapes for characters
  written plainly).
- Strings use the escapes `char` allows (no raw DEL); the part of a string a `pattern` matches
  is written with raw characters; the keys of extra pairs use raw characters or
  `\" \\ \b \f \n \r \t` (one spelling per key, so that a listed name cannot sneak in spelled
  differently). Times have at most 9 digits of fractions, no leap second, upper-case `T` and `Z`.
- Without `type`, the types a schema's keywords apply to are the only ones allowed
  (`{"minLength": 1}` gives strings, `{"properties": ...}` objects); a schema with none of those
  keywords allows any value.

Where it is looser: `oneOf` (see above); `date` does not check the day against the month; and a
`pattern` whose language has `"`, `\` or control characters puts them in the string as they are,
which is not valid JSON (write patterns that exclude them, e.g. `[^"\\]`).

Both ways: a `\u` escape counts as one character for `minLength`/`maxLength`, so a surrogate pair
(`\ud83d\ude00`) counts two where JSON Schema counts one; write such characters raw.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any
from urllib.parse import unquote

from .escape import gbnf_class_char, gbnf_literal
from .limits import MAX_NESTING, MAX_REPEAT

__all__ = ["json_schema_to_gbnf"]

MAX_DIGITS = 16
MAX_INTEGER = 10**MAX_DIGITS - 1

# Shared rules: name -> (body, the shared rules the body uses).
PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "space": (r'| " " | "\n" [ \t]{0,20}', ()),
    "char": (r'[^"\x5C\x7F\x00-\x1F] | "\\" (["\x5C/bfnrt] | "u" [0-9a-fA-F]{4})', ()),
    "key-char": (r'[^"\x5C\x7F\x00-\x1F] | "\\" ["\x5Cbfnrt]', ()),
    "string": (r'"\"" char* "\"" space', ("char", "space")),
    "integral-part": ('"0" | [1-9] [0-9]{0,15}', ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "integer": ('"-"? integral-part space', ("integral-part", "space")),
    "number": ('"-"? integral-part ("." decimal-part)? ([eE] ("+" | "-")? integral-part)? space',
               ("integral-part", "decimal-part", "space")),
    "boolean": ('("true" | "false") space', ("space",)),
    "null": ('"null" space', ("space",)),
    "value": ("object | array | string | number | boolean | null",
              ("object", "array", "string", "number", "boolean", "null")),
    "object": ('"{" space ( string ":" space value ( "," space string ":" space value )* )? "}" space',
               ("string", "value", "space")),
    "array": ('"[" space ( value ( "," space value )* )? "]" space', ("value", "space")),
    "date": ('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] )', ()),
    "time": ('( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? '
             '( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )', ()),
    "date-time": ('date "T" time', ("date", "time")),
    "uuid": ('[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
             "[0-9a-fA-F]{12}", ()),
    "date-string": (r'"\"" date "\"" space', ("date", "space")),
    "time-string": (r'"\"" time "\"" space', ("time", "space")),
    "date-time-string": (r'"\"" date-time "\"" space', ("date-time", "space")),
    "uuid-string": (r'"\"" uuid "\"" space', ("uuid", "space")),
}
FORMATS = ("date", "time", "date-time", "uuid")
TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")

UNSUPPORTED = frozenset({
    "not", "if", "then", "else", "dependentSchemas", "dependentRequired", "dependencies",
    "contains", "minContains", "maxContains", "patternProperties", "propertyNames",
    "unevaluatedProperties", "unevaluatedItems", "additionalItems", "uniqueItems", "multipleOf",
    "minProperties", "maxProperties", "$dynamicRef", "$recursiveRef",
})
RANGE_KEYWORDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
# The keywords that make an untyped schema describe values of one type.
TYPE_KEYWORDS = {
    "object": ("properties", "required", "additionalProperties"),
    "array": ("items", "prefixItems", "minItems", "maxItems"),
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": RANGE_KEYWORDS,
}
# The keywords whose value is an object of schemas, by name.
SCHEMA_MAPS = ("$defs", "definitions", "properties")
CONSTRAINTS = frozenset({"type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf",
                         *(k for keys in TYPE_KEYWORDS.values() for k in keys)})

_NAME = re.compile(r"[a-zA-Z0-9-]+")
_KEY_ESCAPES = '"\\bfnrt'  # what may follow a backslash in the key of an extra pair


COMPACT_SPACE = '| " "'  # `compact=True`: at most one blank between tokens, no newlines


def json_schema_to_gbnf(schema: dict | bool | str, *, compact: bool = False) -> str:
    """GBNF text (start rule `root`) for the JSON texts that validate against `schema`;
    with `compact`, JSON on one line (a model cannot spend its tokens on whitespace).

    `schema` is a dict, a boolean schema, or JSON text of one. Raises ValueError for a
    malformed schema or a keyword the conversion does not support; the message names the
    keyword and its JSON pointer (`#/properties/age`). See the module docstring for what is
    supported and where the grammar is stricter than JSON Schema."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"json schema: not valid JSON: {e}") from e
        except RecursionError:
            raise ValueError(f"json schema: the JSON text is nested too deeply to read (the limit for a "
                             f"schema is {MAX_NESTING} levels)") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"json schema: a schema is an object or a boolean, got {type(schema).__name__}")
    return _Converter(schema, compact).grammar()


class _Converter:
    def __init__(self, document: dict | bool, compact: bool = False):
        self._document = document
        self._compact = compact
        self._rules: dict[str, str | None] = {"root": None}  # None: being written
        self._refs: dict[str, str] = {"#": "root"}
        self._depth = 0  # schemas being converted, one inside the other
        self._primitive("space")  # every grammar uses it
        self._rules["root"] = self._expression(document, "root", "#")

    def grammar(self) -> str:
        names = ["root", *sorted(n for n in self._rules if n != "root")]
        return "".join(f"{name} ::= {self._rules[name]}\n" for name in names)

    # ---- rules --------------------------------------------------------------------------

    def _primitive(self, name: str) -> str:
        body, deps = PRIMITIVES[name]
        body = COMPACT_SPACE if name == "space" and self._compact else body
        if name not in self._rules:
            self._rules[name] = body
            for dep in deps:
                self._primitive(dep)
        return name

    def _add_rule(self, name: str, body: str | None) -> str:
        """Add `name ::= body`, as `name-2`, `name-3`, ... if another rule has the name; an
        identical rule is shared. A None body holds a name for a rule being written."""
        candidate, n = name, 1
        while candidate in self._rules or candidate in PRIMITIVES:
            if body is not None and self._rules.get(candidate) == body:
                return candidate
            n += 1
            candidate = f"{name}-{n}"
        self._rules[candidate] = body
        return candidate

    def _visit(self, schema: Any, name: str, path: str) -> str:
        """The name of a rule for `schema` (a shared rule, or a new one called `name`)."""
        return self._named(self._expression(schema, name, path), name)

    def _named(self, expression: str, name: str) -> str:
        """`expression` if it is a rule name, else a new rule `name` for it."""
        return expression if _NAME.fullmatch(expression) else self._add_rule(name, expression)

    # ---- schemas ------------------------------------------------------------------------

    def _expression(self, schema: Any, name: str, path: str) -> str:
        """A GBNF expression for the JSON texts valid under `schema`."""
        if self._depth == MAX_NESTING:
            shown = path if len(path) <= 80 else path[:80] + "..."
            raise ValueError(f"json schema: the schema at {shown} is nested more than {MAX_NESTING} deep")
        self._depth += 1
        try:
            return self._expression_of(schema, name, path)
        finally:
            self._depth -= 1

    def _expression_of(self, schema: Any, name: str, path: str) -> str:
        if schema is True:
            return self._primitive("value")
        if schema is False:
            raise ValueError(f"json schema: the schema at {path} is false, so nothing matches")
        _check_schema(schema, path)
        for key in schema:
            if key in UNSUPPORTED:
                raise ValueError(f"json schema: {key!r} at {path} is not supported")
        if not isinstance(schema.get("format", ""), str):
            raise ValueError(f"json schema: 'format' at {path} must be a string")
        _check_subschemas(schema, path)
        if "$ref" in schema:
            self._alone(schema, "$ref", path)
            return self._ref(schema["$ref"], path)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                self._alone(schema, key, path)
                return self._union(_schema_list(schema, key, path), name, f"{path}/{key}")
        if "allOf" in schema:
            self._alone(schema, "allOf", path)
            parts = _schema_list(schema, "allOf", path)
            if len(parts) != 1:
                raise ValueError(f"json schema: 'allOf' at {path} with {len(parts)} schemas is not "
                                 "supported (only one)")
            return self._expression(parts[0], name, f"{path}/allOf/0")
        if "enum" in schema or "const" in schema:
            return self._constants(schema, path)
        types = self._types(schema, path)
        if not types:
            return self._primitive("value")
        if len(types) == 1:
            return self._typed(types[0], schema, name, path)
        return " | ".join(self._named(self._typed(t, schema, f"{name}-{t}", path), f"{name}-{t}")
                          for t in types)

    def _alone(self, schema: dict, keyword: str, path: str, allowed: tuple[str, ...] = ()) -> None:
        """ValueError if `schema` constrains anything next to `keyword` (and `allowed`)."""
        for key in schema:
            if key in CONSTRAINTS and key != keyword and key not in allowed and _constrains(schema, key):
                raise ValueError(f"json schema: {key!r} next to {keyword!r} at {path} is not supported")

    def _types(self, schema: dict, path: str) -> list[str]:
        """The types `schema` allows: its `type`, else those its keywords are about."""
        if "type" in schema:
            return _declared_types(schema, path)
        return [t for t, keys in TYPE_KEYWORDS.items() if any(_constrains(schema, k) for k in keys)]

    def _typed(self, type_name: str, schema: dict, name: str, path: str) -> str:
        if type_name == "string":
            return self._string(schema, path)
        if type_name == "integer":
            return self._integer(schema, path)
        if type_name == "number":
            return self._number(schema, path)
        if type_name == "object":
            return self._object(schema, name, path)
        if type_name == "array":
            return self._array(schema, name, path)
        return self._primitive(type_name)  # boolean, null

    def _ref(self, ref: Any, path: str) -> str:
        if not isinstance(ref, str):
            raise ValueError(f"json schema: '$ref' at {path} must be a string")
        if ref in self._refs:
            return self._refs[ref]
        target = self._resolve(ref, path)
        seen = {ref}
        while isinstance(target, dict) and isinstance(target.get("$ref"), str):
            if target["$ref"] in seen:
                raise ValueError(f"json schema: '$ref' at {path} leads back to itself without a value")
            seen.add(target["$ref"])
            target = self._resolve(target["$ref"], path)
        name = self._add_rule(_slug(ref[2:]) or "ref", None)
        self._refs[ref] = name
        self._rules[name] = self._expression(self._resolve(ref, path), name, ref)
        return name

    def _resolve(self, ref: str, path: str) -> Any:
        """The subschema a local `$ref` (a JSON pointer after `#`) points to."""
        if ref != "#" and not ref.startswith("#/"):
            raise ValueError(f"json schema: '$ref' at {path} is {ref!r}; only local references "
                             "('#' and '#/...') are supported")
        target = self._document
        for token in ref[2:].split("/") if ref != "#" else ():
            token = unquote(token).replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and token in target:
                target = target[token]
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            else:
                raise ValueError(f"json schema: '$ref' at {path} ({ref!r}) does not resolve")
        return target

    def _union(self, schemas: list, name: str, path: str) -> str:
        rules = [self._visit(s, f"{name}-{i}", f"{path}/{i}") for i, s in enumerate(schemas)]
        return " | ".join(dict.fromkeys(rules))

    def _constants(self, schema: dict, path: str) -> str:
        self._alone(schema, "enum" if "enum" in schema else "const", path, allowed=("enum", "const", "type"))
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise ValueError(f"json schema: 'enum' at {path} must be a non-empty list")
            if "const" in schema:
                values = [v for v in values if _json_equal(v, schema["const"])]
        else:
            values = [schema["const"]]
        if "type" in schema:
            types = set(_declared_types(schema, path))
            values = [v for v in values if _json_types(v) & types]
        if not values:
            raise ValueError(f"json schema: 'enum', 'const' and 'type' at {path} leave no value")
        try:
            texts = [json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
                     for v in values]
        except ValueError as e:
            raise ValueError(f"json schema: a value of 'enum' or 'const' at {path} is not JSON: {e}") from e
        literals = [gbnf_literal(t) for t in dict.fromkeys(texts)]
        return f"{_group(' | '.join(literals))} space"

    # ---- strings ------------------------------------------------------------------------

    def _string(self, schema: dict, path: str) -> str:
        used = [k for k in TYPE_KEYWORDS["string"] if _constrains(schema, k)]
        if len(used) > 1 and ("pattern" in used or "format" in used):
            raise ValueError(f"json schema: {used[0]!r} next to {used[1]!r} at {path} is not supported")
        if "pattern" in used:
            return self._pattern(schema["pattern"], path)
        if "format" in used:
            return self._primitive(f"{schema['format']}-string")
        low = _count(schema, "minLength", path, 0)
        high = _count(schema, "maxLength", path, None)
        if high is not None and low > high:
            raise ValueError(f"json schema: 'minLength' at {path} is greater than 'maxLength'")
        if low == 0 and high is None:
            return self._primitive("string")
        self._primitive("char")
        return _sequence(r'"\""', _repeat("char", low, high), r'"\""', "space")

    def _pattern(self, pattern: Any, path: str) -> str:
        from .regex import regex_to_gbnf_expression

        if not isinstance(pattern, str):
            raise ValueError(f"json schema: 'pattern' at {path} must be a string")
        self._primitive("char")
        alternatives = []
        for branch in _top_level_branches(pattern):
            starts = branch.startswith("^")
            ends = _ends_with_anchor(branch)
            body = branch[1 if starts else 0:len(branch) - 1 if ends else len(branch)]
            try:
                expression = regex_to_gbnf_expression(body)
            except ValueError as e:
                raise ValueError(f"json schema: 'pattern' at {path}: {e}") from e
            alternatives.append(_sequence("" if starts else "char*", _group(expression),
                                          "" if ends else "char*"))
        return _sequence(r'"\""', _group(" | ".join(alternatives)), r'"\""', "space")

    # ---- numbers ------------------------------------------------------------------------

    def _integer(self, schema: dict, path: str) -> str:
        used = [k for k in RANGE_KEYWORDS if k in schema]
        if not used:
            return self._primitive("integer")
        low, high = -MAX_INTEGER, MAX_INTEGER
        for key in used:
            bound = _bound(schema, key, path)
            if key == "minimum":
                low = max(low, math.ceil(bound))
            elif key == "exclusiveMinimum":
                low = max(low, math.floor(bound) + 1)
            elif key == "maximum":
                high = min(high, math.floor(bound))
            else:
                high = min(high, math.ceil(bound) - 1)
        if low > high:
            raise ValueError(f"json schema: {' and '.join(map(repr, used))} at {path} leave no "
                             f"integer of at most {MAX_DIGITS} digits")
        return _sequence(_group(_integer_range(low, high)), "space")

    def _number(self, schema: dict, path: str) -> str:
        used = [k for k in RANGE_KEYWORDS if k in schema]
        if not used:
            return self._primitive("number")
        if used == ["minimum"] and _bound(schema, "minimum", path) == 0:
            self._primitive("integral-part")
            self._primitive("decimal-part")
            return 'integral-part ("." decimal-part)? ([eE] ("+" | "-")? integral-part)? space'
        raise ValueError(f"json schema: {used[0]!r} at {path} is not supported for numbers "
                         "(only 'minimum': 0 is; integers take any range)")

    # ---- objects ------------------------------------------------------------------------

    def _object(self, schema: dict, name: str, path: str) -> str:
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise ValueError(f"json schema: 'required' at {path} must be a list of strings")
        additional = schema.get("additionalProperties", True if not properties else None)
        if not properties and not required and (additional is True or additional == {}):
            return self._primitive("object")

        entries = [(key, sub, f"{path}/properties/{_pointer(key)}") for key, sub in properties.items()]
        for key in dict.fromkeys(r for r in required if r not in properties):
            if additional is False:
                raise ValueError(f"json schema: 'required' at {path} names {key!r}, which is not in "
                                 "'properties', and 'additionalProperties' is false")
            sub_path = f"{path}/additionalProperties" if isinstance(additional, dict) else path
            entries.append((key, additional if isinstance(additional, dict) else True, sub_path))

        pairs = []  # (rule, required, repeated)
        for key, sub, sub_path in entries:
            if sub is False:
                if key in required:
                    raise ValueError(f"json schema: property {key!r} at {path} is required but its "
                                     "schema is false")
                continue
            prop = f"{name}-{_slug(key) or 'property'}"
            value = self._visit(sub, prop, sub_path)
            kv = f"{gbnf_literal(json.dumps(key, ensure_ascii=False))} space \":\" space {value}"
            pairs.append((self._add_rule(f"{prop}-kv", kv), key in required, False))
        if additional not in (None, False):
            pairs.append((self._extra_pairs(additional, [e[0] for e in entries], name, path), False, True))
        return _sequence('"{" space', _object_members(pairs), '"}" space')

    def _extra_pairs(self, schema: dict | bool, names: list[str], name: str, path: str) -> str:
        """The rule for one extra `"key": value` pair, keys other than `names`."""
        value = self._visit(schema, f"{name}-additional-value", f"{path}/additionalProperties")
        if names:
            key = self._add_rule(f"{name}-additional-k", self._key_excluding(names))
        else:
            key = self._primitive("string")
        return self._add_rule(f"{name}-additional-kv", f'{key} ":" space {value}')

    def _key_excluding(self, names: list[str]) -> str:
        """A quoted key (of `key-char`s) that is none of `names`."""
        trie: dict = {}
        for key in names:
            node = trie
            for unit in _units(json.dumps(key, ensure_ascii=False)[1:-1]):
                node = node.setdefault(unit, {})
            node[None] = {}
        self._primitive("key-char")
        return _sequence(r'"\""', _trie_expression(trie), r'"\""', "space")

    # ---- arrays -------------------------------------------------------------------------

    def _array(self, schema: dict, name: str, path: str) -> str:
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", True)
        low = _count(schema, "minItems", path, 0)
        high = _count(schema, "maxItems", path, None)
        if not prefix and (items is True or items == {}) and low == 0 and high is None:
            return self._primitive("array")
        stop = next((i for i, s in enumerate(prefix) if s is False), None)
        if stop is not None:  # nothing can be at index `stop`
            high = stop if high is None else min(high, stop)
            prefix = prefix[:stop]
        elif items is False:
            high = len(prefix) if high is None else min(high, len(prefix))
        if high is not None and low > high:
            raise ValueError(f"json schema: 'minItems' at {path} asks for more items than the "
                             "schema allows")
        rules = [self._visit(s, f"{name}-tuple-{i}", f"{path}/prefixItems/{i}")
                 for i, s in enumerate(prefix[:high])]
        more = high is None or high > len(prefix)
        item = self._visit(items, f"{name}-item", f"{path}/items") if more else None
        return _sequence('"[" space', _array_elements(rules, item, low, high), '"]" space')


# ---- keyword values -----------------------------------------------------------------------


def _constrains(schema: dict, key: str) -> bool:
    """Whether `key` is in `schema` and narrows the language (an unknown `format` does not)."""
    return key in schema and (key != "format" or schema[key] in FORMATS)


def _check_schema(value: Any, path: str) -> None:
    """ValueError unless `value` is a schema: an object or a boolean."""
    if not isinstance(value, (dict, bool)):
        raise ValueError(f"json schema: the schema at {path} is of type {type(value).__name__}, "
                         "not an object or a boolean")


def _check_subschemas(schema: dict, path: str) -> None:
    """ValueError unless each keyword of `schema` that holds schemas holds them in the shape it
    must: `$defs`, `definitions` and `properties` an object of schemas, `items` and
    `additionalProperties` a schema, `prefixItems` a list of schemas. Checked whatever types the
    schema allows, so a non-schema such as `{"$defs": false}` is refused even where the keyword
    has no effect; the schemas inside are checked further only where they are converted."""
    for key in SCHEMA_MAPS:
        if key in schema:
            value = schema[key]
            if not isinstance(value, dict):
                raise ValueError(f"json schema: {key!r} at {path} must be an object whose values are "
                                 f"schemas (objects or booleans), got {type(value).__name__}")
            for name, sub in value.items():
                _check_schema(sub, f"{path}/{key}/{_pointer(name)}")
    if isinstance(schema.get("items"), list):
        raise ValueError(f"json schema: 'items' at {path} is a list (the tuple form of older "
                         "drafts); write 'prefixItems' instead")
    for key in ("items", "additionalProperties"):
        if key in schema:
            _check_schema(schema[key], f"{path}/{key}")
    if "prefixItems" in schema:
        prefix = schema["prefixItems"]
        if not isinstance(prefix, list):
            raise ValueError(f"json schema: 'prefixItems' at {path} must be a list of schemas, "
                             f"got {type(prefix).__name__}")
        for i, sub in enumerate(prefix):
            _check_schema(sub, f"{path}/prefixItems/{i}")


def _declared_types(schema: dict, path: str) -> list[str]:
    types = schema["type"]
    names = [types] if isinstance(types, str) else types
    if not isinstance(names, list) or not names or not all(isinstance(t, str) for t in names):
        raise ValueError(f"json schema: 'type' at {path} must be a type name or a non-empty list of them")
    for t in names:
        if t not in TYPES:
            raise ValueError(f"json schema: 'type' at {path} names an unknown type {t!r}")
    return list(dict.fromkeys(names))


def _schema_list(schema: dict, key: str, path: str) -> list:
    value = schema[key]
    if not isinstance(value, list) or not value:
        raise ValueError(f"json schema: {key!r} at {path} must be a non-empty list of schemas")
    return value


def _count(schema: dict, key: str, path: str, default: int | None) -> int | None:
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


def _bound(schema: dict, key: str, path: str) -> float:
    value = schema[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"json schema: {key!r} at {path} must be a finite number")
    return value


def _json_types(value: Any) -> set[str]:
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"integer", "number"} if value.is_integer() else {"number"}
    if isinstance(value, str):
        return {"string"}
    return {"array"} if isinstance(value, list) else {"object"}


def _json_equal(a: Any, b: Any) -> bool:
    """JSON Schema equality: 1 == 1.0, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


# ---- GBNF text ----------------------------------------------------------------------------


def _has_top_level_bar(expression: str) -> bool:
    """Whether `expression` has a `|` outside literals, classes and groups."""
    depth, i = 0, 0
    while i < len(expression):
        c = expression[i]
        if c in "\"[":
            close = '"' if c == '"' else "]"
            i += 1
            while expression[i] != close:
                i += 2 if expression[i] == "\\" else 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            return True
        i += 1
    return False


def _group(expression: str) -> str:
    """`expression` made safe to use as one item of a sequence."""
    return f"( {expression} )" if _has_top_level_bar(expression) else expression


def _sequence(*items: str) -> str:
    return " ".join(i for i in items if i) or '""'


def _repeat(item: str, low: int, high: int | None) -> str:
    """`item` repeated `low`..`high` times (`high` None: no limit); "" for exactly zero."""
    if high == 0:
        return ""
    if high is None:
        return f"{item}*" if low == 0 else f"{item}+" if low == 1 else f"{item}{{{low},}}"
    if (low, high) == (0, 1):
        return f"{item}?"
    if (low, high) == (1, 1):
        return item
    return f"{item}{{{low}}}" if low == high else f"{item}{{{low},{high}}}"


def _slug(text: str) -> str:
    """`text` as a piece of a rule name: runs of other characters become `-`."""
    return re.sub(r"[^a-zA-Z0-9]+", "-", text).strip("-")


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _object_members(pairs: list[tuple[str, bool, bool]]) -> str:
    """The members of an object, in order: (rule, required, repeated) each. Optional pairs may
    be left out; the first one written has no comma before it, so the expression is one
    alternative per possible first pair (any pair up to the first required one)."""
    def after(i: int) -> list[str]:
        out = []
        for rule, needed, repeated in pairs[i:]:
            pair = f'"," space {rule}'
            out.append(pair if needed else f"( {pair} )" + ("*" if repeated else "?"))
        return out

    first_required = next((i for i, (_, needed, _) in enumerate(pairs) if needed), None)
    last_start = len(pairs) - 1 if first_required is None else first_required
    alternatives = []
    for i in range(last_start + 1):
        rule, _, repeated = pairs[i]
        alternatives.append(_sequence(rule, *after(i if repeated else i + 1)))
    if not alternatives:
        return ""
    body = " | ".join(alternatives)
    return f"( {body} )?" if first_required is None else _group(body)


def _array_elements(prefix: list[str], item: str | None, low: int, high: int | None) -> str:
    """Elements: the `prefix` rules one by one, then `item` repeated, `low`..`high` in all."""
    def from_index(i: int) -> str:
        if high is not None and i >= high:
            return ""
        comma = '"," space ' if i else ""
        if i < len(prefix):
            body = _sequence(f"{comma}{prefix[i]}", from_index(i + 1))
            return body if i < low else f"( {body} )?"
        if item is None:
            return ""
        need = max(low - i, 0)
        room = None if high is None else high - i
        if i > 0:
            return _repeat(f'( "," space {item} )', need, room)
        rest = _repeat(f'( "," space {item} )', max(need - 1, 0), None if room is None else room - 1)
        body = _sequence(item, rest)
        return body if need else f"( {body} )?"

    return from_index(0)


def _units(spelled: str) -> list[str]:
    """A JSON string's inside split into characters: raw ones and escapes (`\\n`, `\\u00e9`)."""
    units, i = [], 0
    while i < len(spelled):
        size = 1 if spelled[i] != "\\" else 6 if spelled[i + 1] == "u" else 2
        units.append(spelled[i:i + size])
        i += size
    return units


def _spellable(unit: str) -> bool:
    """Whether `key-char` can write `unit`."""
    if len(unit) == 2:
        return unit[1] in _KEY_ESCAPES
    return len(unit) == 1 and unit not in '"\\' and ord(unit) >= 0x20 and ord(unit) != 0x7F


def _trie_expression(node: dict) -> str:
    """Key characters that spell none of the names in the trie below `node` (a name ends where
    a node has the key None)."""
    branches, raw, escaped = [], [], []
    for unit, child in node.items():
        if unit is None or not _spellable(unit):
            continue
        (escaped if len(unit) == 2 else raw).append(unit[-1])
        branches.append(_sequence(gbnf_literal(unit), _trie_expression(child)))
    if not branches:
        return "key-char+" if None in node else "key-char*"
    other = "[^" + '"\\x5C\\x7F\\x00-\\x1F' + "".join(gbnf_class_char(c) for c in raw) + "]"
    escapes = [c for c in _KEY_ESCAPES if c not in escaped]
    if escapes:
        other = f'( {other} | "\\\\" [{"".join(gbnf_class_char(c) for c in escapes)}] )'
    branches.append(f"{other} key-char*")
    body = " | ".join(branches)
    return f"( {body} )" if None in node else f"( {body} )?"


def _top_level_branches(pattern: str) -> list[str]:
    """`pattern` split at the `|` that are outside groups and classes."""
    branches, depth, start, i, in_class = [], 0, 0, 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            i += 1
            if pattern[i:i + 1] == "^":
                i += 1
            if pattern[i:i + 1] == "]":  # a ']' first in a class is itself
                i += 1
            continue
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            branches.append(pattern[start:i])
            start = i + 1
        i += 1
    branches.append(pattern[start:])
    return branches


def _ends_with_anchor(branch: str) -> bool:
    """Whether `branch` ends in a `$` that is not escaped."""
    if not branch.endswith("$"):
        return False
    backslashes = len(branch) - 1 - len(branch[:-1].rstrip("\\"))
    return backslashes % 2 == 0


# ---- integer ranges -----------------------------------------------------------------------


def _integer_range(low: int, high: int) -> str:
    """Alternatives for the integers `low`..`high`, each spelled the canonical way."""
    if high < 0:
        return f'"-" {_group(_natural_range(-high, -low))}'
    if low >= 0:
        return _natural_range(low, high)
    return f'"-" {_group(_natural_range(1, -low))} | {_natural_range(0, high)}'


def _natural_range(low: int, high: int) -> str:
    """Alternatives for `low`..`high` (0 <= low <= high), without leading zeros."""
    alternatives = []
    if low == 0:
        alternatives.append('"0"')
        low = 1
    if low <= high:
        low_len, high_len = len(str(low)), len(str(high))
        if low_len == high_len:
            alternatives.append(_same_length(str(low), str(high)))
        else:
            first_full, last_full = low_len, high_len  # lengths where every number is in range
            if low > 10 ** (low_len - 1):
                alternatives.append(_same_length(str(low), "9" * low_len))
                first_full += 1
            tail = None
            if high < 10**high_len - 1:
                tail = _same_length("1" + "0" * (high_len - 1), str(high))
                last_full -= 1
            if first_full <= last_full:
                alternatives.append(_sequence("[1-9]", _repeat("[0-9]", first_full - 1, last_full - 1)))
            if tail:
                alternatives.append(tail)
    return " | ".join(alternatives)


def _same_length(low: str, high: str) -> str:
    """Alternatives for the digit strings from `low` to `high`, both of the same length."""
    common = 0
    while common < len(low) and low[common] == high[common]:
        common += 1
    head = f'"{low[:common]}"' if common else ""
    low, high = low[common:], high[common:]
    if not low:
        return head
    a, b, k = int(low[0]), int(high[0]), len(low) - 1
    if k == 0:
        return _sequence(head, _digit(a, b))
    alternatives = []
    first = a if low[1:] == "0" * k else a + 1
    last = b if high[1:] == "9" * k else b - 1
    if first > a:
        alternatives.append(_same_length(low, f"{a}{'9' * k}"))
    if first <= last:
        alternatives.append(f"{_digit(first, last)} {_repeat('[0-9]', k, k)}")
    if last < b:
        alternatives.append(_same_length(f"{b}{'0' * k}", high))
    body = " | ".join(alternatives)
    return _sequence(head, _group(body)) if head else body


def _digit(a: int, b: int) -> str:
    return f'"{a}"' if a == b else f"[{a}-{b}]"
