"""JSON schema compiler, property-based: on generated schemas the grammar never accepts a text
whose value JSON Schema rejects (soundness), and on a narrower family it accepts the canonical
text of every valid instance (completeness).

Schemas are drawn from the keywords the compiler is meant to handle; those it refuses
(`ValueError`) are counted, and most must compile. The texts tried on each schema come from
values shaped like the schema (spelled canonically, with `json.dumps`, and with `\\u` escapes)
and from random walks through the grammar's own automaton. Hypothesis runs derandomized: every
run draws the same examples.
"""

import json
import math
import random

import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import providers

from tiny_llm.constrain import Grammar
from tiny_llm.constrain.grammar import Automaton

from conftest import FUZZ_FULL
from conftest import examples as scaled
from test_json_schema_keywords import canonical_text, escape_all, is_valid, text_is_valid

# No shrinking: each step compiles a schema again, and a failure's first example (with its
# schema in the notes) is readable as it is.
RUNS = settings(derandomize=True, database=None, deadline=None, phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])
# The share of generated schemas that must compile (or contradict themselves): with the
# fixture below, 62 of 62 scalar, 52 of 54 object, 55 of 56 array and 74 of 76 nested schemas,
# in any process.
COMPILED_AT_LEAST = 0.9


@pytest.fixture(autouse=True)
def same_examples_in_any_process(monkeypatch):
    """Hypothesis mixes the literals of every project module loaded so far into what it draws,
    so derandomized runs would still differ with what ran before in the process; without
    those literals every run draws the same examples, alone or in a worker of `make test`."""
    monkeypatch.setattr(providers, "_get_local_constants", providers.Constants)
    providers.CONSTANTS_CACHE.cache.clear()  # the constants it picked from before
    yield
    providers.CONSTANTS_CACHE.cache.clear()

# ---- schemas from the supported keywords ----------------------------------------------------

NAMES = ["a", "b", "id", "x_1", "é"]
KEY_PATTERNS = ["^x", "_1$", "^[a-c]+$"]
STRING_PATTERNS = ["^[a-c]*$", "^x", "[0-9]", "^[a-z]{1,3}$"]
INTEGER_BOUNDS = st.integers(-30, 30) | st.sampled_from([-10**20, 10**20])
NUMBER_BOUNDS = st.sampled_from([-10, -2.5, -1, -0.5, 0, 0.25, 0.5, 1, 1.5, 3, 7.25, 100, 10**20])
POOL = ["a", "b", "", "é😀", 0, 1, -1.5, 2.5, True, False, None, [1], {"k": "v"}]


def sometimes(p: float = 0.3):
    """A boolean that is True about `p` of the time (and shrinks to False)."""
    return st.integers(0, 99).map(lambda n: n < p * 100)


@st.composite
def bounds(draw, values) -> dict:
    lo, hi = sorted(draw(st.lists(values, min_size=2, max_size=2)))
    out = {}
    for value, inclusive, exclusive in ((lo, "minimum", "exclusiveMinimum"), (hi, "maximum", "exclusiveMaximum")):
        side = draw(st.sampled_from(["none", "inclusive", "exclusive"]))
        if side != "none":
            out[inclusive if side == "inclusive" else exclusive] = value
    return out


@st.composite
def integer_schema(draw) -> dict:
    schema = {"type": "integer", **draw(bounds(INTEGER_BOUNDS))}
    if draw(sometimes()):
        schema["multipleOf"] = draw(st.sampled_from([2, 3, 7]))
    return schema


@st.composite
def number_schema(draw) -> dict:
    schema = {"type": "number", **draw(bounds(NUMBER_BOUNDS))}
    if draw(sometimes()):
        schema["multipleOf"] = draw(st.sampled_from([0.5, 0.25, 2.5, 3]))  # exact in binary
    return schema


@st.composite
def string_schema(draw) -> dict:
    kind = draw(st.sampled_from(["lengths", "pattern", "enum", "format"]))
    if kind == "enum":
        return {"type": "string", "enum": draw(st.lists(st.sampled_from(["a", "b", "", "é😀", "x1"]),
                                                         min_size=1, max_size=3, unique=True))}
    if kind == "format":
        return {"type": "string", "format": draw(st.sampled_from(["date", "uuid", "date-time", "time"]))}
    schema = {"type": "string"}
    if kind == "pattern":
        schema["pattern"] = draw(st.sampled_from(STRING_PATTERNS))
    lo, hi = sorted(draw(st.lists(st.integers(0, 4), min_size=2, max_size=2)))
    if draw(st.booleans()):
        schema["minLength"] = lo
    if draw(st.booleans()):
        schema["maxLength"] = hi
    return schema


def enum_schema():
    return (st.lists(st.sampled_from(POOL), min_size=1, max_size=4, unique_by=json.dumps).map(lambda v: {"enum": v})
            | st.sampled_from(POOL).map(lambda v: {"const": v}))


def typed(kind: str):
    """A leaf schema of one type."""
    return {"integer": integer_schema(), "number": number_schema(), "string": string_schema(),
            "boolean": st.just({"type": "boolean"}), "null": st.just({"type": "null"})}[kind]


LEAVES = st.sampled_from(["integer", "number", "string", "boolean", "null"]).flatmap(typed) | enum_schema()


@st.composite
def object_schema(draw, child) -> dict:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=3))
    schema = {"type": "object", "properties": {name: draw(child) for name in names}}
    required = draw(st.lists(st.sampled_from(names), unique=True)) if names else []
    if required:
        schema["required"] = required
    extra = draw(st.sampled_from(["absent", "false", "true", "schema"]))
    if extra != "absent":
        schema["additionalProperties"] = {"false": False, "true": True}.get(extra) if extra != "schema" else draw(child)
    if draw(sometimes()):
        schema["patternProperties"] = {draw(st.sampled_from(KEY_PATTERNS)): draw(child)}
    if draw(sometimes(0.2)):
        schema["propertyNames"] = draw(st.sampled_from([{"maxLength": 2}, {"pattern": "^[a-z_]+$"}, {"enum": NAMES}]))
    if draw(sometimes(0.2)):
        schema["minProperties"] = draw(st.integers(0, len(names)))
    if draw(sometimes(0.2)):
        schema["maxProperties"] = draw(st.integers(schema.get("minProperties", 0), 4))
    if len(names) >= 2 and draw(sometimes(0.2)):
        schema["dependentRequired"] = {names[0]: [names[1]]}
    if names and draw(sometimes(0.15)):
        schema["dependentSchemas"] = {names[0]: {"required": names[-1:]}}
    return schema


@st.composite
def array_schema(draw, child) -> dict:
    schema = {"type": "array"}
    if draw(sometimes(0.3)):
        schema["prefixItems"] = draw(st.lists(child, min_size=1, max_size=2))
    if draw(sometimes(0.8)):
        schema["items"] = draw(child | st.just(False))
    lo, hi = sorted(draw(st.lists(st.integers(0, 3), min_size=2, max_size=2)))
    if draw(st.booleans()):
        schema["minItems"] = lo
    if draw(st.booleans()):
        schema["maxItems"] = hi
    if draw(sometimes(0.25)):
        schema["contains"] = draw(child)
        if draw(st.booleans()):
            schema["minContains"] = draw(st.integers(0, 2))
        if draw(st.booleans()):
            schema["maxContains"] = draw(st.integers(schema.get("minContains", 1), 3))
    if draw(sometimes(0.15)):
        schema["items"] = draw(st.sampled_from([{"enum": ["a", "b", 1]}, {"type": "boolean"}]))
        schema["uniqueItems"] = True
        schema.pop("prefixItems", None)
        schema.pop("contains", None)
    return schema


@st.composite
def combination(draw, child) -> dict:
    kind = draw(st.sampled_from(["anyOf", "allOf", "oneOf-types", "oneOf-tag", "not", "if", "ref",
                                 "unevaluated"]))
    if kind == "anyOf":
        return {"anyOf": draw(st.lists(child, min_size=1, max_size=3))}
    if kind == "allOf":  # two schemas of one type, so that most intersections are not empty
        leaf = draw(st.sampled_from(["integer", "number", "string"]))
        return {"allOf": [draw(typed(leaf)), draw(typed(leaf))]}
    if kind == "oneOf-types":
        kinds = draw(st.lists(st.sampled_from(["integer", "string", "boolean", "null"]), min_size=2, max_size=3,
                              unique=True))
        return {"oneOf": [draw(typed(k)) for k in kinds]}
    if kind == "oneOf-tag":
        tags = draw(st.lists(st.sampled_from(["p", "q", "r"]), min_size=2, max_size=3, unique=True))
        return {"oneOf": [{"type": "object", "properties": {"tag": {"const": t}, "v": draw(child)},
                           "required": ["tag"], "additionalProperties": draw(st.booleans())} for t in tags]}
    if kind == "not":
        leaf = draw(st.sampled_from(["integer", "number", "string"]))
        inner = draw(typed(leaf))
        rest = {k: v for k, v in inner.items() if k != "type"}
        return {"type": leaf, "not": rest} if rest and draw(st.booleans()) else {"not": inner}
    if kind == "if":
        return {"type": "integer", "if": draw(bounds(INTEGER_BOUNDS)),
                "then": draw(integer_schema()), "else": draw(integer_schema())}
    if kind == "ref":
        return {"$ref": "#@", "$defs": {"target": {"$anchor": "@", **draw(child)}}}
    return {"type": "object", "properties": {"a": draw(child)},
            "allOf": [{"properties": {"b": draw(child)}}], "unevaluatedProperties": draw(st.booleans())}


def name_anchors(schema):
    """Give each `#@` reference and its `@` anchor (made by `combination`) a name of its own."""
    count = 0

    def visit(node):
        nonlocal count
        if isinstance(node, list):
            return [visit(item) for item in node]
        if not isinstance(node, dict):
            return node
        node = {k: visit(v) if k not in ("enum", "const") else v for k, v in node.items()}
        if node.get("$ref") == "#@":
            count += 1
            node["$ref"] = f"#t{count}"
            node["$defs"]["target"]["$anchor"] = f"t{count}"
        return node

    return visit(schema)


TREES = st.recursive(LEAVES, lambda child: object_schema(child) | array_schema(child) | combination(child),
                     max_leaves=6)


# ---- candidate texts ------------------------------------------------------------------------

TEXT = st.text(st.sampled_from("abcx01_-é😀\"\\\n"), max_size=6)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-100, 100) | st.sampled_from([0.5, -2.25, 1e20, 3.0]) | TEXT,
    lambda inner: (st.lists(inner, max_size=3)
                   | st.dictionaries(st.sampled_from(NAMES + ["x", "zz"]), inner, max_size=3)),
    max_leaves=5)


def near(values, kind: str):
    """Numbers at and around `values` (bounds, multiples)."""
    out = []
    for v in values:
        if kind == "integer":
            out += [math.floor(v) + d for d in (-2, -1, 0, 1, 2)]
        else:
            out += [v, v - 0.25, v + 0.25, v - 1, v + 1, v + 0.5, -v]
    return st.sampled_from(out) if out else st.integers(-5, 5)


def shaped(schema, anchors: dict, depth: int = 0):
    """Values biased toward `schema`'s shape: its types, bounds, names, lengths and items (valid
    or not: the point is to come close to the edges of what it allows)."""
    if depth > 6 or not isinstance(schema, dict):
        return JSON_VALUES
    options = [JSON_VALUES]
    for key in ("anyOf", "oneOf", "allOf"):
        options += [shaped(sub, anchors, depth + 1) for sub in schema.get(key, [])]
    for key in ("not", "if", "then", "else"):
        if key in schema:
            options.append(shaped(schema[key], anchors, depth + 1))
    if "$ref" in schema and schema["$ref"][1:] in anchors:
        options.append(shaped(anchors[schema["$ref"][1:]], anchors, depth + 1))
    if "enum" in schema:
        options.append(st.sampled_from(schema["enum"]))
    if "const" in schema:
        options.append(st.just(schema["const"]))
    kinds = schema.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else kinds
    numbers = [v for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
               if isinstance(v := schema.get(k), int | float)]
    if "integer" in kinds or "number" in kinds:
        kind = "integer" if "integer" in kinds else "number"
        options.append(near(numbers, kind))
        if "multipleOf" in schema:
            step = schema["multipleOf"]
            options.append(st.integers(-20, 20).map(lambda k: k * step))
    if "string" in kinds:
        options += [TEXT, st.text(st.sampled_from("abcxyz09é😀"), min_size=0, max_size=6),
                    st.sampled_from(["2024-02-29", "2024-13-01", "123e4567-e89b-12d3-a456-426614174000",
                                     "2024-02-29T12:00:00Z", "23:59:59Z", "12:00:00"])]
    if "object" in kinds:
        properties = schema.get("properties", {})
        keys = list(properties) + ["x", "x_1", "abc", "zz", "é"]
        options.append(st.lists(st.sampled_from(keys), unique=True, max_size=4).flatmap(
            lambda ks: st.fixed_dictionaries({k: shaped(properties.get(k, schema.get("additionalProperties")),
                                                        anchors, depth + 1) for k in ks})))
    if "array" in kinds:
        items = [*schema.get("prefixItems", []), schema.get("items"), schema.get("contains")]
        options.append(st.lists(st.one_of([shaped(s, anchors, depth + 1) for s in items]), max_size=4))
    return st.one_of(options)


def anchors_of(schema) -> dict:
    found = {}

    def visit(node):
        if isinstance(node, dict):
            if isinstance(node.get("$anchor"), str):
                found[node["$anchor"]] = node
            for key, value in node.items():
                if key not in ("enum", "const"):
                    visit(value)
        elif isinstance(node, list):
            for item in node:
                visit(item)

    visit(schema)
    return found


def spellings(value, schema) -> list[str]:
    return [canonical_text(value, schema), canonical_text(value, schema, string=escape_all),
            json.dumps(value), json.dumps(value, ensure_ascii=False, separators=(",", ":"))]


ALPHABET = tuple(chr(c) for c in range(0x20, 0x7F)) + ("\n", "\t", "é", "😀", "\u2028")


def walk(grammar: Grammar, rnd: random.Random, limit: int = 100) -> str | None:
    """A random text of the grammar, one character at a time from ALPHABET (those that keep the
    text alive); past half the limit, closing characters are preferred. None if the walk ends
    where the text is not complete."""
    automaton = grammar.automaton
    state, text = automaton.start, []
    while len(text) < limit:
        if automaton.accepting(state) and rnd.random() < 0.3:
            break
        options = [(ch, nxt) for ch in ALPHABET
                   if (nxt := automaton.walk(state, ch.encode())) != Automaton.DEAD]
        if not options:
            break
        if len(text) > limit // 2:
            options = [o for o in options if o[0] in '"]}'] or options
        ch, state = rnd.choice(options)
        text.append(ch)
    return "".join(text) if automaton.accepting(state) else None


def no_duplicate_keys(text: str) -> bool:
    """Whether every object in the (JSON) text has distinct keys: the soundness promise leaves
    out texts with duplicates, which json.loads reads by keeping the last."""
    def pairs(items):
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate key")
        return dict(items)

    try:
        json.loads(text, object_pairs_hook=pairs)
    except ValueError:
        return False
    return True


def check_sound(grammar: Grammar, schema, text: str) -> None:
    if grammar.accepts(text) and no_duplicate_keys(text):
        assert text_is_valid(schema, text), f"accepted, but invalid under {json.dumps(schema)}: {text!r}"


EMPTY = "no JSON value validates"  # random keywords that contradict: nothing to write, nothing refused


def compile_or_none(schema) -> Grammar | bool:
    """The grammar; True if no value validates (nothing to write); False if refused."""
    try:
        return Grammar.from_json_schema(schema)
    except ValueError as e:
        note(f"refused: {e}")
        return EMPTY in str(e)


def run_soundness(strategy, full: int) -> None:
    """Soundness on the `full` schemas of `strategy` (a fifth as many in a quick run,
    `conftest.examples`); at most a tenth of the full corpus may be refused."""
    outcomes: list[bool] = []
    examples = scaled(full)  # a line apart: hypothesis derives its examples from `sound`'s own text

    @settings(RUNS, max_examples=examples)
    @given(strategy.map(name_anchors), st.data(), st.randoms(use_true_random=False))
    def sound(schema, data, rnd):
        note(json.dumps(schema))
        grammar = compile_or_none(schema)
        outcomes.append(grammar is not False)
        if isinstance(grammar, bool):
            return
        anchors = anchors_of(schema)
        for value in data.draw(st.lists(shaped(schema, anchors), min_size=3, max_size=6)):
            for text in spellings(value, schema):
                check_sound(grammar, schema, text)
        for _ in range(4):
            text = walk(grammar, rnd)
            if text is not None:
                check_sound(grammar, schema, text)

    sound()
    compiled = sum(outcomes)
    # In a full run, at least COMPILED_AT_LEAST of the schemas compile. A quick run draws a
    # fifth as many: it may meet as many refusals as a full run allows, no more.
    refused_at_most = (1 - COMPILED_AT_LEAST) * (len(outcomes) if FUZZ_FULL else full)
    assert len(outcomes) - compiled <= refused_at_most, f"{compiled} of {len(outcomes)} schemas compiled"


def test_soundness_on_scalar_schemas():
    run_soundness(LEAVES | combination(LEAVES), 60)


def test_soundness_on_object_schemas():
    run_soundness(object_schema(LEAVES) | object_schema(TREES), 50)


def test_soundness_on_array_schemas():
    run_soundness(array_schema(LEAVES) | array_schema(TREES), 50)


def test_soundness_on_nested_schemas():
    run_soundness(TREES, 60)


def test_walks_reach_complete_texts():
    """The walker itself works: on a small object schema most walks end in accepted texts."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string", "maxLength": 3}},
              "required": ["n"], "additionalProperties": False}
    grammar = Grammar.from_json_schema(schema)
    rnd = random.Random(0)
    texts = [walk(grammar, rnd) for _ in range(40)]
    done = [t for t in texts if t is not None]
    assert len(done) >= 30
    assert all(grammar.accepts(t) and is_valid(schema, json.loads(t)) for t in done)
    assert len(set(done)) >= 10


# ---- completeness on a family with no narrowing -------------------------------------------------

QUARTERS = st.integers(-40, 40).map(lambda n: n / 4)


@st.composite
def exact_integer(draw) -> dict:
    lo = draw(st.integers(-50, 50))
    hi = lo + draw(st.integers(7, 60))  # wide enough to hold a multiple of every step
    schema = {"type": "integer"}
    schema.update(draw(st.sampled_from([{"minimum": lo}, {"exclusiveMinimum": lo - 1}, {}])))
    schema.update(draw(st.sampled_from([{"maximum": hi}, {"exclusiveMaximum": hi + 1}, {}])))
    step = draw(st.sampled_from([None, 2, 3, 7]))
    if step:
        schema["multipleOf"] = step
    return schema


@st.composite
def exact_number(draw) -> dict:
    lo = draw(QUARTERS)
    hi = lo + draw(st.integers(4, 40)) / 4  # wide enough to hold a multiple of every step
    schema = {"type": "number"}
    schema.update(draw(st.sampled_from([{"minimum": lo}, {"exclusiveMinimum": lo}, {}])))
    schema.update(draw(st.sampled_from([{"maximum": hi}, {"exclusiveMaximum": hi}, {}])))
    if draw(st.booleans()):
        schema["multipleOf"] = draw(st.sampled_from([0.25, 0.5]))
    return schema


@st.composite
def exact_string(draw) -> dict:
    lo, hi = sorted(draw(st.lists(st.integers(0, 5), min_size=2, max_size=2)))
    schema = {"type": "string", "minLength": lo, "maxLength": hi}
    if draw(sometimes(0.3)):
        schema["pattern"] = "^[a-c]*$"
    return schema


EXACT_LEAVES = (exact_integer() | exact_number() | exact_string()
                | st.sampled_from([{"type": "boolean"}, {"type": "null"}, {"enum": ["a", 1, None, "é"]},
                                   {"const": "k"}, {"type": ["string", "null"], "maxLength": 2}]))


@st.composite
def exact_object(draw, child) -> dict:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, min_size=1, max_size=3))
    return {"type": "object", "properties": {n: draw(child) for n in names},
            "required": draw(st.lists(st.sampled_from(names), unique=True)), "additionalProperties": False}


@st.composite
def exact_array(draw, child) -> dict:
    lo, hi = sorted(draw(st.lists(st.integers(0, 3), min_size=2, max_size=2)))
    return {"type": "array", "items": draw(child), "minItems": lo, "maxItems": hi}


EXACT = st.recursive(EXACT_LEAVES, lambda child: exact_object(child) | exact_array(child)
                     | st.lists(child, min_size=1, max_size=2).map(lambda s: {"anyOf": s}), max_leaves=5)
CHARS = "ab c\"\\\né😀\u2028"


def valid_instance(schema):
    """Values that validate against a schema of the family EXACT, by construction."""
    if "anyOf" in schema:
        return st.one_of([valid_instance(s) for s in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema["type"]
    if kind == ["string", "null"]:
        return st.none() | st.text(CHARS, max_size=2)
    if kind in ("boolean", "null"):
        return st.booleans() if kind == "boolean" else st.none()
    if kind == "string":
        alphabet = "abc" if "pattern" in schema else CHARS
        return st.text(alphabet, min_size=schema["minLength"], max_size=schema["maxLength"])
    if kind in ("integer", "number"):
        step = schema.get("multipleOf", 1 if kind == "integer" else 0.125)
        lo = schema.get("minimum", schema.get("exclusiveMinimum", -100))
        hi = schema.get("maximum", schema.get("exclusiveMaximum", 100))
        return st.integers(math.ceil(lo / step), math.floor(hi / step)).map(lambda k: k * step).filter(
            lambda x: is_valid(schema, x))
    if kind == "array":
        return st.lists(valid_instance(schema["items"]), min_size=schema["minItems"], max_size=schema["maxItems"])
    properties, required = schema["properties"], schema["required"]
    return st.fixed_dictionaries({k: valid_instance(properties[k]) for k in required},
                                 optional={k: valid_instance(s) for k, s in properties.items() if k not in required})


@settings(RUNS, max_examples=scaled(80))
@given(EXACT, st.data())
def test_canonical_texts_of_valid_instances_are_accepted(schema, data):
    note(json.dumps(schema))
    grammar = Grammar.from_json_schema(schema)
    for instance in data.draw(st.lists(valid_instance(schema), min_size=1, max_size=5)):
        assert is_valid(schema, instance)
        text = canonical_text(instance, schema)
        assert grammar.accepts(text), text

