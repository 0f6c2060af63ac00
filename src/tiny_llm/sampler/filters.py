"""Engine — filters beyond the week-1 set, shared by the mlx-lm facade and the engine.

Tests: tests/test_sampler_stages.py, tests/test_sampler_facade.py
"""

import math

import mlx.core as mx


def keep_min_p(logprobs: mx.array, min_p: float, min_tokens_to_keep: int = 1) -> mx.array:
    """Keep tokens with `p >= min_p * p_max` in each row, and at least the
    `min_tokens_to_keep` most likely ones. `min_p <= 0` keeps everything."""
    if min_p <= 0:
        return logprobs
    threshold = mx.max(logprobs, axis=-1, keepdims=True) + math.log(min_p)  # B, 1
    keep = logprobs >= threshold
    if min_tokens_to_keep > 1:
        V = logprobs.shape[-1]
        k = min(min_tokens_to_keep, V)
        kth = mx.partition(logprobs, kth=V - k, axis=-1)[..., V - k : V - k + 1]  # B, 1
        keep = keep | (logprobs >= kth)
    return mx.where(keep, logprobs, -mx.inf)


def xtc_above(probs: mx.array, threshold: "float | mx.array", *, strict: bool = False) -> mx.array:
    """The tokens XTC counts as top choices: `p >= threshold`, llama.cpp's comparison (a
    token exactly at the threshold is one), which the engine follows; `strict=True` is
    mlx-lm's `p > threshold`, which its facade (`apply_xtc`, `mlx_compat.make_sampler`) keeps."""
    return probs > threshold if strict else probs >= threshold


def xtc_mask(probs: mx.array, threshold: float, *, strict: bool = False) -> mx.array:
    """True for the tokens XTC removes: every top choice (`xtc_above`) except the least
    likely of them (so nothing is removed unless two or more tokens pass the threshold)."""
    least_above = mx.min(mx.where(xtc_above(probs, threshold, strict=strict), probs, mx.inf), axis=-1,
                         keepdims=True)
    return probs > least_above
