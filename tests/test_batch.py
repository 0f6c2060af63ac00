"""The batch engine's edges: bad input, settings and one-row batches (outside the course
days, whose tests exercise the students' code)."""

import mlx.core as mx
import pytest
from conftest import tiny_model, vocab_tokenizer

import tiny_llm
from tiny_llm.batch import BatchGenerator, batch_generate
from tiny_llm.kv_cache import BatchKVCache
from tiny_llm.sampler import SamplingParams


def test_batch_cache_rejects_bad_padding_and_over_trimming():
    with pytest.raises(ValueError, match="left_padding"):
        BatchKVCache([])
    with pytest.raises(ValueError, match="left_padding"):
        BatchKVCache([0, -1])
    cache = BatchKVCache([0, 2])
    cache.update_and_fetch(mx.zeros((2, 1, 4, 4)), mx.zeros((2, 1, 4, 4)))
    with pytest.raises(ValueError, match="a row holds only 2 tokens"):
        cache.trim(3)
    assert cache.trim(2) == 2 and cache.offset == 2


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompts=[[1, 2], []]), "prompt 1: prompt is empty"),
    (dict(prompts=[]), "prompts must be a non-empty list"),
    (dict(prompts="w1 w2"), "prompts must be a non-empty list"),
    (dict(prompts=[[1]], max_tokens=0), "prompt 0: max_tokens must be"),
    (dict(prompts=[[1], [2]], max_tokens=[3]), "max_tokens has 1 entries for 2 prompts"),
    (dict(prompts=[[1], [2]], params=[SamplingParams()]), "params has 1 entries for 2 prompts"),
    (dict(prompts=[[1] * 30]), "exceeds the model's context of 32 positions"),
    (dict(prompts=[[1, 500]]), "outside the vocabulary"),
    (dict(prompts=[[1]], params=[{"temperature": 1}]), "params must be a SamplingParams"),
    (dict(prompts=[[1], [2]], params=[SamplingParams(), SamplingParams(logit_bias={112: 1.0})]),
     r"prompt 1: logit_bias names token 112, outside the vocabulary \[0, 112\)"),
])
def test_bad_input_is_refused_before_the_model_runs(kwargs, match):
    model, _ = tiny_model("llama-tied", max_position_embeddings=32)
    calls = []
    spy = type("Spy", (), {"__call__": lambda self, *a, **k: calls.append(1), "args": model.args,
                           "layers": model.layers})()
    kwargs.setdefault("max_tokens", 4)
    with pytest.raises(ValueError, match=match):
        batch_generate(spy, vocab_tokenizer(model.args.vocab_size), **kwargs)
    assert calls == []


def test_bad_generator_settings_are_refused():
    model, _ = tiny_model("llama-tied")
    tok = vocab_tokenizer(model.args.vocab_size)
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchGenerator(model, tok, max_batch_size=0)
    with pytest.raises(ValueError, match="prefill_step_size"):
        BatchGenerator(model, tok, prefill_step_size=0)


def test_one_row_at_a_time_matches_each_prompt_alone():
    """max_batch_size=1: requests run one after another, each as if alone."""
    model, _ = tiny_model("qwen2-untied", seed=40)
    tok = vocab_tokenizer(model.args.vocab_size)
    prompts, limits = [[5, 17, 3], [44], [8, 8, 21, 40]], [4, 6, 3]
    result = batch_generate(model, tok, prompts, limits, max_batch_size=1)
    expected = []
    for p, n in zip(prompts, limits):
        out = [r.token for r in tiny_llm.stream_generate(model, tok, p, n)]
        expected.append(out[:-1] if out[-1] in tok.eos_token_ids else out)
    assert result.tokens == expected

