"""The sampling engine as a whole: every preset against an independent numpy re-implementation
of its rule, batch invariance of mixed batches, chi-square goodness of fit of the drawn
tokens, seeding and replay, `sample_with_logprobs` consistency and bad input.

The reference below is written from the specification (float64 numpy, one row at a time,
no code shared with `tiny_llm.sampler`). Inputs are chosen away from every filter's
decision boundary: the reference records how far each decision was from flipping and the
input search skips cases closer than `MARGIN`.
"""

import math
import re
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

from conftest import pooled

from tiny_llm.sampler import Sampler, SamplingParams, token_distribution

INF = math.inf
MARGIN = 1e-3  # minimum distance of any filter decision from its threshold in the inputs
ALPHA = 1e-4  # false-alarm rate of each chi-square test


# =========================================================================== numpy reference


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the finite entries of `x` (float64); the others get 0."""
    fin = np.isfinite(x)
    e = np.zeros_like(x)
    e[fin] = np.exp(x[fin] - x[fin].max())
    return e / e.sum()


def ref_penalties(x, hist, p):
    n = p.penalty_last_n
    window = list(hist) if n == -1 else (list(hist)[-n:] if n > 0 else [])
    x = x.copy()
    for t, c in Counter(window).items():
        if not np.isfinite(x[t]):
            continue
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
        x[t] -= c * p.frequency_penalty + p.presence_penalty
    return x


def ref_dry(x, hist, p):
    """Brute force over the spec's definition; single-token breakers only."""
    n_last = p.dry_penalty_last_n
    h = list(hist) if n_last == -1 else (list(hist)[-n_last:] if n_last > 0 else [])
    breakers = {b[0] for b in p.dry_sequence_breakers}
    assert all(len(b) == 1 for b in p.dry_sequence_breakers)
    start = max([j + 1 for j, t in enumerate(h) if t in breakers], default=0)
    longest = len(h) - start  # the matched suffix lies after the last breaker
    best: dict[int, int] = {}
    for i in range(len(h)):  # h[i] follows h[i-n:i]
        n = 0
        while n < longest and n < i and h[i - 1 - n] == h[len(h) - 1 - n]:
            n += 1
        best[h[i]] = max(best.get(h[i], 0), n)
    x = x.copy()
    for t, n in best.items():
        if n >= p.dry_allowed_length:
            x[t] -= p.dry_multiplier * p.dry_base ** (n - p.dry_allowed_length)
    return x


def ref_top_n_sigma(x, n, margins):
    f = x[np.isfinite(x)]
    thr = f.max() - n * f.std()
    margins.append(("top_n_sigma", np.abs(f - thr).min()))
    return np.where(x >= thr, x, -INF)


def ref_top_k(x, k, margins):
    f = np.sort(x[np.isfinite(x)])[::-1]
    if k >= len(f):
        return x
    margins.append(("top_k", f[k - 1] - f[k]))
    return np.where(x >= f[k - 1], x, -INF)


def ref_prefix_filter(x, order, pr, limit, keep_while, name, margins, key):
    """Keep tokens in `order` while `keep_while(mass before, limit)` (at least one); keep
    ties (equal `key`) of the last kept one."""
    order = np.asarray(order)
    before = np.concatenate([[0.0], np.cumsum(pr[order])[:-1]])
    ok = keep_while(before, limit)
    ok[0] = True
    n = len(order) if ok.all() else int(np.argmin(ok))  # `before` grows: ok is True then False
    margins.append((name, np.abs(before[: n + 1] - limit).min()))
    keep = np.isfinite(x) & (key == key[order[n - 1]])
    keep[order[:n]] = True
    return np.where(keep, x, -INF)


def ref_typical(x, tp, margins):
    pr = softmax(x)
    fin = np.isfinite(x)
    logp = np.where(fin, np.log(np.where(fin, pr, 1.0)), 0.0)
    H = -(pr[fin] * logp[fin]).sum()
    score = np.where(fin, np.abs(-logp - H), INF)
    order = [j for j in np.argsort(score, kind="stable") if fin[j]]
    return ref_prefix_filter(x, order, pr, tp, lambda b, lim: b <= lim, "typical_p", margins, score)


def ref_top_p(x, tp, margins):
    pr = softmax(x)
    order = [j for j in np.argsort(-pr, kind="stable") if np.isfinite(x[j])]
    return ref_prefix_filter(x, order, pr, tp, lambda b, lim: b < lim, "top_p", margins, pr)


def ref_min_p(x, mp, margins):
    pr = softmax(x)
    fin = np.isfinite(x)
    thr = mp * pr.max()
    margins.append(("min_p", np.abs(np.log(pr[fin]) - np.log(thr)).min()))
    return np.where(fin & (pr >= thr), x, -INF)


def ref_xtc(x, thr, margins):
    pr = softmax(x)
    fin = np.isfinite(x)
    margins.append(("xtc", np.abs(np.log(pr[fin]) - np.log(thr)).min()))
    above = fin & (pr >= thr)
    if above.sum() < 2:
        return x
    least = pr[above].min()
    return np.where(above & (pr > least), -INF, x)


def ref_greedy(x):
    j = int(np.argmax(np.where(np.isfinite(x), x, -INF)))  # first maximum
    return np.where(np.arange(len(x)) == j, 0.0, -INF)


def ref_temperature(x, p):
    T, d = p.temperature, p.dynatemp_range
    if T <= 0:
        return ref_greedy(x)
    if d > 0:
        fin = np.isfinite(x)
        n = fin.sum()
        if n <= 1:
            return x
        pr = softmax(x)[fin]
        h_norm = -(pr * np.log(pr)).sum() / math.log(n)
        lo, hi = max(0.0, T - d), T + d
        return x / (lo + (hi - lo) * h_norm**p.dynatemp_exponent)
    return x / T


def ref_mirostat(x, p, mu, n_vocab, margins):
    pr = softmax(x)
    fin = np.isfinite(x)
    order = [j for j in np.argsort(-pr, kind="stable") if fin[j]]
    if p.mirostat == 2:
        surprise = -np.log2(pr[order])
        margins.append(("mirostat_v2", np.abs(surprise - mu).min()))
        kept = order[: max(1, int((surprise <= mu).sum()))]
    else:
        ps = pr[order]
        num = den = 0.0
        for i in range(min(100 - 1, len(ps) - 1)):
            t = math.log((i + 2) / (i + 1))
            num += t * math.log(ps[i] / ps[i + 1])
            den += t * t
        s_hat = num / den
        eps = s_hat - 1
        k = ((eps * 2**mu) / (1 - n_vocab ** (-eps))) ** (1 / s_hat)
        margins.append(("mirostat_v1", abs(k - round(k))))
        kept = order[: max(int(k), 1)]
    keep = np.zeros(len(x), bool)
    keep[kept] = True
    return np.where(keep, x, -INF)


def ref_distribution(row, p: SamplingParams, hist=(), sampled=0, mu=None, margins=None):
    """The spec's distribution for one row (`sampled`: tokens this row has drawn so far)."""
    margins = [] if margins is None else margins
    x = np.asarray(row, dtype=np.float64).copy()
    x[np.isnan(x)] = -INF
    for t, b in p.logit_bias.items():
        x[t] += b
    if sampled < p.min_tokens:
        x[list(p.eos_token_ids)] = -INF
    if p.mirostat:
        x = ref_greedy(x) if p.temperature <= 0 else x / p.temperature
        mu = 2 * p.mirostat_tau if mu is None else mu
        return softmax(ref_mirostat(x, p, mu, len(x), margins))
    for stage in p.order:
        if stage == "penalties":
            x = ref_penalties(x, hist, p)
        elif stage == "dry" and p.dry_multiplier > 0:
            x = ref_dry(x, hist, p)
        elif stage == "top_n_sigma" and p.top_n_sigma > 0:
            x = ref_top_n_sigma(x, p.top_n_sigma, margins)
        elif stage == "top_k" and p.top_k > 0:
            x = ref_top_k(x, p.top_k, margins)
        elif stage == "typical_p" and p.typical_p < 1:
            x = ref_typical(x, p.typical_p, margins)
        elif stage == "top_p" and p.top_p < 1:
            x = ref_top_p(x, p.top_p, margins)
        elif stage == "min_p" and p.min_p > 0:
            x = ref_min_p(x, p.min_p, margins)
        elif stage == "xtc" and p.xtc_probability > 0 and p.xtc_threshold <= 0.5:
            assert p.xtc_probability == 1.0, "the reference only knows XTC that always fires"
            x = ref_xtc(x, p.xtc_threshold, margins)
        elif stage == "temperature":
            x = ref_temperature(x, p)
    return softmax(x)


def test_reference_reproduces_hand_examples():
    """The reference itself agrees with the spec's worked examples (penalties, DRY)."""
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    np.testing.assert_allclose(ref_penalties(np.array([2.0, -2, 1, 0]), [0, 1, 0], p),
                               [-0.25, -4.75, 1.0, 0.0])
    d = SamplingParams(dry_multiplier=1.0, dry_base=2.0, dry_sequence_breakers=())
    np.testing.assert_allclose(ref_dry(np.zeros(6), [1, 2, 3, 4, 1, 2, 3], d), [0, 0, 0, 0, -2, 0])
    d = SamplingParams(dry_multiplier=1.0, dry_base=2.0, dry_sequence_breakers=[(2,)])
    np.testing.assert_allclose(ref_dry(np.zeros(6), [1, 2, 3, 4, 1, 2, 3], d), np.zeros(6))


# =========================================================================== inputs


def make_inputs(seed, B=4, V=50, hist_len=30):
    """Seeded logits [B, V] (N(0, 2^2), float32) and histories that contain a repeated
    5-token segment (so DRY has something to penalise)."""
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((B, V)) * 2.0).astype(np.float32)
    history = []
    for _ in range(B):
        seg = rng.integers(0, V, 5).tolist()
        h = rng.integers(0, V, 12).tolist() + seg + rng.integers(0, V, hist_len - 20).tolist() + seg[:3]
        history.append(h)
    return logits, history


def off_boundary_inputs(params: SamplingParams, B=4, V=50):
    """The first seeded input whose every filter decision is at least MARGIN from flipping."""
    for seed in range(200):
        logits, history = make_inputs(seed, B, V)
        margins = []
        for b in range(B):
            ref_distribution(logits[b], params, history[b], margins=margins)
        if all(m > MARGIN for _, m in margins):
            return logits, history
    raise AssertionError("no off-boundary input found")  # pragma: no cover


COMMON = dict(temperature=0.7, top_k=10, top_p=0.8, min_p=0.05, repetition_penalty=1.3,
              frequency_penalty=0.2, presence_penalty=0.1, penalty_last_n=16)
# llama.cpp's own extras: penalties and DRY with dynamic temperature, plus filters.
LLAMA_EXTRAS = dict(temperature=0.7, repetition_penalty=1.3, frequency_penalty=0.2,
                    presence_penalty=0.1, penalty_last_n=16, dry_multiplier=0.8, dry_base=1.75,
                    dry_allowed_length=2, dry_sequence_breakers=(), dynatemp_range=0.3)

PRESET_CASES = {
    "llama.cpp": dict(COMMON),
    # Each of these two changes the result when any one of its stages is switched off.
    "llama.cpp-sigma-min_p-xtc": dict(LLAMA_EXTRAS, top_n_sigma=1.5, min_p=0.05,
                                      xtc_probability=1.0, xtc_threshold=0.1),
    "llama.cpp-k-typical-p": dict(LLAMA_EXTRAS, top_k=20, typical_p=0.8, top_p=0.95),
    # Every stage switched on at once.
    "llama.cpp-all-stages": dict(LLAMA_EXTRAS, top_n_sigma=2.5, top_k=15, typical_p=0.97,
                                 top_p=0.97, min_p=0.01, xtc_probability=1.0, xtc_threshold=0.2),
    "hf": dict(COMMON, order="hf", typical_p=0.9),
    "vllm": dict(COMMON, order="vllm"),
    "mlx-lm": dict(COMMON, order="mlx-lm", xtc_probability=1.0, xtc_threshold=0.1),
    "custom-order": dict(temperature=1.4, top_k=12, top_p=0.6, order="nucleus;top-k;temp"),
    "hf-dynatemp": dict(order="hf", temperature=1.2, dynatemp_range=0.5, dynatemp_exponent=2.0,
                        top_k=15, min_p=0.1),
}


# =========================================================================== (a) presets


@pytest.mark.parametrize("case", list(PRESET_CASES))
def test_preset_matches_numpy_reference(case):
    """Each preset order (and a custom aliased order) gives, on seeded random logits with
    per-row histories, the distribution of a direct numpy implementation of that order
    (atol 1e-5); also through `token_distribution`."""
    params = SamplingParams(**PRESET_CASES[case])
    logits, history = off_boundary_inputs(params)
    expected = np.stack([ref_distribution(logits[b], params, history[b]) for b in range(4)])
    # The chosen parameters really filter: some but not all tokens survive in every row.
    assert np.all((expected > 0).sum(axis=1) > 1) and np.all((expected == 0).sum(axis=1) > 0)
    got = np.array(Sampler(params).distribution(mx.array(logits), history))
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    assert np.all(got[expected == 0] == 0.0)
    got2 = np.array(token_distribution(mx.array(logits), params, history))
    np.testing.assert_allclose(got2, expected, atol=1e-5, rtol=0)


def test_order_changes_the_result():
    """Temperature-first (hf) and temperature-last (llama.cpp) differ on the Camelid#534
    example: logits [3, 2, 1], top_p 0.8, T 0.5. Temperature first: p = [.867, .117, .016],
    top-p keeps {0}. Temperature last: p = [.665, .245, .090] keeps {0, 1}, then T=0.5 ->
    weights e^6, e^4."""
    x = mx.array([[3.0, 2.0, 1.0]])
    hf = np.array(token_distribution(x, SamplingParams(top_p=0.8, temperature=0.5, order="hf")))[0]
    np.testing.assert_allclose(hf, [1.0, 0.0, 0.0], atol=1e-6)
    ll = np.array(token_distribution(x, SamplingParams(top_p=0.8, temperature=0.5)))[0]
    w = np.exp([6.0, 4.0])
    np.testing.assert_allclose(ll, [w[0] / w.sum(), w[1] / w.sum(), 0.0], atol=1e-6)


def test_mlx_lm_order_top_p_before_top_k():
    """SAMPLERS.md's measured case: p = [.1,.2,.3,.4], top_p 0.5, top_k 2. mlx-lm order
    (top-p on the full distribution, then top-k) keeps {2, 3} -> [0, 0, 3/7, 4/7]; llama.cpp
    order (top-k -> {.43, .57}, then top-p 0.5) keeps only token 3."""
    x = mx.array(np.log([[0.1, 0.2, 0.3, 0.4]]).astype(np.float32))
    mlx = np.array(token_distribution(x, SamplingParams(top_p=0.5, top_k=2, order="mlx-lm")))[0]
    np.testing.assert_allclose(mlx, [0, 0, 3 / 7, 4 / 7], atol=1e-6)
    ll = np.array(token_distribution(x, SamplingParams(top_p=0.5, top_k=2)))[0]
    np.testing.assert_allclose(ll, [0, 0, 0, 1], atol=1e-6)


# =========================================================================== (a') large vocabularies

# LLM-like rows: ten head tokens with these probabilities at random positions, and a tail of
# V - 10 tokens (log-normal weights) holding the remaining 0.256 of the mass, so that filters
# decide among the head while the tail's mass still counts in every normalisation.
HEAD = np.array([0.2, 0.15, 0.1, 0.08, 0.06, 0.05, 0.04, 0.03, 0.022, 0.012])


def llm_like_logits(seed, B, V):
    rng = np.random.default_rng(seed)
    out = np.empty((B, V))
    for b in range(B):
        w = np.exp(rng.normal(0.0, 0.5, V))
        head = rng.choice(V, len(HEAD), replace=False)
        w[head] = 0.0
        p = (1.0 - HEAD.sum()) * w / w.sum()
        p[head] = HEAD
        out[b] = np.log(p) + rng.normal(0.0, 3.0)  # a random shift: softmax ignores it
    return out.astype(np.float32)


def large_inputs(params, B=3, V=50_000, tolerant=()):
    """The first seeded LLM-like input whose decisions are off-boundary (stages in
    `tolerant` excepted; top-k compares unmodified float32 logits, so its margin is small)."""
    for seed in range(50):
        logits = llm_like_logits(seed, B, V)
        rng = np.random.default_rng(seed)
        history = [rng.choice(V, 40).tolist() + np.argsort(-logits[b])[:3].tolist() for b in range(B)]
        margins = []
        for b in range(B):
            ref_distribution(logits[b], params, history[b], margins=margins)
        if all(m > (1e-5 if what == "top_k" else MARGIN) for what, m in margins if what not in tolerant):
            return logits, history
    raise AssertionError("no off-boundary input found")  # pragma: no cover


LARGE_CASES = {
    "llama.cpp": dict(temperature=0.7, top_k=10, top_p=0.5, min_p=0.05),
    "top_p-only": dict(top_p=0.6),
    "min_p-only": dict(min_p=0.08, temperature=1.3),
    "top_k-wide-with-penalties": dict(top_k=300, repetition_penalty=1.3, presence_penalty=0.5,
                                      temperature=0.9),
    "top_k-2000": dict(top_k=2000, temperature=1.1),
    "top_k-5000": dict(top_k=5000, temperature=1.1),
    "mlx-lm": dict(order="mlx-lm", top_p=0.7, min_p=0.08, top_k=30, temperature=1.2),
    "vllm": dict(order="vllm", temperature=0.7, min_p=0.02, top_k=50, top_p=0.8),
    "hf-typical": dict(order="hf", temperature=1.1, top_k=100, typical_p=0.5),
    "top_n_sigma": dict(top_n_sigma=3.0, temperature=0.8),
    "xtc": dict(xtc_probability=1.0, xtc_threshold=0.09),
    "mirostat-v2": dict(mirostat=2, mirostat_tau=3.0),
    "mirostat-v1": dict(mirostat=1, mirostat_tau=3.0),
}


@pytest.mark.parametrize("case", list(LARGE_CASES))
def test_large_vocabulary_matches_reference(case):
    """V = 50,000 LLM-like rows (the filters decide among ten head tokens while a long tail
    holds a quarter of the mass): the distribution equals the numpy reference (atol 1e-5,
    excluded tokens exactly 0), and tokens drawn by `sample` lie in its support."""
    params = SamplingParams(**LARGE_CASES[case], seed=3)
    logits, history = large_inputs(params)
    expected = np.stack([ref_distribution(logits[b], params, history[b]) for b in range(3)])
    s = Sampler(params)
    got = np.array(s.distribution(mx.array(logits), history))
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    assert np.all(got[expected == 0] == 0.0)
    for _ in range(5):
        tokens = np.array(s.sample(mx.array(logits), history))
        assert np.all(expected[np.arange(3), tokens] > 0), f"{case}: drew {tokens}"
        if params.mirostat:
            break  # mu moves after a draw


@pytest.mark.parametrize("stage,kwargs,nudged", [
    ("top_p", dict(top_p=0.9), [dict(top_p=0.9 - 1e-4), dict(top_p=0.9 + 1e-4)]),
    ("min_p", dict(min_p=1e-5), [dict(min_p=1e-5 * 0.999), dict(min_p=1e-5 * 1.001)]),
])
def test_large_vocabulary_boundary_in_the_tail(stage, kwargs, nudged):
    """A nucleus (or min-p set) reaching deep into a 50,000-token tail, far beyond any
    window of top tokens: the engine's support lies between the reference supports for the
    parameter nudged by a rounding-sized amount either way (only tokens within 1e-4 of the
    threshold may go either way), and the distribution is the softmax over that support."""
    params = SamplingParams(**kwargs, seed=4)
    logits, history = large_inputs(params, tolerant=(stage,))
    supports = [np.stack([ref_distribution(logits[b], SamplingParams(**n), history[b]) > 0
                          for b in range(3)]) for n in nudged]
    inner, outer = supports[0] & supports[1], supports[0] | supports[1]
    assert inner.sum(axis=1).min() > 1000  # the decision really is in the tail
    s = Sampler(params)
    got = np.array(s.distribution(mx.array(logits), history))
    support = got > 0
    assert np.all(support >= inner) and np.all(support <= outer)
    for b in range(3):
        np.testing.assert_allclose(got[b], softmax(np.where(support[b], logits[b].astype(np.float64), -INF)),
                                   atol=1e-5, rtol=0)
    tokens = np.array(s.sample(mx.array(logits), history))
    assert np.all(got[np.arange(3), tokens] > 0)


# =========================================================================== (b) batch invariance

MIXED = [
    SamplingParams(temperature=0.8, top_k=20, top_p=0.9, typical_p=0.95, dry_multiplier=0.8,
                   dry_sequence_breakers=[(7,)], min_tokens=3, eos_token_ids=(0,), seed=11),
    SamplingParams(order="hf", temperature=1.2, top_p=0.7, repetition_penalty=1.2,
                   frequency_penalty=0.1, seed=22),
    SamplingParams(order="mlx-lm", min_p=0.1, xtc_probability=0.5, xtc_threshold=0.1, seed=33),
    SamplingParams(mirostat=2, mirostat_tau=3.0, mirostat_eta=0.2, temperature=0.9, seed=44),
]


def test_mixed_batch_rows_equal_rows_alone():
    """A batch of 4 rows with different params (orders, DRY, min_tokens, XTC at p=.5,
    mirostat v2): over 20 steps each row's distribution equals (atol 1e-6) and each drawn
    token exactly equals the same row sampled alone, and rows (3, 1) as a batch of two."""
    rng = np.random.default_rng(0)
    V = 50
    batch = Sampler(MIXED)
    alone = [Sampler(p) for p in MIXED]
    pair = Sampler([MIXED[3], MIXED[1]])
    history = [rng.integers(1, V, 10).tolist() for _ in range(4)]
    drawn = [[] for _ in range(4)]
    for step in range(20):
        logits = (rng.standard_normal((4, V)) * 2.0).astype(np.float32)
        x = mx.array(logits)
        dist = np.array(batch.distribution(x, history))
        x31 = mx.array(logits[[3, 1]])
        pair_dist = np.array(pair.distribution(x31, [history[3], history[1]]))
        for i in range(4):
            one = np.array(alone[i].distribution(x[i : i + 1], [history[i]]))[0]
            np.testing.assert_allclose(dist[i], one, atol=1e-6, rtol=0, err_msg=f"row {i} step {step}")
        np.testing.assert_allclose(pair_dist, dist[[3, 1]], atol=1e-6, rtol=0)
        tokens = np.array(batch.sample(x, history)).tolist()
        pair_tokens = np.array(pair.sample(x31, [history[3], history[1]])).tolist()
        for i in range(4):
            t = int(alone[i].sample(x[i : i + 1], [history[i]])[0])
            assert tokens[i] == t, f"row {i} step {step}: batch drew {tokens[i]}, alone {t}"
            assert dist[i, t] > 0
        assert pair_tokens == [tokens[3], tokens[1]]
        for i in range(4):
            history[i].append(tokens[i])
            drawn[i].append(tokens[i])
    assert 0 not in drawn[0][:3]  # min_tokens=3 kept EOS out of row 0's first three draws
    assert all(len(set(d)) > 3 for d in drawn)  # the rows really sampled


def test_single_params_apply_to_every_row():
    """One SamplingParams object serves any batch size; each row equals that row alone."""
    rng = np.random.default_rng(1)
    p = SamplingParams(temperature=0.9, top_k=30, seed=5)
    batch, alone = Sampler(p), [Sampler(p) for _ in range(3)]
    for _ in range(10):
        x = mx.array((rng.standard_normal((3, 40)) * 2).astype(np.float32))
        drawn = np.array(batch.sample(x))
        assert drawn.shape == (3,) and np.issubdtype(drawn.dtype, np.integer)
        assert drawn.tolist() == [int(alone[i].sample(x[i : i + 1])[0]) for i in range(3)]


MIXED_LARGE = [
    SamplingParams(top_k=50, top_p=0.9, temperature=0.8, seed=1),
    SamplingParams(top_k=50, dry_multiplier=0.8, dry_sequence_breakers=(), seed=2),
    SamplingParams(top_p=0.99, seed=3),  # a nucleus of thousands of tail tokens
    SamplingParams(min_p=0.05, temperature=1.2, seed=4),
    SamplingParams(top_k=300, repetition_penalty=1.2, seed=5),
    SamplingParams(seed=6),
]


def test_large_vocabulary_batch_rows_equal_rows_alone():
    """V = 3000, six rows sharing the default order but needing different amounts of the
    vocabulary (a small nucleus, DRY, a nucleus deep in the tail, min-p only, a wide top-k,
    no filter): over 15 steps every row draws exactly the tokens it draws alone, and rows
    (2, 0) as a batch of two draw theirs; distributions agree to 1e-6."""
    V = 3000
    batch = Sampler(MIXED_LARGE)
    alone = [Sampler(p) for p in MIXED_LARGE]
    pair = Sampler([MIXED_LARGE[2], MIXED_LARGE[0]])
    rng = np.random.default_rng(7)
    history = [rng.choice(V, 20).tolist() for _ in MIXED_LARGE]
    for step in range(15):
        logits = llm_like_logits(100 + step, len(MIXED_LARGE), V)
        x = mx.array(logits)
        dist = np.array(batch.distribution(x, history))
        for i in range(len(MIXED_LARGE)):
            one = np.array(alone[i].distribution(x[i : i + 1], [history[i]]))[0]
            np.testing.assert_allclose(dist[i], one, atol=1e-6, rtol=0, err_msg=f"row {i} step {step}")
        tokens = np.array(batch.sample(x, history)).tolist()
        for i in range(len(MIXED_LARGE)):
            t = int(alone[i].sample(x[i : i + 1], [history[i]])[0])
            assert tokens[i] == t, f"row {i} step {step}: batch drew {tokens[i]}, alone {t}"
            assert dist[i, t] > 0
        pair_tokens = np.array(pair.sample(mx.array(logits[[2, 0]]), [history[2], history[0]])).tolist()
        assert pair_tokens == [tokens[2], tokens[0]], f"step {step}"
        for i in range(len(MIXED_LARGE)):
            history[i].append(tokens[i])


@pytest.mark.parametrize("V", [50, 3000])
def test_sample_with_logprobs_draws_like_sample_large(V):
    """sample and sample_with_logprobs draw the same tokens from the same seeds, for each
    kind of row in MIXED_LARGE, on a small and a large vocabulary."""
    a, b = Sampler(MIXED_LARGE), Sampler(MIXED_LARGE)
    for step in range(8):
        x = mx.array(llm_like_logits(200 + step, len(MIXED_LARGE), V))
        assert np.array(a.sample(x)).tolist() == np.array(b.sample_with_logprobs(x).tokens).tolist(), step


# =========================================================================== (c) chi-square

V12 = np.array([2.0, 1.6, 1.3, 1.0, 0.8, 0.5, 0.2, 0.0, -0.4, -0.9, -1.6, -2.4], np.float32)
CHI_CASES = {
    "plain": (dict(), None),
    "top_k-top_p-temperature": (dict(temperature=0.7, top_k=8, top_p=0.9), None),
    "penalties-min_p": (dict(repetition_penalty=1.4, frequency_penalty=0.3, presence_penalty=0.2,
                             min_p=0.03, temperature=1.1), [0, 0, 1, 2, 0, 5, 5]),
    "hf-typical": (dict(order="hf", temperature=1.5, top_p=0.85, typical_p=0.9), None),
    "dynatemp-top_n_sigma": (dict(temperature=0.9, dynatemp_range=0.4, top_n_sigma=1.5), None),
    "dry": (dict(dry_multiplier=1.0, dry_base=2.0, dry_sequence_breakers=()), [3, 4, 5, 6, 3, 4, 5]),
    "xtc-half": (dict(xtc_probability=0.5, xtc_threshold=0.12), None),
    "mirostat-v2": (dict(mirostat=2, mirostat_tau=2.5), None),
    "mirostat-v1": (dict(mirostat=1, mirostat_tau=2.5), None),
}
ROWS, ROUNDS = 1000, 5
V2000 = llm_like_logits(42, 1, 2000)[0]
LARGE_CHI_CASES = {
    "window-top_k-top_p": (dict(top_k=40, top_p=0.9, temperature=0.8), None),
    "window-min_p": (dict(min_p=0.05), None),
    "nucleus-beyond-window": (dict(top_p=0.97), None),
    "wide-top_k-penalties": (dict(top_k=600, repetition_penalty=1.5, presence_penalty=0.3),
                             np.argsort(-V2000)[:4].tolist()),
    "temperature-only": (dict(temperature=0.9), None),
}


def test_pooled_merges_small_bins():
    """The test helper: small bins are merged, totals are kept."""
    obs, exp = pooled(np.array([1, 2, 50, 3]), np.array([1.0, 2.5, 48.0, 3.5]))
    assert exp.tolist() == [7.0, 48.0] and obs.tolist() == [6.0, 50.0]


# The same cases drawn by the exponential race (SamplingParams(draw="race")), but mirostat's.
RACE_CASES = [f"race-{c}" for c in CHI_CASES if "mirostat" not in c] + [f"race-V2000-{c}" for c in LARGE_CHI_CASES]


@pytest.mark.parametrize("case", list(CHI_CASES) + [f"V2000-{c}" for c in LARGE_CHI_CASES] + RACE_CASES)
def test_chi_square_draws_follow_distribution(case):
    """5000 draws (1000 rows of identical logits with their own seeds, 5 rounds; V = 12, or
    V = 2000 LLM-like rows where windows of top tokens matter) follow the summed
    `.distribution()` rows: tokens of probability 0 are never drawn and a chi-square test
    (scipy.stats.chisquare, small bins pooled to expected >= 5) does not reject at
    false-alarm rate ALPHA = 1e-4. Mirostat rounds use fresh Samplers (new seeds) so every
    draw is made at mu = 2 tau; the others draw 5 successive tokens per row. "race-" cases
    draw by the exponential race instead of the inverse CDF."""
    race = case.startswith("race-")
    case = case.removeprefix("race-")
    if case.startswith("V2000-"):  # LLM-like 2000-token rows: windows of top tokens matter
        (kw, hist), row = LARGE_CHI_CASES[case[6:]], V2000
    else:
        (kw, hist), row = CHI_CASES[case], V12
    kw = dict(kw, draw="race") if race else kw
    x = mx.array(np.tile(row, (ROWS, 1)))
    history = None if hist is None else [hist] * ROWS
    observed = np.zeros(len(row))
    expected = np.zeros(len(row))
    sampler = None
    for r in range(ROUNDS):
        if sampler is None or kw.get("mirostat"):
            sampler = Sampler([SamplingParams(**kw, seed=r * ROWS + i) for i in range(ROWS)])
        d = np.array(sampler.distribution(x, history), np.float64)
        tokens = np.array(sampler.sample(x, history))
        assert np.all(d[np.arange(ROWS), tokens] > 0), "a token of probability 0 was drawn"
        expected += d.sum(axis=0)
        observed += np.bincount(tokens, minlength=len(row))
    assert observed.sum() == ROWS * ROUNDS
    support = expected > 0
    assert np.all(observed[~support] == 0)
    obs, exp = pooled(observed[support], expected[support])
    exp *= obs.sum() / exp.sum()
    assert len(exp) >= 2
    stat, pvalue = chisquare(obs, exp)
    assert pvalue > ALPHA, f"{case}: chi2={stat:.1f}, p={pvalue:.2e}, obs={obs}, exp={exp.round(1)}"


def test_chi_square_cases_match_reference():
    """The distributions the chi-square tests rely on are the spec's (numpy reference)."""
    for case, (kw, hist) in CHI_CASES.items():
        if "xtc" in case:
            continue
        p = SamplingParams(**kw)
        got = np.array(token_distribution(mx.array(V12[None]), p, None if hist is None else [hist]))[0]
        margins = []
        expected = ref_distribution(V12, p, hist or [], margins=margins)
        assert all(m > MARGIN for _, m in margins), (case, margins)
        np.testing.assert_allclose(got, expected, atol=1e-5, err_msg=case)


def test_xtc_fires_with_its_probability_and_distribution_reports_it():
    """XTC with probability 0.5 on 400 seeded rows: each row's `.distribution()` is either the
    untouched softmax or the XTC-cut one (threshold .12 on V12: tokens 0-2 over it -> 0, 1
    removed), the cut happens in a binomial-plausible share of rows (200 +- 4.5 sigma = 45),
    and every drawn token lies in its row's reported support."""
    n = 400
    x = mx.array(np.tile(V12, (n, 1)))
    s = Sampler([SamplingParams(xtc_probability=0.5, xtc_threshold=0.12, seed=i) for i in range(n)])
    d = np.array(s.distribution(x))
    full = softmax(V12.astype(np.float64))
    cut = softmax(np.where(np.arange(12) < 2, -INF, V12.astype(np.float64)))
    is_full = np.all(np.abs(d - full) < 1e-5, axis=1)
    is_cut = np.all(np.abs(d - cut) < 1e-5, axis=1)
    assert np.all(is_full ^ is_cut)
    assert abs(int(is_cut.sum()) - n // 2) <= 45
    tokens = np.array(s.sample(x))
    assert np.all(d[np.arange(n), tokens] > 0)


# =========================================================================== (d) seeding


def step_logits(steps=20, B=1, V=50, seed=3):
    rng = np.random.default_rng(seed)
    return [mx.array((rng.standard_normal((B, V))).astype(np.float32)) for _ in range(steps)]


def run(sampler, logits, interleave_distribution=False):
    out = []
    for x in logits:
        if interleave_distribution:
            for _ in range(3):
                sampler.distribution(x)
        out.append(np.array(sampler.sample(x)).tolist())
    return out


def test_same_seed_same_tokens_reset_replays_other_seed_differs():
    """Same seed -> same 20 tokens in a new Sampler; reset() replays them; calling
    .distribution() in between changes nothing; another seed gives other tokens."""
    logits = step_logits()
    p = SamplingParams(seed=7)
    s = Sampler(p)
    first = run(s, logits)
    assert len({t[0] for t in first}) > 5
    assert run(Sampler(p), logits) == first
    s.reset()
    assert run(s, logits) == first
    assert run(Sampler(p), logits, interleave_distribution=True) == first
    assert run(Sampler(SamplingParams(seed=8)), logits) != first


def test_stream_keyed_by_seed_and_count_only():
    """The draw at step k depends on (seed, k) and that step's distribution only: two
    Samplers with the same seed fed different logits at step 0 draw the same token at
    step 1 when given the same logits there."""
    a, b = step_logits(2, seed=10), step_logits(2, seed=11)
    for seed in range(5):
        p = SamplingParams(seed=seed)
        s1, s2 = Sampler(p), Sampler(p)
        s1.sample(a[0])
        s2.sample(b[0])
        assert int(s1.sample(a[1])[0]) == int(s2.sample(a[1])[0])


def test_no_seed_uses_fresh_entropy():
    """seed=None: two Samplers draw different 20-token sequences from a flat 50-token
    distribution (same with probability 50**-20)."""
    logits = [mx.zeros((1, 50))] * 20
    assert run(Sampler(SamplingParams()), logits) != run(Sampler(SamplingParams()), logits)


def test_sample_with_logprobs_draws_like_sample():
    """sample_with_logprobs advances like sample: same seed, same tokens."""
    logits = step_logits(10, B=2)
    p = SamplingParams(seed=12, top_k=20, logprobs=3)
    a, b = Sampler(p), Sampler(p)
    for x in logits:
        assert np.array(a.sample(x)).tolist() == np.array(b.sample_with_logprobs(x).tokens).tolist()


def test_stats_count_draws():
    """Sampler.stats starts at zero and counts one draw per row; reset() keeps the totals."""
    s = Sampler(SamplingParams(seed=1))
    assert s.stats.draws == 0
    x = mx.zeros((2, 10))
    for _ in range(3):
        s.sample(x)
    assert s.stats.draws == 6  # 3 calls of 2 rows
    total = s.stats.seconds
    s.reset()
    assert (s.stats.draws, s.stats.seconds) == (6, total)


# =========================================================================== (e) logprobs


def test_sample_with_logprobs_consistency():
    """logprob = log(distribution[token]), raw_logprob = log_softmax(logits)[token], ranks
    count strictly more probable tokens, top lists are the n (max over rows' logprobs) most
    likely tokens in descending order, for the final and the raw distribution."""
    rng = np.random.default_rng(4)
    params = [SamplingParams(temperature=0.8, top_k=15, top_p=0.99, seed=1, logprobs=2),
              SamplingParams(min_p=0.02, seed=2, logprobs=5),
              SamplingParams(order="hf", temperature=1.3, seed=3)]
    s = Sampler(params)
    for _ in range(10):
        logits = rng.standard_normal((3, 40)).astype(np.float32)
        d = np.array(s.distribution(mx.array(logits)), np.float64)
        r = s.sample_with_logprobs(mx.array(logits))
        tokens = np.array(r.tokens)
        raw = logits.astype(np.float64)
        raw = raw - raw.max(axis=1, keepdims=True)
        raw = raw - np.log(np.exp(raw).sum(axis=1, keepdims=True))
        assert tuple(np.array(r.top_tokens).shape) == (3, 5)
        assert tuple(np.array(r.raw_top_logprobs).shape) == (3, 5)
        for b in range(3):
            t = int(tokens[b])
            assert d[b, t] > 0 and (d[b] > 0).sum() >= 5
            np.testing.assert_allclose(float(np.array(r.logprob)[b]), math.log(d[b, t]), atol=1e-5)
            np.testing.assert_allclose(float(np.array(r.raw_logprob)[b]), raw[b, t], atol=1e-5)
            assert int(np.array(r.rank)[b]) == int((d[b] > d[b, t]).sum())
            assert int(np.array(r.raw_rank)[b]) == int((raw[b] > raw[b, t]).sum())
            top = np.argsort(-d[b], kind="stable")[:5]
            assert np.array(r.top_tokens)[b].tolist() == top.tolist()
            np.testing.assert_allclose(np.array(r.top_logprobs)[b], np.log(d[b, top]), atol=1e-5)
            raw_top = np.argsort(-raw[b], kind="stable")[:5]
            assert np.array(r.raw_top_tokens)[b].tolist() == raw_top.tolist()
            np.testing.assert_allclose(np.array(r.raw_top_logprobs)[b], raw[b, raw_top], atol=1e-5)


def test_logprobs_zero_gives_empty_top_lists():
    """With logprobs=0 on every row the top lists have width 0."""
    r = Sampler(SamplingParams(seed=0)).sample_with_logprobs(mx.zeros((2, 6)))
    assert tuple(np.array(r.top_tokens).shape) == (2, 0)
    assert tuple(np.array(r.raw_top_logprobs).shape) == (2, 0)
    np.testing.assert_allclose(np.array(r.logprob), [-math.log(6)] * 2, atol=1e-6)


# =========================================================================== (f) bad input


def raises_naming(*parts):
    pattern = "".join(f"(?=[\\s\\S]*{re.escape(p)})" for p in parts)
    return pytest.raises(ValueError, match=pattern)


def test_history_with_wrong_number_of_rows():
    """history must have one list per row: 1 list for a batch of 2 is a ValueError."""
    s = Sampler(SamplingParams(presence_penalty=0.5))
    with raises_naming("history"):
        s.distribution(mx.zeros((2, 5)), [[1, 2]])
    with raises_naming("history"):
        s.sample(mx.zeros((2, 5)), [[1], [2], [3]])


@pytest.mark.parametrize("method", ["distribution", "sample", "sample_with_logprobs"])
def test_rows_without_finite_logit(method):
    """An all-NaN or all -inf row raises ValueError naming that row in every entry point."""
    x = np.zeros((3, 5), np.float32)
    x[1] = np.nan
    with raises_naming("row 1"):
        getattr(Sampler(SamplingParams()), method)(mx.array(x))
    x = np.zeros((4, 5), np.float32)
    x[3] = -np.inf
    with raises_naming("row 3"):
        getattr(Sampler(SamplingParams()), method)(mx.array(x))


def test_logit_bias_id_outside_vocabulary():
    """A logit-bias id >= V raises ValueError naming the id and V."""
    s = Sampler(SamplingParams(logit_bias={60: 1.0}))
    with raises_naming("60", "50"):
        s.distribution(mx.zeros((1, 50)))
    with raises_naming("60", "50"):
        token_distribution(mx.zeros((1, 50)), SamplingParams(logit_bias={60: 1.0}))


@pytest.mark.parametrize("shape", [(5,), (1, 2, 5), ()])
def test_logits_must_be_2d(shape):
    """Logits must be [B, V]: a 1-D, 3-D or scalar array is a ValueError naming `logits`."""
    with raises_naming("logits"):
        Sampler(SamplingParams()).sample(mx.zeros(shape))


def test_params_list_length_must_match_batch():
    """Three SamplingParams for a batch of four rows is a ValueError naming both numbers."""
    s = Sampler([SamplingParams(seed=i) for i in range(3)])
    with raises_naming("3", "4"):
        s.sample(mx.zeros((4, 6)))


def test_bad_input_does_not_advance_state():
    """A call that raises draws nothing: the next draws equal a fresh Sampler's."""
    p = SamplingParams(seed=9)
    s = Sampler(p)
    bad = np.zeros((1, 50), np.float32)
    bad[0] = np.nan
    with pytest.raises(ValueError):
        s.sample(mx.array(bad))
    logits = step_logits(5)
    assert run(s, logits) == run(Sampler(p), logits)


# ---- regressions: each of these once went wrong ------------------------------------------


def test_window_and_full_chain_agree_at_a_top_p_boundary():
    """top-k then top-p with p within an ulp of a cumulative mass: the drawn token has
    positive probability, and the row draws the same alone, in a batch, and with logprobs."""
    x = mx.array((np.random.default_rng(0).normal(size=(1, 30000)) * 3).astype(np.float32))
    p = SamplingParams(top_k=95, top_p=0.10878346115350723, seed=2)
    token = Sampler(p).sample(x).item()
    assert np.array(Sampler(p).distribution(x))[0, token] > 0
    assert Sampler(p).sample_with_logprobs(x).tokens.item() == token
    mixed = Sampler([p, SamplingParams(temperature=0.8, seed=9)]).sample(mx.concatenate([x, x]))
    assert mixed.tolist()[0] == token


def test_mirostat_logprobs_describe_the_distribution_drawn_from():
    """sample_with_logprobs reports the chosen token under the mu it was drawn with."""
    x = mx.array((np.random.default_rng(0).normal(size=(1, 50)) * 3).astype(np.float32))
    s = Sampler(SamplingParams(mirostat=2, mirostat_tau=1.0, mirostat_eta=1.0, seed=3))
    for _ in range(3):
        probs = np.array(s.distribution(x))[0]
        r = s.sample_with_logprobs(x)
        assert np.isfinite(r.logprob.item()) and probs[r.tokens.item()] > 0
        np.testing.assert_allclose(r.logprob.item(), np.log(probs[r.tokens.item()]), atol=1e-5)


@pytest.mark.parametrize("params, history", [
    (SamplingParams(temperature=1e-40, seed=1), None),
    (SamplingParams(repetition_penalty=1e-39, seed=1), [[2]]),
    (SamplingParams(frequency_penalty=-1e38, seed=1), [[2] * 5]),
    (SamplingParams(frequency_penalty=1e38, seed=1), [list(range(8)) * 5]),
])
def test_overflowing_stages_raise_instead_of_returning_token_zero(params, history):
    """Parameters extreme enough to overflow float32 give a ValueError naming the row."""
    row = mx.array([[0.5, 1, 2, 0.1, -1, 3, 0.2, 0.3]])
    sampler = Sampler(params)
    with pytest.raises(ValueError, match="row 0: the sampling stages left no finite logit"):
        sampler.sample(row, history)
    assert sampler.stats.draws == 0  # nothing was drawn, no state moved


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(top_k=5), SamplingParams(mirostat=2)])
def test_reset_replays_a_shared_unseeded_sampler(params):
    """One unseeded SamplingParams for a batch: rows differ, and reset() replays them."""
    x = mx.array(np.random.default_rng(5).normal(size=(3, 50)).astype(np.float32) * 3)
    s = Sampler(params)
    first = [s.sample(x).tolist() for _ in range(6)]
    s.reset()
    assert first == [s.sample(x).tolist() for _ in range(6)]
    assert len({tuple(step) for step in zip(*first)}) > 1  # the three rows are not copies


def test_distribution_changes_no_state():
    """distribution() on one batch size does not pin a shared sampler to it."""
    s = Sampler(SamplingParams(seed=1))
    s.distribution(mx.zeros((1, 50)))
    assert s.sample(mx.zeros((3, 50))).shape == (3,)


def test_tokens_are_int32_on_every_path():
    """Greedy, plain, window and full-chain draws all return int32 tokens."""
    x = mx.random.normal((2, 3000), key=mx.random.key(1))
    for p in (SamplingParams(temperature=0), SamplingParams(temperature=0.7),
              SamplingParams(top_k=5), SamplingParams(typical_p=0.5)):
        assert Sampler(p).sample(x).dtype == mx.int32


def test_select_and_concat_go_on_where_the_rows_were():
    """Rows taken out of a sampler (select) or put together (concat) keep their params,
    seeds and counters: their next draws equal the original sampler's."""
    rng = np.random.default_rng(77)
    params = [SamplingParams(temperature=1.0, seed=s, top_k=k) for s, k in ((1, 0), (2, 5), (3, 0))]
    logits = [mx.array(rng.normal(size=(3, 50)).astype(np.float32)) for _ in range(4)]
    whole = Sampler(params)
    for x in logits[:2]:
        whole.sample(x)
    picked = whole.select([2, 0])
    parts = Sampler.concat([whole.select([0]), whole.select([1, 2])])
    for x in logits[2:]:
        want = whole.sample(x).tolist()
        assert picked.sample(x[mx.array([2, 0])]).tolist() == [want[2], want[0]]
        assert parts.sample(x).tolist() == want


def test_select_and_concat_refuse_bad_input():
    with pytest.raises(ValueError, match="list of SamplingParams"):
        Sampler(SamplingParams()).select([0])
    with pytest.raises(ValueError, match="indices below 2"):
        Sampler([SamplingParams(), SamplingParams()]).select([2])
    with pytest.raises(ValueError, match="non-empty"):
        Sampler([SamplingParams()]).select([])
    with pytest.raises(ValueError, match="at least one"):
        Sampler.concat([])


@pytest.mark.parametrize("kw", [dict(temperature=0.7), dict(min_p=0.02), dict(top_p=0.9, temperature=1.3)])
def test_chi_square_two_level_draw_over_4096_tokens(kw):
    """A vocabulary of 4096 (64-token chunks: the two-level draw) with a model-like head and
    a long tail: 5,000 seeded draws per case follow `.distribution()` (chi-square, pooled)."""
    row = llm_like_logits(7, 1, 4096)[0]
    x = mx.array(np.tile(row, (ROWS, 1)))
    observed, expected = np.zeros(4096), np.zeros(4096)
    for r in range(ROUNDS):
        sampler = Sampler([SamplingParams(**kw, seed=10_000 + r * ROWS + i) for i in range(ROWS)])
        d = np.array(sampler.distribution(x), np.float64)
        tokens = np.array(sampler.sample(x))
        assert np.all(d[np.arange(ROWS), tokens] > 0)
        expected += d.sum(axis=0)
        observed += np.bincount(tokens, minlength=4096)
    support = expected > 0
    obs, exp = pooled(observed[support], expected[support])
    exp *= obs.sum() / exp.sum()
    stat, pvalue = chisquare(obs, exp)
    assert pvalue > ALPHA, f"{kw}: chi2={stat:.1f}, p={pvalue:.2e}"


LAZY = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, seed=5),
        SamplingParams(temperature=0.9, min_p=0.05, seed=6), SamplingParams(top_p=0.9, seed=7)]


@pytest.mark.parametrize("params", LAZY, ids=["greedy", "temperature", "min_p", "top_p"])
def test_sample_lazily_draws_what_sample_draws(params, monkeypatch):
    """Five steps of `sample_lazily` and of `sample` on the same rows give the same tokens;
    greedy, temperature and min-p rows are drawn without evaluating anything (no
    `mx.eval` until `confirm`), top-p's selection needs the logits and samples at once."""
    x = mx.array(llm_like_logits(3, 2, 3000))
    lazy, eager = Sampler(params), Sampler(params)
    real_eval = mx.eval
    for _ in range(5):
        evals = []
        monkeypatch.setattr(mx, "eval", lambda *a: (evals.append(len(a)), real_eval(*a))[1])
        tokens, confirm = lazy.sample_lazily(x)
        monkeypatch.undo()
        assert (evals == []) == (params.top_p >= 1)
        confirm()
        assert tokens.tolist() == eager.sample(x).tolist()


def test_sample_lazily_counts_nan_as_excluded():
    """A row with NaN at its largest logits: the lazy greedy draw is the checked path's
    (the largest finite logit), not the NaN's index."""
    row = np.array(llm_like_logits(4, 1, 500)[0])
    best = int(np.argmax(row))
    row[best] = np.nan
    x = mx.array(row[None])
    tokens, confirm = Sampler(SamplingParams(temperature=0.0)).sample_lazily(x)
    confirm()
    assert tokens.tolist() == Sampler(SamplingParams(temperature=0.0)).sample(x).tolist() != [best]


@pytest.mark.parametrize("params, values, match", [
    (SamplingParams(temperature=0.0), [0.0, math.nan], "row 1: the logits have no finite value"),
    (SamplingParams(temperature=0.7, seed=1), [math.inf, 0.0], r"row 0: the logits have \+inf"),
    (SamplingParams(temperature=1.401298464324817e-45, seed=1), [0.0, 0.0],  # float32's least positive number
     "row 0: the sampling stages left no finite logit"),
], ids=["nan-row", "inf-row", "overflow"])
def test_sample_lazily_confirms_bad_rows_and_undoes_the_draw(params, values, match):
    """A row that `sample` refuses: `confirm` raises the same ValueError, and the draw is
    undone (the next draw uses the same uniforms as a fresh sampler's first)."""
    x = mx.array(np.tile(np.array(values, dtype=np.float32)[:, None], (1, 50)) + np.arange(50, dtype=np.float32))
    with pytest.raises(ValueError, match=match):
        Sampler(params).sample(x)
    sampler = Sampler(params)
    _, confirm = sampler.sample_lazily(x)
    with pytest.raises(ValueError, match=match):
        confirm()
    assert sampler.stats.draws == 0 and sampler._batch is None



# ---- the exponential race -------------------------------------------------------------


@pytest.mark.parametrize("kw", [dict(temperature=0.8), dict(temperature=1.2, top_k=50, min_p=0.01),
                                dict(temperature=0.7, repetition_penalty=1.3, top_p=0.9)],
                         ids=["temperature", "top_k-min_p", "penalties-top_p"])
def test_race_rows_draw_the_same_batched_or_alone(kw):
    """A seeded race row draws the same tokens alone and beside other rows (race and
    inverse-CDF rows, other seeds), eagerly and lazily: its noise comes from its own seed
    and draw count."""
    x = mx.array(llm_like_logits(5, 4, 2000))
    hist = [[1, 2, 3]] * 4
    alone = Sampler(SamplingParams(**kw, seed=11, draw="race"))
    mixed = Sampler([SamplingParams(**kw, seed=11, draw="race"), SamplingParams(temperature=0.9, seed=3),
                     SamplingParams(**kw, seed=12, draw="race"), SamplingParams(temperature=0.0)])
    lazy = Sampler(SamplingParams(**kw, seed=11, draw="race"))
    for _ in range(4):
        a = alone.sample(x[:1], hist[:1]).item()
        assert mixed.sample(x, hist)[0].item() == a
        token, confirm = lazy.sample_lazily(x[:1], hist[:1])
        confirm()
        assert token.item() == a


def test_race_and_inverse_cdf_draw_other_tokens_from_one_seed():
    """Two ways to draw, one seed: the same distribution, but other tokens (so a row's way of
    drawing is part of what makes it reproducible)."""
    x = mx.array(llm_like_logits(6, 1, 2000))
    race = Sampler(SamplingParams(temperature=1.5, seed=4, draw="race"))
    cdf = Sampler(SamplingParams(temperature=1.5, seed=4))
    assert [race.sample(x).item() for _ in range(8)] != [cdf.sample(x).item() for _ in range(8)]


def test_race_noise_depends_on_the_row_and_the_token_only():
    """`race_noise`: one row's noise for a token is the same whichever tokens are raced with
    it, and differs between rows' random bits; it is finite (the clamp keeps -log(v) above 0)."""
    from tiny_llm.sampler.draw import race_noise

    h = mx.array([1, 2, 0xFFFFFFFF], dtype=mx.uint32)
    full = race_noise(h, mx.arange(1000))
    some = race_noise(h, mx.array([[7, 500, 999]] * 3))
    assert mx.array_equal(full[:, mx.array([7, 500, 999])], some)
    assert not mx.array_equal(full[0], full[1]) and mx.all(mx.isfinite(full)).item()
    edge = -mx.log(-mx.log(mx.minimum(mx.array([1.0]), 1.0 - 2.0**-24)))
    assert mx.isfinite(edge).item()


@pytest.mark.parametrize("kw, match", [
    (dict(draw="gumbel"), "draw must be one of inverse_cdf, race, got 'gumbel'"),
    (dict(draw="race", mirostat=2), "draw='race' does not combine with a grammar or mirostat"),
])
def test_bad_draw_is_refused(kw, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        SamplingParams(**kw)


def test_min_tokens_counts_from_each_new_reply():
    """`new_reply()`: `min_tokens` counts the draws of the current reply (a chat's turn),
    while the row's random stream goes on; without it, only the first reply is held back."""
    x = mx.array([[5.0, 0.0, 0.0]])  # token 0 (the end of sequence) is by far the most likely
    s = Sampler(SamplingParams(temperature=0.0, min_tokens=2, eos_token_ids=(0,)))
    assert [s.sample(x).item() for _ in range(3)] == [1, 1, 0]
    s.new_reply()
    assert [s.sample(x).item() for _ in range(3)] == [1, 1, 0]
    assert [s.sample(x).item() for _ in range(2)] == [0, 0]  # no new reply: nothing held back


INVARIANCE_KINDS = {
    "plain": dict(temperature=1.0), "top_p": dict(temperature=1.0, top_p=0.9),
    "min_p": dict(temperature=1.0, min_p=0.05), "top_k": dict(temperature=0.8, top_k=40),
    "penalties": dict(temperature=1.0, repetition_penalty=1.2), "race": dict(temperature=1.0, draw="race"),
}


@pytest.mark.parametrize("neighbour", ["top_p", "min_p", "plain"])
@pytest.mark.parametrize("subject", list(INVARIANCE_KINDS))
def test_a_seeded_row_draws_the_same_tokens_whatever_its_neighbour_asks_for(subject, neighbour):
    """The same row alone and beside a row of another kind: the same token at every step.
    (A row without top-p once drew from top-p's selection when its neighbour had top-p: a
    neighbouring token at a boundary of the cumulative sum, 4 times in these 60 steps.)"""
    row = SamplingParams(seed=11, **INVARIANCE_KINDS[subject])
    alone, batch = Sampler(row), Sampler([row, SamplingParams(seed=99, **INVARIANCE_KINDS[neighbour])])
    rng = np.random.default_rng(0)
    for step in range(60):
        x = mx.array((rng.standard_normal((2, 49152)) * 4).astype(np.float32)).astype(mx.float16)
        assert int(alone.sample(x[:1])[0]) == int(batch.sample(x)[0]), step


# ---- the plan: chosen once from the parameters ------------------------------------------


def plan_of(params):
    from tiny_llm.sampler.plans import make_plan
    from tiny_llm.sampler.rows import make_rows
    return make_plan(make_rows(params, None))


def route(plan):
    """The first route's name and its groups as (members, path)."""
    from tiny_llm.sampler.plans import Apart
    first = plan.first.unchecked if isinstance(plan.first, Apart) else plan.first
    return type(plan.first).__name__, [(g.members, g.path) for g in first.groups]


@pytest.mark.parametrize("params, expected, lazy", [
    ([dict(temperature=0.0), dict(temperature=0.0, order="hf")], ("Unchecked", [((0, 1), "greedy")]), True),
    ([dict(temperature=0.7), dict(temperature=0.9, min_p=0.1)], ("Unchecked", [((0, 1), "stages")]), True),
    ([dict(temperature=0.7), dict(temperature=1.3)], ("Unchecked", [((0, 1), "divide")]), True),
    # A greedy row beside a temperature row: dividing by 0 would leave it no distribution.
    ([dict(temperature=0.0), dict(temperature=0.7)], ("Unchecked", [((0, 1), "stages")]), True),
    ([dict(temperature=0.7), dict(top_p=0.9), dict(temperature=0.0, top_p=0.9)],
     ("Unchecked", [((0,), "divide"), ((1, 2), "stages")]), False),
    ([dict(temperature=0.7), dict(temperature=0.7, order="hf")], ("Checked", [((0,), "stages"), ((1,), "stages")]), False),
    ([dict(top_k=40), dict(mirostat=2), dict(temperature=0.0, top_k=5, order="vllm")],
     ("Checked", [((0,), "window"), ((1,), "chain"), ((2,), "greedy")]), False),
    ([dict(top_k=40, draw="race"), dict(xtc_probability=0.5)], ("Checked", [((0,), "chain"), ((1,), "chain")]), False),
], ids=["greedy", "min_p", "divide", "greedy-beside-temperature", "top_p-apart", "two-orders", "window-chain-greedy",
        "race-and-xtc"])
def test_plan_gives_each_group_its_path(params, expected, lazy):
    """Rows group by chain, draw and top-p, and each group gets the cheapest path its
    parameters allow; rows of more than one chain skip the unchecked route."""
    plan = plan_of([SamplingParams(**kw) for kw in params])
    assert (route(plan), plan.lazy) == (expected, lazy)


def test_plan_is_made_with_the_rows_and_only_then(monkeypatch):
    """Drawing runs the plan: once the sampler is built (and again by `select` and `concat`),
    nothing asks which path the parameters allow, and every method still draws."""
    from tiny_llm.sampler import fast, plans

    params = [SamplingParams(temperature=0.0, seed=1), SamplingParams(top_k=20, seed=2),
              SamplingParams(top_p=0.9, seed=3), SamplingParams(mirostat=2, seed=4),
              SamplingParams(temperature=0.8, draw="race", seed=5)]
    sampler, twin = Sampler(params), Sampler(params)
    x = mx.array(llm_like_logits(8, 5, 3000))
    expected = [twin.sample(x).tolist() for _ in range(3)]

    def refuse(*_):
        raise AssertionError("the path was chosen again at a draw")

    for name in ("eligible", "wants_window"):
        monkeypatch.setattr(fast, name, refuse)
    monkeypatch.setattr(plans, "make_plan", refuse)
    got = [sampler.sample(x).tolist() for _ in range(2)]
    got.append(sampler.sample_with_logprobs(x).tokens.tolist())
    assert got == expected
    assert sampler.distribution(x).shape == (5, 3000)
    monkeypatch.undo()
    part = sampler.select([0, 2])
    assert route(part._plan) == ("Unchecked", [((0,), "greedy"), ((1,), "stages")])
    assert route(Sampler.concat([part, sampler.select([1])])._plan)[0] == "Checked"


def test_unchecked_route_raises_needs_checked_path_and_sample_reports_the_row():
    """The unchecked route does not check the logits: a row without a finite logit makes it
    raise `NeedsCheckedPath`; `sample` then runs the checked route, which names the row."""
    from tiny_llm.sampler.plans import NeedsCheckedPath
    from tiny_llm.sampler.rows import make_rows

    params = [SamplingParams(temperature=0.7, seed=1), SamplingParams(temperature=0.0)]
    rows = make_rows(params, None)
    x = mx.array(np.array([[0.0, 1.0, 2.0], [-INF, -INF, -INF]], dtype=np.float32))
    with pytest.raises(NeedsCheckedPath):
        plan_of(params).first.sample(x, None, rows)
    with pytest.raises(NeedsCheckedPath):
        plan_of(params).first.sample(x[:1], [[1], [2]], rows[:1])  # a history of two rows for one
    with pytest.raises(ValueError, match="row 1: the logits have no finite value"):
        Sampler(params).sample(x)


def test_group_refuses_an_unknown_path():
    from tiny_llm.sampler.plans import Group

    with pytest.raises(ValueError, match="path must be one of greedy, divide, stages, window, chain, got 'fast'"):
        Group((0,), ("temperature",), "inverse_cdf", "fast")


@pytest.mark.parametrize("params", [
    [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, seed=3)],
    [SamplingParams(temperature=0.8, draw="race", seed=4), SamplingParams(temperature=0.0, draw="race")],
], ids=["inverse-cdf", "race"])
def test_sample_lazily_draws_a_greedy_row_beside_a_temperature_row(params):
    """A greedy row beside a temperature row: `sample_lazily` draws what `sample` draws, and
    `confirm` has nothing to report (dividing the greedy row by its temperature of 0 would
    leave it no distribution, and `confirm` would refuse a row that `sample` draws)."""
    x = mx.array(llm_like_logits(9, 2, 500))
    lazy, eager = Sampler(params), Sampler(params)
    for _ in range(4):
        tokens, confirm = lazy.sample_lazily(x)
        confirm()
        assert tokens.tolist() == eager.sample(x).tolist()
    assert lazy.stats.draws == eager.stats.draws == 8


def test_an_empty_order_draws_from_the_plain_softmax():
    """order=[] runs no stage: the distribution is the softmax of the logits, and a seeded
    row draws from it (alone and beside a greedy row) instead of failing."""
    logits = mx.array([[0.1, 0.5, 0.2]])
    params = SamplingParams(order=[], seed=1)
    np.testing.assert_allclose(np.array(Sampler(params).distribution(logits)), np.array(mx.softmax(logits, axis=-1)),
                               rtol=1e-6)
    alone = Sampler(params).sample(logits).tolist()
    both = Sampler([params, SamplingParams(temperature=0)]).sample(mx.concatenate([logits, logits])).tolist()
    assert both == alone + [1] and alone[0] in (0, 1, 2)
