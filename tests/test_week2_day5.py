"""Week 2, day 5: continuous batching — rows leave (filter) and join (extend) the running
batch between decode steps, and every request still gets the tokens it would get alone."""

import mlx.core as mx
import numpy as np
import pytest
from conftest import cache_slots, filled_batch_cache, generate_alone, tiny_model, vocab_tokenizer

from tiny_llm.batch import BatchGenerator, RunningBatch, batch_generate
from tiny_llm.kv_cache import BatchKVCache
from tiny_llm.model import prefill
from tiny_llm.sampler import Sampler, SamplingParams
from tiny_llm.scheduler import BatchRequest
from tiny_llm.tokenizer import StreamingDetokenizer


# ---- the cache: rows leave and join -----------------------------------------------------------


def test_extend_left_pads_the_shorter_side():
    """A (1 row, 3 slots) + B (2 rows, 5 slots, row 0 padded by 1): A is shifted right by 2;
    padding and offset move together, so every row keeps its positions."""
    a, b = filled_batch_cache([0], 3, base=100), filled_batch_cache([1, 0], 5, base=200)
    a.extend(b)
    assert a.offset == 5 and a.left_padding == [2, 1, 0]
    assert cache_slots(a, 0)[2:] == [100, 101, 102]
    assert cache_slots(a, 1) == [200, 201, 202, 203, 204] and cache_slots(a, 2) == [210, 211, 212, 213, 214]
    assert a.rope_offset.tolist() == [3, 4, 5]
    c, d = filled_batch_cache([0], 4, base=0), filled_batch_cache([0], 2, base=50)
    c.extend(d)  # now the joining side is shorter
    assert c.left_padding == [0, 2] and cache_slots(c, 1)[2:] == [50, 51]


def test_extend_into_an_empty_cache_takes_the_rows():
    empty, b = BatchKVCache([0]), filled_batch_cache([1, 0], 3, base=0)
    empty.extend(b)
    assert empty.offset == 3 and empty.left_padding == [1, 0] and cache_slots(empty, 1) == [10, 11, 12]


def test_rows_that_join_keep_their_logits_and_follow_the_running_rows():
    """A prefilled 1-row batch joins a running 2-row batch that has decoded a token: the
    requests, sampler rows and logits follow the running ones, and one more step gives every
    row the logits its prompt gets alone."""
    model, _ = tiny_model("qwen2-tied", seed=33)
    tok = vocab_tokenizer(model.args.vocab_size)

    def requests(first: int, prompts):
        return [BatchRequest(first + i, list(p), 8, Sampler([SamplingParams(temperature=0.9, seed=first + i)]),
                             StreamingDetokenizer(tok), history=list(p)) for i, p in enumerate(prompts)]

    running = RunningBatch.prefilled(model, requests(0, [PROMPTS[0], PROMPTS[1]]), step_size=4)
    running.advance(model, mx.array([20, 21]))
    joining = RunningBatch.prefilled(model, requests(2, [PROMPTS[2]]), step_size=4)
    expected = np.concatenate([np.array(running.logits), np.array(joining.logits)])
    running.extend(joining)
    assert [r.uid for r in running.requests] == [0, 1, 2] and [p.seed for p in running.sampler.params] == [0, 1, 2]
    np.testing.assert_allclose(np.array(running.logits), expected)
    running.advance(model, mx.array([22, 23, 24]))
    for row, (prompt, fed) in enumerate([(PROMPTS[0], [20, 22]), (PROMPTS[1], [21, 23]), (PROMPTS[2], [24])]):
        own = model.make_cache()
        prefill(model, mx.array([prompt]), own)
        for token in fed:
            want = model(mx.array([[token]]), cache=own)[:, -1, :]
        np.testing.assert_allclose(np.array(running.logits[row : row + 1]), np.array(want), atol=1e-4, rtol=1e-4)


# ---- the generator ------------------------------------------------------------------------------

PROMPTS = [[5, 17, 3, 9, 30, 12, 7], [44], [8, 8, 21, 40], [19, 2, 33, 11, 6, 25, 14, 3, 10], [7, 7]]
LIMITS = [6, 9, 3, 7, 5]


def run(gen: BatchGenerator) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    while gen.has_work():
        for r in gen.step():
            if r.finish_reason != "stop":
                out.setdefault(r.uid, []).append(r.token)
    return out


@pytest.mark.parametrize("max_batch_size", [2, 3])
def test_requests_queue_join_and_leave_and_match_running_alone(max_batch_size):
    """Five requests, at most `max_batch_size` rows at once: waiting ones join as others
    finish; greedy tokens equal each prompt alone."""
    model, _ = tiny_model("qwen2-untied", seed=40)
    tok = vocab_tokenizer(model.args.vocab_size)
    gen = BatchGenerator(model, tok, max_batch_size=max_batch_size, prefill_step_size=3)
    uids = [gen.insert(p, n) for p, n in zip(PROMPTS, LIMITS)]
    out = run(gen)
    assert [out[u] for u in uids] == [generate_alone(model, tok, p, n) for p, n in zip(PROMPTS, LIMITS)]


def test_a_request_inserted_mid_run_joins_and_both_match_alone():
    """Seeded sampling: request B arrives after A has made 3 tokens, joins A's batch, and
    both draw the same tokens as when each runs alone."""
    model, _ = tiny_model("llama-tied", seed=41)
    tok = vocab_tokenizer(model.args.vocab_size)
    pa = SamplingParams(temperature=0.9, top_k=30, seed=11)
    pb = SamplingParams(temperature=1.2, min_p=0.05, seed=12)
    gen = BatchGenerator(model, tok, max_batch_size=4)
    a = gen.insert(PROMPTS[3], 10, pa)
    got = {a: []}
    for _ in range(3):
        got[a] += [r.token for r in gen.step()]
    b = gen.insert(PROMPTS[0], 6, pb)
    assert gen.waiting == [b] and gen.running == [a]
    first = gen.step()
    assert gen.running == [a, b] and [r.uid for r in first] == [a, b]
    for r in first:
        got.setdefault(r.uid, []).append(r.token)
    for uid, tokens in run(gen).items():
        got[uid] += tokens
    assert got[a] == generate_alone(model, tok, PROMPTS[3], 10, pa)
    assert got[b] == generate_alone(model, tok, PROMPTS[0], 6, pb)


@pytest.mark.parametrize("prompt, max_tokens, match", [
    ([], 4, "prompt is empty"),
    ([1, 2], 0, "max_tokens must be"),
    ([1] * 30, 4, "exceeds the model's context of 32 positions"),
    ([1, 999], 4, "outside the vocabulary"),
])
def test_a_bad_request_is_refused_and_the_others_are_not_lost(prompt, max_tokens, match):
    """A bad insert in the middle of a run raises and changes nothing: the running and
    waiting requests finish with the tokens they get without it."""
    model, _ = tiny_model("qwen2-tied", seed=43, max_position_embeddings=32)
    tok = vocab_tokenizer(model.args.vocab_size)
    gen = BatchGenerator(model, tok, max_batch_size=2)
    uids = [gen.insert(p, n) for p, n in zip(PROMPTS[:3], LIMITS[:3])]
    first = {r.uid: [r.token] for r in gen.step()}
    with pytest.raises(ValueError, match=match):
        gen.insert(prompt, max_tokens)
    assert gen.running == uids[:2] and gen.waiting == uids[2:]
    for uid, tokens in run(gen).items():
        first.setdefault(uid, []).extend(tokens)
    assert [first[u] for u in uids] == [generate_alone(model, tok, p, n) for p, n in zip(PROMPTS[:3], LIMITS[:3])]


def test_batch_generate_with_fewer_rows_than_prompts():
    """batch_generate(max_batch_size=2) runs five prompts through two rows."""
    model, _ = tiny_model("llama-untied", seed=44)
    tok = vocab_tokenizer(model.args.vocab_size)
    result = batch_generate(model, tok, PROMPTS, LIMITS, max_batch_size=2)
    assert result.tokens == [generate_alone(model, tok, p, n) for p, n in zip(PROMPTS, LIMITS)]
