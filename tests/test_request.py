"""One way to build a request (`tiny_llm.request`): the command line's flags, a batch file's
lines and the server's bodies reach `SamplingParams` through it, with the tokenizer's
end-of-sequence ids for `min_tokens` and the field named as each caller spells it."""

import json
import math
import re

import pytest
from conftest import vocab_tokenizer
from test_cli import prompts_file, run_captured

from tiny_llm.cli import build_parser
from tiny_llm.cli.options import SAMPLING_FLAGS, request
from tiny_llm.constrain import Grammar
from tiny_llm.request import (FieldError, GrammarCache, build_request, compile_constraint, parse_logit_bias,
                             parse_stop, seeded)
from tiny_llm.sampler import SamplingParams

TOKENIZER = vocab_tokenizer(64)  # token 0 ends the sequence
EOS = 2  # the default model's end-of-sequence token

# A valid value for every sampling flag (each alias too), and the value SamplingParams holds.
VALUES = {
    "temperature": ("0.5", 0.5), "top_k": ("7", 7), "top_p": ("0.9", 0.9), "min_p": ("0.05", 0.05),
    "typical_p": ("0.8", 0.8), "top_n_sigma": ("1.5", 1.5), "xtc_probability": ("0.5", 0.5),
    "xtc_threshold": ("0.2", 0.2), "dynatemp_range": ("0.3", 0.3), "dynatemp_exponent": ("1.5", 1.5),
    "repetition_penalty": ("1.1", 1.1), "frequency_penalty": ("0.2", 0.2), "presence_penalty": ("0.3", 0.3),
    "penalty_last_n": ("32", 32), "dry_multiplier": ("0.8", 0.8), "dry_base": ("1.5", 1.5),
    "dry_allowed_length": ("3", 3), "dry_penalty_last_n": ("100", 100), "mirostat": ("2", 2),
    "mirostat_tau": ("4.0", 4.0), "mirostat_eta": ("0.2", 0.2), "min_tokens": ("5", 5), "seed": ("3", 3),
    "logprobs": ("2", 2), "draw": ("race", "race"),
}
CASES = [(flag, field, *VALUES[field]) for flags, field, _, _ in SAMPLING_FLAGS for flag in flags]
# The other flags that take a value and reach the request: (argv, field, expected value).
OTHER = [
    (["--logit-bias", "5+1.5", "--logit-bias", "6-inf", "--logit-bias", "7=2"], "logit_bias",
     {5: 1.5, 6: -math.inf, 7: 2.0}),
    (["--samplers", "top_k;temperature"], "order", ("top_k", "temperature")),
    (["--samplers", "hf"], "order", ("penalties", "temperature", "top_k", "top_p", "min_p", "typical_p")),
    (["--dry-sequence-breaker", "\\n", "--dry-sequence-breaker", "ab"], "dry_sequence_breakers", ("\n", "ab")),
    (["--dry-sequence-breaker", "none"], "dry_sequence_breakers", ()),
    (["--regex", "[0-9]+", "--grammar-first"], "grammar_first", True),
]


def test_every_value_flag_is_covered():
    """The table above names every flag of `generate` that sets a sampling field."""
    assert set(VALUES) == {field for _, field, _, _ in SAMPLING_FLAGS}


@pytest.mark.parametrize("flag, field, text, value", CASES, ids=[c[0] for c in CASES])
def test_each_sampling_flag_reaches_sampling_params(flag, field, text, value):
    """`--flag VALUE` alone ends as that value of the SamplingParams the command samples
    with (not only past the parser): checked before a model loads, then with its tokenizer."""
    args = build_parser().parse_args(["generate", "--prompt", "hi", flag, text])
    request(args)  # the check before loading
    params = request(args, TOKENIZER, 64).params
    assert getattr(params, field) == value
    others = {f: getattr(SamplingParams(temperature=0.0), f) for _, f, _, _ in SAMPLING_FLAGS if f != field}
    assert {f: getattr(params, f) for f in others} == others  # nothing else moved
    if field == "min_tokens":
        assert params.eos_token_ids == (0,)  # the tokenizer's end-of-sequence token


@pytest.mark.parametrize("argv, field, value", OTHER, ids=[a[0] for a, _, _ in OTHER])
def test_the_other_value_flags_reach_sampling_params(argv, field, value):
    args = build_parser().parse_args(["generate", "--prompt", "hi", *argv])
    assert getattr(request(args, TOKENIZER, 64).params, field) == value


def test_constraint_flags_become_the_grammar(tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "integer"}))
    gbnf = tmp_path / "yes.gbnf"
    gbnf.write_text('root ::= "yes" | "no"')
    for argv, accepted, refused in ((["--regex", "[0-9]{2}"], "42", "4"), (["--json-schema", str(schema)], "17", "x"),
                                    (["--grammar", str(gbnf)], "no", "maybe")):
        args = build_parser().parse_args(["generate", "--prompt", "hi", *argv])
        grammar = request(args, TOKENIZER, 64).params.grammar
        assert grammar.accepts(accepted) and not grammar.accepts(refused), argv
        assert request(args, TOKENIZER, 64).params.grammar is grammar  # compiled once


def test_min_tokens_gets_the_tokenizers_end_of_sequence_ids():
    """Every caller gets the end-of-sequence ids from the tokenizer; without one (checking
    before a model loads) the fields are still checked."""
    request = build_request({"min_tokens": 3, "temperature": 0.7}, TOKENIZER)
    assert (request.params.min_tokens, request.params.eos_token_ids) == (3, (0,))
    assert build_request({"min_tokens": 3}, None).params.min_tokens == 3
    with pytest.raises(FieldError, match=r"^--min-tokens must be in \[0, inf\), got -1$") as e:
        build_request({"min_tokens": -1}, TOKENIZER, spell=lambda f: "--" + f.replace("_", "-"))
    assert e.value.field == "--min-tokens"


@pytest.mark.parametrize("given, spell, message, field", [
    ({"top_p": 2}, None, r"^top_p must be in \[0.0, 1.0\], got 2", "top_p"),
    ({"top_p": 2}, {"top_p": "--top-p"}, r"^--top-p must be in \[0.0, 1.0\], got 2", "--top-p"),
    ({"regex": "a", "grammar": 'root ::= "a"'}, None, r"^give one of grammar, regex and json_schema, not grammar and regex$",
     "regex"),
    ({"regex": ""}, None, r"^regex: matches only the empty text", "regex"),
    ({"json_schema": "{x"}, None, r"^json_schema is not valid JSON", "json_schema"),
    ({"grammar": 5}, None, r"^grammar must be text, got 5$", "grammar"),
    ({"regex": "a(b"}, None, r"^regex: regex: missing \)", "regex"),
    ({"regex": "a", "mirostat": 2}, None, r"^grammar does not combine with mirostat=2", "regex"),
    ({"logit_bias": {"x": 1}}, None, r'^logit_bias keys are token ids such as "15043", got \'x\'$', "logit_bias"),
    ({"logit_bias": ["7~1"]}, {"logit_bias": "--logit-bias"}, r"^--logit-bias takes TOKEN\+BIAS", "--logit-bias"),
    ({"logit_bias": {"99": 1}}, None, r"^logit_bias names token 99, outside the vocabulary \[0, 64\)", "logit_bias"),
    ({"max_tokens": 0}, None, r"^max_tokens must be a positive integer, got 0$", "max_tokens"),
    ({"stop": ["a", ""]}, None, r"^stop must be a non-empty string or a list", "stop"),
    ({"samplers": "hf", "order": "hf"}, None, r"^samplers and order name the same thing", "order"),
    ({"samplers": "nonsense"}, None, r"^order has unknown stage 'nonsense'", "order"),
    ({"temperature": 1e-50}, {"temperature": "--temp"}, r"^--temp must be a float32 \(the sampler's numbers\)", "--temp"),
    ({"dry_penalty_last_n": -2}, {"dry_penalty_last_n": "--dry-penalty-last-n", "penalty_last_n": "--penalty-last-n"},
     r"^--dry-penalty-last-n must be in \[-1, inf\), got -2$", "--dry-penalty-last-n"),
    ({"logit_bias": {"5": None}}, None, r"^logit_bias value for token 5 must be a number or -inf, got None$",
     "logit_bias"),
    ({"logit_bias": [1]}, None, r"^logit_bias takes TOKEN\+BIAS, TOKEN-BIAS or TOKEN=BIAS, got 1$", "logit_bias"),
], ids=lambda v: v if isinstance(v, str) and not v.startswith("^") else None)
def test_mistakes_name_the_field_as_the_caller_spells_it(given, spell, message, field):
    spelling = (lambda f: spell.get(f, f)) if spell else (lambda f: f)
    with pytest.raises(FieldError, match=message) as e:
        build_request(given, TOKENIZER, spell=spelling, vocab_size=64)
    assert e.value.field == field


def test_a_refusal_of_sampling_params_carries_its_field():
    """`SamplingParams`' own ParamError reaches the caller in its spelling through its `field`
    (no message is read back): the words after the name are the library's."""
    from tiny_llm.sampler.params import ParamError

    with pytest.raises(ParamError) as library:
        SamplingParams(top_k=-3)
    with pytest.raises(FieldError) as e:
        build_request({"top_k": -3}, TOKENIZER, spell=lambda f: {"top_k": "the-k"}.get(f, f))
    assert (str(e.value), e.value.field) == ("the-k" + str(library.value).removeprefix("top_k"), "the-k")


def test_openai_logit_bias_is_an_object():
    """The command line's entries are not OpenAI's: a list is refused in SamplingParams' words."""
    with pytest.raises(FieldError, match=r"^logit_bias must be a mapping of token id to bias, got \['5\+1'\]$") as e:
        build_request({"logit_bias": ["5+1"]}, TOKENIZER, openai_bias=True)
    assert e.value.field == "logit_bias"
    assert build_request({"logit_bias": ["5+1"]}, TOKENIZER).params.logit_bias == {5: 1.0}


def test_base_fields_hold_where_the_given_ones_are_silent():
    """A batch line's fields over the command line's: the line wins field by field."""
    built = build_request({"top_k": 5}, TOKENIZER, base={"top_k": 9, "temperature": 0.3, "max_tokens": 7})
    assert (built.params.top_k, built.params.temperature, built.max_tokens) == (5, 0.3, 7)


def test_openai_logit_bias_and_the_command_lines_entries():
    assert parse_logit_bias({"5": -100, "6": 2.5}, openai=True) == {5: -math.inf, 6: 2.5}
    assert parse_logit_bias({"5": -150.0}) == {5: -150.0}  # outside OpenAI's range: only there refused
    with pytest.raises(FieldError, match=r"for token 5 must be a number in \[-100, 100\], got 101"):
        parse_logit_bias({"5": 101}, openai=True)
    assert parse_logit_bias(["15043+1", "3=-inf", "4-0.5"]) == {15043: 1.0, 3: -math.inf, 4: -0.5}


def test_stop_strings_and_seeds():
    assert parse_stop("###") == ("###",) and parse_stop(["a", "b"]) == ("a", "b") and parse_stop(None) == ()
    with pytest.raises(FieldError):
        parse_stop(["x"] * 17)
    p = SamplingParams(seed=2**32 - 1)
    assert [seeded(p, i).seed for i in range(3)] == [2**32 - 1, 0, 1]
    assert seeded(SamplingParams(), 5).seed is None


def test_grammars_from_kinds_and_the_cache():
    cache = GrammarCache(size=1)
    first = build_request({"regex": "[ab]+"}, TOKENIZER, grammars=cache).params.grammar
    assert build_request({"regex": "[ab]+"}, TOKENIZER, grammars=cache).params.grammar is first
    build_request({"json_schema": {"type": "boolean"}}, TOKENIZER, grammars=cache)
    assert build_request({"regex": "[ab]+"}, TOKENIZER, grammars=cache).params.grammar is not first  # evicted
    assert Grammar.from_kind("json_schema", '{"type": "boolean"}').accepts("true")
    with pytest.raises(ValueError, match="kind is one of grammar, regex, json_schema, got 'xml'"):
        Grammar.from_kind("xml", "<a/>")


def test_a_constraints_error_is_worded_by_its_type():
    """Only an error about the value itself reads as said of the field ("json_schema is not
    valid JSON"); a compiler's or a builder's message follows a colon, whatever its words."""
    def build():
        raise ValueError("must be odd, as this builder wants")

    with pytest.raises(FieldError, match=r"^f: must be odd, as this builder wants$"):
        compile_constraint([("f", build, 1)])
    with pytest.raises(FieldError, match=r"^json_schema is JSON nested too deeply to read \(the limit for a schema "
                                         r"is 100 levels\)$"):
        compile_constraint([("json_schema", "json_schema", "[" * 100_000)])
    with pytest.raises(FieldError, match=r"^regex must be text, got 5$"):
        compile_constraint([("regex", "regex", 5)], grammars=GrammarCache())


# ---------------------------------------------------------------------------------------------
# --min-tokens end to end: the end-of-sequence token is made the most likely by a logit bias,
# so without --min-tokens every reply is that token alone; with --min-tokens 4 it comes fifth.


def test_min_tokens_in_generate():
    status, out, err = run_captured(["generate", "--prompt", "hi", "--max-tokens", "12", "--verbose",
                                     "--logit-bias", f"{EOS}+100", "--min-tokens", "4"])
    assert status == 0, err
    assert re.search(r"^generation: 5 tokens", err, re.M), err  # four, then the end-of-sequence token
    status, _, err = run_captured(["generate", "--prompt", "hi", "--max-tokens", "12", "--verbose",
                                   "--logit-bias", f"{EOS}+100"])
    assert status == 0 and re.search(r"^generation: 1 tokens", err, re.M), err


def test_min_tokens_in_chat(monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("hi\nand again\n"))
    status, out, err = run_captured(["chat", "--max-tokens", "12", "--verbose", "--logit-bias", f"{EOS}+100",
                                     "--min-tokens", "4"])
    assert status == 0, err
    assert re.findall(r"^generation: (\d+) tokens", err, re.M) == ["5", "5"], err  # every reply, not the first


def test_min_tokens_in_batch(tmp_path):
    """From the flags for every line, and from a line's own field."""
    path = prompts_file(tmp_path, 'hi\n{"prompt": "hello", "min_tokens": 2}\n{"prompt": "hey", "min_tokens": 0}\n')
    status, out, err = run_captured(["batch", "--prompts", path, "--max-tokens", "12",
                                     "--logit-bias", f"{EOS}+100", "--min-tokens", "4"])
    assert status == 0, err
    found = dict(re.findall(r"--- request (\d) \(stop, (\d+) tokens\) ---", out))
    assert found == {"0": "5", "1": "3", "2": "1"}, out


def test_max_tokens_flag_reaches_the_request():
    args = build_parser().parse_args(["generate", "--prompt", "hi", "--max-tokens", "9"])
    assert request(args, TOKENIZER, 64).max_tokens == 9
    args = build_parser().parse_args(["generate", "--prompt", "hi", "--max-tokens", "-1"])
    assert request(args).max_tokens == -1  # the command line's "no limit"


def test_batch_flags_reach_batch_settings():
    from tiny_llm.cli.options import batch_settings
    from tiny_llm.defaults import BatchSettings

    args = build_parser().parse_args(["batch", "--prompts", "p.txt", "--max-batch-size", "3", "--prefill-step-size",
                                      "5", "--page-size", "8", "--prefix-cache-bytes", "1M"])
    assert batch_settings(args) == BatchSettings(3, 5, 8, 1 << 20)
    assert batch_settings(args).kwargs() == dict(max_batch_size=3, prefill_step_size=5, page_size=8,
                                                 prefix_cache_bytes=1 << 20)


def test_speculative_decoding_refuses_the_race():
    """Its acceptance test draws by the inverse CDF: draw="race" is refused, not ignored."""
    from tiny_llm.speculative import refused_fields

    assert refused_fields(SamplingParams(draw="race")) == ["draw"]
    status, out, err = run_captured(["generate", "--prompt", "hi", "--prompt-lookup", "--draw", "race",
                                     "--model", "/nonexistent/model"])
    assert status == 2 and err.strip() == "tiny-llm: error: speculative decoding does not combine with --draw", err
