"""Every supported architecture through the whole engine: the command line, batching,
speculative decoding, beam search and constrained decoding run on the model contract alone,
with no per-architecture branch. Each model is a small random-weight directory written by
`scripts/make_random_model.py` (the default model's tokenizer), so the tokens are compared
with mlx-lm's greedy generation from the very same files."""

import contextlib
import io
import re
import sys
from pathlib import Path

import mlx.core as mx
import pytest

import tiny_llm
from tiny_llm import SamplingParams, batch_generate
from tiny_llm.beam_search import beam_search
from tiny_llm.cli import main
from tiny_llm.constrain import Grammar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from make_random_model import ARCHITECTURES, write_random_model  # noqa: E402

PROMPT = "What is the capital of France?"
ARCHS = ["llama3", "qwen3", "qwen2_moe", "qwen3_moe"]
MAX_TOKENS = 8


@pytest.fixture(scope="module", params=ARCHS)
def arch_dir(request, tmp_path_factory):
    bits = 4 if request.param == "qwen3_moe" else None  # one of them with packed experts
    return request.param, write_random_model(tmp_path_factory.mktemp(request.param), request.param, bits=bits)


@pytest.fixture(scope="module")
def loaded(arch_dir):
    """tiny-llm's model and tokenizer of `arch_dir`, loaded once for the tests of it."""
    return tiny_llm.load(str(arch_dir[1]))


def greedy_mlx_lm(path: Path, prompt: list[int]) -> list[int]:
    """mlx-lm's greedy tokens: its model, its decoding loop (token ids: no tokenizer needed)."""
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler
    from mlx_lm.utils import load_model

    model, _ = load_model(path)
    steps = generate_step(mx.array(prompt), model, max_tokens=MAX_TOKENS, sampler=make_sampler(0.0))
    return [int(token) for token, _ in steps]


def prompt_ids(tokenizer) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}]))


def test_greedy_generation_equals_mlx_lm(arch_dir, loaded):
    arch, path = arch_dir
    model, tokenizer = loaded
    assert model.args.model_type == ARCHITECTURES[arch]["model_type"]
    prompt = prompt_ids(tokenizer)
    ours = [r.token for r in tiny_llm.stream_generate(model, tokenizer, prompt, MAX_TOKENS,
                                                      params=SamplingParams(temperature=0.0))]
    assert ours == greedy_mlx_lm(path, prompt)


def test_batch_speculative_and_beam_search_give_the_greedy_tokens(loaded):
    """Batched rows, prompt-lookup drafts and a single beam all produce what plain greedy
    decoding produces, row by row."""
    model, tokenizer = loaded
    prompts = [prompt_ids(tokenizer), tokenizer.encode("one two three one two three one two")]
    greedy = SamplingParams(temperature=0.0)
    alone = [[r.token for r in tiny_llm.stream_generate(model, tokenizer, p, MAX_TOKENS, params=greedy)]
             for p in prompts]
    batched = batch_generate(model, tokenizer, prompts, MAX_TOKENS, params=greedy)
    eos = set(tokenizer.eos_token_ids)
    assert batched.tokens == [[t for t in row if t not in eos] for row in alone]
    for p, want in zip(prompts, alone):
        drafted = [r.token for r in tiny_llm.stream_generate(model, tokenizer, p, MAX_TOKENS, params=greedy,
                                                             prompt_lookup=True)]
        assert drafted == want
        beam = beam_search(model, tokenizer, p, num_beams=1, max_tokens=MAX_TOKENS)[0]
        assert beam.tokens == [t for t in want if t not in eos]


def test_constrained_generation_follows_the_grammar(loaded):
    model, tokenizer = loaded
    pattern = r"[0-9]{3}-[a-z]{2,4}"
    params = SamplingParams(temperature=1.0, seed=3, grammar=Grammar.from_regex(pattern))
    text = tiny_llm.generate(model, tokenizer, prompt_ids(tokenizer), max_tokens=16, params=params)
    assert re.fullmatch(pattern, text), text


def test_command_line_generates_the_greedy_text(arch_dir, loaded):
    _, path = arch_dir
    model, tokenizer = loaded
    want = tiny_llm.generate(model, tokenizer, prompt_ids(tokenizer), max_tokens=MAX_TOKENS,
                             params=SamplingParams(temperature=0.0))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["generate", "--model", str(path), "--prompt", PROMPT, "--max-tokens", str(MAX_TOKENS),
                       "--temp", "0"])
    assert status == 0, err.getvalue()
    assert out.getvalue().rstrip("\n") == want.rstrip("\n")
    mx.clear_cache()
