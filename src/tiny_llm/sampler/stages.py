"""Engine — the stages of the sampling chain: the reference every faster path agrees with.

Each maps logits `[G, V]` (float32, excluded tokens at -inf) to logits `[G, V]`, with one parameter per row (`[G, 1]` arrays): rows whose value
means "off" pass through unchanged. A filter renormalises over the candidates it is given
and keeps every token tied with the last one it keeps.

Tests: tests/test_sampler_stages.py, tests/test_sampler_engine.py
"""

import math

import mlx.core as mx

from .filters import xtc_above
from .penalties import apply_frequency, apply_presence, apply_repetition

NEG_INF = -math.inf
LOG2E = 1.4426950408889634


def exp(z: mx.array) -> mx.array:
    """e**z as 2**(z log2 e): on MLX's CPU backend 2**z is about three times faster than
    exp, and every path of the engine uses this same function, so they agree."""
    return mx.power(2.0, z * LOG2E)


CHUNK = 64  # the two-level argmax and draw work in chunks of this many tokens


def argmax(x: mx.array) -> mx.array:
    """Each row's argmax `[B]` (the lowest index on ties; a NaN counts as the largest, as in
    `mx.argmax`). When the vocabulary splits into chunks of 64, it takes the largest chunk
    max first and then the argmax inside that chunk: the same index, and on MLX's CPU
    backend 1.1-1.5x faster than one `mx.argmax` over the row in `scripts/bench_sampler.py`."""
    B, V = x.shape
    if V % CHUNK or V < 4 * CHUNK:
        return mx.argmax(x, axis=-1)
    chunks = x.reshape(B, V // CHUNK, CHUNK)
    j = mx.argmax(mx.max(chunks, axis=-1), axis=-1)  # B: the first chunk holding the max
    inside = mx.take_along_axis(chunks, j[:, None, None], axis=1)[:, 0]  # B, C
    return j * CHUNK + mx.argmax(inside, axis=-1)


def softmax(x: mx.array) -> mx.array:
    """Probabilities over the candidates; excluded tokens (-inf) get exactly 0."""
    e = exp(x - mx.max(x, axis=-1, keepdims=True))
    return e / mx.sum(e, axis=-1, keepdims=True)


def _probs(x: mx.array) -> mx.array:
    return softmax(x)


def _descending(x: mx.array) -> tuple[mx.array, mx.array]:
    """Logits sorted high to low per row, and the matching probabilities."""
    xs = -mx.sort(-x, axis=-1)
    return xs, _probs(xs)


def _keep_at_least(x: mx.array, threshold: mx.array, on: mx.array) -> mx.array:
    """Keep logits >= threshold `[G, 1]` in rows where `on` `[G, 1]`."""
    return mx.where(on & (x < threshold), NEG_INF, x)


def penalties(x, counts, repetition, frequency, presence):
    """Repetition divides positive logits (multiplies negative ones) of seen tokens; then
    frequency subtracts per occurrence and presence once. `counts [G, V]`; the formulas are
    those of the mlx-lm facade's processors (`penalties.py`)."""
    x = apply_repetition(x, counts, repetition)
    return apply_presence(apply_frequency(x, counts, frequency), counts, presence)


def top_n_sigma(x, n):
    """Keep logits >= max - n * std over the current candidates (n > 0)."""
    finite = mx.isfinite(x)
    count = mx.maximum(mx.sum(finite, axis=-1, keepdims=True), 1)
    mean = mx.sum(mx.where(finite, x, 0.0), axis=-1, keepdims=True) / count
    var = mx.sum(mx.where(finite, (x - mean) ** 2, 0.0), axis=-1, keepdims=True) / count
    top = mx.max(x, axis=-1, keepdims=True)
    return _keep_at_least(x, top - n * mx.sqrt(var), n > 0)


def top_k(x, k):
    """Keep the k largest logits and their ties (k > 0); `k` is `[G, 1]` int."""
    V = x.shape[-1]
    xs = -mx.sort(-x, axis=-1)
    kth = mx.take_along_axis(xs, mx.clip(k - 1, 0, V - 1).astype(mx.int32), axis=-1)
    return _keep_at_least(x, kth, k > 0)


def typical_p(x, p):
    """Locally typical: keep the tokens whose surprise is closest to the entropy, until
    their mass exceeds p (p < 1)."""
    probs = _probs(x)
    logp = mx.log(probs)
    entropy = -mx.sum(mx.where(probs > 0, probs * logp, 0.0), axis=-1, keepdims=True)
    score = mx.where(probs > 0, mx.abs(-logp - entropy), math.inf)
    order = mx.argsort(score, axis=-1)
    ps = mx.take_along_axis(probs, order, axis=-1)
    before = mx.cumsum(ps, axis=-1) - ps  # mass before each token, in score order
    kept = mx.maximum(mx.sum(before <= p, axis=-1, keepdims=True), 1)  # a prefix
    last = mx.take_along_axis(mx.take_along_axis(score, order, axis=-1), kept - 1, axis=-1)
    return mx.where((p < 1) & (score > last), NEG_INF, x)


def top_p(x, p, uncut=None):
    """Nucleus: the smallest set of most likely tokens whose mass reaches p (p < 1).

    The normaliser is summed exactly as the fast path sums it: over the vocabulary in
    vocabulary order for rows no earlier filter has cut (`uncut [G, 1]`, default all), and
    as a running sum from the most likely token down for the others.
    """
    xs = -mx.sort(-x, axis=-1)
    top = xs[:, :1]
    es = exp(xs - top)
    z = mx.cumsum(es, axis=-1)[:, -1:]
    if uncut is None or bool(mx.any(uncut).item()):
        whole = mx.sum(exp(x - top), axis=-1, keepdims=True)
        z = whole if uncut is None else mx.where(uncut, whole, z)
    ps = es / z
    before = mx.cumsum(ps, axis=-1) - ps
    kept = mx.maximum(mx.sum(before < p, axis=-1, keepdims=True), 1)
    threshold = mx.take_along_axis(xs, kept - 1, axis=-1)
    return _keep_at_least(x, threshold, p < 1)


def min_p(x, p):
    """Keep tokens with probability >= p * (the top probability) (p > 0)."""
    top = mx.max(x, axis=-1, keepdims=True)
    return _keep_at_least(x, top + mx.log(mx.maximum(p, 1e-38)), p > 0)


def xtc(x, threshold, active):
    """Exclude Top Choices: in rows where `active`, if two or more tokens have
    p >= threshold, remove all of them but the least likely (and its ties)."""
    probs = _probs(x)
    above = xtc_above(probs, threshold)
    n_above = mx.sum(above, axis=-1, keepdims=True)
    least = mx.min(mx.where(above, x, math.inf), axis=-1, keepdims=True)
    drop = active & (n_above >= 2) & above & (x > least)
    return mx.where(drop, NEG_INF, x)


def greedy(x):
    """Only the argmax survives (the lowest index on ties)."""
    V = x.shape[-1]
    best = argmax(x)[:, None]
    return mx.where(mx.arange(V)[None, :] == best, x, NEG_INF)


def plain_temperature(x, t, any_greedy: bool):
    """Divide by t; rows with t <= 0 keep only their argmax."""
    scaled = mx.where(t > 0, x / mx.where(t > 0, t, 1.0), x)
    return mx.where(t <= 0, greedy(x), scaled) if any_greedy else scaled


def temperature(x, t, dyn_range, dyn_exponent):
    """Divide by the temperature; t <= 0 (without dynamic range) is greedy. With a dynamic
    range d > 0 the temperature moves within [max(0, t - d), t + d] with the normalised
    entropy of the current candidates."""
    dynamic = dyn_range > 0
    probs = _probs(x)
    n = mx.sum(probs > 0, axis=-1, keepdims=True)
    entropy = -mx.sum(mx.where(probs > 0, probs * mx.log(probs), 0.0), axis=-1, keepdims=True)
    h_norm = mx.where(n > 1, entropy / mx.log(mx.maximum(n, 2).astype(mx.float32)), 0.0)
    low = mx.maximum(t - dyn_range, 0.0)
    t_dyn = low + (t + dyn_range - low) * mx.power(mx.maximum(h_norm, 0.0), dyn_exponent)
    t_eff = mx.where(dynamic, t_dyn, t)
    is_greedy = ~dynamic & (t <= 0)
    single = dynamic & (n <= 1)  # one candidate: nothing to scale
    scaled = mx.where(single | is_greedy, x, x / mx.where(t_eff > 0, t_eff, 1.0))
    # A dynamic temperature of exactly 0 (entropy 0 at t <= d) is greedy too.
    return mx.where(is_greedy | (dynamic & (t_eff <= 0)), greedy(x), scaled)


def mirostat_v2(x, mu):
    """Drop tokens whose surprise -log2(p) exceeds mu (the top token always stays)."""
    probs = _probs(x)
    surprise = -mx.log2(probs)
    top = mx.max(x, axis=-1, keepdims=True)
    return mx.where((surprise > mu) & (x < top), NEG_INF, x)


def mirostat_v1(x, mu, vocab_size: int, m: int = 100):
    """Estimate the Zipf exponent from the top m tokens, derive k from mu, keep the top k."""
    V = x.shape[-1]
    xs, ps = _descending(x)
    count = mx.sum(ps > 0, axis=-1, keepdims=True)
    terms = min(m - 1, V - 1)
    i = mx.arange(terms, dtype=mx.float32)[None, :]
    t = mx.log((i + 2) / (i + 1))
    b = mx.log(ps[:, :terms] / ps[:, 1 : terms + 1])
    valid = i < (count - 1)
    s_hat = mx.sum(mx.where(valid, t * b, 0.0), axis=-1, keepdims=True) / mx.maximum(
        mx.sum(mx.where(valid, t * t, 0.0), axis=-1, keepdims=True), 1e-30
    )
    eps = s_hat - 1
    k = mx.power((eps * mx.power(2.0, mu)) / (1 - mx.power(float(vocab_size), -eps)), 1 / s_hat)
    k = mx.where(mx.isnan(k), 1.0, mx.clip(k, 1.0, float(V)))
    k = mx.where(count <= 1, 1, mx.floor(k).astype(mx.int32))
    return top_k(x, k)
