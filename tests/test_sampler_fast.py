"""The fast path (window selection) draws exactly what the full chain draws.

Each test samples the same seeded rows twice: through the engine as it is, and with the fast
path switched off, so that every token comes from the full-vocabulary chain. Equal tokens
draw after draw mean the fast path selected the same candidates with the same weights.
"""

import math

import mlx.core as mx
import numpy as np
import pytest

from tiny_llm.sampler import Sampler, SamplingParams, fast
from tiny_llm.sampler.fast import top_window


def both_paths(params, logits, steps=30, history=None, monkeypatch=None):
    """Tokens from `steps` draws with the fast path and with the full path only."""
    fast_sampler = Sampler(params)
    fast_tokens = [fast_sampler.sample(logits, history).tolist() for _ in range(steps)]
    monkeypatch.setattr(fast, "eligible", lambda *_: False)
    full_sampler = Sampler(params)
    full_tokens = [full_sampler.sample(logits, history).tolist() for _ in range(steps)]
    monkeypatch.undo()
    return fast_tokens, full_tokens


def model_like(B, V, seed, exponent=1.5):
    key1, key2 = mx.random.split(mx.random.key(seed))
    scores = -exponent * mx.log(mx.arange(1, V + 1, dtype=mx.float32)) + mx.random.normal((B, V), key=key1)
    perm = mx.argsort(mx.random.uniform(shape=(B, V), key=key2), axis=-1)
    return mx.take_along_axis(scores, perm, axis=-1)


CHAINS = [
    dict(top_p=0.9),
    dict(top_k=40),
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    dict(temperature=0.7, top_k=300, top_p=0.8, order="hf"),
    dict(temperature=1.3, top_p=0.6, min_p=0.02, order="vllm"),
    dict(top_p=0.9, min_p=0.05, top_k=50, order="mlx-lm"),
    dict(temperature=0.8, top_k=40, repetition_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1),
]


@pytest.mark.parametrize("kwargs", CHAINS)
def test_fast_path_draws_the_full_chains_tokens(kwargs, monkeypatch):
    """Model-like rows (V = 20000): seeded draws agree token for token."""
    logits = model_like(3, 20_000, seed=1)
    params = [SamplingParams(seed=s, **kwargs) for s in (1, 2, 3)]
    history = [[5, 17, 17, 900], [], list(range(100))]
    a, b = both_paths(params, logits, history=history, monkeypatch=monkeypatch)
    assert a == b


def test_nucleus_larger_than_the_window(monkeypatch):
    """A flat row whose 0.9 nucleus holds thousands of tokens (far past the window)."""
    logits = model_like(2, 20_000, seed=2, exponent=0.5)
    params = [SamplingParams(top_p=0.9, seed=s) for s in (4, 5)]
    a, b = both_paths(params, logits, monkeypatch=monkeypatch)
    assert a == b
    probs = np.sort(np.array(mx.softmax(logits, axis=-1)))[:, ::-1]
    assert ((np.cumsum(probs, axis=-1) < 0.9).sum(axis=-1) > fast.WINDOW).all()  # really past it


def test_ties_across_the_window_edge(monkeypatch):
    """Many tokens share the value at the window's edge: top-k keeps every one of them."""
    V = 5000
    values = np.full((1, V), -5.0, dtype=np.float32)
    values[0, :100] = np.linspace(0, -2, 100)
    values[0, 3000:3600] = -3.0  # 600 ties straddle any 256-token window
    logits = mx.array(values)
    params = SamplingParams(top_k=200, seed=6)
    a, b = both_paths(params, logits, steps=60, monkeypatch=monkeypatch)
    assert a == b
    drawn = {t for row in a for t in row}
    assert any(3000 <= t < 3600 for t in drawn)  # tied tokens beyond the window are drawn
    probs = np.array(Sampler(params).distribution(logits))[0]
    assert (probs[3000:3600] > 0).all() and probs[3600:].sum() == 0


def test_all_mass_on_one_token(monkeypatch):
    """A row with one finite logit always gives that token, on both paths."""
    values = np.full((2, 3000), -math.inf, dtype=np.float32)
    values[0, 1234] = 0.0
    values[1, 7] = 3.0
    values[1, 8] = -40.0  # probability ~4e-19: kept by top-p 0.999, never drawn
    a, b = both_paths(SamplingParams(top_p=0.999, top_k=10, seed=7), mx.array(values), monkeypatch=monkeypatch)
    assert a == b
    assert all(row == [1234, 7] for row in a)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_half_precision_logits(dtype, monkeypatch):
    """float16/bfloat16 logits (many exact ties) sample like the full chain."""
    logits = model_like(2, 8000, seed=3).astype(dtype)
    params = [SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=s) for s in (8, 9)]
    a, b = both_paths(params, logits, monkeypatch=monkeypatch)
    assert a == b


def test_window_holds_the_largest_logits():
    """The two-level selection returns exactly the W largest values (V not a multiple of
    the chunk, rows with a single huge value and with ties)."""
    V = 151_937
    y = mx.random.normal((3, V), key=mx.random.key(4))
    y = y.at[1, 5].add(100.0)
    y = mx.where(mx.arange(V)[None, :] % 1000 == 0, 4.0, y)  # 152 tied maxima per row
    for W in (64, 256):
        got = mx.sort(mx.take_along_axis(y, top_window(y, W), axis=-1), axis=-1)
        assert mx.array_equal(got, mx.sort(y, axis=-1)[:, -W:])


@pytest.mark.parametrize("V", [64 * 37, 64 * 37 + 5, 200])
def test_chunked_argmax_equals_mx_argmax(V):
    """The two-level argmax returns mx.argmax's index: ties across and inside chunks (the
    lowest index wins), a NaN (counts as largest), all -inf rows, and vocabularies that do
    not split into chunks."""
    from tiny_llm.sampler import stages

    rng = np.random.default_rng(V)
    x = rng.integers(-3, 3, size=(8, V)).astype(np.float32)  # many ties
    x[1] = 2.0  # every entry ties
    x[2, :] = -np.inf
    x[3, V // 2] = np.nan
    x[4, V - 1] = 9.0  # the max in the last chunk
    x[5, 63], x[5, 64] = 9.0, 9.0  # a tie straddling a chunk boundary
    x[6, 0] = -np.inf
    got = np.array(stages.argmax(mx.array(x)))
    assert got.tolist() == np.array(mx.argmax(mx.array(x), axis=-1)).tolist()
    assert got[1] == 0 and got[4] == V - 1 and got[5] == 63 and got[3] == V // 2


@pytest.mark.parametrize("V", [64 * 40, 64 * 40 + 7])
def test_two_level_draw_is_the_inverse_cdf(V):
    """The chunked draw (and, for V not a multiple of 64, the flat one) picks, for every u
    on a grid, the token whose float64 cumulative interval holds u: excluded tokens (-inf)
    are never drawn, also at chunk edges (u within 1e-5 of an interval end is skipped)."""
    from tiny_llm.sampler.draw import draw as _draw

    rng = np.random.default_rng(V)
    x = np.full((3, V), -np.inf, dtype=np.float32)
    x[0] = rng.normal(size=V)  # every token possible
    keep = [0, 63, 64, 127, 1000, 1001, V - 1]  # few tokens, on and across chunk edges
    x[1, keep] = rng.normal(size=len(keep))
    x[2, 65] = 0.0  # one token
    us = (np.arange(997) + 0.5) / 997
    rows = np.repeat(x, len(us), axis=0)
    u = np.tile(us, 3).astype(np.float32)
    tokens, top = _draw(mx.array(rows), mx.array(u))
    tokens = np.array(tokens).reshape(3, len(us))
    np.testing.assert_array_equal(np.array(top).reshape(3, -1)[:, 0], x.max(axis=1))
    for r in range(3):
        p = np.exp(x[r].astype(np.float64) - x[r].max())
        cdf = np.cumsum(p) / p.sum()
        want = np.searchsorted(cdf, us)  # first index with cdf >= u
        clear = np.min(np.abs(cdf[:, None] - us[None, :]), axis=0) > 1e-5
        assert clear.sum() > 900
        np.testing.assert_array_equal(tokens[r][clear], want[clear])
        assert np.all(np.isfinite(x[r][tokens[r]]))


def test_fewer_finite_tokens_than_k_stay_in_the_window(monkeypatch):
    """Top-k 40 on a row with 12 finite logits: the k-th value is -inf and every token
    outside the window ties with it, but those carry no mass, so the window answers (no
    full path) and draws what the full chain draws."""
    V = 5000
    values = np.full((2, V), -math.inf, dtype=np.float32)
    rng = np.random.default_rng(12)
    for row in range(2):
        values[row, rng.choice(V, 12, replace=False)] = rng.normal(0, 1, 12)
    logits = mx.array(values)
    params = [SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=s) for s in (10, 11)]
    u = mx.array([0.3, 0.7])
    _, needs_full, _ = fast.fast_tokens(logits, params, params[0].order, u)
    assert needs_full.tolist() == [False, False]
    a, b = both_paths(params, logits, steps=40, monkeypatch=monkeypatch)
    assert a == b
    assert all(np.isfinite(values[r, t]) for step in a for r, t in enumerate(step))
