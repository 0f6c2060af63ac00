"""Week 2, day 2: the KV cache, chunked prefill and cached generation."""

import mlx.core as mx
import numpy as np
import pytest
from conftest import TINY_CONFIGS, CachedCountingModel, tiny_model

import tiny_llm
from tiny_llm.attention import causal_mask
from tiny_llm.generate import generate_step
from tiny_llm.model import prefill
from tiny_llm.kv_cache import KVCache


def close(a: mx.array, b: mx.array, atol: float):
    np.testing.assert_allclose(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)),
                               atol=atol, rtol=atol)


def kv(B: int, L: int, start: int, H: int = 2, D: int = 4) -> tuple[mx.array, mx.array]:
    """Keys/values whose entries encode their position: key = position, value = -position."""
    pos = mx.arange(start, start + L, dtype=mx.float32)[None, None, :, None]
    k = mx.broadcast_to(pos, (B, H, L, D))
    return k, -k


# ---- the cache itself -------------------------------------------------------------------------


def test_update_appends_and_returns_everything_stored():
    """Three updates (5, 1, 3 positions) return positions 0..4, 0..5, 0..8 in order."""
    cache = KVCache()
    for start, L in ((0, 5), (5, 1), (6, 3)):
        keys, values = cache.update_and_fetch(*kv(2, L, start))
        assert cache.offset == start + L
        expected = np.arange(start + L, dtype=np.float32)
        np.testing.assert_array_equal(np.array(keys[0, 1, :, 2]), expected)
        np.testing.assert_array_equal(np.array(values[1, 0, :, 3]), -expected)
        assert keys.shape == (2, 2, start + L, 4)


def test_storage_grows_in_blocks_and_keeps_old_entries():
    """Storage is a multiple of `step` positions; crossing a block boundary copies what
    was stored before."""
    cache = KVCache()
    cache.update_and_fetch(*kv(1, 200, 0))
    assert cache.keys.shape[2] == 256
    first = cache.keys  # the block in use
    cache.update_and_fetch(*kv(1, 50, 200))
    assert cache.keys is first  # room left: written in place
    keys, _ = cache.update_and_fetch(*kv(1, 10, 250))
    assert cache.keys.shape[2] == 512 and cache.offset == 260
    np.testing.assert_array_equal(np.array(keys[0, 0, :, 0]), np.arange(260, dtype=np.float32))


def test_make_mask_is_none_for_one_query_and_causal_otherwise():
    """L = 1 needs no mask; L = 3 after 2 stored positions is causal_mask(3, 5):
    query i sees keys 0 .. 2 + i."""
    cache = KVCache()
    assert cache.make_mask(1) is None
    cache.update_and_fetch(*kv(1, 2, 0))
    assert cache.make_mask(1) is None
    mask = np.array(cache.make_mask(3))
    ninf = -np.inf
    np.testing.assert_array_equal(mask, [[0, 0, 0, ninf, ninf], [0, 0, 0, 0, ninf], [0, 0, 0, 0, 0]])
    assert cache.make_mask(3, mx.float16).dtype == mx.float16
    np.testing.assert_array_equal(np.array(cache.make_mask(2)), np.array(causal_mask(2, 4)))


def test_trim_forgets_the_last_positions_and_later_updates_overwrite_them():
    """trim(n) drops min(n, offset) positions; the next update writes over them."""
    cache = KVCache()
    cache.update_and_fetch(*kv(1, 6, 0))
    assert cache.trim(2) == 2 and cache.offset == 4
    keys, values = cache.update_and_fetch(*kv(1, 1, 100))
    np.testing.assert_array_equal(np.array(keys[0, 0, :, 0]), [0, 1, 2, 3, 100])
    np.testing.assert_array_equal(np.array(values[0, 0, :, 0]), [0, -1, -2, -3, -100])
    assert cache.trim(10) == 5 and cache.offset == 0
    assert cache.trim(0) == 0


def test_trim_rejects_a_negative_count():
    cache = KVCache()
    with pytest.raises(ValueError, match="trim needs n >= 0, got -1"):
        cache.trim(-1)


def test_rope_offset_is_the_number_of_stored_positions():
    cache = KVCache()
    assert cache.rope_offset == 0
    cache.update_and_fetch(*kv(1, 7, 0))
    assert cache.rope_offset == 7


# ---- the model with a cache -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_cached_decoding_equals_full_recompute(name):
    """Prefill then one token at a time through the KV cache gives the full-sequence logits."""
    model, _ = tiny_model(name, seed=12)
    V = model.args.vocab_size
    tokens = mx.random.randint(0, V, (2, 9), key=mx.random.key(13))
    full = model(tokens)
    cache = model.make_cache()
    steps = [model(tokens[:, :5], cache=cache)]
    steps += [model(tokens[:, i : i + 1], cache=cache) for i in range(5, 9)]
    close(mx.concatenate(steps, axis=1), full, atol=1e-5)
    assert cache[0].offset == 9


@pytest.mark.parametrize("step_size", [1, 2, 3, 7, 100])
def test_chunked_prefill_gives_the_last_logits_and_the_same_cache(step_size):
    """prefill() in chunks of any size returns the last position's logits of one full
    forward pass, and leaves the cache holding every prompt position."""
    model, _ = tiny_model("qwen2-untied", seed=4)
    tokens = mx.random.randint(0, model.args.vocab_size, (2, 11), key=mx.random.key(5))
    cache = model.make_cache()
    last = prefill(model, tokens, cache, step_size)
    close(last, model(tokens)[:, -1, :], atol=1e-5)
    assert [c.offset for c in cache] == [11] * len(cache)
    whole = model.make_cache()
    model(tokens, cache=whole)
    for ours, ref in zip(cache, whole):
        close(ours.keys[:, :, :11], ref.keys[:, :, :11], atol=1e-5)
        close(ours.values[:, :, :11], ref.values[:, :, :11], atol=1e-5)


@pytest.mark.parametrize("step_size, calls", [
    (2048, [[1, 2], [3], [4], [5]]),
    (1, [[1], [2], [3], [4], [5]]),
    (2, [[1, 2], [3], [4], [5]]),
])
def test_generate_step_prefills_then_feeds_one_token(step_size, calls):
    """The prompt but its last token goes in chunks (only the cache is needed from them),
    the last prompt token gives the first logits, then each step feeds one new token."""
    model = CachedCountingModel()
    out = list(generate_step(mx.array([1, 2, 3]), model, max_tokens=3, prefill_step_size=step_size, kv_cache=True))
    assert [t for t, _ in out] == [4, 5, 6]
    assert model.calls == calls


def test_the_default_takes_the_cache_once_this_day_runs():
    """`kv_cache=None` (the default) picks the cached loop when this day's code runs: the
    model then sees the prompt once and one token per step."""
    asked = [t for t, _ in generate_step(mx.array([1, 2, 3]), CachedCountingModel(), max_tokens=3, kv_cache=True)]
    model = CachedCountingModel()
    assert [t for t, _ in generate_step(mx.array([1, 2, 3]), model, max_tokens=3)] == asked == [4, 5, 6]
    assert model.calls == [[1, 2], [3], [4], [5]]


def test_a_one_token_prompt_needs_no_prefill_chunk():
    model = CachedCountingModel()
    assert [t for t, _ in generate_step(mx.array([6]), model, max_tokens=2, kv_cache=True)] == [7, 0]
    assert model.calls == [[6], [7]]


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
@pytest.mark.parametrize("step_size", [1, 3, 2048])
def test_cached_generation_equals_recompute_and_mlx_lm(name, step_size):
    """12 greedy tokens: the cached loop (any chunk size) = week 1's recompute loop =
    mlx-lm's generate_step."""
    from mlx_lm.generate import generate_step as reference_step

    model, ref = tiny_model(name, seed=8)
    prompt = mx.array([3, 14, 15, 9, 26, 5, 35])
    cached = [t for t, _ in generate_step(prompt, model, max_tokens=12, prefill_step_size=step_size, kv_cache=True)]
    recomputed = [t for t, _ in generate_step(prompt, model, max_tokens=12, kv_cache=False)]
    theirs = [int(t) for t, _ in reference_step(prompt, ref, max_tokens=12)]
    assert cached == recomputed == theirs


def test_a_given_prompt_cache_is_extended_in_place():
    """A prompt_cache passed in holds the prompt and the generated tokens afterwards (the
    last token's successor is already computed, one step ahead)."""
    model, _ = tiny_model("llama-tied", seed=2)
    cache = model.make_cache()
    out = [t for t, _ in generate_step(mx.array([1, 2, 3, 4]), model, max_tokens=5, prompt_cache=cache)]
    assert len(out) == 5
    assert cache[0].offset == 4 + 4  # the prompt and the 4 tokens fed back


@pytest.mark.parametrize("step_size, reports", [
    (4, [(4, 10), (8, 10), (9, 10), (10, 10)]),
    (1, [(n, 10) for n in range(1, 11)]),
    (100, [(9, 10), (10, 10)]),
])
def test_prefill_reports_each_evaluated_chunk_then_the_last_position(step_size, reports):
    """progress(done, L) after each chunk (all but the last position go in chunks), then
    (L, L) once the last position's logits are evaluated; the logits are the same."""
    model, _ = tiny_model("qwen2-untied", seed=4)
    tokens = mx.random.randint(0, model.args.vocab_size, (2, 10), key=mx.random.key(6))
    seen = []
    last = prefill(model, tokens, model.make_cache(), step_size, lambda done, total: seen.append((done, total)))
    assert seen == reports
    close(last, prefill(model, tokens, model.make_cache(), step_size), atol=1e-6)


def test_generate_step_reports_the_prefill_before_the_first_token():
    """prompt_progress sees the prefill of the prompt it is given (a prompt_cache's earlier
    positions are not counted), all of it before the first token comes out."""
    events = []
    steps = generate_step(mx.arange(1, 11), CachedCountingModel(), max_tokens=2, prefill_step_size=4,
                          kv_cache=True, prompt_progress=lambda done, total: events.append((done, total)))
    events += [("token", t) for t, _ in steps]
    assert events == [(4, 10), (8, 10), (9, 10), (10, 10), ("token", 3), ("token", 4)]
    model, _ = tiny_model("llama-tied", seed=2)
    cache, seen = model.make_cache(), []
    list(generate_step(mx.array([1, 2, 3, 4]), model, max_tokens=2, prompt_cache=cache))
    list(generate_step(mx.array([5, 6, 7]), model, max_tokens=2, prompt_cache=cache, prefill_step_size=4,
                       prompt_progress=lambda done, total: seen.append((done, total))))
    assert seen == [(2, 3), (3, 3)]


# ---- the real default model -------------------------------------------------------------------

PROMPTS = ["def fibonacci(n):", "Once upon a time, in a small village,"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_generation_matches_mlx_lm(course_default_model, reference_default_model, prompt):
    """16 greedy tokens of the default model equal mlx_lm.stream_generate's, token for token
    (each token costs about a fifth of a second on a slow CPU, and the course checks this
    file once for every day it does not depend on)."""
    model, tokenizer = course_default_model
    ids = tokenizer.encode(prompt)
    ours = [r.token for r in tiny_llm.stream_generate(model, tokenizer, ids, max_tokens=16, kv_cache=True)]
    theirs = reference_default_model.greedy(ids, 16)  # mlx_lm.stream_generate's tokens
    assert len(ours) == 16
    assert ours == theirs


def test_default_model_cached_equals_recompute(course_default_model):
    """On the default model, the cached loop (prefill in chunks of 3) gives week 1's tokens."""
    model, tokenizer = course_default_model
    prompt = mx.array(tokenizer.encode("The three primary colours are"))
    cached = [t for t, _ in generate_step(prompt, model, max_tokens=6, prefill_step_size=3, kv_cache=True)]
    recomputed = [t for t, _ in generate_step(prompt, model, max_tokens=6, kv_cache=False)]
    assert cached == recomputed


def test_chat_answer_from_the_default_model(course_default_model):
    """With the chat template, the model answers a factual question correctly."""
    model, tokenizer = course_default_model
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    responses = list(tiny_llm.stream_generate(model, tokenizer, prompt, max_tokens=20, kv_cache=True))
    text = "".join(r.text for r in responses)
    assert "Paris" in text
    assert responses[-1].finish_reason == "stop"
