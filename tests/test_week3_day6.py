"""Week 3, day 6: attention straight over pages, flash-style (a C++ MLX primitive for the CPU),
against attention on the gathered pages computed in float64, and inside the paged batch engine."""

import mlx.core as mx
import numpy as np
import pytest

from conftest import EPS, tiny_model
from tiny_llm import kernels
from tiny_llm.paged_cache import BlockTable, PagedKVCache, PagePool

# Every test here runs our kernel: on the CPU, built (the error says why not).
pytestmark = pytest.mark.usefixtures("kernels_on_the_cpu")


def reference(q, keys, values, pages, starts, page_size, scale):
    """Float64 attention: row b's query i sees positions 0 .. starts[b] + i, found through its pages."""
    q, keys, values = (np.array(a.astype(mx.float32), dtype=np.float64) for a in (q, keys, values))
    pages, starts = np.array(pages), np.array(starts)
    B, Hq, L, D = q.shape
    Hkv = keys.shape[1]
    out = np.zeros((B, Hq, L, values.shape[2]))
    for b in range(B):
        for i in range(L):
            n = starts[b] + i + 1
            slots = pages[b, np.arange(n) // page_size] * page_size + np.arange(n) % page_size
            for h in range(Hq):
                k, v = keys[slots, h // (Hq // Hkv)], values[slots, h // (Hq // Hkv)]
                s = k @ q[b, h, i] * scale
                p = np.exp(s - s.max())
                out[b, h, i] = p @ v / p.sum()
    return out


def random_pool(B, L, starts, Hkv, D, page_size, dtype, seed):
    """A pool with each row's pages in a shuffled order, some pages unused."""
    rng = np.random.default_rng(seed)
    need = [-(-(s + L) // page_size) for s in starts]
    n = max(need)
    total = sum(need) + 3
    order = rng.permutation(total)
    pages, at = np.zeros((B, n), dtype=np.int32), 0
    for b in range(B):
        pages[b, :need[b]] = order[at:at + need[b]]
        at += need[b]
    keys = mx.array(rng.standard_normal((total * page_size, Hkv, D)), dtype=dtype)
    values = mx.array(rng.standard_normal((total * page_size, Hkv, D)), dtype=dtype)
    return keys, values, mx.array(pages), mx.array(np.array(starts, dtype=np.int32))


CASES = [  # (starts of the rows, L new positions, Hq, Hkv, D, page_size, dtype)
    ([37], 1, 9, 3, 64, 16, mx.float16),             # decode, the default model's heads
    ([0, 5, 40, 17], 1, 4, 2, 32, 16, mx.float32),   # a ragged batch decoding
    ([3, 0], 7, 4, 4, 32, 5, mx.float32),            # chunked prefill, no grouping, odd pages
    ([0], 70, 6, 2, 64, 16, mx.bfloat16),            # a whole prompt: several key tiles
    ([12, 40, 1], 3, 2, 1, 16, 1, mx.float16),       # pages of one position
    ([100, 33], 1, 14, 2, 64, 32, mx.float32),
]


@pytest.mark.parametrize("starts, L, Hq, Hkv, D, page_size, dtype", CASES)
def test_paged_attention_equals_attention_on_gathered_pages(starts, L, Hq, Hkv, D, page_size, dtype):
    B = len(starts)
    keys, values, pages, starts_a = random_pool(B, L, starts, Hkv, D, page_size, dtype, seed=sum(starts) + L)
    q = mx.random.normal((B, Hq, L, D), key=mx.random.key(L * 31 + Hq)).astype(dtype)
    scale = D**-0.5
    ours = kernels.paged_attention(q, keys, values, pages, starts_a, page_size, scale)
    assert ours.shape == (B, Hq, L, D) and ours.dtype == dtype
    ref = reference(q, keys, values, pages, starts_a, page_size, scale)
    # Outputs are averages of values of order 1: a few units of the dtype, plus float32 sums.
    bound = 4 * EPS[dtype] + 1e-5
    assert np.abs(np.array(ours.astype(mx.float32)) - ref).max() <= bound


def test_mlx_on_gathered_pages_agrees():
    """MLX's own fused attention on the gathered pages, with the per-row causal mask, is the
    same function (float32)."""
    keys, values, pages, starts = random_pool(3, 4, [5, 0, 21], 2, 32, 8, mx.float32, seed=9)
    q = mx.random.normal((3, 6, 4, 32), key=mx.random.key(9))
    ours = kernels.paged_attention(q, keys, values, pages, starts, 8, 0.2)
    mlx = kernels._paged_attention_ops(q, keys, values, pages, starts, 8, 0.2)
    np.testing.assert_allclose(np.array(ours), np.array(mlx), atol=2e-5, rtol=1e-5)


def test_threads_and_a_row_alone_give_the_same_bits():
    """A row's output does not depend on the thread count or on the other rows."""
    keys, values, pages, starts = random_pool(3, 2, [30, 4, 61], 2, 64, 16, mx.float16, seed=5)
    q = mx.random.normal((3, 6, 2, 64), key=mx.random.key(5)).astype(mx.float16)
    outs = []
    for n in (1, 2):
        with kernels.threads(n):
            outs.append(np.array(kernels.paged_attention(q, keys, values, pages, starts, 16, 0.125).astype(mx.float32)))
    assert (outs[0] == outs[1]).all()
    alone = kernels.paged_attention(q[1:2], keys, values, pages[1:2, :1], starts[1:2], 16, 0.125)
    assert (np.array(alone.astype(mx.float32)) == outs[0][1:2]).all()


def test_the_paged_cache_attends_in_place():
    """The model on a paged cache: with the kernel, attention never gathers the pages
    (`update_and_fetch` is not called), and the logits equal those of the gathering path."""
    model = tiny_model("llama-tied")[0]
    kernels.extension().probe("week3-day6")  # the day's function runs (a starter's stub raises here)
    tokens = mx.array([[3, 17, 5, 9, 22, 4, 8], [1, 2, 3, 4, 5, 6, 7]])

    def run(in_place: bool):
        pool = PagePool(page_size=4)
        tables = [BlockTable(pool), BlockTable(pool)]
        cache = [PagedKVCache(pool, layer, tables) for layer in range(len(model.layers))]
        fetched = []
        for c in cache:
            real = c.update_and_fetch
            c.update_and_fetch = lambda k, v, real=real: fetched.append(1) or real(k, v)
            if not in_place:
                c.attend = lambda *a: None
        first = model(tokens[:, :5], cache=cache)
        second = model(tokens[:, 5:], cache=cache)  # two positions more, on pages already half full
        return np.array(mx.concatenate([first, second], axis=1)), len(fetched)

    direct, gathers = run(True)
    gathered, gathers_without = run(False)
    assert gathers == 0 and gathers_without == 2 * len(model.layers)
    np.testing.assert_allclose(direct, gathered, atol=1e-4, rtol=1e-4)


def test_batch_engine_on_the_kernel_writes_the_same_tokens(default_model_dir):
    """Greedy batches of the default model on pages: the same tokens with the kernel as with
    the kernels off (MLX ops, gathered pages)."""
    import tiny_llm
    from tiny_llm import SamplingParams, batch_generate

    kernels.extension().probe("week3-day6")
    model, tokenizer = tiny_llm.load(str(default_model_dir))
    prompts = ["Name a colour.", "Count to five:", "The capital of Italy is"]
    params = [SamplingParams(temperature=0.0)] * 3
    ours = batch_generate(model, tokenizer, prompts, max_tokens=8, params=params, paged=True).texts
    before = kernels.enable(False)
    try:
        ref = batch_generate(model, tokenizer, prompts, max_tokens=8, params=params, paged=True).texts
    finally:
        kernels.enable(before)
    assert ours == ref


@pytest.mark.parametrize("B, L, start, Hq, Hkv, dtype", [(1, 1, 40, 9, 3, mx.float16), (2, 5, 0, 4, 2, mx.float32),
                                                          (1, 9, 300, 2, 2, mx.bfloat16)])
def test_attention_over_a_dense_cache_equals_the_reference(B, L, start, Hq, Hkv, dtype):
    """A KVCache's buffers `[B, Hkv, S, D]` are one page of S positions per row and head:
    the same kernel reads them in place (positions past `start + L` are never read)."""
    S, D = 512, 32
    keys = mx.random.normal((B, Hkv, S, D), key=mx.random.key(1)).astype(dtype)
    values = mx.random.normal((B, Hkv, S, D), key=mx.random.key(2)).astype(dtype)
    q = mx.random.normal((B, Hq, L, D), key=mx.random.key(3)).astype(dtype)
    ours = kernels.dense_attention(q, keys, values, start, 0.25)
    # The same numbers as a pool: slot b * Hkv * S + h * S + s  <->  pool[slot // Hkv ...]: lay out directly.
    pool_k = keys.transpose(0, 2, 1, 3).reshape(B * S, Hkv, D)  # row b's position s at slot b * S + s
    pool_v = values.transpose(0, 2, 1, 3).reshape(B * S, Hkv, D)
    pages = mx.array([[b * S + s for s in range(S)] for b in range(B)], dtype=mx.int32)  # pages of one position
    ref = reference(q, pool_k, pool_v, pages, mx.array([start] * B, dtype=mx.int32), 1, 0.25)
    assert np.abs(np.array(ours.astype(mx.float32)) - ref).max() <= 4 * EPS[dtype] + 1e-5


def test_generation_on_a_dense_cache_attends_in_place(monkeypatch):
    """`KVCache.attend` (single-sequence generation): the same logits as the gathering path,
    through prefill in two chunks and decode (the layers on MLX ops: the fused decode step of
    week 2 day 7 attends inside its own primitive); a batch cache (left padding) never attends."""
    from tiny_llm import fused_step
    from tiny_llm.kv_cache import BatchKVCache

    monkeypatch.setattr(fused_step, "decode", lambda model, tokens, cache: None)

    kernels.extension().probe("week3-day6")
    model = tiny_model("qwen2-untied")[0]
    tokens = mx.array([[3, 17, 5, 9, 22, 4, 8, 11]])

    answered = []

    def run(in_place: bool):
        cache = model.make_cache()
        for c in cache:
            real = c.attend
            c.attend = (lambda *a, real=real: answered.append(real(*a)) or answered[-1]) if in_place else (lambda *a: None)
        parts = [model(tokens[:, :5], cache=cache), model(tokens[:, 5:7], cache=cache), model(tokens[:, 7:], cache=cache)]
        return np.array(mx.concatenate(parts, axis=1))

    np.testing.assert_allclose(run(True), run(False), atol=1e-4, rtol=1e-4)
    assert len(answered) == 3 * len(model.layers) and all(o is not None for o in answered)
    assert BatchKVCache([0]).attend(None, None, None, 1.0) is None
