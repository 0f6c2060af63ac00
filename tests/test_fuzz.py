"""Property-based tests (hypothesis, derandomized: every run draws the same examples).

On arbitrary input the GBNF parser, the regex and JSON-schema compilers, `SamplingParams`
and the command line either succeed or raise `ValueError` (the command line: one line, exit
status 2), within a time and memory bound. On generated grammars the compiled automaton
accepts exactly the language, and its token masks equal brute force.
"""

import itertools
import json
import re
import tracemalloc

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiny_llm.constrain import Grammar, TokenMatcher, TokenTable
from tiny_llm.sampler import SamplingParams

from conftest import examples, vocab_tokenizer
from test_cli import NO_MODEL, run_captured

FUZZ = settings(derandomize=True, database=None, deadline=2000, max_examples=examples(400),
                suppress_health_check=[HealthCheck.too_slow])
MEMORY = 64 * 2**20  # bytes one compilation may hold at its peak
DEPTHS = [1, 99, 100, 101, 300, 1000, 5000]  # nesting around the limit and far past it


def compiles_or_refuses(build, text) -> Grammar | None:
    """`build(text)`: a Grammar or a ValueError, and never more than MEMORY at the peak."""
    tracemalloc.start()
    try:
        return build(text)
    except ValueError:
        return None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < MEMORY, (text, peak)


# ---- arbitrary text --------------------------------------------------------------------------

GBNF_PIECES = st.sampled_from(['root', ' ::= ', '"a"', '"\\x4"', '[a-z]', '[^"]', '.', '(', ')', '|', '*', '+',
                               '?', '{2}', '{0,9999}', '{3,1}', '\n', 'x', ' x ::= ', '#c\n', '""', '"é"', '\\'])
REGEX_PIECES = st.sampled_from(["a", "b", "é", ".", "(", ")", "(?:", "(?P<n>", "|", "*", "+", "?", "{2}",
                                "{1,3}", "{,2}", "{9999}", "[", "]", "^", "-", "\\d", "\\W", "\\", "$", "\\x4",
                                "[^\\s\\S]", "*?"])


@FUZZ
@given(st.one_of(st.text(max_size=60), st.lists(GBNF_PIECES, max_size=30).map("".join),
                 st.sampled_from(DEPTHS).map(lambda n: "root ::= " + "(" * n + '"a"' + ")" * n)))
def test_gbnf_text_compiles_or_is_refused(text):
    compiles_or_refuses(Grammar.from_gbnf, text)


@FUZZ
@given(st.one_of(st.text(max_size=40), st.lists(REGEX_PIECES, max_size=25).map("".join),
                 st.sampled_from(DEPTHS).map(lambda n: "(" * n + "a" + ")" * n)))
def test_regex_text_compiles_or_is_refused(pattern):
    compiles_or_refuses(Grammar.from_regex, pattern)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=12)
KEYWORDS = st.sampled_from(["type", "properties", "items", "required", "enum", "const", "minimum", "maximum",
                            "minLength", "maxLength", "pattern", "anyOf", "oneOf", "allOf", "$ref", "format",
                            "additionalProperties", "minItems", "maxItems", "$defs", "not", "prefixItems"])
SCHEMAS = st.recursive(
    st.booleans() | st.fixed_dictionaries({"type": st.sampled_from(
        ["string", "integer", "number", "boolean", "null", "object", "array", "thing"])}),
    lambda inner: st.dictionaries(KEYWORDS, inner | JSON, max_size=4), max_leaves=10)


@FUZZ
@given(st.one_of(SCHEMAS, JSON, st.text(max_size=30)))
def test_json_schemas_compile_or_are_refused(schema):
    compiles_or_refuses(Grammar.from_json_schema, schema if isinstance(schema, str) else json.dumps(schema))


# ---- generated grammars: the language and the masks --------------------------------------------

def regexes(depth: int = 3):
    """Patterns over "ab" whose sentences are short: so that every live prefix can be
    finished within a few characters, and brute force over "ab" decides the masks."""
    atom = st.sampled_from(["a", "b", "[ab]", "(?:ab|b)", "a?"])
    return st.recursive(atom, lambda inner: st.one_of(
        st.tuples(inner, inner).map("".join),
        st.tuples(inner, inner).map(lambda p: f"(?:{p[0]}|{p[1]})"),
        st.tuples(inner, st.sampled_from(["?", "{2}", "{0,2}", "{1,2}"])).map(lambda p: f"(?:{p[0]}){p[1]}"),
    ), max_leaves=depth * 2)


def words(up_to: int):
    return ["".join(w) for n in range(up_to + 1) for w in itertools.product("ab", repeat=n)]


WORDS = words(8)


@FUZZ
@given(regexes())
def test_generated_regexes_accept_exactly_their_language(pattern):
    grammar = Grammar.from_regex(pattern)
    for w in WORDS:
        assert grammar.accepts(w) == bool(re.fullmatch(pattern, w)), (pattern, w)


@settings(FUZZ, max_examples=examples(200))
@given(regexes(), st.sampled_from(words(3)))
def test_generated_regex_masks_equal_brute_force(pattern, prefix):
    """Each token of a vocabulary of every 1- and 2-character word (and end-of-sequence) is
    allowed after `prefix` exactly when some text of the language starts with prefix+token."""
    vocab = [b"<eos>"] + [w.encode() for w in words(2)[1:]]
    matcher = TokenMatcher(Grammar.from_regex(pattern), TokenTable(vocab, eos_token_ids=[0]))
    language = [w for w in WORDS if re.fullmatch(pattern, w)]
    state = matcher.automaton.walk(matcher.start, prefix.encode())
    expected = [prefix in language] + [any(w.startswith(prefix + t.decode()) for w in language) for t in vocab[1:]]
    if state == 0:
        assert not any(expected), (pattern, prefix)
    else:
        assert matcher.mask(state).tolist() == expected, (pattern, prefix)


@settings(FUZZ, max_examples=examples(200))
@given(SCHEMAS, st.lists(JSON, min_size=1, max_size=8))
def test_json_texts_a_schema_grammar_accepts_validate(schema, values):
    """Soundness: whatever compact JSON text the grammar accepts validates against the
    schema (the grammar may be stricter than JSON Schema, never looser). Generated objects
    that are not JSON Schemas at all (`{"$defs": false}`) have no validation to compare with."""
    grammar = compiles_or_refuses(Grammar.from_json_schema, json.dumps(schema))
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError:
        return
    if grammar is None:
        return
    for value in values:
        text = json.dumps(value)
        if grammar.accepts(text):
            jsonschema.Draft202012Validator(schema).validate(value)


# ---- SamplingParams and the command line ----------------------------------------------------------

VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True), st.text(max_size=8),
                   st.lists(st.one_of(st.integers(-5, 2**33), st.text(max_size=3)), max_size=3),
                   st.dictionaries(st.one_of(st.integers(-5, 2**33), st.text(max_size=3)),
                                   st.one_of(st.floats(), st.text(max_size=2)), max_size=2))
FIELDS = st.sampled_from([f for f in SamplingParams.__dataclass_fields__ if f != "grammar"])


@FUZZ
@given(st.dictionaries(FIELDS, VALUES, max_size=4))
def test_sampling_params_build_or_raise_value_error(fields):
    try:
        SamplingParams(**fields)
    except ValueError:
        pass


FLAGS = st.sampled_from(["--temp", "--top-k", "--top-p", "--min-p", "--seed", "--max-tokens", "--logit-bias",
                         "--repetition-penalty", "--samplers", "--mirostat", "--dry-multiplier", "--min-tokens",
                         "--num-beams", "--num-draft-tokens", "--prefill-step-size", "--logprobs", "--regex",
                         "--xtc-probability", "--prompt-lookup", "--grammar-first", "--typical-p"])
ARGS = st.one_of(st.sampled_from(["0", "-1", "1.5", "nan", "inf", "1e400", "3+2", "abc", "", "999999999999+1",
                                  "top_k;temperature", "a{0,1000000}", "[^\\s\\S]"]), st.text(max_size=6))


TOKENIZER = vocab_tokenizer(64)


@settings(FUZZ, max_examples=examples(200))
@given(st.lists(st.tuples(FLAGS, ARGS), max_size=4))
def test_command_line_flags_end_in_one_line_and_status_2(pairs):
    """Whatever the flags, `generate` with a model that does not exist stops with status 2
    and no traceback: a bad flag is named, good flags reach the model's absence, and then
    they make a request with a tokenizer too (as once the model has loaded)."""
    argv = ["generate", "--prompt", "hi", *[x for pair in pairs for x in pair], *NO_MODEL]
    try:
        status, out, err = run_captured(argv)
    except SystemExit as e:  # argparse: a usage line and status 2
        status, out, err = e.code, "", "usage"
    assert status == 2 and not out and "Traceback" not in err, (argv, err)
    if "no model at '/nonexistent/model'" in err:  # the flags were all accepted: they make a request
        from tiny_llm.cli import build_parser
        from tiny_llm.cli.options import request

        args = build_parser().parse_args(argv)
        assert request(args, TOKENIZER).params.top_k == args.top_k, argv
