"""Course: week 2 day 3 — fused kernels: week-1 building blocks, each as one `mx.fast` call.

Each class or function takes the same arguments as its hand-written counterpart, so the
model swaps them in with `fused=True` and computes the same values (up to rounding).

Tests: tests/test_week2_day3.py
"""

import math

import mlx.core as mx

from .attention import check_attention_inputs
from .layer_norm import DEFAULT_RMS_NORM_EPS
from .positional_encoding import RoPE


class FusedRMSNorm:
    """`RMSNorm` as one `mx.fast.rms_norm` kernel."""

    def __init__(self, weight: mx.array, eps: float = DEFAULT_RMS_NORM_EPS):
        self.weight = weight
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        # BEGIN SOLUTION week2-day3
        return mx.fast.rms_norm(x, self.weight, self.eps)
        # END SOLUTION


class FusedRoPE(RoPE):
    """`RoPE` as one `mx.fast.rope` kernel; `x [B, L, H, D]` as in week 1 (the settings are
    RoPE's)."""

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        """`offset`: the first token's position, an int or one per row (`[B]`)."""
        # BEGIN SOLUTION week2-day3
        # mx.fast.rope wants the positions on the second-to-last axis: [B, H, L, D].
        y = mx.fast.rope(
            x.swapaxes(1, 2), self.dims, traditional=self.traditional, base=self.base,
            scale=1.0, offset=offset,
        )
        return y.swapaxes(1, 2)
        # END SOLUTION


def fused_attention(
    query: mx.array,
    key: mx.array,
    value: mx.array,
    scale: float | None = None,
    mask: mx.array | str | None = None,
) -> mx.array:
    """`scaled_dot_product_attention_grouped` as one `mx.fast.scaled_dot_product_attention`
    call: `query [B, Hq, L, D]`, `key/value [B, Hkv, S, D]`, an additive `mask`
    broadcastable to `[B, Hq, L, S]` or `"causal"`; bad inputs raise as in
    `check_attention_inputs`."""
    # BEGIN SOLUTION week2-day3
    check_attention_inputs(query, key, value, mask)  # week 1's checks, before the kernel runs
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    if isinstance(mask, mx.array):
        mask = mask.astype(query.dtype)
    return mx.fast.scaled_dot_product_attention(query, key, value, scale=scale, mask=mask)
    # END SOLUTION
