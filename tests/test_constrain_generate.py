"""Constrained generation end to end on the default model, from Python and from the CLI.

Each token of the real model takes about a fifth of a second on a slow CPU: the wide
sampling runs on random weights over the real tokenizer, the real model checks fewer rows.
"""

import json
import re
from pathlib import Path

import jsonschema
import pytest

from tiny_llm import stream_generate
from tiny_llm.batch import batch_generate
from tiny_llm.constrain import Grammar
from tiny_llm.sampler import SamplingParams

from conftest import tiny_model
from test_cli import NO_MODEL, assert_user_error, run_captured

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PERSON = json.loads((EXAMPLES / "person.json").read_text())
PHONE = r"\(\d{3}\) \d{3}-\d{4}"


def chat(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}])


@pytest.fixture(scope="module")
def random_model(default_tokenizer):
    """Random weights over the default tokenizer's 49,152 tokens: they put mass on every
    token the grammar allows (whitespace runs, escapes, the optional array, odd characters),
    so the grammar is walked far more widely than the real model walks it, at a few
    milliseconds a token instead of a fifth of a second."""
    model, _ = tiny_model("llama-tied", vocab_size=default_tokenizer.vocab_size, max_position_embeddings=1024)
    return model, default_tokenizer


def test_twenty_json_schema_generations_parse_and_validate(random_model):
    """Twenty seeded samples in one batch all stop by themselves and validate; each row's
    tokens are the ones it draws alone (its random stream is its own)."""
    model, tokenizer = random_model
    grammar = Grammar.from_json_schema(PERSON)
    prompt = chat(tokenizer, "Describe a person as JSON.")
    params = [SamplingParams(temperature=1.0, seed=seed, grammar=grammar) for seed in range(20)]
    result = batch_generate(model, tokenizer, [prompt] * len(params), 400, params=params)
    for text, finish in zip(result.texts, result.finish_reasons):
        assert finish == "stop", text  # the grammar closed the object and ended it
        jsonschema.validate(json.loads(text), PERSON)
    assert len(set(result.texts)) == 20  # sampled, not one text twenty times
    assert sum("hobbies" in json.loads(t) for t in result.texts) >= 3  # the optional field is walked
    alone = "".join(r.text for r in stream_generate(model, tokenizer, prompt, 400, params=params[3]))
    assert alone == result.texts[3]


def test_regex_generations_match_in_full_in_a_batch(default_model, random_model):
    """Six random-weight rows and one of the real model's: every text is a whole match."""
    grammar = Grammar.from_regex(PHONE)
    for (model, tokenizer), rows in ((random_model, 6), (default_model, 1)):
        prompts = [chat(tokenizer, "What is your phone number?")] * rows
        params = [SamplingParams(temperature=1.0, seed=s, grammar=grammar) for s in range(rows)]
        result = batch_generate(model, tokenizer, prompts, 24, params=params)
        assert result.finish_reasons == ["stop"] * rows
        for text in result.texts:
            assert re.fullmatch(PHONE, text), text
        assert len(set(result.texts)) == rows  # each row samples its own number


def test_grammar_first_gives_the_same_greedy_text(default_model):
    model, tokenizer = default_model
    grammar = Grammar.from_gbnf((EXAMPLES / "answer.gbnf").read_text())
    prompt = chat(tokenizer, "Is the sky blue?")
    texts = []
    for first in (False, True):
        params = SamplingParams(temperature=0.0, grammar=grammar, grammar_first=first)
        texts.append("".join(r.text for r in stream_generate(model, tokenizer, prompt, 40, params=params)))
    assert texts[0] == texts[1]
    assert grammar.accepts(texts[0]), texts[0]


def test_speculative_decoding_refuses_a_grammar(default_model):
    model, tokenizer = default_model
    params = SamplingParams(grammar=Grammar.from_regex("a+"))
    with pytest.raises(ValueError, match="speculative decoding does not take a grammar"):
        next(stream_generate(model, tokenizer, "hi", 4, params=params, prompt_lookup=True))


# ---- the command line ---------------------------------------------------------------------


def test_cli_json_schema_prints_valid_json(tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    status, out, err = run_captured(["generate", "--json-schema", str(schema), "--prompt", "Describe a person"])
    assert status == 0, err
    jsonschema.validate(json.loads(out), PERSON)


FILES = {"{gbnf}": 'root ::= "a"\n', "{bad-gbnf}": 'root ::= "a"\n::= x\n',
         "{schema}": '{"oneOf": [{"type": "number"}, {}]}'}


@pytest.mark.parametrize("flags, fragments", [
    (["--grammar", "/nonexistent/g.gbnf"], ["cannot read --grammar /nonexistent/g.gbnf"]),
    (["--grammar", "{bad-gbnf}"], ["--grammar", "expected a rule name", "line 2, column 1"]),
    (["--json-schema", "{schema}"], ["--json-schema", "'oneOf' at #/oneOf"]),
    (["--regex", "a(b"], ["--regex a(b", "position"]),
    (["--regex", "a", "--grammar", "{gbnf}"], ["pass one of", "--grammar and --regex"]),
    (["--regex", r"ab[^\s\S]"], [r"--regex ab[^\s\S]: regex: 'ab[^\\s\\S]' matches no text"]),
    (["--regex", ""], ["--regex : matches only the empty text, so there is nothing to generate"]),
    (["--grammar-first"], ["--grammar-first needs"]),
    (["--regex", "a", "--num-beams", "2"], ["beam search does not combine"]),
    (["--regex", "a", "--prompt-lookup"], ["speculative decoding does not combine with a grammar"]),
    (["--regex", "a", "--mirostat", "2"], ["grammar does not combine with mirostat=2"]),
], ids=["missing-file", "bad-gbnf", "bad-schema", "bad-regex", "two-constraints", "no-text", "only-empty",
        "grammar-first-alone",
        "beams", "speculative", "mirostat"])
def test_cli_grammar_user_errors(flags, fragments, tmp_path):
    for name, text in FILES.items():
        (tmp_path / name.strip("{}")).write_text(text)
    flags = [str(tmp_path / f.strip("{}")) if f in FILES else f for f in flags]
    status, out, err = run_captured(["generate", "--prompt", "hi", *flags, *NO_MODEL])
    assert_user_error(status, out, err, *fragments)
