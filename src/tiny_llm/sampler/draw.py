"""Engine — the draw: one token per row from unnormalised weights and a uniform.

A draw picks the first token whose running mass, in vocabulary order, reaches u times the
total (the inverse CDF). Every path of the sampling engine, and speculative decoding, draws
through here. `race` is the other way (`SamplingParams(draw="race")`): every token gets
Gumbel noise made from the row's uniform and its own id, and the largest logit plus noise
wins (the exponential race of week 1 day 7) — no running sum, but two logarithms a token.

Run as a parallel scan (Metal's `cumsum`), the running sums are added in another order than on the
CPU: they may fall by an ulp over tokens of mass 0, and a sum taken twice in two orders
need not agree in the last bit. The draw therefore only ever picks an entry of positive
mass, and never aims past the largest running value at such an entry. In exact arithmetic
(and for the CPU's sequential scan) both guards are no-ops: the tokens are the same.

Tests: tests/test_sampler_draw_order.py, tests/test_sampler_engine.py, tests/test_sampler_fast.py
"""

import mlx.core as mx

from . import rng, stages

DRAWS = ("inverse_cdf", "race")  # SamplingParams.draw: how a token is drawn from the final logits


def running_sum(w: mx.array) -> mx.array:
    """Running sums of `w [..., N]` along the last axis. Every draw sums through here (a
    test swaps in scans that add in other orders)."""
    return mx.cumsum(w, axis=-1)


def reach(running: mx.array, positive: mx.array) -> mx.array:
    """`[B]`: the largest of `running [B, N]` at an entry where `positive [B, N]`, or 0. For
    monotone sums it is the running value at the last positive entry: the row total."""
    return mx.max(mx.where(positive, running, 0.0), axis=-1)


def first_reaching(running: mx.array, positive: mx.array, target: mx.array) -> mx.array:
    """`[B]` int32: the first entry where `positive` and `running >= target [B]` (0 where
    none is). If `target <= reach(running, positive)`, the entry where the reach is found
    qualifies, so the answer has `positive` set whatever order `running` was summed in."""
    hit = positive & (running >= target[:, None])  # B, N
    return mx.argmax(hit, axis=-1).astype(mx.int32)  # argmax of booleans: the first True


def inverse_cdf(w: mx.array, u: mx.array) -> mx.array:
    """`[B]` int32: one draw per row of unnormalised weights `w [B, N]` (>= 0) for uniforms
    `u [B]` in [0, 1): the first entry whose running mass reaches u times the total. The
    entry always has `w > 0` (a row without one gives 0: callers tell such rows by their
    max)."""
    running, positive = running_sum(w), w > 0
    return first_reaching(running, positive, u * reach(running, positive))


def draw(final: mx.array, u: mx.array) -> tuple[mx.array, mx.array]:
    """One token per row: the first whose running (unnormalised) mass, in vocabulary order,
    reaches u times the total. Excluded tokens add exactly 0 and are never chosen. Also
    returns each row's max (NaN or -inf reveal a row that cannot be sampled).

    The running mass is kept in two levels when the vocabulary splits into chunks of 64: a
    running sum inside every chunk, and a running sum of the chunk totals. The draw finds
    the chunk first, then the token inside it; on MLX's CPU backend this is about 1.7x
    faster than one running sum over the row. Both levels go through `first_reaching`,
    so the token has positive mass whatever order the sums were added in (see above)."""
    B, V = final.shape
    if V % stages.CHUNK or V < 4 * stages.CHUNK:
        return draw_flat(final, u)
    y = final.reshape(B, V // stages.CHUNK, stages.CHUNK)
    top = mx.max(mx.max(y, axis=-1), axis=-1)  # B
    e = stages.exp(y - top[:, None, None])  # B, N, C
    inside = running_sum(e)  # B, N, C
    mass = inside[..., -1]  # B, N: each chunk's total, positive iff one of its tokens is
    chunks = running_sum(mass)  # B, N: mass up to the end of each chunk
    filled = mass > 0
    target = u * reach(chunks, filled)
    j = first_reaching(chunks, filled, target)  # B: the chunk
    before = mx.take_along_axis(chunks, mx.maximum(j - 1, 0)[:, None], axis=-1)[:, 0]
    before = mx.where(j > 0, before, 0.0)
    running = before[:, None] + mx.take_along_axis(inside, j[:, None, None], axis=1)[:, 0]  # B, C
    positive = mx.take_along_axis(e, j[:, None, None], axis=1)[:, 0] > 0  # B, C
    # Summed in another order, the chunk's last running value may fall short of chunks[j]
    # (and so of the target): aim at most at the largest value at a positive token.
    k = first_reaching(running, positive, mx.minimum(target, reach(running, positive)))
    return j * stages.CHUNK + k, top


@mx.compile
def draw_flat(final: mx.array, u: mx.array) -> tuple[mx.array, mx.array]:
    """`draw` with one running sum over the whole row."""
    top = mx.max(final, axis=-1, keepdims=True)
    return inverse_cdf(stages.exp(final - top), u), top[:, 0]


# The noise's uniforms are 32-bit; clamped below 1 so that -log(v) is never 0 (a zero clock
# would win whatever its token's mass).
RACE_MAX_UNIFORM = 1.0 - 2.0**-24


def race_noise(h: mx.array, ids: mx.array) -> mx.array:
    """Gumbel noise `[B, N]` for token ids `ids` (`[N]` or `[B, N]`): a hash of the row's 32
    random bits `h [B]` (`rng.bits`: its seed, draw number and stream) and the token's id, so
    a token's noise does not depend on the tokens raced beside it or on other rows."""
    h = rng.mix(h.astype(mx.uint32) ^ mx.array(0x5BD1E995, dtype=mx.uint32))  # B
    ids = ids.astype(mx.uint32)
    bits = rng.mix(h[:, None] ^ rng.mix(ids if ids.ndim == 2 else ids[None, :]))
    v = mx.minimum((bits.astype(mx.float32) + 0.5) * (1.0 / 2**32), RACE_MAX_UNIFORM)  # (0, 1)
    return -mx.log(-mx.log(v))


@mx.compile
def race(final: mx.array, h: mx.array) -> tuple[mx.array, mx.array]:
    """One token per row of the final logits `[B, V]`: `argmax(final + Gumbel noise)`, which
    is a draw from `softmax(final)` (tokens at -inf never win); the noise comes from each
    row's random bits `h [B]` (`race_noise`). Also returns each row's max, as `draw` does."""
    V = final.shape[-1]
    noisy = final + race_noise(h, mx.arange(V, dtype=mx.uint32))
    return mx.argmax(noisy, axis=-1).astype(mx.int32), mx.max(final, axis=-1)


@mx.compile
def argmax_and_value(y: mx.array) -> tuple[mx.array, mx.array]:
    """Each row's argmax, and the logit found there (NaN or +-inf reveal a bad row)."""
    tokens = stages.argmax(y)
    return tokens.astype(mx.int32), mx.take_along_axis(y, tokens[:, None], axis=-1)[:, 0]


def scatter_rows(out: mx.array, idx: mx.array, rows: mx.array) -> mx.array:
    """`out` (`[B, ...]`) with the rows `idx [n]` replaced by `rows [n, ...]`, in order;
    no fancy-index assignment (which with a 2-D index masks the union of all rows)."""
    B = out.shape[0]
    where = mx.zeros((B,), dtype=mx.int32).at[idx].add(mx.arange(1, idx.size + 1, dtype=mx.int32))
    picked = rows[mx.maximum(where - 1, 0)]  # B, ...: row b's replacement (or garbage)
    hit = (where > 0).reshape((B,) + (1,) * (out.ndim - 1))
    return mx.where(hit, picked, out)
