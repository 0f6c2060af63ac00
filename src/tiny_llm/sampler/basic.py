"""Course: week 1 day 7 — the first sampler: greedy, temperature, top-k and top-p, and the exponential race.

Every function works on a batch: `logprobs [B, V]`, one distribution per row. Filters return
the same array with the tokens they drop set to `-inf`. The race (`sample_exponential_race`,
and `sample_gumbel_max`, the same draw in the log domain) takes a temperature per row and
draws without a sort or a running sum.

Tests: tests/test_week1_day7.py, tests/test_sampler_facade.py
"""

import math
from collections.abc import Callable
from functools import partial

import mlx.core as mx

from .checks import check_float, check_int
from .filters import keep_min_p

SamplerFunction = Callable[[mx.array], mx.array]


@partial(mx.compile, inputs=mx.random.state, outputs=mx.random.state)
def categorical_draw(logits: mx.array, inv_temp: float) -> mx.array:
    """One token per row from `softmax(logits * inv_temp)` (compiled: one fused pass)."""
    return mx.random.categorical(logits.astype(mx.float32) * inv_temp, axis=-1)


def keep_top_k(logprobs: mx.array, k: int) -> mx.array:
    """Keep the `k` largest entries of each row (and any entry tied with the k-th)."""
    # BEGIN SOLUTION week1-day7
    V = logprobs.shape[-1]
    if k >= V:
        return logprobs
    # The k-th largest value of each row: partition puts it at index V - k.
    kth = mx.partition(logprobs, kth=V - k, axis=-1)[..., V - k : V - k + 1]  # B, 1
    return mx.where(logprobs >= kth, logprobs, -mx.inf)
    # END SOLUTION


def keep_top_p(logprobs: mx.array, p: float) -> mx.array:
    """Keep the most likely tokens of each row until their mass reaches `p`.

    The mass is measured over the finite entries (so after top-k it is renormalised over the
    survivors). A token is kept when the mass of the tokens strictly more likely than it is
    below `p`; tokens tied with the last kept one are kept too.
    """
    # BEGIN SOLUTION week1-day7
    ascending = mx.sort(logprobs, axis=-1)  # B, V
    # float32 for the sums: in float16 a cumulative sum over 150k entries drifts.
    probs = mx.exp(ascending.astype(mx.float32))
    mass_above = mx.cumsum(probs, axis=-1, reverse=True, inclusive=False)  # B, V
    total = mass_above[..., :1] + probs[..., :1]  # B, 1
    dropped = mx.sum(mass_above >= p * total, axis=-1, keepdims=True)  # B, 1
    dropped = mx.minimum(dropped, logprobs.shape[-1] - 1)  # a row of -inf keeps its max
    threshold = mx.take_along_axis(ascending, dropped, axis=-1)  # B, 1
    return mx.where(logprobs >= threshold, logprobs, -mx.inf)
    # END SOLUTION


def make_sampler(
    temp: float = 0.0,
    top_p: float | None = 0.0,
    top_k: int | None = 0,
    *,
    min_p: float = 0.0,
    min_tokens_to_keep: int = 1,
) -> SamplerFunction:
    """A function `logprobs [B, V] -> tokens [B]`.

    `temp == 0` picks the argmax (the lowest index on ties). Otherwise the filters run in
    llama.cpp's order, each on what the previous one left: top-k, top-p, min-p; then the
    survivors are divided by `temp` and one token is drawn per row with
    `mx.random.categorical`. `top_p` and `top_k` of 0 or None, `top_p = 1` and `min_p = 0`
    switch a filter off. Arguments are checked here, before anything runs (`check_float`
    and `check_int` from `tiny_llm.sampler.checks` raise the `ValueError`s).
    """
    # BEGIN SOLUTION week1-day7
    temp = check_float("temp", temp, minimum=0.0, maximum=math.inf, max_open=True)
    top_p = 0.0 if top_p is None else check_float("top_p", top_p, minimum=0.0, maximum=1.0)
    top_k = 0 if top_k is None else check_int("top_k", top_k, minimum=0)
    min_p = check_float("min_p", min_p, minimum=0.0, maximum=1.0)
    min_tokens_to_keep = check_int("min_tokens_to_keep", min_tokens_to_keep, minimum=1)
    if temp == 0:
        return lambda logprobs: mx.argmax(logprobs, axis=-1)

    def sampler(logprobs: mx.array) -> mx.array:
        if top_k > 0:
            logprobs = keep_top_k(logprobs, top_k)
        if 0 < top_p < 1:
            logprobs = keep_top_p(logprobs, top_p)
        if min_p > 0:
            logprobs = keep_min_p(logprobs, min_p, min_tokens_to_keep)
        return categorical_draw(logprobs, 1.0 / temp)

    return sampler
    # END SOLUTION


# The smallest exponential the race divides by: a uniform of exactly 0 gives E = 0, and p / 0
# would make that token win whatever its probability (or give NaN where p = 0).
MIN_EXPONENTIAL = 1e-10


def exponential_noise(shape: tuple[int, ...], key: mx.array | None = None) -> mx.array:
    """`E ~ Exponential(1)` of `shape`, from `mx.random.uniform` (with `key`, or MLX's global
    random state), clamped below at `MIN_EXPONENTIAL`."""
    # BEGIN SOLUTION week1-day7
    u = mx.random.uniform(shape=shape, key=key)  # [0, 1)
    return mx.maximum(-mx.log1p(-u), MIN_EXPONENTIAL)  # -log(1 - u): Exponential(1)
    # END SOLUTION


def sample_exponential_race(logits: mx.array, temperatures: mx.array, noise: mx.array | None = None) -> mx.array:
    """One token per row of `logits [B, V]`, row b drawn from `softmax(logits[b] / T_b)` with
    `T = temperatures [B]`; a row with `T_b = 0` takes its argmax. The draw is a race: every
    token gets an exponential clock `E [B, V]` (`noise`, or fresh `exponential_noise`) and
    the token with the largest `p / E` wins — no cumulative sum, no sort."""
    # BEGIN SOLUTION week1-day7
    logits = logits.astype(mx.float32)
    noise = exponential_noise(logits.shape) if noise is None else noise
    t = temperatures.astype(mx.float32)[:, None]  # B, 1
    greedy = t <= 0
    probs = mx.softmax(logits / mx.where(greedy, 1.0, t), axis=-1)
    race = mx.argmax(probs / noise, axis=-1)
    return mx.where(greedy[:, 0], mx.argmax(logits, axis=-1), race)
    # END SOLUTION


def sample_gumbel_max(logits: mx.array, temperatures: mx.array, noise: mx.array | None = None) -> mx.array:
    """`sample_exponential_race` in the log domain: `argmax(logits / T - log E)`, where
    `-log E` is Gumbel noise. Under the same `noise` it picks the same tokens."""
    # BEGIN SOLUTION week1-day7
    logits = logits.astype(mx.float32)
    noise = exponential_noise(logits.shape) if noise is None else noise
    t = temperatures.astype(mx.float32)[:, None]
    greedy = t <= 0
    race = mx.argmax(logits / mx.where(greedy, 1.0, t) - mx.log(noise), axis=-1)
    return mx.where(greedy[:, 0], mx.argmax(logits, axis=-1), race)
    # END SOLUTION
