"""Week 1, day 7: make_sampler — greedy, temperature, top-k, top-p (and min-p), batched; and
the exponential race (Gumbel-max) with a temperature per row."""

import math

import mlx.core as mx
import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import chi2, chisquare, ncx2

from tiny_llm.sampler import (MIN_EXPONENTIAL, exponential_noise, keep_top_k, keep_top_p, make_sampler,
                              sample_exponential_race, sample_gumbel_max)

# Tests that compare sampled frequencies with expected probabilities use a chi-square test
# at this false-alarm rate (with fixed seeds the outcome is deterministic; the rate says
# how unlucky a seed would have to be for correct code to fail).
FALSE_ALARM = 1e-4


def log(p) -> mx.array:
    return mx.log(mx.array(p, dtype=mx.float32))


def reference_filter(logprobs: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """Straightforward per-row version of the chain: top-k (ties kept), top-p over the
    renormalised survivors (ties kept), min-p. Returns the boolean mask of kept tokens."""
    keep = np.ones_like(logprobs, dtype=bool)
    for r, row in enumerate(logprobs):
        k = np.isfinite(row)
        if 0 < top_k < len(row):
            kth = np.sort(row)[::-1][top_k - 1]
            k &= row >= kth
        if 0 < top_p < 1:
            p = np.where(k, np.exp(row - row[k].max()), 0.0)
            p /= p.sum()
            order = np.argsort(-p, kind="stable")
            mass_before = np.cumsum(p[order]) - p[order]
            last = order[mass_before < top_p][-1]
            k &= row >= row[last]
        if min_p > 0:
            k &= row >= row[k].max() + math.log(min_p)
        keep[r] = k
    return keep


# Four rows with different shapes: peaked, flat with ties, two-humped, and a long tail.
# The top_p values used with them stay clear of the rows' cumulative sums (0.5, 0.7, 0.8,
# 0.9 ...): exactly at a boundary the outcome depends on the last bit of float rounding,
# which test_top_p_boundary_* pins down with exactly representable probabilities.
ROWS = np.log(np.array([
    [0.50, 0.20, 0.10, 0.08, 0.06, 0.04, 0.01, 0.01],
    [0.15, 0.15, 0.15, 0.15, 0.10, 0.10, 0.10, 0.10],
    [0.02, 0.30, 0.02, 0.02, 0.30, 0.14, 0.10, 0.10],
    [0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.65],
], dtype=np.float32))


# ---- greedy ---------------------------------------------------------------------------


def test_temperature_zero_is_argmax_per_row():
    """temp=0 returns each row's most likely token."""
    sampler = make_sampler(0.0)
    assert sampler(mx.array(ROWS)).tolist() == [0, 0, 1, 7]


def test_greedy_ties_go_to_the_lowest_index():
    """Equal maxima pick the first of them, as llama.cpp and mlx-lm do."""
    sampler = make_sampler(temp=0)
    logits = mx.array([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    assert sampler(logits).tolist() == [1, 0]


# ---- the filters, exactly -------------------------------------------------------------


def test_top_k_keeps_exactly_the_k_largest_per_row():
    """keep_top_k on rows whose largest entries sit at different positions."""
    logprobs = mx.array([[0.0, -1.0, -2.0, -3.0], [-3.0, -2.0, -1.0, 0.0]])
    out = keep_top_k(logprobs, 2)
    expected = [[0.0, -1.0, -math.inf, -math.inf], [-math.inf, -math.inf, -1.0, 0.0]]
    assert out.tolist() == expected


def test_top_k_keeps_ties_with_the_kth_value():
    """Every token tied with the k-th largest survives (row 1 of ROWS has four 0.15s)."""
    out = keep_top_k(mx.array(ROWS), 2)
    kept = np.isfinite(np.array(out))
    assert kept[1].tolist() == [True, True, True, True, False, False, False, False]
    assert kept[2].tolist() == [False, True, False, False, True, False, False, False]


@pytest.mark.parametrize("k", [8, 9, 1000])
def test_top_k_at_or_above_vocabulary_is_a_no_op(k):
    """k >= V keeps everything."""
    assert mx.array_equal(keep_top_k(mx.array(ROWS), k), mx.array(ROWS))


def test_top_p_hand_worked_example():
    """p = {.4, .3, .2, .1}, top_p = 0.6: .4 < .6 so .3 is needed too; .7 >= .6 stops."""
    out = keep_top_p(log([[0.1, 0.2, 0.3, 0.4]]), 0.6)
    assert np.isfinite(np.array(out)).tolist() == [[False, False, True, True]]


def test_top_p_boundary_is_inclusive_of_the_token_that_reaches_p():
    """Mass exactly reaching p: {.5, .25, .25} with p = .75 keeps .5 and both .25s (tie)."""
    out = keep_top_p(log([[0.5, 0.25, 0.25, 0.0]]), 0.75)
    assert np.isfinite(np.array(out)).tolist() == [[True, True, True, False]]


def test_top_p_renormalises_after_top_k():
    """After top-2 of {.1,.2,.3,.4} the survivors are {.43,.57}: top_p .5 keeps only .57.
    (mlx-lm, which runs top-p on the full distribution first, would keep both.)"""
    x = keep_top_p(keep_top_k(log([[0.1, 0.2, 0.3, 0.4]]), 2), 0.5)
    assert np.isfinite(np.array(x)).tolist() == [[False, False, False, True]]


@pytest.mark.parametrize("top_k, top_p, min_p", [
    (0, 0.92, 0.0), (3, 0.0, 0.0), (3, 0.72, 0.0), (0, 0.55, 0.0), (5, 0.95, 0.2), (1, 0.9, 0.0),
])
def test_filters_match_a_row_by_row_reference(top_k, top_p, min_p):
    """The chain's surviving set equals a plain per-row reference on all four rows."""
    x = mx.array(ROWS)
    if top_k:
        x = keep_top_k(x, top_k)
    if top_p:
        x = keep_top_p(x, top_p)
    if min_p:
        from tiny_llm.sampler.filters import keep_min_p

        x = keep_min_p(x, min_p)
    expected = reference_filter(ROWS, top_k, top_p, min_p)
    assert np.isfinite(np.array(x)).tolist() == expected.tolist()


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_filters_accept_half_precision(dtype):
    """float16/bfloat16 logprobs give the same surviving set as float32."""
    x = mx.array(ROWS)
    for f in (lambda a: keep_top_k(a, 3), lambda a: keep_top_p(a, 0.83)):
        assert mx.array_equal(mx.isfinite(f(x.astype(dtype))), mx.isfinite(f(x)))


# ---- sampling ----------------------------------------------------------------------------


def draw(sampler, logprobs: np.ndarray, n: int, seed: int) -> np.ndarray:
    """n draws per row: the batch is each row repeated n times. Returns [rows, n]."""
    mx.random.seed(seed)
    batch = mx.repeat(mx.array(logprobs), n, axis=0)  # rows * n, V
    return np.array(sampler(batch)).reshape(len(logprobs), n)


@pytest.mark.parametrize("top_k, top_p, min_p", [(3, 0.0, 0.0), (0, 0.72, 0.0), (4, 0.83, 0.0), (0, 0.0, 0.3)])
def test_drawable_set_equals_the_filtered_set(top_k, top_p, min_p):
    """Over 3000 draws per row every kept token appears and no dropped token ever does."""
    sampler = make_sampler(1.0, top_p=top_p, top_k=top_k, min_p=min_p)
    draws = draw(sampler, ROWS, 3000, seed=1)
    expected = reference_filter(ROWS, top_k, top_p, min_p)
    for r in range(len(ROWS)):
        assert set(np.unique(draws[r]).tolist()) == set(np.flatnonzero(expected[r]).tolist())


@pytest.mark.parametrize("temp, top_k, top_p", [(1.0, 0, 0.0), (0.7, 4, 0.0), (1.5, 0, 0.83), (0.5, 5, 0.91)])
def test_frequencies_match_the_filtered_tempered_distribution(temp, top_k, top_p):
    """Chi-square: counts over 8000 draws per row fit softmax(kept logprobs / temp)."""
    sampler = make_sampler(temp, top_p=top_p, top_k=top_k)
    draws = draw(sampler, ROWS, 8000, seed=2)
    keep = reference_filter(ROWS, top_k, top_p, 0.0)
    for r in range(len(ROWS)):
        logits = np.where(keep[r], ROWS[r] / temp, -np.inf)
        p = np.exp((logits - logits.max()).astype(np.float64))
        p /= p.sum()
        observed = np.bincount(draws[r], minlength=8)[keep[r]]
        expected = p[keep[r]] / p[keep[r]].sum() * observed.sum()
        result = chisquare(observed, expected)
        assert result.pvalue > FALSE_ALARM, (r, observed, p)
        assert observed.sum() == draws.shape[1]  # nothing outside the kept set


def test_low_temperature_concentrates_on_the_top_token():
    """temp = 0.05 on row 0 (p_max .5 vs .2): the top token wins essentially always."""
    draws = draw(make_sampler(0.05), ROWS[:1], 2000, seed=3)
    assert (draws == 0).all()


def test_same_seed_same_tokens_other_seed_other_tokens():
    """Seeding the global generator makes draws reproducible; another seed changes them."""
    sampler = make_sampler(1.0, top_p=0.95)
    a, b, c = draw(sampler, ROWS, 50, 7), draw(sampler, ROWS, 50, 7), draw(sampler, ROWS, 50, 8)
    assert (a == b).all()
    assert (a != c).any()


def test_batch_rows_use_their_own_distribution():
    """Rows whose nuclei are disjoint never borrow each other's tokens (no union masking)."""
    logprobs = log([[0.9, 0.05, 0.05, 0.0], [0.0, 0.05, 0.05, 0.9]])
    draws = draw(make_sampler(1.0, top_k=1), np.array(logprobs), 200, seed=4)
    assert (draws[0] == 0).all() and (draws[1] == 3).all()


@pytest.mark.parametrize("top_p", [0.0, None, 1.0])
def test_top_p_zero_none_and_one_are_off(top_p):
    """top_p of 0, None or 1 leaves the distribution whole: the rare tokens still appear."""
    draws = draw(make_sampler(1.0, top_p=top_p, top_k=None), ROWS[:1], 4000, seed=5)
    assert set(np.unique(draws).tolist()) == set(range(8))


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_sampler_accepts_half_precision(dtype):
    """Half-precision logprobs sample only from the filtered set."""
    sampler = make_sampler(0.8, top_k=3, top_p=0.9)
    mx.random.seed(6)
    batch = mx.repeat(mx.array(ROWS).astype(dtype), 500, axis=0)
    draws = np.array(sampler(batch)).reshape(4, 500)
    expected = reference_filter(ROWS, 3, 0.9, 0.0)
    for r in range(4):
        assert set(np.unique(draws[r]).tolist()) <= set(np.flatnonzero(expected[r]).tolist())


# ---- bad arguments --------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, match", [
    # The message must name the argument and the value it got.
    (dict(temp=-0.5), r"temp.*-0\.5"),
    (dict(temp=float("nan")), "temp.*nan"),
    (dict(temp=float("inf")), "temp.*inf"),
    (dict(temp=0.7, top_p=1.5), r"top_p.*1\.5"),
    (dict(temp=0.7, top_p=-0.1), r"top_p.*-0\.1"),
    (dict(temp=0.7, top_p=float("nan")), "top_p.*nan"),
    (dict(temp=0.7, top_k=2.5), r"top_k.*2\.5"),
    (dict(temp=0.7, top_k=-1), "top_k.*-1"),
    (dict(temp=0.7, top_k=True), "top_k.*True"),
    (dict(temp=0.7, min_p=2.0), r"min_p.*2\.0"),
    (dict(temp=0.7, min_tokens_to_keep=0), "min_tokens_to_keep.*0"),
])
def test_bad_arguments_raise_when_the_sampler_is_made(kwargs, match):
    """make_sampler checks its arguments itself, before any sampling runs."""
    with pytest.raises(ValueError, match=match):
        make_sampler(**kwargs)


# ---- the exponential race (Gumbel-max) ------------------------------------------------


def race_frequencies(logits: np.ndarray, temperature: float, n: int, seed: int, draw) -> np.ndarray:
    """How often each token wins in `n` draws of one row (as a batch of `n` copies)."""
    rows = mx.broadcast_to(mx.array(logits, dtype=mx.float32), (n, logits.size))
    tokens = draw(rows, mx.full((n,), temperature), exponential_noise(rows.shape, key=mx.random.key(seed)))
    return np.bincount(np.array(tokens), minlength=logits.size)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


DRAWS = 20_000


def detectable_distance(draws: int, categories: int, power: float = 0.99) -> float:
    """The chi-square distance sum((q - p)^2 / p) from the expected p at which a test of
    `draws` draws, at the rate FALSE_ALARM, catches a wrong distribution q with `power`."""
    critical = chi2.ppf(1 - FALSE_ALARM, categories - 1)
    return brentq(lambda lam: ncx2.sf(critical, categories - 1, lam) - power, 1e-6, 1e4) / draws


@pytest.mark.parametrize("draw", [sample_exponential_race, sample_gumbel_max], ids=["race", "gumbel"])
@pytest.mark.parametrize("row", range(len(ROWS)))
@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_race_frequencies_match_the_softmax(draw, row, temperature):
    """The winner of the race is distributed as softmax(logits / T): a chi-square test over
    20,000 seeded draws per row and temperature. Its power: a wrong distribution at
    chi-square distance 0.0027 or more from the right one — e.g. on the flat row, one token
    of 0.10 drawn at 0.116 — is caught with probability 0.99 (computed below)."""
    logits = ROWS[row]
    expected = softmax(logits / temperature)
    assert detectable_distance(DRAWS, logits.size) < 0.0027
    counts = race_frequencies(logits, temperature, DRAWS, seed=100 * row + int(10 * temperature), draw=draw)
    assert chisquare(counts, DRAWS * expected).pvalue > FALSE_ALARM, (counts, DRAWS * expected)


def test_race_rows_at_temperature_zero_are_their_argmax():
    """A row with T = 0 takes its most likely token (the lowest index on ties), whatever the noise."""
    logits = mx.array([[0.1, 3.0, 3.0, -1.0], [2.0, 0.0, 1.0, 5.0], [1.0, 1.0, 1.0, 1.0]])
    for seed in range(20):
        noise = exponential_noise(logits.shape, key=mx.random.key(seed))
        for draw in (sample_exponential_race, sample_gumbel_max):
            assert draw(logits, mx.zeros((3,)), noise).tolist() == [1, 3, 0]


def test_race_and_gumbel_pick_the_same_tokens_under_the_same_noise():
    """argmax(p / E) and argmax(logits / T - log E) are the same arg-max: token for token."""
    logits = mx.random.normal((64, 50), key=mx.random.key(0)) * 3
    temperatures = mx.array([0.0, 0.3, 1.0, 2.5] * 16)
    for seed in range(5):
        noise = exponential_noise(logits.shape, key=mx.random.key(seed))
        assert mx.array_equal(sample_exponential_race(logits, temperatures, noise),
                              sample_gumbel_max(logits, temperatures, noise))


def test_a_rows_draw_ignores_the_other_rows():
    """Under the same noise, row 0's token does not change when the other rows' logits and
    temperatures do: each row races alone."""
    key = mx.random.key(7)
    logits = mx.random.normal((4, 30), key=mx.random.key(1))
    noise = exponential_noise(logits.shape, key=key)
    first = sample_exponential_race(logits, mx.array([0.8, 1.0, 1.0, 1.0]), noise)
    others = mx.concatenate([logits[:1], -logits[1:] * 5])
    again = sample_exponential_race(others, mx.array([0.8, 0.0, 3.0, 0.1]), noise)
    assert first[0].item() == again[0].item()


def test_the_noise_is_exponential_and_never_zero():
    """Mean and variance 1 (Exponential(1)), and the clamp keeps a zero uniform off 0: p / E
    must not become inf (or NaN for p = 0)."""
    e = np.array(exponential_noise((200_000,), key=mx.random.key(3)))
    assert abs(e.mean() - 1) < 0.01 and abs(e.var() - 1) < 0.03
    assert e.min() >= MIN_EXPONENTIAL
    zero = mx.maximum(-mx.log1p(-mx.zeros((1,))), MIN_EXPONENTIAL)  # what a uniform of 0 becomes
    assert zero.item() == pytest.approx(MIN_EXPONENTIAL)
    probs_row = mx.array([[0.0, 1.0]])  # a token of p = 0 must not win with a tiny clock
    assert sample_exponential_race(mx.log(probs_row), mx.ones((1,)), mx.array([[MIN_EXPONENTIAL, 1.0]])).item() == 1
