"""top-k and top-p without sorting the vocabulary (`sampler/search.py`), on rows of every shape.

`search.top_k` and `search.top_p` must give the logits of the sorted reference
(`stages.top_k`, `stages.top_p`) to the bit: on typical rows, on wide rows (a 0.9 nucleus of
about a thousand tokens), on flat rows (thousands), with ties at the threshold, for k up to
the vocabulary and on rows an earlier filter has cut. The engine runs them, so its draws on
such rows follow the reference's distribution (chi-square), are reproducible, do not depend
on the other rows of the batch, and never sort the vocabulary.
"""

import mlx.core as mx
import numpy as np
import pytest
from conftest import pooled
from scipy.stats import chisquare

from tiny_llm.sampler import Sampler, SamplingParams, fast, search, stages

ALPHA = 1e-4  # false-alarm rate of each chi-square test
SHAPES = {"typical": (1.5, 1.0), "wide": (1.0, 0.5), "flat": (0.0, 3.0)}  # Zipf exponent, noise


def rows(shape: str, B: int, V: int, seed: int = 0, ties: bool = False, noise: float | None = None) -> mx.array:
    """`B` rows of logits of one shape, each permuted; `ties`: rounded to bfloat16 (few
    distinct values, so large groups of equal logits); `noise` overrides the shape's."""
    exponent, scale = SHAPES[shape]
    noise = scale if noise is None else noise
    rng = np.random.default_rng(seed)
    scores = -exponent * np.log(np.arange(1, V + 1)) + noise * rng.standard_normal((B, V))
    x = mx.array(rng.permuted(scores, axis=1).astype(np.float32))
    return x.astype(mx.bfloat16).astype(mx.float32) if ties else x


def nucleus_size(x: mx.array, p: float) -> np.ndarray:
    kept = stages.top_p(x, mx.full((x.shape[0], 1), p))
    return np.array(mx.sum(kept > -np.inf, axis=-1))


@pytest.mark.parametrize("first", [search.FIRST, 256], ids=["first-selection", "growing"])
@pytest.mark.parametrize("ties", [False, True], ids=["float32", "bfloat16-ties"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_top_p_is_the_sorted_reference(shape, ties, first, monkeypatch):
    """Every p from 0 to 0.999, on 6 rows of 30,000 tokens: the same logits to the bit;
    also when the first selection takes only 256 tokens, so that wide and flat rows need
    the larger selections after it."""
    monkeypatch.setattr(search, "FIRST", first)
    x = rows(shape, 6, 30_000, seed=1, ties=ties)
    for value in (0.0, 0.05, 0.5, 0.9, 0.95, 0.999):
        p = mx.full((6, 1), value)
        assert mx.array_equal(search.top_p(x, p), stages.top_p(x, p)).item(), (shape, value)
    if shape != "typical":  # these rows reach past the window, and past 256 tokens
        assert (nucleus_size(x, 0.9) > max(fast.WINDOW, 256)).all()


def test_top_p_rows_of_different_p_and_cut_rows():
    """Per-row p (one row off), and rows an earlier filter cut (their normaliser is the
    running sum over the candidates)."""
    x = rows("flat", 4, 20_000, seed=2)
    p = mx.array([[0.9], [1.0], [0.3], [0.99]])
    assert mx.array_equal(search.top_p(x, p), stages.top_p(x, p)).item()
    cut = stages.top_k(x, mx.array([[5000], [0], [300], [19_000]]))
    uncut = mx.array([[False], [True], [False], [False]])
    assert mx.array_equal(search.top_p(cut, p, uncut), stages.top_p(cut, p, uncut)).item()


def test_top_p_ties_straddle_the_threshold():
    """600 equal logits around where the mass reaches p: all of them stay, as in the
    reference (the nucleus ends inside the tied block)."""
    V = 5000
    values = np.full((1, V), -8.0, dtype=np.float32)
    values[0, :50] = np.linspace(2.0, 0.0, 50)
    values[0, 1000:1600] = -1.0
    x = mx.array(values)
    mass = np.exp(values[0].astype(np.float64))
    above = mass[:50].sum() / mass.sum()
    through = (mass[:50].sum() + mass[1000:1600].sum()) / mass.sum()
    p = mx.array([[(above + through) / 2]])  # inside the tied block
    got = np.array(search.top_p(x, p))[0]
    assert mx.array_equal(mx.array(got)[None], stages.top_p(x, p)).item()
    assert (got[1000:1600] == -1.0).all() and (got[1600:] == -np.inf).all()


@pytest.mark.parametrize("shape", ["typical", "flat"])
def test_top_k_is_the_sorted_reference(shape):
    """k from 1 to past the vocabulary, per row (one row off), with and without ties."""
    V = 10_000
    for ties in (False, True):
        x = rows(shape, 4, V, seed=3, ties=ties)
        for ks in ([1, 40, 0, 257], [5000, V - 1, V, V + 3]):
            k = mx.array(ks)[:, None]
            assert mx.array_equal(search.top_k(x, k), stages.top_k(x, k)).item(), (shape, ties, ks)


def test_top_k_keeps_every_tie_of_the_kth():
    """k = 100 lands inside 400 equal logits: all 400 stay."""
    values = np.full((1, 3000), -5.0, dtype=np.float32)
    values[0, :60] = np.linspace(3.0, 1.0, 60)
    values[0, 2000:2400] = 0.0
    got = np.array(search.top_k(mx.array(values), mx.array([[100]])))[0]
    assert (got[2000:2400] == 0.0).all() and np.isinf(got[60:2000]).all() and np.isinf(got[2400:]).all()


# ---- the engine on wide and flat rows ------------------------------------------------------------

V_CHI, ROWS, ROUNDS = 2000, 1000, 5
# Flat rows of 2,000 tokens with N(0, 1.5) logits: a 0.9 nucleus of about 800 tokens.
CHI_ROWS = {"wide": rows("wide", 1, V_CHI, seed=4)[0], "flat": rows("flat", 1, V_CHI, seed=5, noise=1.5)[0],
            "flat-ties": rows("flat", 1, V_CHI, seed=6, ties=True, noise=1.5)[0]}
CHI_PARAMS = {
    "top_p": dict(top_p=0.9),
    "top_p-hot": dict(top_p=0.95, temperature=1.5),
    "top_k-near-V": dict(top_k=V_CHI - 3),
    "top_k-wide": dict(top_k=700, temperature=0.7),
    "min_p-below-window": dict(min_p=0.002, top_k=1500),
    "chain": dict(temperature=0.8, top_k=1200, top_p=0.95, min_p=0.001),
    "hf-order": dict(order="hf", temperature=1.4, top_p=0.9, top_k=1500),
}


def sorted_reference(monkeypatch):
    """The engine with the sorted reference stages in place of `search`."""
    monkeypatch.setattr(search, "top_k", stages.top_k)
    monkeypatch.setattr(search, "top_p", stages.top_p)


# Every filter on the wide and the flat row; on the row of ties, the filters whose
# threshold can fall inside a tied block.
CHI_CASES = [(row, params) for row in ("wide", "flat") for params in CHI_PARAMS] + [
    ("flat-ties", params) for params in ("top_p", "top_k-wide", "chain")]


@pytest.mark.parametrize("row, params", CHI_CASES, ids=[f"{r}-{p}" for r, p in CHI_CASES])
def test_draws_follow_the_reference_distribution(row, params, monkeypatch):
    """5,000 draws (1,000 rows with their own seeds, 5 rounds) against the distribution the
    sorted reference chain gives: never a token of probability 0, and a chi-square test
    (bins pooled to expected >= 20, where the chi-square approximation of the statistic
    holds in the tail) does not reject at ALPHA. The engine's own
    `.distribution()` is the reference's to the bit."""
    kw = CHI_PARAMS[params]
    x = mx.array(np.tile(np.array(CHI_ROWS[row]), (ROWS, 1)))
    with monkeypatch.context() as m:
        sorted_reference(m)
        expected_row = np.array(Sampler(SamplingParams(**kw)).distribution(x[:1]), np.float64)[0]
    assert np.array_equal(np.array(Sampler(SamplingParams(**kw)).distribution(x[:1]))[0], expected_row)
    assert np.count_nonzero(expected_row) > fast.WINDOW  # past the window: the search decides
    sampler = Sampler([SamplingParams(**kw, seed=i) for i in range(ROWS)])
    observed = np.zeros(V_CHI)
    for _ in range(ROUNDS):
        tokens = np.array(sampler.sample(x))
        assert (expected_row[tokens] > 0).all(), "a token of probability 0 was drawn"
        observed += np.bincount(tokens, minlength=V_CHI)
    support = expected_row > 0
    obs, exp = pooled(observed[support], expected_row[support] * ROWS * ROUNDS, minimum=20)
    stat, pvalue = chisquare(obs, exp * obs.sum() / exp.sum())
    assert pvalue > ALPHA, f"{row}/{params}: chi2={stat:.1f}, p={pvalue:.2e}"


def test_seeded_draws_repeat_and_ignore_the_rest_of_the_batch():
    """A flat top-p row and a wide top-k row draw the same 8 tokens alone, again, and inside
    a batch beside a greedy row, a typical top-k 40 row and a min-p row."""
    flat, wide, typical = rows("flat", 1, 8000, seed=7), rows("wide", 1, 8000, seed=8), rows("typical", 1, 8000, seed=9)
    a = SamplingParams(top_p=0.9, seed=11)
    b = SamplingParams(top_k=3000, temperature=0.9, seed=12)
    others = [SamplingParams(temperature=0.0), SamplingParams(top_k=40, seed=13), SamplingParams(min_p=0.01, seed=14)]

    def draw(params, x, steps=8):
        sampler = Sampler(params)
        return [sampler.sample(x).tolist() for _ in range(steps)]

    alone_a, alone_b = draw([a], flat), draw([b], wide)
    assert alone_a == draw([a], flat) and alone_b == draw([b], wide)
    assert len({t[0] for t in alone_a}) > 1  # really sampling
    batch = draw([others[0], a, others[1], b, others[2]], mx.concatenate([typical, flat, typical, wide, typical]))
    assert [t[1] for t in batch] == [t[0] for t in alone_a]
    assert [t[3] for t in batch] == [t[0] for t in alone_b]


def test_logprobs_on_flat_rows_are_the_reference_distribution(monkeypatch):
    """sample_with_logprobs on flat rows draws what sample draws, and reports the log of the
    reference distribution at the token."""
    x = rows("flat", 3, 8000, seed=10)
    params = [SamplingParams(top_p=0.9, seed=s) for s in (1, 2, 3)]
    with monkeypatch.context() as m:
        sorted_reference(m)
        probs = np.array(Sampler(params).distribution(x), np.float64)
    plain, with_logprobs = Sampler(params), Sampler(params)
    for _ in range(4):
        tokens = plain.sample(x)
        result = with_logprobs.sample_with_logprobs(x)
        assert result.tokens.tolist() == tokens.tolist()
        expected = np.log(probs[np.arange(3), np.array(tokens)])
        np.testing.assert_allclose(np.array(result.logprob), expected, rtol=1e-5)


def test_no_path_of_these_filters_sorts_the_vocabulary(monkeypatch):
    """Sampling, `.distribution()` and `.sample_with_logprobs()` (0 or 5 alternatives) of top-p on
    flat rows, wide top-k, and the llama.cpp chain never sort (or argsort) as many values as
    the vocabulary has."""
    V = 20_000
    sizes = []

    def recording(fn):
        def wrapped(a, *args, **kwargs):
            sizes.append(np.shape(a)[-1])
            return fn(a, *args, **kwargs)
        return wrapped

    for module, name in ((mx, "sort"), (mx, "argsort"), (np, "sort"), (np, "argsort")):
        monkeypatch.setattr(module, name, recording(getattr(module, name)))
    x = rows("flat", 2, V, seed=11)
    for kw in (dict(top_p=0.9), dict(top_k=5000), dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
               dict(top_p=0.95, min_p=0.0001)):
        for logprobs in (0, 5):
            sampler = Sampler(SamplingParams(seed=1, logprobs=logprobs, **kw))
            sampler.sample(x)
            sampler.distribution(x)
            mx.eval(*vars(sampler.sample_with_logprobs(x)).values())
    assert sizes and max(sizes) < V // 2, sorted(sizes)[-5:]
