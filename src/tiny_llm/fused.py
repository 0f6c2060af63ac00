"""Fused kernels: the week-1 building blocks, each replaced by one `mx.fast` call.

Each class or function takes the same arguments as its hand-written counterpart, so the
model swaps them in with `fused=True` and computes the same values (up to rounding).
"""

import math

import mlx.core as mx

from .positional_encoding import RoPE


class FusedRMSNorm:
    """`RMSNorm` as one `mx.fast.rms_norm` kernel."""

    def __init__(self, weight: mx.array, eps: float = 1e-6):
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
    broadcastable to `[B, Hq, L, S]` or `"causal"`."""
    # BEGIN SOLUTION week2-day3
    if (query.ndim != 4 or key.ndim != 4 or value.ndim != 4 or key.shape[:3] != value.shape[:3]
            or key.shape[0] != query.shape[0] or key.shape[3] != query.shape[3]
            or query.shape[1] % key.shape[1]):
        raise ValueError(
            f"attention shapes do not match: query {query.shape}, key {key.shape}, value {value.shape} "
            f"(need [B, Hq, L, D], [B, Hkv, S, D], [B, Hkv, S, Dv] with Hq a multiple of Hkv)"
        )
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"mask must be an array, None or 'causal', got {mask!r}")
        if query.shape[2] > key.shape[2]:
            raise ValueError(f"a causal mask needs L <= S, got L={query.shape[2]}, S={key.shape[2]}")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    if isinstance(mask, mx.array):
        mask = mask.astype(query.dtype)
    return mx.fast.scaled_dot_product_attention(query, key, value, scale=scale, mask=mask)
    # END SOLUTION
