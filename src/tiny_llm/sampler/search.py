"""Engine — top-k and top-p without sorting the vocabulary: the same logits as `stages.py`.

Both filters keep the tokens whose logit is at least a threshold: top-k's is the k-th
largest logit, top-p's the logit where the mass, summed from the most likely token down,
first reaches p. Neither needs the whole vocabulary in order:

- top-k's threshold is one order statistic: a selection (`np.partition`, linear time)
  finds it.
- top-p's threshold is found among the most likely tokens. A selection takes the 8,192
  largest logits (and their probabilities), only they are sorted, and the reference's own
  arithmetic (`stages.top_p`: probabilities over the same normaliser, a running sum in
  float32 from the top) runs on them. If their mass does not reach p, eight times as many
  are taken, and so on. A typical row (a nucleus of tens of tokens) costs what a wide one
  (thousands) does: one selection over the vocabulary and two sorts of 8,192 values.

The running sums are the reference's, term by term, so the thresholds are the same to the
bit: `stages.top_k` and `stages.top_p` stay the oracle, and these are what the engine runs.
The selections run on the host with NumPy (zero-copy on MLX's CPU device and on unified
memory); MLX computes everything that involves the probabilities, so they are the numbers
every other path uses.

Tests: tests/test_sampler_search.py
"""

import math

import mlx.core as mx
import numpy as np

from . import stages

FIRST = 8192  # tokens taken by the first selection of top-p
GROWTH = 8  # each further selection takes this many times more
MARGIN = 1e-5  # the running mass must pass p by this much before the tokens after it are
#                left uncounted: a running sum minus its last term can fall below p by
#                rounding just after the crossing, and the reference counts such a token.


def top_k(x: mx.array, k: mx.array) -> mx.array:
    """`stages.top_k` (keep the k largest logits and their ties where k > 0; `k [G, 1]`)
    without sorting."""
    G, V = x.shape
    ks = np.array(k).reshape(G)
    on = ks > 0
    if not on.any():
        return x
    xs = np.asarray(x)
    kth = np.full(G, -np.inf, dtype=np.float32)
    for g in np.flatnonzero(on):
        i = min(int(ks[g]), V) - 1  # the reference clips k - 1 into [0, V - 1]
        kth[g] = -np.partition(-xs[g], i)[i]
    return stages._keep_at_least(x, mx.array(kth)[:, None], k > 0)


def top_p(x: mx.array, p: mx.array, uncut: mx.array | None = None) -> mx.array:
    """`stages.top_p` (the nucleus: the most likely tokens whose mass reaches p, where
    p < 1; `p [G, 1]`) without sorting the vocabulary. `uncut [G, 1]`: rows no earlier
    filter has cut, whose normaliser is summed over the whole vocabulary (default all)."""
    found = nucleus(x, p, uncut)
    return x if found is None else found.logits


class Nucleus:
    """What `nucleus` found: the filtered logits, and what a draw from them needs, kept on
    the host where the selection ran."""

    def __init__(self, x: np.ndarray, e: np.ndarray, threshold: np.ndarray, top: mx.array, logits: mx.array):
        self._x, self._e, self._threshold = x, e, threshold
        self.top = top  # [G]: each row's max, kept by the filter
        self.logits = logits  # [G, V]: top-p's result (lazy)

    def draw(self, u: mx.array) -> mx.array:
        """`[G]` int32: `draw.draw(self.logits, u)`: per row the first kept token, in
        vocabulary order, whose running mass reaches u times the kept mass, summed on the
        host over the kept tokens only. The numbers are the draw's own (`exp(x - max)`
        from MLX); only the order of the float32 additions differs from the two-level
        running sum, which can move a draw whose u lies within rounding of a boundary."""
        us = np.array(u, dtype=np.float32)
        out = np.zeros(len(us), dtype=np.int32)
        for g, target in enumerate(us):
            ids = np.flatnonzero(self._x[g] >= self._threshold[g])
            w = self._e[g][ids]
            running = np.cumsum(w, dtype=np.float32)
            positive = w > 0
            if not positive.any():
                continue  # nothing to draw: the caller tells such a row by its max
            reach = running[positive].max()
            hit = positive & (running >= target * reach)
            out[g] = ids[int(np.argmax(hit))]
        return mx.array(out)


def nucleus(x: mx.array, p: mx.array, uncut: mx.array | None = None) -> Nucleus | None:
    """`top_p`'s work, kept for a draw (None where no row has p < 1)."""
    G, V = x.shape
    ps = np.array(p).reshape(G)
    on = ps < 1
    if not on.any():
        return None
    top = mx.max(x, axis=-1, keepdims=True)
    e = stages.exp(x - top)
    whole = mx.sum(e, axis=-1)
    mx.eval(e, whole)
    xs, es, wholes = np.asarray(x), np.asarray(e), np.asarray(whole)
    uncut_rows = np.ones(G, dtype=bool) if uncut is None else np.array(uncut).reshape(G)
    threshold = np.full(G, -np.inf, dtype=np.float32)
    for g in np.flatnonzero(on):
        threshold[g] = _nucleus_threshold(xs[g], es[g], np.float32(ps[g]),
                                          wholes[g] if uncut_rows[g] else None)
    column = mx.array(threshold)[:, None]
    return Nucleus(xs, es, threshold, top[:, 0], mx.where(x >= column, x, -math.inf))


def _largest(x: np.ndarray, e: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The `n` largest logits of `x`, largest first, and their weights `e` in the same
    order: the first n entries of the sorted reference's `xs` and `es`. One selection
    finds the n largest logits; `e` is a non-decreasing function of `x`, so sorting the
    logits and their weights each by value lines them up (equal logits have equal weights)."""
    if n < x.size:
        idx = np.argpartition(x, x.size - n)[x.size - n:]
        x, e = x[idx], e[idx]
    return np.sort(x)[::-1], np.sort(e)[::-1]


def _nucleus_threshold(x: np.ndarray, e: np.ndarray, p: np.float32, whole) -> np.float32:
    """One row's top-p threshold, as `stages.top_p` computes it. `e = exp(x - max)` as the
    reference computes it; `whole`: the normaliser summed over the vocabulary, or None for a
    row an earlier filter has cut (its normaliser is the running sum over the candidates)."""
    n = int(np.count_nonzero(x > -np.inf))
    if n == 0:
        return np.float32(-np.inf)
    if whole is None:
        # The reference's normaliser for a cut row: a running sum from the top over every
        # candidate, so every candidate is taken (as many as the filter before it left).
        xs, es = _largest(x, e, n)
        z = np.cumsum(es, dtype=np.float32)[-1]
    else:
        z, xs, es = np.float32(whole), x[:0], e[:0]
    take = min(n, FIRST)
    while True:
        if xs.size < take:
            xs, es = _largest(x, e, take)
        probs = es / z
        before = np.cumsum(probs, dtype=np.float32) - probs
        if xs.size >= n or before[-1] >= p + MARGIN:
            kept = max(int(np.count_nonzero(before < p)), 1)
            return xs[kept - 1]
        take = min(n, take * GROWTH)
