"""Week 2, day 4: batched generation — left padding, per-row positions and masks, one
Sampler call for rows with their own SamplingParams, rows that finish independently."""

import mlx.core as mx
import numpy as np
import pytest
from conftest import TINY_CONFIGS, cache_slots, filled_batch_cache, generate_alone, tiny_model, vocab_tokenizer

from tiny_llm.batch import BatchGenerator, RunningBatch, batch_generate, left_pad
from tiny_llm.model import prefill
from tiny_llm.kv_cache import BatchKVCache
from tiny_llm.sampler import Sampler, SamplingParams
from tiny_llm.scheduler import BatchRequest
from tiny_llm.tokenizer import StreamingDetokenizer

NINF = -np.inf


def close(a: mx.array, b: mx.array, atol: float):
    np.testing.assert_allclose(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)),
                               atol=atol, rtol=atol)


PROMPTS = [[5, 17, 3, 9, 30, 12, 7], [44], [8, 8, 21, 40], [19, 2, 33, 11, 6, 25, 14, 3, 10]]


# ---- padding, positions and masks ---------------------------------------------------------------


def test_left_pad_by_hand():
    tokens, padding = left_pad([[1, 2, 3], [4], [5, 6]], pad=9)
    assert tokens.tolist() == [[1, 2, 3], [9, 9, 4], [9, 5, 6]]
    assert padding == [0, 2, 1]
    assert left_pad([[7]])[0].tolist() == [[7]] and left_pad([[7]])[1] == [0]


def test_rope_offset_is_each_rows_own_position():
    """After 5 slots, rows padded by 0 and 2 have seen 5 and 3 tokens."""
    cache = BatchKVCache([0, 2])
    cache.update_and_fetch(mx.zeros((2, 1, 5, 4)), mx.zeros((2, 1, 5, 4)))
    assert cache.rope_offset.tolist() == [5, 3]


def test_batch_mask_by_hand():
    """Rows padded by 0 and 1, three queries: row 0 is causal; in row 1 slot 0 is hidden
    from every query but itself (so that no softmax row is empty)."""
    mask = np.array(BatchKVCache([0, 1]).make_mask(3))
    assert mask.shape == (2, 1, 3, 3)
    np.testing.assert_array_equal(mask[0, 0], [[0, NINF, NINF], [0, 0, NINF], [0, 0, 0]])
    np.testing.assert_array_equal(mask[1, 0], [[0, NINF, NINF], [NINF, 0, NINF], [NINF, 0, 0]])


def test_batch_mask_for_one_query():
    """One new query: None without padding; otherwise it hides each row's padding slots."""
    cache = BatchKVCache([0, 0])
    cache.update_and_fetch(mx.zeros((2, 1, 2, 4)), mx.zeros((2, 1, 2, 4)))
    assert cache.make_mask(1) is None
    cache = BatchKVCache([2, 0])
    cache.update_and_fetch(mx.zeros((2, 1, 3, 4)), mx.zeros((2, 1, 3, 4)))
    np.testing.assert_array_equal(np.array(cache.make_mask(1))[:, 0, 0], [[NINF, NINF, 0, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_padded_batch_logits_equal_each_row_alone(name):
    """Prefill a left-padded batch, then decode two tokens: every row's logits equal the
    same row run alone without padding."""
    model, _ = tiny_model(name, seed=31)
    tokens, padding = left_pad(PROMPTS)
    cache = [BatchKVCache(padding) for _ in model.layers]
    batch = [prefill(model, tokens, cache, step_size=4)]
    nxt = mx.array([[1], [2], [3], [4]])
    batch += [model(nxt, cache=cache)[:, -1, :], model(nxt + 10, cache=cache)[:, -1, :]]
    for b, prompt in enumerate(PROMPTS):
        own = model.make_cache()
        rows = [prefill(model, mx.array([prompt]), own)]
        rows += [model(nxt[b : b + 1], cache=own)[:, -1, :], model(nxt[b : b + 1] + 10, cache=own)[:, -1, :]]
        for got, want in zip(batch, rows):
            close(got[b : b + 1], want, atol=1e-4)


def test_filter_keeps_rows_in_order_and_drops_shared_padding():
    """Keep rows 2 and 1 (padded 3 and 2): the 2 slots both pad are dropped."""
    cache = filled_batch_cache([0, 2, 3], 6, base=0)
    cache.filter([2, 1])
    assert cache.left_padding == [1, 0] and cache.offset == 4
    assert cache_slots(cache, 0) == [22, 23, 24, 25] and cache_slots(cache, 1) == [12, 13, 14, 15]
    np.testing.assert_array_equal(np.array(cache.values[0, 1, :4, 2]), [-22, -23, -24, -25])
    assert cache.rope_offset.tolist() == [3, 4]  # each row's own position is unchanged


def test_filter_needs_a_row():
    with pytest.raises(ValueError, match="at least one row"):
        filled_batch_cache([0], 2, 0).filter([])


# ---- the running batch ----------------------------------------------------------------------


def batch_requests(tok, prompts) -> list[BatchRequest]:
    """Request i of `prompts[i]`, drawing with seed i."""
    return [BatchRequest(i, list(p), 8, Sampler([SamplingParams(temperature=0.9, seed=i)]), StreamingDetokenizer(tok),
                         history=list(p)) for i, p in enumerate(prompts)]


def test_a_prefilled_batch_has_one_row_per_request_and_equal_prompts_share_a_prefill():
    """Requests 0 and 2 have one prompt: three rows from two prefilled prompts, each row's
    logits those of its prompt alone, its sampler row its own."""
    model, _ = tiny_model("qwen2-untied", seed=31)
    tok = vocab_tokenizer(model.args.vocab_size)
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[0]]
    batch = RunningBatch.prefilled(model, batch_requests(tok, prompts), step_size=4)
    assert [r.uid for r in batch.requests] == [0, 1, 2] and [p.seed for p in batch.sampler.params] == [0, 1, 2]
    assert batch.cache[0].left_padding == [0, 3, 0] and batch.logits.shape[0] == 3
    for b, prompt in enumerate(prompts):
        close(batch.logits[b : b + 1], prefill(model, mx.array([prompt]), model.make_cache()), atol=1e-4)
    np.testing.assert_array_equal(np.array(batch.logits[0]), np.array(batch.logits[2]))


def test_filter_keeps_requests_cache_sampler_and_logits_in_step_and_advance_feeds_them():
    """`filter([2, 0])` keeps rows 2 and 0 in that order everywhere; `advance` then gives each
    kept row the next-token logits its prompt gets alone."""
    model, _ = tiny_model("llama-untied", seed=32)
    tok = vocab_tokenizer(model.args.vocab_size)
    batch = RunningBatch.prefilled(model, batch_requests(tok, PROMPTS[:3]), step_size=4)
    before = np.array(batch.logits)
    batch.filter([2, 0])
    assert [r.uid for r in batch.requests] == [2, 0] and [p.seed for p in batch.sampler.params] == [2, 0]
    np.testing.assert_array_equal(np.array(batch.logits), before[[2, 0]])
    assert batch.cache[0].left_padding == [3, 0] and batch.cache[0].offset == 7
    batch.advance(model, mx.array([11, 12]))
    for row, (prompt, token) in enumerate([(PROMPTS[2], 11), (PROMPTS[0], 12)]):
        own = model.make_cache()
        prefill(model, mx.array([prompt]), own)
        close(batch.logits[row : row + 1], model(mx.array([[token]]), cache=own)[:, -1, :], atol=1e-4)


# ---- batch_generate -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen2-untied", "llama-tied"])
def test_greedy_rows_equal_each_prompt_alone(name):
    model, _ = tiny_model(name, seed=5)
    tok = vocab_tokenizer(model.args.vocab_size)
    result = batch_generate(model, tok, PROMPTS, max_tokens=10)
    assert result.tokens == [generate_alone(model, tok, p, 10) for p in PROMPTS]
    assert result.texts == [tok.decode(t) for t in result.tokens]


def test_seeded_rows_with_their_own_params_equal_each_prompt_alone():
    """Each row has its own temperature, filters and seed: it draws exactly the tokens the
    same prompt and params draw alone."""
    model, _ = tiny_model("qwen2-tied", seed=6)
    tok = vocab_tokenizer(model.args.vocab_size)
    params = [
        SamplingParams(temperature=1.0, seed=1),
        SamplingParams(temperature=0.7, top_k=20, seed=2),
        SamplingParams(temperature=1.3, top_p=0.9, min_p=0.02, seed=3),
        SamplingParams(temperature=0.9, repetition_penalty=1.3, seed=4),
    ]
    result = batch_generate(model, tok, PROMPTS, max_tokens=12, params=params)
    assert result.tokens == [generate_alone(model, tok, p, 12, q) for p, q in zip(PROMPTS, params)]
    assert len({tuple(t) for t in result.tokens}) == 4


def test_rows_finish_independently():
    """Row 1 has 3 tokens to make, row 2 is forced to end at once (its end-of-sequence
    token gets a huge bias): both stop while the others go on, with their reasons."""
    model, _ = tiny_model("llama-untied", seed=7)
    tok = vocab_tokenizer(model.args.vocab_size)
    params = [None, None, SamplingParams(temperature=0.0, logit_bias={0: 1e4}), None]
    params = [p or SamplingParams(temperature=0.0, logit_bias={0: -1e4}) for p in params]
    result = batch_generate(model, tok, PROMPTS, max_tokens=[8, 3, 8, 5], params=params)
    assert [len(t) for t in result.tokens] == [8, 3, 0, 5]
    assert result.finish_reasons == ["length", "length", "stop", "length"]
    assert result.tokens[0] == generate_alone(model, tok, PROMPTS[0], 8, params[0])
    assert result.stats.generation_tokens == 8 + 3 + 1 + 5  # the end-of-sequence draw counts
    assert result.stats.prompt_tokens == sum(map(len, PROMPTS))


def test_requests_with_one_prompt_share_its_prefill():
    """Three requests of one prompt and one of another, joining together: two prompts are
    prefilled, and every request gives its solo tokens."""
    model, _ = tiny_model("llama-tied", seed=41)
    tok = vocab_tokenizer(model.args.vocab_size)
    prompts = [[5, 17, 3, 8], [5, 17, 3, 8], [9, 2], [5, 17, 3, 8]]
    params = [SamplingParams(temperature=0.9, seed=i) for i in range(4)]
    gen = BatchGenerator(model, tok)
    for p, sp in zip(prompts, params):
        gen.insert(p, 6, sp)
    tokens = {}
    while gen.has_work():
        for r in gen.step():
            if r.finish_reason != "stop":
                tokens.setdefault(r.uid, []).append(r.token)
    assert gen.stats.prompt_tokens == 4 + 2
    for uid in range(4):
        assert tokens[uid] == generate_alone(model, tok, prompts[uid], 6, params[uid])
    assert len({tuple(tokens[u]) for u in (0, 1, 3)}) == 3  # one prefill, three seeds


def test_string_prompts_are_encoded():
    model, _ = tiny_model("llama-tied", seed=9)
    tok = vocab_tokenizer(model.args.vocab_size)
    result = batch_generate(model, tok, ["w5 w6 w7", "w9"], max_tokens=4)
    assert result.tokens == [generate_alone(model, tok, [5, 6, 7], 4), generate_alone(model, tok, [9], 4)]


def test_default_model_batch_equals_each_prompt_alone(course_default_model):
    """Three chat-free prompts of different lengths on the default model, greedy."""
    model, tok = course_default_model
    prompts = ["The capital of France is", "Write a haiku about the sea.", "1, 2, 3, 4,"]
    result = batch_generate(model, tok, prompts, max_tokens=8)
    assert result.tokens == [generate_alone(model, tok, p, 8) for p in prompts]


def test_responses_report_progress_and_text():
    model, _ = tiny_model("llama-untied", seed=42)
    tok = vocab_tokenizer(model.args.vocab_size)
    gen = BatchGenerator(model, tok, max_batch_size=2)
    uid = gen.insert([3, 4], 3, SamplingParams(temperature=0.0, logit_bias={0: -1e4}))
    responses = [r for _ in range(3) for r in gen.step()]
    assert [r.generation_tokens for r in responses] == [1, 2, 3]
    assert [r.finish_reason for r in responses] == [None, None, "length"]
    assert "".join(r.text for r in responses) == tok.decode([r.token for r in responses])
    assert not gen.has_work() and gen.step() == [] and uid == 0
