"""Engine — the fast path: top-k / top-p / min-p / temperature chains without sorting the vocabulary.

The most likely W tokens of each row are found by partial selection (one pass over the
vocabulary) and only they are sorted. Every filter then works on this window; the mass of
the whole vocabulary enters top-p through an exact sum over all tokens. A row whose answer
could depend on a token outside the window (a nucleus larger than the window, ties at the
window's edge, a min-p threshold below it, no filter at all) is reported for the chain
(whose top-k and top-p need no sort either: `search.py`), so the result is always the
same as the reference chain's.

Tests: tests/test_sampler_fast.py, tests/test_sampler_draw_order.py, tests/test_sampler_engine.py
"""

import math

import mlx.core as mx

from . import stages
from .draw import inverse_cdf
from .params import STAGE_ON, SamplingParams, stage_on

WINDOW = 256  # tokens kept in the window (at least; top-k up to MAX_WINDOW widens it)
MAX_WINDOW = 4096
FILTERS = ("top_k", "top_p", "min_p")  # the window's filters: one that is on for a row cuts the row
FAST_STAGES = {"penalties", *FILTERS, "temperature"}


def eligible(params: list[SamplingParams], order: tuple[str, ...]) -> bool:
    """Whether the fast path applies to a group: only the stages above switched on,
    penalties (if any) before everything else, and no dynamic temperature."""
    for p in params:
        on = set(p.enabled_stages())
        if p.mirostat or not on <= FAST_STAGES or p.dynatemp_range > 0:
            return False
        if p.top_k > MAX_WINDOW:
            return False
    used = [s for s in order if s in FAST_STAGES]
    return "penalties" not in used or used[0] == "penalties"


def column(params: list[SamplingParams], name: str, dtype: mx.Dtype = mx.float32) -> mx.array:
    """`[G, 1]`: parameter `name` of every row, the shape a stage takes its parameters in."""
    return mx.array([getattr(p, name) for p in params], dtype=dtype)[:, None]


def window_size(params: list[SamplingParams], V: int) -> int:
    return min(V, max([WINDOW] + [p.top_k for p in params if stage_on("top_k", p)]))


def sparse_penalties(y: mx.array, hist: list[list[int]], params: list[SamplingParams]) -> mx.array:
    """The penalties stage, touching only the tokens each row has seen."""
    import numpy as np

    G, V = y.shape
    uniq, counts = [], []
    for h, p in zip(hist, params):
        n = p.penalty_last_n
        window = h if n < 0 else (h[-n:] if n > 0 else [])
        bad = [t for t in window if not 0 <= t < V]
        if bad:
            raise ValueError(f"history has token {bad[0]} outside the vocabulary of {V}")
        u, c = np.unique(np.array(window, dtype=np.int64), return_counts=True)
        uniq.append(u), counts.append(c)
    U = max(1, max(len(u) for u in uniq))
    idx = np.zeros((G, U), dtype=np.int32)
    cnt = np.zeros((G, U), dtype=np.int32)
    for g, (u, c) in enumerate(zip(uniq, counts)):
        if len(u):
            # Pad with the row's first token: duplicates write the same value back.
            idx[g], cnt[g] = u[0], c[0]
            idx[g, : len(u)], cnt[g, : len(u)] = u, c
    idx, cnt = mx.array(idx), mx.array(cnt)
    picked = mx.take_along_axis(y, idx, axis=-1)
    new = stages.penalties(picked, cnt, column(params, "repetition_penalty"), column(params, "frequency_penalty"),
                           column(params, "presence_penalty"))
    return mx.put_along_axis(y, idx, new, axis=-1)


CHUNK = 32  # vocabulary chunk for the two-level selection


def top_window(y: mx.array, W: int) -> mx.array:
    """Indices `[G, W]` of W largest logits per row (unsorted; among ties at the W-th value
    any may be chosen). Two levels: the W chunks with the largest maxima hold every token
    above the W-th value, so partial selection runs on W * CHUNK candidates, not on V."""
    G, V = y.shape
    n_chunks = -(-V // CHUNK)
    if W * CHUNK * 4 > V:  # too little to gain
        return mx.argpartition(-y, W - 1, axis=-1)[:, :W]
    pad = n_chunks * CHUNK - V
    yp = mx.concatenate([y, mx.full((G, pad), -math.inf)], axis=-1) if pad else y
    chunks = yp.reshape(G, n_chunks, CHUNK)
    best = mx.argpartition(-mx.max(chunks, axis=-1), W - 1, axis=-1)[:, :W]  # G, W chunks
    cand = mx.take_along_axis(chunks, best[:, :, None], axis=1).reshape(G, W * CHUNK)
    ids = (best[:, :, None] * CHUNK + mx.arange(CHUNK)[None, None, :]).reshape(G, W * CHUNK)
    pick = mx.argpartition(-cand, W - 1, axis=-1)[:, :W]
    return mx.take_along_axis(ids, pick, axis=-1)


def wants_window(params: list[SamplingParams]) -> bool:
    """Whether the window pays: every row is cut to a few tokens by top-k. Top-p alone
    costs less through `search.top_p` and one draw over the vocabulary (its nucleus may be
    any size), and min-p and temperature alone are passes over the vocabulary."""
    return all(p.temperature <= 0 or stage_on("top_k", p) for p in params)


def fast_tokens(y: mx.array, params: list[SamplingParams], order: tuple[str, ...], u: mx.array):
    """Draw one token per row from the chain `order` applied to `y [G, V]` (penalties
    already applied). Returns `(tokens [G], needs_full [G], top [G])`; where `needs_full` is
    true the token must be recomputed by the full path; `top` is each row's largest final
    logit (not finite: the row cannot be sampled)."""
    ids, yw, full = window(y, params, order)
    greedy = column(params, "temperature") <= 0
    tokens = window_draw(ids, yw, u)[:, None]  # G, 1
    best = stages.argmax(y)[:, None].astype(tokens.dtype)
    tokens = mx.where(greedy, best, tokens)
    top = mx.where(greedy, mx.max(y, axis=-1, keepdims=True), mx.max(yw, axis=-1, keepdims=True))
    return tokens[:, 0].astype(mx.int32), full & ~greedy[:, 0], top[:, 0]


def window_draw(ids: mx.array, yw: mx.array, u: mx.array) -> mx.array:
    """`[G]`: one token per row from the window's final logits `yw [G, W]` of the tokens
    `ids [G, W]` (in vocabulary order, as the full path draws, so both pick the same token)."""
    e = stages.exp(yw - mx.max(yw, axis=-1, keepdims=True))
    return mx.take_along_axis(ids, inverse_cdf(e, u)[:, None], axis=-1)[:, 0]


def window(y: mx.array, params: list[SamplingParams], order: tuple[str, ...]):
    """The chain `order` applied to the most likely tokens of `y [G, V]` (penalties already
    applied). Returns `(ids [G, W], yw [G, W], needs_full [G])`: the window's tokens in
    vocabulary order, their final logits (-inf: filtered out) and, per row, whether the
    final distribution may reach tokens outside the window (the full path must answer
    then). Greedy rows are not told apart here."""
    G, V = y.shape

    def col(name: str, dtype: mx.Dtype = mx.float32) -> mx.array:
        return column(params, name, dtype)

    W = window_size(params, V)
    has_tail = W < V
    idx = top_window(y, W) if has_tail else mx.broadcast_to(mx.arange(V), (G, V))
    yw = mx.take_along_axis(y, idx, axis=-1)
    by = mx.argsort(-yw, axis=-1)
    idx = mx.take_along_axis(idx, by, axis=-1)  # window tokens, most likely first
    alive = mx.ones((G, W), dtype=mx.bool_)
    # Whether tokens outside the window are still candidates: known per row from the
    # parameters alone (a filter that is on closes the tail).
    tail_rows = [has_tail] * G
    tail = mx.array(tail_rows)[:, None]
    full = mx.zeros((G, 1), dtype=mx.bool_)

    def close_tail(flags: list[bool]):
        nonlocal tail
        for g, on in enumerate(flags):
            tail_rows[g] = tail_rows[g] and not on
        tail = mx.array(tail_rows)[:, None]

    def window_values():
        return mx.take_along_axis(y, idx, axis=-1)

    def count_full_at_least(threshold):
        return mx.sum(y >= threshold, axis=-1, keepdims=True)

    for stage in order:
        if stage == "penalties":
            continue  # in `y` already
        rows_on = [STAGE_ON[stage](p) for p in params]
        if not any(rows_on):
            continue  # no row uses it
        if stage == "temperature":
            t = col("temperature")
            y = mx.where(t > 0, y / mx.where(t > 0, t, 1.0), y)  # the same division as the chain
            continue
        on = mx.array(rows_on)[:, None]
        if stage == "top_k":
            k = col("top_k", mx.int32)
            yw = window_values()
            kth = mx.take_along_axis(yw, mx.clip(k - 1, 0, W - 1), axis=-1)
            keep = yw >= kth
            # Tokens outside the window tied with the k-th value would survive too (unless
            # that value is -inf: fewer than k tokens are left, and the rest have no mass).
            outside = tail & (kth > -math.inf) & (count_full_at_least(kth) > mx.sum(keep, axis=-1, keepdims=True))
            full = full | (on & outside)
            alive = mx.where(on, alive & keep, alive)
        elif stage == "top_p":
            p = col("top_p")
            yw = window_values()
            top = yw[:, :1]
            ew = mx.where(alive, stages.exp(yw - top), 0.0)
            z = mx.cumsum(ew, axis=-1)[:, -1:]  # alive tokens lead: a running sum, as the chain
            if any(t and o for t, o in zip(tail_rows, rows_on)):
                # Exact mass: over the whole vocabulary while the tail is alive.
                z = mx.where(tail, mx.sum(stages.exp(y - top), axis=-1, keepdims=True), z)
            ps = ew / z
            before = mx.cumsum(ps, axis=-1) - ps
            kept = mx.maximum(mx.sum(alive & (before < p), axis=-1, keepdims=True), 1)
            threshold = mx.take_along_axis(yw, kept - 1, axis=-1)
            in_window_mass = mx.sum(ps, axis=-1, keepdims=True)
            # The nucleus may reach past the window, or tie with tokens outside it.
            short = tail & (in_window_mass < p)
            ties = tail & (count_full_at_least(threshold) > mx.sum(alive & (yw >= threshold), axis=-1, keepdims=True))
            full = full | (on & (short | ties))
            alive = mx.where(on, alive & (yw >= threshold), alive)
        elif stage == "min_p":
            p = col("min_p")
            yw = window_values()
            threshold = yw[:, :1] + mx.log(mx.maximum(p, 1e-38))
            keep = yw >= threshold
            outside = tail & (count_full_at_least(threshold) > mx.sum(keep, axis=-1, keepdims=True))
            full = full | (on & outside)
            alive = mx.where(on, alive & keep, alive)
        if stage in FILTERS:
            close_tail(rows_on)
    full = full | tail  # no filter closed the tail: the draw needs every token
    yw = mx.where(alive, window_values(), -math.inf)
    by_id = mx.argsort(idx, axis=-1)
    return mx.take_along_axis(idx, by_id, axis=-1), mx.take_along_axis(yw, by_id, axis=-1), full[:, 0]
