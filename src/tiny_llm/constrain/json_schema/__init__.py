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
  the number's plain spelling (`constrain/numbers.py`);
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

The package, stage by stage: `vocabulary` (the keywords known and refused), `keywords` (each
keyword's value read and checked), `values` (JSON equality), `specs` (a schema's keywords read
into typed specs: what it says of scalars, of objects, of arrays), `part` and `references` (a
schema in place, `$ref` resolution), `conjunction` and `negation` (the algebra: `allOf`,
choices, `not`), `facts` (an alternative merged per type), `oneof` (disjoint branches),
`scalars`, `objects`, `arrays` and `members` (the rules per type), `rules` (the GBNF table),
`compiler` (the stages joined; `json_schema_to_gbnf`), `recursion` (the recursion limit
while compiling).

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from .compiler import json_schema_to_gbnf
from .values import json_equal

__all__ = ["json_equal", "json_schema_to_gbnf"]
