"""Speculative decoding's edges outside the course exercise: the prompt-lookup drafter and
argument checks."""

import mlx.core as mx
import pytest
from conftest import tiny_model, vocab_tokenizer

import tiny_llm
from tiny_llm.sampler import SamplingParams
from tiny_llm.speculative import prompt_lookup, speculative_generate_step


def models(V: int = 8):
    target, _ = tiny_model("qwen2-untied", seed=50, vocab_size=V)
    draft, _ = tiny_model("llama-tied", seed=51, vocab_size=V)
    return target, draft


def test_prompt_lookup_proposes_what_followed_the_last_ngram():
    h = [1, 2, 3, 4, 5, 9, 2, 3]
    assert prompt_lookup(h, 3, ngram=3, min_ngram=3) == []  # "9 2 3" never came before
    assert prompt_lookup(h, 3) == [4, 5, 9]  # "2 3" was followed by 4 5 9
    assert prompt_lookup(h, 1) == [4]
    assert prompt_lookup([7, 1, 7, 2, 7], 2) == [2, 7]  # the latest occurrence wins
    assert prompt_lookup([1, 2, 3], 3) == []
    assert prompt_lookup([5, 5], 4) == [5]


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_draft_tokens=0), "num_draft_tokens"),
    (dict(num_draft_tokens=-2), "num_draft_tokens"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(params=SamplingParams(mirostat=2)), "mirostat"),
    (dict(params=SamplingParams(xtc_probability=0.5)), "xtc_probability"),
    (dict(params=SamplingParams(min_tokens=2, eos_token_ids=(0,))), "min_tokens"),
])
def test_bad_arguments_are_refused(kwargs, match):
    target, draft = models()
    with pytest.raises(ValueError, match=match):
        speculative_generate_step(mx.array([1, 2]), target, draft, **kwargs)


def test_a_draft_model_with_another_vocabulary_is_refused():
    target, _ = tiny_model("qwen2-untied", vocab_size=8)
    draft, _ = tiny_model("llama-tied", vocab_size=9)
    with pytest.raises(ValueError, match="9 tokens, the target's 8"):
        speculative_generate_step(mx.array([1, 2]), target, draft)


def test_stream_generate_refuses_mixed_options():
    target, draft = models()
    tok = vocab_tokenizer(8)
    with pytest.raises(ValueError, match="either draft_model or prompt_lookup"):
        list(tiny_llm.stream_generate(target, tok, [1], 3, draft_model=draft, prompt_lookup=True))
    with pytest.raises(ValueError, match="params=SamplingParams"):
        list(tiny_llm.stream_generate(target, tok, [1], 3, draft_model=draft, sampler=lambda x: x))
    with pytest.raises(ValueError, match="makes its own caches"):
        list(tiny_llm.stream_generate(target, tok, [1], 3, prompt_lookup=True, kv_cache=False))


@pytest.mark.parametrize("drafter", ["model", "lookup"])
def test_prompt_progress_follows_the_targets_prefill(drafter):
    """The target prefills all but the last prompt token in chunks; the first round feeds
    the last one: (4, 10), (8, 10), (9, 10), then (10, 10) before the first token."""
    target, draft = models()
    events = []
    options = dict(draft_model=draft) if drafter == "model" else dict(prompt_lookup=True)
    for response in tiny_llm.stream_generate(target, vocab_tokenizer(8), [1, 2, 3, 4, 5, 6, 7, 1, 2, 3], 3,
                                             prefill_step_size=4, **options,
                                             prompt_progress=lambda done, total: events.append((done, total))):
        events.append(("token", response.token))
    assert events[:5] == [(4, 10), (8, 10), (9, 10), (10, 10), ("token", events[4][1])]
    assert all(e[0] == "token" for e in events[4:])
    seen = []
    list(speculative_generate_step(mx.array([5]), target, draft, max_tokens=2,
                                   prompt_progress=lambda done, total: seen.append((done, total))))
    assert seen == [(1, 1)]
