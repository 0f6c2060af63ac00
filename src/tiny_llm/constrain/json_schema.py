r"""Engine — JSON schemas to GBNF: a grammar whose texts are JSON documents that validate.

    json_schema_to_gbnf({"type": "object", "properties": {"name": {"type": "string"}},
                         "required": ["name"]})

gives (root first, the other rules in alphabetical order)

    root ::= "{" space root-name-kv "}" space
    char ::= [^"\x5C\x7F\x00-\x1F] | "\\" (["\x5C/bfnrt] | "u" unicode-escape)
    root-name-kv ::= "\"name\"" space ":" space string
    space ::= | " " | "\n" [ \t]{0,20}
    string ::= "\"" char* "\"" space
    unicode-escape ::= ...

The promise is soundness: every text the grammar accepts is JSON that validates against the
schema (draft 2020-12). Where JSON Schema allows more than the grammar writes, the grammar is
narrower on purpose and says so below; where a keyword cannot be written exactly as a grammar,
converting raises ValueError naming the keyword and its JSON pointer
(`json schema: 'uniqueItems' at #/items ...`). Nothing is dropped silently.

How a schema is compiled. A schema is a conjunction: its own keywords, its `allOf` members,
what its `$ref` and `$dynamicRef` point to, and `not` (turned into a positive schema: the
negation of each keyword, joined by `anyOf`). Choices (`anyOf`, `oneOf`, `if`/`then`/`else`,
`dependentSchemas`) are multiplied out into alternatives, each a flat list of schemas. Each
alternative's keywords are merged per JSON type:

- strings: `pattern` (searched, not matched in full), `format`, `minLength`/`maxLength`,
  `enum`/`const` and everything `not` excludes are regular languages; they are intersected as
  automata (`automata.DFA`) and written as one rule per state;
- numbers: bounds, `multipleOf`, integers and excluded values are automata over the digits of
  the number's plain spelling (`numbers.py`);
- objects: every key named by `properties`, `required` or a dependency gets the conjunction of
  every schema that applies to it (its property schema, the `patternProperties` it matches, else
  `additionalProperties`, and `unevaluatedProperties` where nothing evaluated it); other keys
  fall into classes by the patterns they match, each class a key automaton with its value's
  conjunction; counts (`minProperties`, `maxProperties`) and `dependentRequired` are tracked by
  the rules that write the members one after another;
- arrays: each position gets its `prefixItems`/`items` conjunction; `contains` counts matching
  items (exactly where its complement can be written), `uniqueItems` holds when items come
  from a few values;
- `oneOf` compiles when its branches are disjoint (their languages do not intersect per type,
  or a property every branch requires has disjoint values — a discriminator); otherwise it is
  refused with the two branches that may overlap.

Rules are named by place: `root-name` (a property), `root-name-kv` (its `"key": value` pair),
`root-item`, `root-tuple-0`, `root-0` (an alternative), `defs-Node` (a `$ref` target), one rule
per state of an automaton (`root-name-3`), so recursive schemas work.

Narrower than JSON Schema, on purpose:

- Properties named in the schema come in the order listed (the schema itself first, then its
  `allOf` members and references, depth first), other keys after them; when `properties` is
  given and nothing says what other keys may be (`additionalProperties`, `patternProperties`,
  `unevaluatedProperties`, `propertyNames`), no other keys are written.
- No leading whitespace, bounded whitespace (`space`: nothing, one blank, or one newline and at
  most 20 blanks or tabs).
- Numbers without constraints have at most 16 digits per part; numbers under any constraint
  (bounds, `multipleOf`, an excluded value, `integer` next to them) are written in plain decimal:
  no exponent, no leading zeros, no trailing zeros after the point, no `-0`, at most 16 digits
  after the point and (where a side is unbounded) 16 before it. An integer has no fraction.
- `enum` and `const` values in their compact `json.dumps` spelling (numbers as above).
- Strings under a pattern, a format, `enum`/`const`, `not` or `propertyNames`, and keys of extra
  pairs, are written one way: the way `json.dumps(..., ensure_ascii=False)` writes them (the
  other strings may use `\u` escapes; a surrogate pair counts as one character, a lone
  surrogate is not written).
- `minProperties` counts only the keys the schema names (a grammar cannot keep extra keys
  distinct from each other); asking for more than are named is refused.
- `format` is enforced for `date`, `time`, `date-time`, `uuid`, `email`, `ipv4` and `hostname`
  (JSON Schema treats `format` as an annotation, so this narrows); other formats are annotations.
- Without `type`, the types a schema's keywords are about are the only ones allowed
  (`{"minLength": 1}` gives strings); a schema with no such keyword allows any value.

Looser, because a grammar cannot see it: a text that repeats a key (`{"a": 1, "a": 2}`); JSON
parsers keep one of the values.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

from .automata import DFA, JSON_CONTROL, JSON_CONTROL_BODY, json_string, plain, reaching
from .escape import gbnf_literal
from .limits import MAX_NESTING, MAX_REPEAT

__all__ = ["json_schema_to_gbnf"]

MAX_DIGITS = 16
MAX_ALTERNATIVES = 256  # alternatives of one schema once its choices are multiplied out
MAX_SUBSET_BRANCHES = 5  # an anyOf beside unevaluated* is written per set of matching branches up to this
MAX_KEY_CLASSES = 64  # classes of extra keys (by the patterns they match)
MAX_MEMBER_STATES = 5000  # states of the rules that write an object's or an array's members
MAX_UNIQUE_VALUES = 8  # `uniqueItems` holds over items drawn from at most this many values
RECURSION_LIMIT = 20 * MAX_NESTING + 1000
DEFAULT_BASE = "https://schema.invalid/root.json"  # the base URI of a document without `$id`

HEX = "[0-9a-fA-F]"
# Shared rules: name -> (body, the shared rules the body uses).
PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "space": (r'| " " | "\n" [ \t]{0,20}', ()),
    "char": (r'[^"\x5C\x7F\x00-\x1F] | "\\" (["\x5C/bfnrt] | "u" unicode-escape)', ("unicode-escape",)),
    # A UTF-16 unit that is no surrogate, or a surrogate pair (one character).
    "unicode-escape": (f'[0-9a-cA-Ce-fE-F] {HEX}{{3}} | [dD] [0-7] {HEX}{{2}} '
                       rf'| [dD] [89abAB] {HEX}{{2}} "\\u" [dD] [c-fC-F] {HEX}{{2}}', ()),
    "string": (r'"\"" char* "\"" space', ("char", "space")),
    "integral-part": ('"0" | [1-9] [0-9]{0,15}', ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "integer": ('"-"? integral-part space', ("integral-part", "space")),
    "number": ('"-"? integral-part ("." decimal-part)? ([eE] ("+" | "-")? integral-part)? space',
               ("integral-part", "decimal-part", "space")),
    "boolean": ('("true" | "false") space', ("space",)),
    JSON_CONTROL: (JSON_CONTROL_BODY, ()),
    "null": ('"null" space', ("space",)),
    "value": ("object | array | string | number | boolean | null",
              ("object", "array", "string", "number", "boolean", "null")),
    "object": ('"{" space ( string ":" space value ( "," space string ":" space value )* )? "}" space',
               ("string", "value", "space")),
    "array": ('"[" space ( value ( "," space value )* )? "]" space', ("value", "space")),
}
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
UNSUPPORTED = {
    "dependencies": "write 'dependentRequired' or 'dependentSchemas' (draft 2019-09 and later)",
    "additionalItems": "write 'items' after 'prefixItems' (draft 2020-12)",
    "$recursiveRef": "write '$dynamicRef' (draft 2020-12)",
}
# The keywords that say what keys an object may have beyond those it names.
EXTRA_KEYWORDS = ("additionalProperties", "patternProperties", "unevaluatedProperties", "propertyNames")
# The keywords whose value is an object of schemas, by name.
SCHEMA_MAPS = ("$defs", "definitions", "properties", "patternProperties", "dependentSchemas")
SINGLE_SCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
                  "propertyNames", "unevaluatedProperties", "unevaluatedItems")
SCHEMA_LISTS = ("prefixItems", "allOf", "anyOf", "oneOf")

# Keywords only a negation makes (tuples, so no schema text can spell them).
NOT_PATTERN = ("not", "pattern")
NOT_MULTIPLE = ("not", "multipleOf")
NOT_VALUES = ("not", "enum")
NOT_INTEGER = ("not", "integer")

COMPACT_SPACE = '| " "'  # `compact=True`: at most one blank between tokens, no newlines
_NAME = re.compile(r"[a-zA-Z0-9-]+")


def json_schema_to_gbnf(schema: dict | bool | str, *, compact: bool = False) -> str:
    """GBNF text (start rule `root`) for the JSON texts that validate against `schema`;
    with `compact`, JSON on one line (a model cannot spend its tokens on whitespace).

    `schema` is a dict, a boolean schema, or JSON text of one. Raises ValueError for a
    malformed schema or a keyword the conversion cannot write exactly; the message names the
    keyword and its JSON pointer (`#/properties/age`). See the module docstring."""
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
    if sys.getrecursionlimit() < RECURSION_LIMIT:  # each level of nesting takes a dozen frames
        sys.setrecursionlimit(RECURSION_LIMIT)
    return _Converter(schema, compact).grammar()


@dataclass(frozen=True)
class Part:
    """One schema of a conjunction, where it sits: the base URI its references resolve
    against, the dynamic scope (resources entered, outermost first), its JSON pointer, whether
    what it evaluates counts for `unevaluated*` (not for the schemas a negation makes), and the
    schemas around it at this place of the instance (whose `unevaluated*` see its evaluations)."""

    schema: Any
    base: str
    path: str
    scope: tuple[str, ...] = ()
    annotating: bool = True
    owners: frozenset[int] = frozenset()

    def child(self, schema: Any, path: str, *, annotating: bool | None = None) -> Part:
        """A subschema of this one at the same place of the instance (`allOf`, a branch)."""
        return Part(schema, self.base, path, self.scope, self.annotating if annotating is None else annotating,
                    self.owners | {id(self.schema)})


Alternative = list[Part]


class _Converter:
    def __init__(self, document: dict | bool, compact: bool = False):
        self._document = document
        self._compact = compact
        self._rules: dict[str, str | None] = {"root": None}  # None: being written
        self._done: dict[tuple, str] = {}  # a conjunction's key -> its rule
        self._made: list[Any] = []  # schemas made here (kept alive: their ids are keys)
        self.made: set[int] = set()  # their ids
        self._depth = 0
        self._resources: dict[str, Any] = {}
        self._anchors: dict[str, Any] = {}
        self._dynamic: dict[str, Any] = {}
        self._base_of: dict[int, str] = {}
        self._dfa_cache: dict[tuple, DFA] = {}
        self._recursive: set[str] = set()  # rules named inside their own definition
        root_base = DEFAULT_BASE
        if isinstance(document, dict) and isinstance(document.get("$id"), str):
            root_base = urldefrag(urljoin(DEFAULT_BASE, document["$id"]))[0]
        self._resources[DEFAULT_BASE] = document
        self._index(document, root_base)
        self._primitive("space")  # every grammar uses it
        root = Part(document, root_base, "#", (root_base,))
        expression = self._conjunction([root], "root", "#", top=True)
        if expression is None:
            raise ValueError("json schema: no JSON value validates against the schema at # (its keywords "
                             "contradict each other)" if document is not False else
                             "json schema: the schema at # is false, so nothing matches")
        self._rules["root"] = expression

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

    def _define(self, name: str, body: str) -> None:
        self._rules[name] = body

    def _named(self, expression: str, name: str) -> str:
        """`expression` if it is a rule name, else a new rule `name` for it."""
        return expression if _NAME.fullmatch(expression) else self._add_rule(name, expression)

    def _make(self, schema: dict) -> dict:
        self._made.append(schema)
        self.made.add(id(schema))
        return schema

    # ---- resources ----------------------------------------------------------------------

    def _index(self, document: Any, base: str) -> None:
        """Record every schema's base URI, and the resources (`$id`), anchors (`$anchor`) and
        dynamic anchors (`$dynamicAnchor`) of the document (with a work list: documents may
        nest deeper than Python recurses)."""
        todo = [(document, base, True)]
        while todo:
            schema, base, top = todo.pop()
            if not isinstance(schema, dict):
                continue
            if isinstance(schema.get("$id"), str):
                if not top:
                    base = urldefrag(urljoin(base, schema["$id"]))[0]
                self._resources[base] = schema
            self._base_of[id(schema)] = base
            for key, table in (("$anchor", self._anchors), ("$dynamicAnchor", self._dynamic)):
                if isinstance(schema.get(key), str):
                    table[f"{base}#{schema[key]}"] = schema
                    self._anchors.setdefault(f"{base}#{schema[key]}", schema)
            for key, value in schema.items():
                if key in SCHEMA_MAPS and isinstance(value, dict):
                    todo += [(sub, base, False) for sub in value.values()]
                elif key in SINGLE_SCHEMAS:
                    todo.append((value, base, False))
                elif key in SCHEMA_LISTS and isinstance(value, list):
                    todo += [(sub, base, False) for sub in value]

    def _target(self, part: Part, keyword: str) -> Part:
        """The part a `$ref` or `$dynamicRef` of `part` points to."""
        ref = part.schema[keyword]
        where = part.path
        if not isinstance(ref, str):
            raise ValueError(f"json schema: {keyword!r} at {where} must be a string")
        uri = urljoin(part.base, ref)
        resource, fragment = urldefrag(uri)
        if resource not in self._resources:
            raise ValueError(f"json schema: {keyword!r} at {where} is {ref!r}, which is outside this "
                             "document (remote references are not fetched)")
        if fragment.startswith("/") or not fragment:
            target: Any = self._resources[resource]
            for token in fragment[1:].split("/") if fragment else ():
                token = unquote(token).replace("~1", "/").replace("~0", "~")
                if isinstance(target, dict) and token in target:
                    target = target[token]
                elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                    target = target[int(token)]
                else:
                    raise ValueError(f"json schema: {keyword!r} at {where} ({ref!r}) does not resolve")
        elif f"{resource}#{fragment}" in self._anchors:
            target = self._anchors[f"{resource}#{fragment}"]
        else:
            raise ValueError(f"json schema: {keyword!r} at {where} ({ref!r}) names no anchor of the document")
        if keyword == "$dynamicRef" and isinstance(target, dict) and target.get("$dynamicAnchor") == fragment:
            for outer in part.scope:  # the outermost resource in scope with this dynamic anchor
                if f"{outer}#{fragment}" in self._dynamic:
                    target = self._dynamic[f"{outer}#{fragment}"]
                    break
        base = self._base_of.get(id(target), resource)
        scope = part.scope if base in part.scope else (*part.scope, base)
        label = ref if ref.startswith("#") else f"{where}/{keyword}"
        return Part(target, base, label, scope, part.annotating, part.owners | {id(part.schema)})

    def _follow(self, part: Part) -> None:
        """ValueError if a chain of references from `part` comes back without a value."""
        start, seen = part.path, {id(part.schema)}
        while _only_ref(part.schema):
            part = self._target(part, "$ref")
            if id(part.schema) in seen:
                raise ValueError(f"json schema: '$ref' at {start} leads back to itself without a value")
            seen.add(id(part.schema))

    # ---- conjunctions -------------------------------------------------------------------

    def _conjunction(self, parts: list[Part], name: str, path: str, top: bool = False) -> str | None:
        """A rule (or expression) for the values valid under every part; None if none is."""
        if all(_trivial(p.schema) for p in parts):
            for p in parts:
                if isinstance(p.schema, dict):
                    _check_keywords(p.schema, p.path)
            return self._primitive("value")
        if len(parts) == 1 and _only_ref(parts[0].schema):  # a reference alone: its target's rule
            _check_keywords(parts[0].schema, parts[0].path)
            ref = parts[0].schema["$ref"]
            target = self._target(parts[0], "$ref")
            if target.schema is not parts[0].schema and _only_ref(target.schema):
                self._follow(parts[0])
            if target.schema is not parts[0].schema:
                label = _slug(ref[2:]) or "ref" if isinstance(ref, str) and ref.startswith("#") else name
                return self._conjunction([target], label, target.path)
        path = parts[0].path if parts else path
        key = tuple((id(p.schema), p.base, p.scope, p.annotating) for p in parts)
        if key in self._done:
            rule = self._done[key]
            if rule is not None and self._rules.get(rule, "") is None:
                self._recursive.add(rule)  # named while it is being written
            return rule
        if self._depth == MAX_NESTING:
            shown = path if len(path) <= 80 else path[:80] + "..."
            raise ValueError(f"json schema: the schema at {shown} is nested more than {MAX_NESTING} deep")
        rule = "root" if top else self._add_rule(name, None)
        self._done[key] = rule
        self._depth += 1
        try:
            expression = self._alternatives(self._expand(parts, frozenset()), rule, path)
        finally:
            self._depth -= 1
        if expression is None:
            self._done[key] = None
            if not top:
                del self._rules[rule]
            return None
        if top:
            return expression
        if _NAME.fullmatch(expression) and rule not in self._recursive:
            del self._rules[rule]  # another rule's name: no alias needed
            self._done[key] = expression
            return expression
        self._rules[rule] = expression
        return rule

    def _expand(self, parts: list[Part], active: frozenset[int]) -> list[Alternative]:
        """The conjunction as alternatives, each a flat list of parts with no choice left."""
        items: list = []  # parts and choices, in the order the schemas list them
        seen: set[tuple] = set()
        for part in parts:
            if not self._flatten(part, active, items, items, seen):
                return []
        alternatives: list[Alternative] = [[]]
        for item in items:
            if isinstance(item, Part):
                for alternative in alternatives:
                    alternative.append(item)
                continue
            keyword, where, options, inner = item
            if keyword == "anyOf" and 1 < len(options) <= MAX_SUBSET_BRANCHES and any(
                    isinstance(p, Part) and isinstance(p.schema, dict) and p.annotating
                    and ("unevaluatedProperties" in p.schema or "unevaluatedItems" in p.schema) for p in items):
                # `unevaluated*` sees what every matching branch evaluated: one alternative per
                # set of branches that match together.
                options = [[p for i, option in enumerate(options) if subset >> i & 1 for p in option]
                           for subset in range(1, 1 << len(options))]
            expanded = [self._expand(option, inner) for option in options]
            if keyword == "oneOf":
                self._check_disjoint(expanded, where)
            alternatives = [alt + branch for alt in alternatives for option in expanded for branch in option]
            if len(alternatives) > MAX_ALTERNATIVES:
                raise ValueError(f"json schema: {keyword!r} at {where} multiplies the schema into more than "
                                 f"{MAX_ALTERNATIVES} alternatives")
        return alternatives

    def _flatten(self, part: Part, active: frozenset[int], leaves: list[Part], choices: list,
                 seen: set[tuple]) -> bool:
        """Add `part` and the parts it implies at the same place to `leaves`, and its choices
        to `choices`; False if `part` is the false schema."""
        schema = part.schema
        if schema is True:
            return True
        if schema is False:
            return False
        _check_schema(schema, part.path)
        base = self._base_of.get(id(schema), part.base)
        if base != part.base:  # a schema with its own `$id`: a resource of its own
            part = replace(part, base=base, scope=part.scope if base in part.scope else (*part.scope, base))
        if _only_ref(schema):
            self._follow(part)
        if id(schema) in active:
            raise ValueError("json schema: a '$ref' leads back to a schema that holds it before any "
                             f"character of a value is read (at {part.path})")
        key = (id(schema), part.base, part.annotating)
        if key in seen:
            return True
        seen.add(key)
        _check_keywords(schema, part.path)
        leaves.append(part)
        inner = active | {id(schema)}
        path = part.path
        implied: list[Part] = []
        for keyword in ("$ref", "$dynamicRef"):
            if keyword in schema:
                implied.append(self._target(part, keyword))
        implied += [part.child(s, f"{path}/allOf/{i}") for i, s in enumerate(_schema_list(schema, "allOf", path))]
        if "not" in schema:
            negated = self._negate(part.child(schema["not"], f"{path}/not"), frozenset())
            implied.append(part.child(negated, f"{path}/not", annotating=False))
        for sub in implied:
            if not self._flatten(sub, inner, leaves, choices, seen):
                return False
        for keyword in ("anyOf", "oneOf"):
            if keyword in schema:
                options = [[part.child(s, f"{path}/{keyword}/{i}")]
                           for i, s in enumerate(_schema_list(schema, keyword, path))]
                choices.append((keyword, f"{path}/{keyword}", options, inner))
        if "if" in schema and ("then" in schema or "else" in schema):
            condition = part.child(schema["if"], f"{path}/if")
            otherwise = part.child(self._negate(condition, frozenset(), "if"), f"{path}/if", annotating=False)
            options = [[condition, part.child(schema.get("then", True), f"{path}/then")],
                       [otherwise, part.child(schema.get("else", True), f"{path}/else")]]
            choices.append(("if", path, options, inner))
        for key, sub in _schema_map(schema, "dependentSchemas", path).items():
            where = f"{path}/dependentSchemas/{_pointer(key)}"
            others = [k for k in KINDS if k != "object"] + ["integer"]
            options = [[part.child(self._make({"type": others}), where)],
                       [part.child(self._make({"type": "object", "required": [key]}), where),
                        part.child(sub, where)],
                       [part.child(self._make({"type": "object", "properties": {key: False}}), where,
                                   annotating=False)]]
            choices.append(("dependentSchemas", where, options, inner))
        return True

    # ---- negation -----------------------------------------------------------------------

    def _negate(self, part: Part, active: frozenset[int], via: str = "not") -> Any:
        """A schema for the values `part` rejects (made of `anyOf` and plain keywords), or
        ValueError (naming `via`, the keyword that needs the complement) where the complement
        has no such form."""
        schema = part.schema
        if isinstance(schema, bool):
            return not schema
        _check_schema(schema, part.path)
        _check_keywords(schema, part.path)
        if id(schema) in active:
            raise ValueError(f"json schema: {via!r} at {part.path} leads back to itself through '$ref'")
        active = active | {id(schema)}
        path = part.path
        options: list[Any] = []  # the negation is the anyOf of these
        for keyword in ("$ref", "$dynamicRef"):
            if keyword in schema:
                options.append(self._negate(self._target(part, keyword), active, via))
        for i, sub in enumerate(_schema_list(schema, "allOf", path)):
            options.append(self._negate(part.child(sub, f"{path}/allOf/{i}"), active, via))
        if "anyOf" in schema:
            negations = [self._negate(part.child(s, f"{path}/anyOf/{i}"), active, via)
                         for i, s in enumerate(_schema_list(schema, "anyOf", path))]
            options.append(self._make({"allOf": negations}))
        if "not" in schema:
            options.append(schema["not"])
        for keyword in ("oneOf", "if", "dependentSchemas", "additionalProperties", "patternProperties",
                        "propertyNames", "prefixItems", "unevaluatedProperties", "unevaluatedItems",
                        "uniqueItems"):
            if keyword in schema and not (keyword == "uniqueItems" and schema[keyword] is False):
                raise ValueError(f"json schema: {via!r} at {path} holds {keyword!r}, whose complement a "
                                 "grammar cannot write")
        options += self._negate_keywords(schema, part)
        options = [o for o in options if o is not False]
        if any(o is True for o in options):
            return True
        if not options:
            return False
        return options[0] if len(options) == 1 else self._make({"anyOf": options})

    def _negate_keywords(self, schema: dict, part: Part) -> list[Any]:
        path = part.path
        make = self._make
        out: list[Any] = []
        kinds = _declared(schema, path) if "type" in schema else None
        if kinds is not None:
            types, integer = kinds
            rest = [k for k in KINDS if k not in types]
            if integer:
                out.append(make({"type": "number", NOT_INTEGER: True}))
            if rest:
                out.append(make({"type": rest}))
        if "const" in schema:
            out.append(make({NOT_VALUES: [schema["const"]]}))
        if "enum" in schema:
            out.append(make({NOT_VALUES: list(_enum(schema, path))}))
        flips = {"minimum": "exclusiveMaximum", "exclusiveMinimum": "maximum", "maximum": "exclusiveMinimum",
                 "exclusiveMaximum": "minimum"}
        for key, flipped in flips.items():
            if key in schema:
                out.append(make({"type": "number", flipped: _bound(schema, key, path)}))
        if "multipleOf" in schema:
            out.append(make({"type": "number", NOT_MULTIPLE: _step(schema, path)}))
        for low, high, kind in (("minLength", "maxLength", "string"), ("minItems", "maxItems", "array"),
                                ("minProperties", "maxProperties", "object")):
            if low in schema and _count(schema, low, path, 0) > 0:
                out.append(make({"type": kind, high: _count(schema, low, path, 0) - 1}))
            if high in schema:
                out.append(make({"type": kind, low: _count(schema, high, path, None) + 1}))
        if "pattern" in schema:
            out.append(make({"type": "string", NOT_PATTERN: schema["pattern"]}))
        # `format` asserts nothing to a validator that reads it as an annotation (the default):
        # its complement is empty, so a negated format adds no alternative.
        for key in _required(schema, path):
            out.append(make({"type": "object", "properties": {key: False}}))
        for key, sub in _schema_map(schema, "properties", path).items():
            negated = self._negate(part.child(sub, f"{path}/properties/{_pointer(key)}"), frozenset())
            if negated is not False:
                out.append(make({"type": "object", "required": [key], "properties": {key: negated}}))
        for key, needed in _dependent_required(schema, path).items():
            for other in needed:
                out.append(make({"type": "object", "required": [key], "properties": {other: False}}))
        if "items" in schema:
            negated = self._negate(part.child(schema["items"], f"{path}/items"), frozenset())
            if negated is not False:
                out.append(make({"type": "array", "contains": negated}))
        if "contains" in schema:
            low = _count(schema, "minContains", path, 1)
            high = _count(schema, "maxContains", path, None)
            if low > 0:
                out.append(make({"type": "array", "contains": schema["contains"], "minContains": 0,
                                 "maxContains": low - 1}))
            if high is not None:
                out.append(make({"type": "array", "contains": schema["contains"], "minContains": high + 1}))
        undo = {NOT_PATTERN: ("string", "pattern"),
                NOT_MULTIPLE: ("number", "multipleOf"), NOT_VALUES: (None, "enum"),
                NOT_INTEGER: ("integer", None)}
        for key, value in schema.items():
            if key in undo:  # a negation's own keyword, negated back
                kind, keyword = undo[key]
                out.append(make({**({"type": kind} if kind else {}), **({keyword: value} if keyword else {})}))
        return out

    # ---- alternatives -------------------------------------------------------------------

    def _alternatives(self, alternatives: list[Alternative], name: str, path: str) -> str | None:
        expressions = []
        for i, leaves in enumerate(alternatives):
            label = name if len(alternatives) == 1 else f"{name}-{i}"
            expression = self._leaves(leaves, label, path)
            if expression is not None:
                expressions.append(expression if len(alternatives) == 1 else self._named(expression, label))
        if not expressions:
            return None
        return " | ".join(dict.fromkeys(expressions))

    def _leaves(self, leaves: list[Part], name: str, path: str) -> str | None:
        """An expression for the values valid under every leaf (no choices among them)."""
        facts = _Facts.of(self, leaves)
        if facts is None:
            return None
        out = []
        for kind in KINDS:
            if kind not in facts.kinds:
                continue
            label = name if len(facts.kinds) == 1 else f"{name}-{kind}"
            expression = self._kind(facts, kind, label, path)
            if expression is not None:
                out.append(expression if len(facts.kinds) == 1 else self._named(expression, label))
        return " | ".join(out) if out else None

    def _kind(self, facts: _Facts, kind: str, name: str, path: str) -> str | None:
        if facts.values is not None:
            return self._values(facts, kind, path)
        if kind == "null":
            return self._primitive("null")
        if kind == "boolean":
            return self._primitive("boolean")
        if kind == "string":
            return self._string(facts, name)
        if kind == "number":
            return self._number(facts, name)
        if kind == "object":
            return self._object(facts, name, path)
        return self._array(facts, name, path)

    def _values(self, facts: _Facts, kind: str, path: str) -> str | None:
        texts = []
        for value in facts.values:
            if _kind_of(value) != kind:
                continue
            if kind == "number":
                if facts.integer and not _integral(value):
                    continue
                text = _canonical_number(value)
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
                text = _compact(value, path)
            texts.append(text)
        if not texts:
            return None
        return f"{_group(' | '.join(gbnf_literal(t) for t in dict.fromkeys(texts)))} space"

    # ---- strings and numbers --------------------------------------------------------------

    def _string(self, facts: _Facts, name: str) -> str | None:
        language = facts.string_language(force=False)
        if language is None:  # lengths at most: any spelling, escapes too
            low, high = facts.lengths
            if low == 0 and high is None:
                return self._primitive("string")
            self._primitive("char"), self._primitive("space")
            return _sequence(r'"\""', _repeat("char", low, high), r'"\""', "space")
        if language.is_empty():
            return None
        self._primitive("space"), self._primitive(JSON_CONTROL)
        body = language.rules(self._reserve, self._define, name, json_string)
        return _sequence(r'"\""', body if body != '""' else "", r'"\""', "space")

    def _reserve(self, name: str) -> str:
        return self._add_rule(name, None)

    def _number(self, facts: _Facts, name: str) -> str | None:
        language = facts.number_language()
        if language is None:
            return self._primitive("integer" if facts.integer else "number")
        if language.is_empty():
            return None
        self._primitive("space")
        return _sequence(language.rules(self._reserve, self._define, name, plain), "space")

    # ---- objects --------------------------------------------------------------------------

    def _object(self, facts: _Facts, name: str, path: str) -> str | None:
        shape = _ObjectShape(self, facts.leaves, name, path)
        return shape.expression()

    # ---- arrays ---------------------------------------------------------------------------

    def _array(self, facts: _Facts, name: str, path: str) -> str | None:
        shape = _ArrayShape(self, facts.leaves, name, path)
        return shape.expression()

    # ---- oneOf ----------------------------------------------------------------------------

    def _check_disjoint(self, options: list[list[Alternative]], where: str) -> None:
        """ValueError unless no value is valid under two of the options."""
        summaries = [[_Facts.of(self, alt) for alt in option] for option in options]
        for i in range(len(options)):
            for j in range(i + 1, len(options)):
                for a in summaries[i]:
                    for b in summaries[j]:
                        if a is None or b is None:
                            continue
                        overlap = a.overlap(b)
                        if overlap:
                            raise ValueError(f"json schema: 'oneOf' at {where}: branches {i} and {j} may both "
                                             f"match {overlap} (a grammar cannot say 'exactly one'; make the "
                                             "branches disjoint, e.g. by type, const or a discriminator property)")

    # ---- automata -----------------------------------------------------------------------

    def dfa(self, key: tuple, build) -> DFA:
        if key not in self._dfa_cache:
            self._dfa_cache[key] = build()
        return self._dfa_cache[key]

    def pattern_dfa(self, pattern: Any, path: str) -> DFA:
        if not isinstance(pattern, str):
            raise ValueError(f"json schema: 'pattern' at {path} must be a string")

        def build() -> DFA:
            try:
                return DFA.from_search(pattern, portable=True)
            except ValueError as e:
                raise ValueError(f"json schema: 'pattern' at {path}: {str(e).removeprefix('json schema: ')}") from e

        return self.dfa(("pattern", pattern), build)

    def format_dfa(self, name: str) -> DFA:
        return self.dfa(("format", name), lambda: DFA.from_regex(FORMATS[name]))

    def name_language(self, leaf: Part) -> DFA:
        """The keys `propertyNames` of `leaf` allows."""
        part = _at(leaf, leaf.schema["propertyNames"], f"{leaf.path}/propertyNames")

        def build() -> DFA:
            language = DFA.empty()
            for alternative in self._expand([part], frozenset()):
                facts = _Facts.of(self, alternative)
                if facts is not None and "string" in facts.kinds:
                    if facts.values is not None:
                        strings = [v for v in facts.values if isinstance(v, str) and facts.admits(v)]
                        language = language.union(DFA.of_strings(strings))
                    else:
                        language = language.union(facts.string_language(True))
            return language

        return self.dfa(("names", id(leaf.schema), leaf.base), build)

    def finite_values(self, parts: list[Part]) -> list | None:
        """Every value valid under the conjunction, if they are few; None if they are not."""
        out: list = []
        for alternative in self._expand(parts, frozenset()):
            facts = _Facts.of(self, alternative)
            if facts is None:
                continue
            if facts.values is not None:
                candidates = facts.values
            else:
                candidates = []
                for kind in facts.kinds:
                    if kind == "null":
                        candidates.append(None)
                    elif kind == "boolean":
                        candidates += [False, True]
                    elif kind == "string":
                        strings = facts.string_language(True).finite_strings(MAX_UNIQUE_VALUES)
                        if strings is None:
                            return None
                        candidates += strings
                    elif kind == "number":
                        numbers = facts.number_language()
                        spelled = numbers.finite_strings(MAX_UNIQUE_VALUES) if numbers is not None else None
                        if spelled is None:
                            return None
                        candidates += [json.loads(t) for t in spelled]
                    else:
                        return None
            for value in candidates:
                if facts.admits(value) and not any(_json_equal(value, v) and type(value) is type(v) for v in out):
                    out.append(value)
            if len(out) > MAX_UNIQUE_VALUES:
                return None
        return out

    def discriminated(self, mine: list[Part], theirs: list[Part]) -> bool:
        """Whether a property both sides require takes values on one side that it cannot take
        on the other (a discriminator), or one side forbids a property the other requires."""
        def required(leaves: list[Part]) -> set[str]:
            return {k for leaf in leaves for k in _required(leaf.schema, leaf.path)}

        def schemas(leaves: list[Part], key: str) -> list[Part]:
            return [_at(leaf, _schema_map(leaf.schema, "properties", leaf.path)[key], leaf.path)
                    for leaf in leaves if key in _schema_map(leaf.schema, "properties", leaf.path)]

        for a, b in ((mine, theirs), (theirs, mine)):
            for key in required(a):
                if any(p.schema is False for p in schemas(b, key)):
                    return True
        for key in required(mine) & required(theirs):
            left, right = schemas(mine, key), schemas(theirs, key)
            if not left or not right:
                continue
            a, b = self.finite_values(left), self.finite_values(right)
            if a is not None and b is not None and not any(_json_equal(x, y) for x in a for y in b):
                return True
        return False


# ---- merged keywords ------------------------------------------------------------------------


class _Facts:
    """What every leaf of one alternative says, merged per JSON type."""

    def __init__(self, conv: _Converter):
        self.conv = conv
        self.kinds = set(KINDS)
        self.integer = False
        self.not_integer = False
        self.values: list | None = None
        self.excluded: list = []
        self.low: tuple[Fraction, bool] | None = None  # (bound, exclusive)
        self.high: tuple[Fraction, bool] | None = None
        self.multiples: list[Fraction] = []
        self.not_multiples: list[Fraction] = []
        self.lengths: list = [0, None]
        self.patterns: list[tuple[str, str]] = []  # (pattern, path)
        self.not_patterns: list[tuple[str, str]] = []
        self.formats: list[str] = []
        self.leaves: list[Part] = []
        self._strings: DFA | None = None
        self._numbers: Any = ...

    @classmethod
    def of(cls, conv: _Converter, leaves: list[Part]) -> _Facts | None:
        facts = cls(conv)
        for leaf in leaves:
            facts.add(leaf)
        if facts.values is not None:
            facts.kinds &= {_kind_of(v) for v in facts.values}
        if facts.low and facts.high and (facts.low[0] > facts.high[0] or facts.low[0] == facts.high[0]
                                         and (facts.low[1] or facts.high[1])):
            facts.kinds.discard("number")
        return facts if facts.kinds else None

    def add(self, leaf: Part) -> None:
        schema, path = leaf.schema, leaf.path
        self.leaves.append(leaf)
        if "type" in schema:
            kinds, integer = _declared(schema, path)
            self.kinds &= kinds
            self.integer |= integer
        else:
            implied = {k for k, keys in KIND_KEYWORDS.items() if any(_constrains(schema, key) for key in keys)}
            implied |= {"string" for key in (NOT_PATTERN,) if key in schema}
            implied |= {"number" for key in (NOT_MULTIPLE, NOT_INTEGER) if key in schema}
            if implied:
                self.kinds &= implied
        for key in ("enum", "const"):
            if key in schema:
                values = _enum(schema, path) if key == "enum" else [schema["const"]]
                self.values = values if self.values is None else [
                    v for v in self.values if any(_json_equal(v, w) for w in values)]
        self.excluded += schema.get(NOT_VALUES, [])
        self.not_integer |= bool(schema.get(NOT_INTEGER))
        for key in ("minimum", "exclusiveMinimum"):
            if key in schema:
                for bound in _read_bound(_bound(schema, key, path), key != "minimum", up=True):
                    if self.low is None or bound[0] > self.low[0] or bound[0] == self.low[0] and bound[1]:
                        self.low = bound
        for key in ("maximum", "exclusiveMaximum"):
            if key in schema:
                for bound in _read_bound(_bound(schema, key, path), key != "maximum", up=False):
                    if self.high is None or bound[0] < self.high[0] or bound[0] == self.high[0] and bound[1]:
                        self.high = bound
        if "multipleOf" in schema:
            self.multiples.append(_step(schema, path))
        if NOT_MULTIPLE in schema:
            self.not_multiples.append(_fraction(schema[NOT_MULTIPLE]))
        low = _count(schema, "minLength", path, 0)
        high = _count(schema, "maxLength", path, None)
        self.lengths[0] = max(self.lengths[0], low)
        if high is not None:
            self.lengths[1] = high if self.lengths[1] is None else min(self.lengths[1], high)
        if "pattern" in schema:
            self.patterns.append((schema["pattern"], path))
        if NOT_PATTERN in schema:
            self.not_patterns.append((schema[NOT_PATTERN], path))
        if not isinstance(schema.get("format", ""), str):
            raise ValueError(f"json schema: 'format' at {path} must be a string")
        if schema.get("format") in FORMATS:
            self.formats.append(schema["format"])

    # -- strings --

    def string_language(self, force: bool, formats: bool = True) -> DFA | None:
        """The strings allowed, as an automaton; None (unless `force`) when only lengths
        constrain them (those are written with any escapes). `formats=False`: formats read as
        annotations, as validators do by default (for telling `oneOf` branches apart)."""
        if self._strings is not None and formats:
            return self._strings
        excluded = [v for v in self.excluded if isinstance(v, str)]
        if not (force or self.patterns or self.not_patterns or self.formats or excluded):
            return None
        conv = self.conv
        language = DFA.everything()
        for pattern, path in self.patterns:
            language = language.intersect(conv.pattern_dfa(pattern, path))
        for name in self.formats if formats else ():
            language = language.intersect(conv.format_dfa(name))
        for pattern, path in self.not_patterns:
            language = language.difference(conv.pattern_dfa(pattern, path))
        if excluded:
            language = language.difference(DFA.of_strings(excluded))
        low, high = self.lengths
        if (low, high) != (0, None) and not language.is_empty():
            language = language.intersect(DFA.length(low, high))
        if formats:
            self._strings = language
        return language

    # -- numbers --

    def number_language(self) -> DFA | None:
        """The numbers allowed, as an automaton over their plain spelling; None when nothing
        constrains them (the shared `number` or `integer` rule is written)."""
        if self._numbers is not ...:
            return self._numbers
        from .numbers import number_dfa, value_dfa

        excluded = [v for v in self.excluded if _kind_of(v) == "number"]
        if not (self.low or self.high or self.multiples or self.not_multiples or self.not_integer or excluded):
            self._numbers = None
            return None
        bounds = dict(low=self.low and self.low[0], low_exclusive=bool(self.low and self.low[1]),
                      high=self.high and self.high[0], high_exclusive=bool(self.high and self.high[1]))
        language = number_dfa(integer=self.integer, multiples=tuple(self.multiples), **bounds)
        for step in self.not_multiples:
            language = language.difference(number_dfa(integer=self.integer, multiples=(step,), **bounds))
        if self.not_integer:
            language = language.difference(number_dfa(integer=True, **bounds))
        for value in excluded:
            language = language.difference(value_dfa(_fraction(value)))
        self._numbers = language
        return language

    # -- objects and arrays --

    def has_structure(self, kind: str) -> bool:
        keys = OBJECT_KEYWORDS if kind == "object" else ARRAY_KEYWORDS
        return any(k in leaf.schema for leaf in self.leaves for k in keys)

    # -- oneOf --

    def overlap(self, other: _Facts) -> str:
        """'' if no value is valid under both, else what may be."""
        for kind in KINDS:
            if kind not in self.kinds or kind not in other.kinds:
                continue
            if self.values is not None or other.values is not None:
                mine = [v for v in (self.values if self.values is not None else other.values) if _kind_of(v) == kind]
                theirs = other if self.values is not None else self
                for value in mine:
                    if theirs.admits(value, formats=False):
                        return f"the value {_compact(value, '')}"
                continue
            if kind in ("null", "boolean"):
                return f"{kind}s" if kind == "boolean" else "null"
            if kind == "string":
                both = self.string_language(True, formats=False).intersect(other.string_language(True, formats=False))
                if not both.is_empty():
                    return "strings"
            elif kind == "number":
                if not self._numbers_apart(other):
                    return "numbers"
            elif kind == "object":
                if not self.conv.discriminated(self.leaves, other.leaves):
                    return "objects"
            elif not self._arrays_apart(other):
                return "arrays"
        return ""

    def admits(self, value: Any, formats: bool = True) -> bool:
        """Whether `value` may be valid here (exact for scalars; objects and arrays: maybe);
        `formats=False`: formats read as annotations."""
        kind = _kind_of(value)
        if kind not in self.kinds or any(_json_equal(value, v) for v in self.excluded):
            return False
        if self.values is not None and not any(_json_equal(value, v) for v in self.values):
            return False
        if kind == "string":
            return self.string_language(True, formats).accepts(value)
        if kind == "number":
            if self.integer and not _integral(value):
                return False
            language = self.number_language()
            return language is None or language.accepts(_canonical_number(value))
        return True

    def _numbers_apart(self, other: _Facts) -> bool:
        if self.integer and other.not_integer or other.integer and self.not_integer:
            return True
        for a, b in ((self, other), (other, self)):
            if a.high and b.low and (a.high[0] < b.low[0] or a.high[0] == b.low[0] and (a.high[1] or b.low[1])):
                return True
        return False

    def _arrays_apart(self, other: _Facts) -> bool:
        def counts(facts: _Facts) -> tuple[int, float]:
            low = max([_count(l.schema, "minItems", l.path, 0) for l in facts.leaves] or [0])
            highs = [_count(l.schema, "maxItems", l.path, None) for l in facts.leaves]
            return low, min([h for h in highs if h is not None] or [math.inf])

        (a_low, a_high), (b_low, b_high) = counts(self), counts(other)
        return a_high < b_low or b_high < a_low


# ---- objects ----------------------------------------------------------------------------------


class _ObjectShape:
    """The members of an object: the named keys in order, then extra pairs, written by rules
    that count what `minProperties`, `maxProperties` and `dependentRequired` need."""

    def __init__(self, conv: _Converter, leaves: list[Part], name: str, path: str):
        self.conv, self.leaves, self.name, self.path = conv, leaves, name, path

    def expression(self) -> str | None:
        conv, leaves, name, path = self.conv, self.leaves, self.name, self.path
        named: dict[str, None] = {}
        required: set[str] = set()
        needs: dict[str, set[str]] = {}
        low, high = 0, None
        for leaf in leaves:
            s, p = leaf.schema, leaf.path
            named.update(dict.fromkeys(_schema_map(s, "properties", p)))
            for key in _required(s, p):
                named.setdefault(key)
                required.add(key)
            for key, others in _dependent_required(s, p).items():
                named.setdefault(key)
                named.update(dict.fromkeys(others))
                needs.setdefault(key, set()).update(others)
            low = max(low, _count(s, "minProperties", p, 0))
            top = _count(s, "maxProperties", p, None)
            high = top if high is None else high if top is None else min(high, top)
        if high is not None and low > high:
            return None
        extras_said = any(k in leaf.schema for leaf in leaves for k in EXTRA_KEYWORDS)
        open_ = extras_said or not any("properties" in leaf.schema and id(leaf.schema) not in conv.made
                                       for leaf in leaves)
        if not named and open_ and low == 0 and high is None and not extras_said:
            return conv._primitive("object")
        pairs = []  # (key, kv rule or None, required)
        for key in named:
            value = self._named_value(key)
            if value is None and key in required:
                return None
            kv = None
            if value is not None:
                literal = gbnf_literal(json.dumps(key, ensure_ascii=False))
                kv = conv._add_rule(f"{name}-{_slug(key) or 'property'}-kv", f'{literal} space ":" space {value}')
            pairs.append((key, kv, key in required))
        extra = self._extra_pair(set(named)) if open_ else None
        if low > sum(1 for _, kv, _ in pairs if kv):
            raise ValueError(f"json schema: 'minProperties' at {path} is {low}, more than the {len(pairs)} "
                             "properties the schema names (a grammar cannot keep extra keys distinct)")
        return self._members(pairs, extra, low, high, needs)

    def _named_value(self, key: str) -> str | None:
        """The rule for the value of `key`, or None if the key cannot appear."""
        conv = self.conv
        parts: list[Part] = []
        evaluated: list[Part] = []  # the annotating leaves that evaluate the key
        for leaf in self.leaves:
            s, p = leaf.schema, leaf.path
            properties = _schema_map(s, "properties", p)
            listed = key in properties
            if listed:
                parts.append(_at(leaf, properties[key], f"{p}/properties/{_pointer(key)}"))
            # Every pattern the key matches applies too, listed or not.
            matched = [(pattern, sub) for pattern, sub in _schema_map(s, "patternProperties", p).items()
                       if conv.pattern_dfa(pattern, f"{p}/patternProperties").accepts(key)]
            parts += [_at(leaf, sub, f"{p}/patternProperties/{_pointer(pattern)}") for pattern, sub in matched]
            if not listed and not matched and "additionalProperties" in s:
                parts.append(_at(leaf, s["additionalProperties"], f"{p}/additionalProperties"))
            if listed or matched or "additionalProperties" in s:
                evaluated.append(leaf)
            if "propertyNames" in s and not conv.name_language(leaf).accepts(key):
                return None
        parts += self._unevaluated(evaluated)
        return conv._conjunction(parts, f"{self.name}-{_slug(key) or 'property'}", self.path) if parts else \
            conv._primitive("value")

    def _unevaluated(self, evaluated: list[Part]) -> list[Part]:
        """The `unevaluatedProperties` schemas that apply to a key the `evaluated` leaves saw."""
        out = []
        for leaf in self.leaves:
            if "unevaluatedProperties" in leaf.schema and not any(
                    e.annotating and (e is leaf or id(leaf.schema) in e.owners) for e in evaluated):
                out.append(_at(leaf, leaf.schema["unevaluatedProperties"], f"{leaf.path}/unevaluatedProperties"))
        return out

    def _extra_pair(self, named: set[str]) -> str | None:
        """The rule for one `"key": value` pair whose key is not named, or None if none can be."""
        conv, name = self.conv, self.name
        start = DFA.everything().difference(DFA.of_strings(named)) if named else DFA.everything()
        classes: list[tuple[DFA, list[Part], list[Part]]] = [(start, [], [])]  # keys, schemas, evaluators
        for leaf in self.leaves:
            s, p = leaf.schema, leaf.path
            if "propertyNames" in s:
                names = conv.name_language(leaf)
                classes = [(k.intersect(names), ps, ev) for k, ps, ev in classes]
                classes = [c for c in classes if not c[0].is_empty()]
            patterns = _schema_map(s, "patternProperties", p)
            if not patterns and "additionalProperties" not in s:
                continue
            split = []
            for keys, parts, evaluators in classes:
                pieces = [(keys, parts, evaluators, False)]
                for pattern, sub in patterns.items():
                    language = conv.pattern_dfa(pattern, f"{p}/patternProperties")
                    step = []
                    for k, ps, ev, matched in pieces:
                        inside, outside = k.intersect(language), k.difference(language)
                        sub_part = _at(leaf, sub, f"{p}/patternProperties/{_pointer(pattern)}")
                        if not inside.is_empty():
                            step.append((inside, ps + [sub_part], ev + [leaf], True))
                        if not outside.is_empty():
                            step.append((outside, ps, ev, matched))
                    pieces = step
                for k, ps, ev, matched in pieces:
                    if not matched and "additionalProperties" in s:
                        ps = ps + [_at(leaf, s["additionalProperties"], f"{p}/additionalProperties")]
                        ev = ev + [leaf]
                    split.append((k, ps, ev))
            classes = split
            if len(classes) > MAX_KEY_CLASSES:
                raise ValueError(f"json schema: 'patternProperties' at {p} splits the keys into more than "
                                 f"{MAX_KEY_CLASSES} classes")
        alternatives = []
        for i, (keys, parts, evaluators) in enumerate(classes):
            parts = parts + self._unevaluated(evaluators)
            label = f"{name}-additional" if len(classes) == 1 else f"{name}-additional-{i}"
            value = conv._conjunction(parts, f"{label}-value", self.path) if parts else conv._primitive("value")
            if value is None:
                continue
            if not named and keys.size == 1 and keys.accepts("") and keys.edges[0] == ((0, 0x10FFFF, 0),):
                key = conv._primitive("string")
            else:
                conv._primitive(JSON_CONTROL)
                body = keys.rules(conv._reserve, conv._define, f"{label}-k", json_string)
                key = conv._add_rule(f"{label}-key", _sequence(r'"\""', body if body != '""' else "", r'"\""',
                                                               "space"))
            alternatives.append(f'{key} ":" space {value}')
        if not alternatives:
            return None
        return conv._add_rule(f"{name}-additional-kv", " | ".join(alternatives))

    def _members(self, pairs: list, extra: str | None, low: int, high: int | None,
                 needs: dict[str, set[str]]) -> str:
        """Rules that write the members: state (next named key, named keys written (up to
        `low`), pairs written (while `high` counts), keys written that dependencies are about,
        whether a pair came before)."""
        conv, name = self.conv, self.name
        watched = sorted({k for k in needs} | {o for others in needs.values() for o in others})
        bit = {key: 1 << i for i, key in enumerate(watched)}
        n = len(pairs)

        def satisfied(mask: int) -> bool:
            return all(not mask & bit[k] or all(mask & bit[o] for o in others) for k, others in needs.items())

        def moves(state):
            i, got, total, mask, first = state
            if i < n:
                key, kv, needed = pairs[i]
                if not needed:
                    yield None, (i + 1, got, total, mask, first)
                if kv is not None and (high is None or total < high):
                    yield kv, (i + 1, min(got + 1, low), total + 1 if high is not None else 0,
                               mask | bit.get(key, 0), False)
            elif extra is not None and (high is None or total < high):
                yield extra, (i, got, total + 1 if high is not None else 0, mask, False)

        def final(state) -> bool:
            i, got, _, mask, _ = state
            return i == n and got >= low and satisfied(mask)

        start = (0, 0, 0, 0, True)
        states = _explore(start, moves, f"the object at {self.path}", "properties")
        body = _state_rules(conv, f"{name}-members", start, states, final,
                            lambda state, kv: kv if state[4] else f'"," space {kv}')
        return None if body is None else _sequence('"{" space', _group(body), '"}" space')


def _state_rules(conv: _Converter, name: str, start, states: dict, final, write) -> str | None:
    """Rules for a little automaton over members: `states` maps a state to its moves (item or
    None for an empty move, next state); `final(state)` says whether the members may end
    there, `write(state, item)` spells an item written from a state (its comma). One rule per
    state that can still end; the start's body is returned (None if it cannot end)."""
    live = _live(states, final)
    if start not in live:
        return None
    names: dict = {}
    order = [start]
    bodies: dict = {}
    while order:
        state = order.pop(0)
        options = []
        for item, nxt in states[state]:
            if nxt not in live:
                continue
            head = "" if item is None else write(state, item)
            follow = ""
            if states[nxt] and any(n in live for _, n in states[nxt]):
                if nxt not in names:
                    names[nxt] = conv._reserve(f"{name}-{len(names) + 1}")
                    order.append(nxt)
                follow = names[nxt]
            options.append(_sequence(head, follow))
        if final(state):
            options.append('""')
        bodies[state] = " | ".join(dict.fromkeys(options))
    for state, rule in names.items():
        conv._define(rule, bodies[state])
    return bodies[start] if start not in names else names[start]


def _explore(start, moves, what: str, counted: str) -> dict:
    """Every state reachable from `start`, with its moves (`moves(state)` yields (item,
    next state) pairs); ValueError past MAX_MEMBER_STATES."""
    states, order, seen = {}, [start], {start}
    while order:
        state = order.pop()
        states[state] = list(moves(state))
        for _, nxt in states[state]:
            if nxt not in seen:
                seen.add(nxt)
                order.append(nxt)
                if len(seen) > MAX_MEMBER_STATES:
                    raise ValueError(f"json schema: {what} needs more than {MAX_MEMBER_STATES} states to count "
                                     f"its {counted}")
    return states


def _live(states: dict, final) -> set:
    """The states from which a final state can be reached."""
    return reaching({s: [nxt for _, nxt in moves] for s, moves in states.items()}, [s for s in states if final(s)])


# ---- arrays -----------------------------------------------------------------------------------


class _ArrayShape:
    """The items of an array: each position's conjunction, and the rules that count what
    `minItems`, `maxItems`, `contains` and `uniqueItems` need."""

    def __init__(self, conv: _Converter, leaves: list[Part], name: str, path: str):
        self.conv, self.leaves, self.name, self.path = conv, leaves, name, path

    def expression(self) -> str | None:
        conv, leaves, name, path = self.conv, self.leaves, self.name, self.path
        low, high = 0, None
        for leaf in leaves:
            s, p = leaf.schema, leaf.path
            low = max(low, _count(s, "minItems", p, 0))
            top = _count(s, "maxItems", p, None)
            high = top if high is None else high if top is None else min(high, top)
        if high is not None and low > high:
            return None
        prefix_length = max([len(_schema_list(l.schema, "prefixItems", l.path, empty=True)) for l in leaves] or [0])
        clauses = []  # (contains part, low, high, leaf)
        for leaf in leaves:
            s, p = leaf.schema, leaf.path
            if "contains" in s:
                c_low = _count(s, "minContains", p, 1)
                c_high = _count(s, "maxContains", p, None)
                if c_low == 0 and c_high is None:
                    continue
                clauses.append((_at(leaf, s["contains"], f"{p}/contains"), c_low, c_high, leaf))
        unique = any(l.schema.get("uniqueItems") is True for l in leaves) and (high is None or high > 1)
        unevaluated = [l for l in leaves if "unevaluatedItems" in l.schema]
        if not any("items" in l.schema or "prefixItems" in l.schema for l in leaves) and not (
                clauses or unique or unevaluated) and low == 0 and high is None:
            return conv._primitive("array")
        if len(clauses) > 4:
            raise ValueError(f"json schema: 'contains' at {path}: more than 4 of them apply to one array")
        positions = max(prefix_length, low, high if high is not None else 0) if high is not None else max(
            prefix_length, low)
        if unique and clauses:
            raise ValueError(f"json schema: 'uniqueItems' next to 'contains' at {path} is not supported")
        if not clauses and not unique and not unevaluated:
            return self._simple(prefix_length, low, high)
        return self._counted(prefix_length, positions, low, high, clauses, unique, unevaluated)

    def _position_parts(self, i: int) -> tuple[list[Part], list[Part]]:
        """The schemas for the item at position `i`, and the leaves that evaluate it there."""
        parts, evaluators = [], []
        for leaf in self.leaves:
            s, p = leaf.schema, leaf.path
            prefix = _schema_list(s, "prefixItems", p, empty=True)
            if i < len(prefix):
                parts.append(_at(leaf, prefix[i], f"{p}/prefixItems/{i}"))
                evaluators.append(leaf)
            elif "items" in s:
                parts.append(_at(leaf, s["items"], f"{p}/items"))
                evaluators.append(leaf)
        return parts, evaluators

    def _item(self, parts: list[Part], label: str) -> str | None:
        return self.conv._conjunction(parts, label, self.path) if parts else self.conv._primitive("value")

    def _simple(self, prefix_length: int, low: int, high: int | None) -> str | None:
        rules = []
        for i in range(prefix_length if high is None else min(prefix_length, high)):
            rule = self._item(self._position_parts(i)[0], f"{self.name}-tuple-{i}")
            if rule is None:
                high = i
                break
            rules.append(rule)
        if high is not None and low > high:
            return None
        more = high is None or high > len(rules)
        item = self._item(self._position_parts(len(rules))[0], f"{self.name}-item") if more else None
        if item is None and more:
            if low > len(rules):
                return None
            high = len(rules)
        return _sequence('"[" space', _array_elements(rules, item, low, high), '"]" space')

    def _counted(self, prefix_length, positions, low, high, clauses, unique, unevaluated) -> str | None:
        conv, name = self.conv, self.name
        negations = []
        for part, _, c_high, _ in clauses:
            negations.append(_at_made(part, conv._negate(part, frozenset())) if c_high is not None else None)
        caps = [c_high + 1 if c_high is not None else c_low for _, c_low, c_high, _ in clauses]
        values: list[str] | None = None
        alternatives_at: dict[int, list[tuple[str, tuple[int, ...], int]]] = {}  # position -> (rule, adds, value bit)

        def alternatives(i: int):
            if i in alternatives_at:
                return alternatives_at[i]
            base, evaluators = self._position_parts(i)
            label = f"{name}-tuple-{i}" if i < prefix_length else f"{name}-item"
            out = []
            for subset in range(1 << len(clauses)):
                parts = list(base)
                adds = tuple((subset >> j) & 1 for j in range(len(clauses)))
                for j, (part, _, _, _) in enumerate(clauses):
                    if adds[j]:
                        parts.append(part)
                    elif negations[j] is not None:
                        parts.append(negations[j])
                for leaf in unevaluated:
                    seen_here = any(e.annotating and (e is leaf or id(leaf.schema) in e.owners) for e in evaluators)
                    counted = any(adds[j] and c[3].annotating and (c[3] is leaf or id(leaf.schema) in c[3].owners)
                                  for j, c in enumerate(clauses))
                    if not seen_here and not counted:
                        parts.append(_at(leaf, leaf.schema["unevaluatedItems"], f"{leaf.path}/unevaluatedItems"))
                if unique:
                    for text in self._finite_texts(parts, i):
                        out.append((gbnf_literal(text) + " space", adds, text))
                    continue
                rule = self._item(parts, label if not clauses else f"{label}-{subset}")
                if rule is not None:
                    out.append((rule, adds, None))
            alternatives_at[i] = out
            return out

        texts: dict[str, int] = {}

        def moves(state):
            i, counts, used = state
            if high is not None and i >= high:
                return
            for rule, adds, text in alternatives(min(i, positions)):
                bit = 0
                if text is not None:
                    bit = 1 << texts.setdefault(text, len(texts))
                    if used & bit:
                        continue
                new_counts = tuple(min(c + a, cap) for c, a, cap in zip(counts, adds, caps))
                if any(c_high is not None and c > c_high for c, (_, _, c_high, _) in zip(new_counts, clauses)):
                    continue
                # Past every position that differs, one state (but past the first: a comma).
                yield rule, (i + 1 if high is not None else min(i + 1, max(positions, 1)), new_counts, used | bit)

        start = (0, (0,) * len(clauses), 0)
        states = _explore(start, moves, f"the array at {self.path}", "items")

        def final(state) -> bool:
            i, counts, _ = state
            return i >= low and all(c >= c_low for c, (_, c_low, _, _) in zip(counts, clauses))

        body = _state_rules(conv, f"{name}-items", start, states, final,
                            lambda state, item: item if state[0] == 0 else f'"," space {item}')
        return None if body is None else _sequence('"[" space', _group(body), '"]" space')

    def _finite_texts(self, parts: list[Part], i: int) -> list[str]:
        values = self.conv.finite_values(parts)
        if values is None or len(values) > MAX_UNIQUE_VALUES:
            raise ValueError(f"json schema: 'uniqueItems' at {self.path}: the items can take more than "
                             f"{MAX_UNIQUE_VALUES} values, and a grammar cannot keep unboundedly many apart")
        return [_compact(v, self.path) if _kind_of(v) != "number" else _canonical_number(v) for v in values]


def _at(leaf: Part, schema: Any, path: str) -> Part:
    """A subschema of `leaf` at a new place of the instance (a property's value, an item)."""
    return Part(schema, leaf.base, path, leaf.scope, leaf.annotating)


def _at_made(part: Part, schema: Any) -> Part:
    return Part(schema, part.base, part.path, part.scope, False, part.owners)


# ---- keyword values -----------------------------------------------------------------------

ANNOTATIONS = frozenset({"title", "description", "examples", "default", "$schema", "$id", "$comment",
                         "deprecated", "readOnly", "writeOnly", "$anchor", "$dynamicAnchor", "$defs",
                         "definitions", "$vocabulary", "contentEncoding", "contentMediaType", "contentSchema"})


def _trivial(schema: Any) -> bool:
    """Whether `schema` allows every value (true, or annotations only)."""
    return schema is True or isinstance(schema, dict) and all(isinstance(k, str) and k in ANNOTATIONS
                                                              for k in schema)


def _only_ref(schema: Any) -> bool:
    """Whether `schema` is a `$ref` and annotations only."""
    return isinstance(schema, dict) and "$ref" in schema and all(
        k == "$ref" or (isinstance(k, str) and k in ANNOTATIONS) for k in schema)


def _constrains(schema: dict, key: str) -> bool:
    """Whether `key` is in `schema` and narrows the language (an unknown `format` does not)."""
    return key in schema and (key != "format" or schema[key] in FORMATS)


def _check_schema(value: Any, path: str) -> None:
    """ValueError unless `value` is a schema: an object or a boolean."""
    if not isinstance(value, (dict, bool)):
        raise ValueError(f"json schema: the schema at {path} is of type {type(value).__name__}, "
                         "not an object or a boolean")


def _check_keywords(schema: dict, path: str) -> None:
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
            _schema_map(schema, key, path, check=True)
    for key in SINGLE_SCHEMAS:
        if key in schema:
            _check_schema(schema[key], f"{path}/{key}")
    for key in SCHEMA_LISTS:
        if key in schema:
            _schema_list(schema, key, path, empty=key == "prefixItems")
    if not isinstance(schema.get("format", ""), str):
        raise ValueError(f"json schema: 'format' at {path} must be a string")
    for low, high in (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"),
                      ("minContains", "maxContains"), ("minimum", "maximum")):
        if low in schema and high in schema:
            check = _bound if low == "minimum" else lambda s, k, p: _count(s, k, p, 0)
            if check(schema, low, path) > check(schema, high, path):
                raise ValueError(f"json schema: {low!r} at {path} is greater than {high!r}")
    if "uniqueItems" in schema and not isinstance(schema["uniqueItems"], bool):
        raise ValueError(f"json schema: 'uniqueItems' at {path} must be true or false")


def _schema_map(schema: dict, key: str, path: str, check: bool = False) -> dict:
    """The object of schemas under `key` ({} if absent); `check`: each value is checked too."""
    value = schema.get(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"json schema: {key!r} at {path} must be an object whose values are "
                         f"schemas (objects or booleans), got {type(value).__name__}")
    if check:
        for name, sub in value.items():
            if not isinstance(sub, (dict, bool)):
                _check_schema(sub, f"{path}/{key}/{_pointer(name)}")
    return value


def _schema_list(schema: dict, key: str, path: str, empty: bool = True) -> list:
    """The list of schemas under `key` ([] if absent); `empty=False`: it may not be empty."""
    if key not in schema:
        return []
    value = schema[key]
    if not isinstance(value, list) or (not value and not empty):
        raise ValueError(f"json schema: {key!r} at {path} must be a {'' if empty else 'non-empty '}list of "
                         f"schemas, got {type(value).__name__ if not isinstance(value, list) else 'an empty list'}")
    for i, sub in enumerate(value):
        _check_schema(sub, f"{path}/{key}/{i}")
    return value


def _required(schema: dict, path: str) -> list[str]:
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValueError(f"json schema: 'required' at {path} must be a list of strings")
    return required


def _dependent_required(schema: dict, path: str) -> dict[str, list[str]]:
    value = schema.get("dependentRequired", {})
    if not isinstance(value, dict) or not all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in value.values()):
        raise ValueError(f"json schema: 'dependentRequired' at {path} must be an object of lists of strings")
    return value


def _declared(schema: dict, path: str) -> tuple[set[str], bool]:
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


def _enum(schema: dict, path: str) -> list:
    values = schema["enum"]
    if not isinstance(values, list) or not values:
        raise ValueError(f"json schema: 'enum' at {path} must be a non-empty list")
    return values


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


def _bound(schema: dict, key: str, path: str) -> int | float:
    value = schema[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"json schema: {key!r} at {path} must be a finite number")
    return value


def _step(schema: dict, path: str) -> Fraction:
    value = _bound(schema, "multipleOf", path)
    if value <= 0:
        raise ValueError(f"json schema: 'multipleOf' at {path} must be greater than 0, got {value!r}")
    return _fraction(value)


def _read_bound(value: int | float, exclusive: bool, up: bool) -> list[tuple[Fraction, bool]]:
    """A lower (`up`) or upper bound as constraints on the exact decimal a text spells, such
    that the text also passes where JSON parsers read numbers as binary doubles: its decimal
    reading; for a float beyond 2**53 its binary value (integers are compared with it exactly);
    and for an exclusive bound, the double next to it (a decimal just past the bound may read
    as the bound itself) where decimals of at most MAX_DIGITS fraction digits lie between."""
    bounds = [(_fraction(value), exclusive)]
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


def _fraction(value: Any) -> Fraction:
    """A JSON number as the exact decimal it was written as (floats by their shortest repr)."""
    return Fraction(value) if isinstance(value, (int, Fraction)) else Fraction(repr(float(value)))


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _integral(value: Any) -> bool:
    return isinstance(value, int) or isinstance(value, float) and value.is_integer()


def _canonical_number(value: Any) -> str:
    from .numbers import canonical

    return canonical(value)


def _compact(value: Any, path: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError as e:
        raise ValueError(f"json schema: a value of 'enum' or 'const' at {path} is not JSON: {e}") from e


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
