"""Course: week 1 days 1 and 3 — scaled dot-product attention: plain (day 1), grouped-query (day 3).

Tests: tests/test_week1_day1.py, tests/test_week1_day3.py, tests/test_progress.py
"""

import math

import mlx.core as mx

from .basics import linear, softmax


def scaled_dot_product_attention_simple(
    query: mx.array,
    key: mx.array,
    value: mx.array,
    scale: float | None = None,
    mask: mx.array | None = None,
) -> mx.array:
    """`softmax(q @ k^T * scale + mask) @ v`.

    `query [..., L, D]`, `key [..., S, D]`, `value [..., S, D]`, `mask` broadcastable to
    `[..., L, S]` (additive: 0 keeps, -inf drops). `scale` defaults to `1/sqrt(D)`.
    """
    # BEGIN SOLUTION week1-day1
    if query.shape[-1] != key.shape[-1] or key.shape[:-1] != value.shape[:-1]:
        raise ValueError(
            f"attention shapes do not match: query {query.shape}, key {key.shape}, "
            f"value {value.shape} (need query[..., D], key[..., S, D], value[..., S, Dv])"
        )
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = (query @ key.swapaxes(-1, -2)) * scale  # ..., L, S
    if mask is not None:
        scores = scores + mask
    return softmax(scores, axis=-1) @ value  # ..., L, Dv
    # END SOLUTION


class SimpleMultiHeadAttention:
    """Multi-head attention with separate projections `wq, wk, wv, wo [E, E]`."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        wq: mx.array,
        wk: mx.array,
        wv: mx.array,
        wo: mx.array,
    ):
        # BEGIN SOLUTION week1-day1
        if hidden_size % num_heads:
            raise ValueError(
                f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}"
            )
        for name, w in (("wq", wq), ("wk", wk), ("wv", wv), ("wo", wo)):
            if w.shape != (hidden_size, hidden_size):
                raise ValueError(
                    f"{name} has shape {w.shape}, expected ({hidden_size}, {hidden_size})"
                )
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.wq, self.wk, self.wv, self.wo = wq, wk, wv, wo
        # END SOLUTION

    def __call__(
        self,
        query: mx.array,
        key: mx.array,
        value: mx.array,
        mask: mx.array | None = None,
    ) -> mx.array:
        """`query [B, L, E]`, `key/value [B, S, E]` -> `[B, L, E]`."""
        # BEGIN SOLUTION week1-day1
        B, L, _ = query.shape
        S = key.shape[1]
        H, Dh = self.num_heads, self.head_dim
        q = linear(query, self.wq).reshape(B, L, H, Dh).transpose(0, 2, 1, 3)  # B, H, L, Dh
        k = linear(key, self.wk).reshape(B, S, H, Dh).transpose(0, 2, 1, 3)  # B, H, S, Dh
        v = linear(value, self.wv).reshape(B, S, H, Dh).transpose(0, 2, 1, 3)  # B, H, S, Dh
        o = scaled_dot_product_attention_simple(q, k, v, mask=mask)  # B, H, L, Dh
        return linear(o.transpose(0, 2, 1, 3).reshape(B, L, H * Dh), self.wo)
        # END SOLUTION


def causal_mask(L: int, S: int, dtype: mx.Dtype = mx.float32) -> mx.array:
    """Additive mask `[L, S]` for `L` queries that are the last `L` of `S` positions.

    Query `i` sits at position `S - L + i` and may see keys `0 .. S - L + i`: 0 there,
    -inf after.
    """
    # BEGIN SOLUTION week1-day3
    if L > S:
        raise ValueError(f"causal_mask needs L <= S, got L={L}, S={S}")
    rows = mx.arange(S - L, S)[:, None]  # L, 1
    cols = mx.arange(S)[None, :]  # 1, S
    return mx.where(cols <= rows, 0.0, -mx.inf).astype(dtype)
    # END SOLUTION


def check_attention_inputs(
    query: mx.array,
    key: mx.array,
    value: mx.array,
    mask: mx.array | str | None = None,
) -> None:
    """Raise `ValueError` unless `query [B, Hq, L, D]`, `key [B, Hkv, S, D]` and
    `value [B, Hkv, S, Dv]` fit together (`Hq` a multiple of `Hkv`) and `mask` is None, an
    array or `"causal"` (which needs `L <= S`).

    Grouped attention calls it first; so does the fused kernel of week 2 day 3, which must
    refuse the same inputs before `mx.fast` runs.
    """
    # BEGIN SOLUTION week1-day3
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4 or key.shape[:3] != value.shape[:3]:
        raise ValueError(
            f"attention shapes do not match: query {query.shape}, key {key.shape}, "
            f"value {value.shape} (need [B, Hq, L, D], [B, Hkv, S, D], [B, Hkv, S, Dv])"
        )
    B, Hq, L, D = query.shape
    _, Hkv, S, _ = key.shape
    if key.shape[0] != B or key.shape[3] != D or Hq % Hkv:
        raise ValueError(
            f"attention shapes do not match: query {query.shape}, key {key.shape} "
            f"(batch and head size must agree and Hq={Hq} must be a multiple of Hkv={Hkv})"
        )
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"mask must be an array, None or 'causal', got {mask!r}")
        if L > S:
            raise ValueError(f"a causal mask needs L <= S, got L={L}, S={S}")
    # END SOLUTION


def scaled_dot_product_attention_grouped(
    query: mx.array,
    key: mx.array,
    value: mx.array,
    scale: float | None = None,
    mask: mx.array | str | None = None,
) -> mx.array:
    """Grouped-query attention: `query [B, Hq, L, D]`, `key/value [B, Hkv, S, D]`.

    Each group of `Hq / Hkv` query heads shares one key/value head. `mask` is an additive
    array broadcastable to `[B, Hq, L, S]`, or `"causal"`. Bad inputs raise as in
    `check_attention_inputs`.
    """
    # BEGIN SOLUTION week1-day3
    check_attention_inputs(query, key, value, mask)
    B, Hq, L, D = query.shape
    _, Hkv, S, _ = key.shape
    n_rep = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    q = query.reshape(B, Hkv, n_rep, L, D)
    k = key[:, :, None]  # B, Hkv, 1, S, D
    v = value[:, :, None]  # B, Hkv, 1, S, Dv
    scores = (q @ k.swapaxes(-1, -2)) * scale  # B, Hkv, n_rep, L, S
    if isinstance(mask, str):  # "causal", the only name check_attention_inputs lets through
        scores = scores + causal_mask(L, S, scores.dtype)
    elif mask is not None:
        mask = mx.broadcast_to(mask, (B, Hq, L, S)).reshape(B, Hkv, n_rep, L, S)
        scores = scores + mask
    out = softmax(scores, axis=-1) @ v  # B, Hkv, n_rep, L, Dv
    return out.reshape(B, Hq, L, -1)
    # END SOLUTION
