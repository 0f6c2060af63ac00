"""Week 2, day 3: fused kernels (mx.fast RMSNorm, RoPE and attention) and the fused model.

The references here do not use `tiny_llm.fused`: `mlx.nn.RMSNorm` / `mlx.nn.RoPE`, explicit
float64 numpy math, and mlx-lm's models. The KV-cache tests use a small cache defined in
this file (not `tiny_llm.kv_cache`, which is week 2 day 2 and not a dependency of this day).
"""

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import TINY_CONFIGS, model_weights, reference_model

from tiny_llm.attention import causal_mask
from tiny_llm.fused import FusedRMSNorm, FusedRoPE, fused_attention
from tiny_llm.qwen2 import ModelArgs, Qwen2Model

DTYPES = [mx.float32, mx.float16, mx.bfloat16]

# (atol, rtol) per dtype against a float64 oracle on the same (rounded) inputs. float16 keeps
# 11 significant bits and bfloat16 only 8: the kernels round their outputs (and, for
# attention, intermediate products) to the input dtype, about one unit in the last place of
# values of order 1.
TOLERANCES = {
    mx.float32: (1e-5, 1e-5),
    mx.float16: (1e-2, 1e-2),
    mx.bfloat16: (5e-2, 5e-2),
}


def normal(key: mx.array, shape: tuple[int, ...], dtype: mx.Dtype = mx.float32,
           scale: float = 1.0) -> mx.array:
    return (scale * mx.random.normal(shape, key=key)).astype(dtype)


def f64(x: mx.array) -> np.ndarray:
    return np.array(x.astype(mx.float32)).astype(np.float64)


def assert_close(actual: mx.array, expected, atol: float, rtol: float,
                 dtype: mx.Dtype | None = None) -> None:
    """Same shape (and dtype, when given), values within `atol` / `rtol`."""
    expected = f64(expected) if isinstance(expected, mx.array) else np.asarray(expected)
    assert tuple(actual.shape) == tuple(expected.shape), (actual.shape, expected.shape)
    if dtype is not None:
        assert actual.dtype == dtype, (actual.dtype, dtype)
    np.testing.assert_allclose(f64(actual), expected, atol=atol, rtol=rtol)


# --- FusedRMSNorm --------------------------------------------------------------------------


def np_rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 16), (2, 5, 64), (3, 1, 96)])
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_rms_norm_matches_nn_and_numpy(shape, eps, dtype):
    """FusedRMSNorm equals mlx.nn.RMSNorm with the same weight, and the float64 formula."""
    k_x, k_w = mx.random.split(mx.random.key(0), 2)
    D = shape[-1]
    x = normal(k_x, shape, dtype, scale=3.0)
    w = (1.0 + normal(k_w, (D,), mx.float32, scale=0.2)).astype(dtype)
    ref = nn.RMSNorm(D, eps=eps)
    ref.weight = w
    actual = FusedRMSNorm(w, eps)(x)
    atol, rtol = TOLERANCES[dtype]
    assert_close(actual, ref(x), atol, rtol, dtype=dtype)
    assert_close(actual, np_rms_norm(f64(x), f64(w), eps), atol, rtol)


def test_rms_norm_uses_its_eps():
    """With inputs of size 1e-3 the result depends on eps: 1e-2 shrinks it, 1e-12 does not."""
    x = normal(mx.random.key(1), (2, 3, 32), scale=1e-3)
    w = mx.linspace(0.5, 1.5, 32)
    for eps in (1e-2, 1e-12):
        assert_close(FusedRMSNorm(w, eps)(x), np_rms_norm(f64(x), f64(w), eps), 1e-5, 1e-4)


def test_rms_norm_default_eps_is_the_models():
    """Without an eps, FusedRMSNorm uses ModelArgs' default rms_norm_eps, as week 1's RMSNorm
    does; inputs of size 1e-3 make eps visible."""
    config = {k: v for k, v in TINY_CONFIGS["qwen2-untied"].items() if k != "rms_norm_eps"}
    eps = ModelArgs.from_config(config).rms_norm_eps
    x = normal(mx.random.key(3), (2, 3, 32), scale=1e-3)
    w = mx.linspace(0.5, 1.5, 32)
    assert_close(FusedRMSNorm(w)(x), np_rms_norm(f64(x), f64(w), eps), 1e-5, 1e-4)


def test_rms_norm_large_half_precision_values_do_not_overflow():
    """float16 inputs near 1e3 (x**2 overflows float16 past 65504) still normalise correctly."""
    x = normal(mx.random.key(2), (2, 64), mx.float16, scale=2000.0)
    w = mx.ones((64,), dtype=mx.float16)
    actual = FusedRMSNorm(w, 1e-6)(x)
    assert np.isfinite(f64(actual)).all()
    assert_close(actual, np_rms_norm(f64(x), f64(w), 1e-6), 1e-2, 1e-2, dtype=mx.float16)


# --- FusedRoPE -----------------------------------------------------------------------------


def np_rope(x: np.ndarray, dims: int, base: float, traditional: bool, offsets) -> np.ndarray:
    """Float64 RoPE of `x [B, L, H, D]`; `offsets` an int or one start position per row."""
    B, L, H, D = x.shape
    half = dims // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / dims)
    start = np.broadcast_to(np.asarray(offsets, dtype=np.float64).reshape(-1, 1), (B, 1))
    theta = (start + np.arange(L))[..., None] * inv_freq  # B, L, half
    cos, sin = np.cos(theta)[:, :, None, :], np.sin(theta)[:, :, None, :]  # B, L, 1, half
    rot, rest = x[..., :dims], x[..., dims:]
    if traditional:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., :half], rot[..., half:]
    y1, y2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    if traditional:
        y = np.stack([y1, y2], axis=-1).reshape(B, L, H, dims)
    else:
        y = np.concatenate([y1, y2], axis=-1)
    return np.concatenate([y, rest], axis=-1)


def rope_tolerance(dtype: mx.Dtype, last_position: int) -> tuple[float, float]:
    """In float32 the angle `position * freq` is off by about `position * 1.2e-7` rad, so the
    absolute error grows with the position."""
    atol, rtol = TOLERANCES[dtype]
    if dtype == mx.float32:
        atol *= 1 + last_position / 32
    return atol, rtol


def nn_rope(x: mx.array, dims: int, base: float, traditional: bool, offset: int) -> mx.array:
    """mlx.nn.RoPE rotates along axis -2: [B, L, H, D] -> [B, H, L, D] and back."""
    rope = nn.RoPE(dims, traditional=traditional, base=base)
    return rope(x.transpose(0, 2, 1, 3), offset=offset).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("offset", [0, 7, 300])
@pytest.mark.parametrize("shape", [(1, 1, 1, 16), (2, 5, 4, 16), (1, 6, 3, 64)])
def test_rope_int_offset_matches_nn_and_numpy(shape, offset, traditional, dtype):
    """FusedRoPE over all head features equals mlx.nn.RoPE and the float64 formula."""
    B, L, H, D = shape
    x = normal(mx.random.key(3), shape, dtype)
    actual = FusedRoPE(D, base=10000.0, traditional=traditional)(x, offset=offset)
    tol = rope_tolerance(dtype, offset + L)
    assert_close(actual, nn_rope(x, D, 10000.0, traditional, offset), *tol, dtype=dtype)
    assert_close(actual, np_rope(f64(x), D, 10000.0, traditional, offset), *tol)


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("base", [500.0, 1_000_000.0])
def test_rope_other_bases(base, traditional):
    """FusedRoPE honours `base` (Qwen2 uses 1e6)."""
    x = normal(mx.random.key(4), (2, 6, 2, 32))
    actual = FusedRoPE(32, base=base, traditional=traditional)(x, offset=3)
    assert_close(actual, np_rope(f64(x), 32, base, traditional, 3), *rope_tolerance(mx.float32, 9))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("traditional", [False, True])
def test_rope_per_row_offsets_equal_each_row_alone(traditional, dtype):
    """An offset array [B] rotates row b from position offset[b]: the same values as running
    row b alone with the int offset, and as the float64 formula."""
    offsets = [0, 5, 37, 250]
    x = normal(mx.random.key(5), (4, 3, 2, 16), dtype)
    rope = FusedRoPE(16, base=10000.0, traditional=traditional)
    batched = rope(x, offset=mx.array(offsets))
    assert batched.shape == x.shape and batched.dtype == dtype
    tol = rope_tolerance(dtype, max(offsets) + 3)
    for b, off in enumerate(offsets):
        alone = rope(x[b : b + 1], offset=off)
        np.testing.assert_array_equal(f64(batched[b : b + 1]), f64(alone))
    assert_close(batched, np_rope(f64(x), 16, 10000.0, traditional, offsets), *tol)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims, D", [(8, 16), (16, 64), (32, 64)])
def test_rope_partial_dims_rotates_only_first_features(dims, D, traditional, dtype):
    """With dims < head_dim only the first dims features rotate; the rest pass unchanged."""
    x = normal(mx.random.key(6), (2, 5, 3, D), dtype)
    rope = FusedRoPE(dims, base=10000.0, traditional=traditional)
    tol = rope_tolerance(dtype, 12)
    actual = rope(x, offset=7)
    assert_close(actual, nn_rope(x, dims, 10000.0, traditional, 7), *tol, dtype=dtype)
    assert_close(actual, np_rope(f64(x), dims, 10000.0, traditional, 7), *tol)
    np.testing.assert_array_equal(f64(actual[..., dims:]), f64(x[..., dims:]))
    per_row = rope(x, offset=mx.array([2, 9]))
    assert_close(per_row, np_rope(f64(x), dims, 10000.0, traditional, [2, 9]), *tol)
    np.testing.assert_array_equal(f64(per_row[..., dims:]), f64(x[..., dims:]))


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("position", [1, 3])
def test_rope_exact_two_features(position, traditional):
    """With D = 2 the unit vector (1, 0) at position p becomes (cos p, sin p)."""
    x = mx.array([1.0, 0.0]).reshape(1, 1, 1, 2)
    actual = FusedRoPE(2, traditional=traditional)(x, offset=position).reshape(2)
    np.testing.assert_allclose(f64(actual), [math.cos(position), math.sin(position)], atol=1e-6)


def test_rope_layouts_pair_different_features():
    """Traditional rotates (x0, x1); half-split rotates (x0, x2): e1 moves differently."""
    e1 = mx.array([0.0, 1.0, 0.0, 0.0]).reshape(1, 1, 1, 4)
    p = 1.0  # base 100, D 4: pair 0 turns by p rad, pair 1 by p / 10 rad
    trad = FusedRoPE(4, base=100.0, traditional=True)(e1, offset=1).reshape(4)
    half = FusedRoPE(4, base=100.0, traditional=False)(e1, offset=1).reshape(4)
    np.testing.assert_allclose(f64(trad), [-math.sin(p), math.cos(p), 0, 0], atol=1e-6)
    np.testing.assert_allclose(f64(half), [0, math.cos(p / 10), 0, math.sin(p / 10)], atol=1e-6)


def test_rope_rejects_bad_dims():
    """Odd or non-positive dims are refused up front; dims above the head size on the call."""
    for dims in (3, 0, -2):
        with pytest.raises(ValueError):
            FusedRoPE(dims)
    x = normal(mx.random.key(7), (1, 2, 2, 8))
    with pytest.raises(ValueError):
        mx.eval(FusedRoPE(16)(x))


# --- fused_attention -----------------------------------------------------------------------


def np_attention(q, k, v, scale, mask):
    """Float64 softmax attention; query head h reads kv head h // (Hq / Hkv)."""
    q, k, v = f64(q), f64(k), f64(v)
    B, Hq, L, D = q.shape
    S = k.shape[2]
    n_rep = Hq // k.shape[1]
    k, v = np.repeat(k, n_rep, axis=1), np.repeat(v, n_rep, axis=1)
    scores = q @ k.swapaxes(-1, -2) * scale  # B, Hq, L, S
    if isinstance(mask, str):
        assert mask == "causal"
        rows = (S - L + np.arange(L))[:, None]  # query i sits at position S - L + i
        scores = np.where(np.arange(S)[None, :] <= rows, scores, -np.inf)
    elif mask is not None:
        scores = scores + f64(mask)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def additive_mask(key: mx.array, shape: tuple[int, ...]) -> mx.array:
    """Random additive values with about a third of the keys dropped (-inf); key 0 is always
    kept so that no row is fully masked."""
    k_val, k_drop = mx.random.split(key, 2)
    values = mx.random.normal(shape, key=k_val)
    drop = (mx.random.uniform(shape=shape, key=k_drop) < 0.33) & (mx.arange(shape[-1]) > 0)
    return mx.where(drop, -mx.inf, values)


ATTN_SHAPES = [  # B, Hq, Hkv, L, S, D
    (1, 1, 1, 4, 4, 16),  # ratio 1, one head
    (2, 4, 2, 3, 7, 16),  # ratio 2, L < S
    (2, 6, 2, 5, 9, 32),  # ratio 3
    (2, 7, 1, 4, 6, 8),  # ratio 7 (multi-query)
    (1, 6, 3, 1, 11, 64),  # ratio 2, one query (decode)
    (1, 7, 7, 6, 6, 16),  # ratio 1, seven heads
]
MASK_KINDS = ["none", "causal", "2d", "per_batch", "per_head"]

# Attention reduces over S keys and D features, and half-precision kernels round q @ k^T and
# the probabilities once more; the bound is a few units in the last place at |x| ~ 1.
ATTN_TOL = {mx.float32: (2e-5, 2e-5), mx.float16: (1e-2, 1e-2), mx.bfloat16: (6e-2, 6e-2)}


def make_mask(kind: str, key: mx.array, B: int, Hq: int, L: int, S: int):
    if kind in ("none", "causal"):
        return None if kind == "none" else "causal"
    shape = {"2d": (L, S), "per_batch": (B, 1, L, S), "per_head": (B, Hq, L, S)}[kind]
    return additive_mask(key, shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_kind", MASK_KINDS)
@pytest.mark.parametrize("B, Hq, Hkv, L, S, D", ATTN_SHAPES)
def test_attention_matches_numpy(B, Hq, Hkv, L, S, D, mask_kind, dtype):
    """Grouped-query attention equals float64 softmax attention for every mask kind (an
    additive float32 mask with -inf entries, or "causal" aligned to the last L positions)."""
    k_q, k_k, k_v, k_m = mx.random.split(mx.random.key(8), 4)
    q = normal(k_q, (B, Hq, L, D), dtype)
    k = normal(k_k, (B, Hkv, S, D), dtype)
    v = normal(k_v, (B, Hkv, S, D), dtype)
    mask = make_mask(mask_kind, k_m, B, Hq, L, S)
    actual = fused_attention(q, k, v, mask=mask)
    atol, rtol = ATTN_TOL[dtype]
    assert_close(actual, np_attention(q, k, v, 1.0 / math.sqrt(D), mask), atol, rtol, dtype=dtype)


@pytest.mark.parametrize("scale", [0.1, 1.0])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "per_head"])
def test_attention_explicit_scale(scale, mask_kind):
    """An explicit scale replaces 1/sqrt(D)."""
    B, Hq, Hkv, L, S, D = 2, 6, 2, 3, 8, 16
    k_q, k_k, k_v, k_m = mx.random.split(mx.random.key(9), 4)
    q, k, v = normal(k_q, (B, Hq, L, D)), normal(k_k, (B, Hkv, S, D)), normal(k_v, (B, Hkv, S, D))
    mask = make_mask(mask_kind, k_m, B, Hq, L, S)
    actual = fused_attention(q, k, v, scale=scale, mask=mask)
    assert_close(actual, np_attention(q, k, v, scale, mask), 2e-5, 2e-5, dtype=mx.float32)


@pytest.mark.parametrize("L, S", [(1, 1), (1, 9), (2, 9), (5, 8), (6, 6)])
def test_attention_causal_is_bottom_right_aligned(L, S):
    """mask="causal" with L queries and S keys: query i sits at position S - L + i and sees
    keys 0 .. S - L + i, the same as the additive causal_mask(L, S) array."""
    B, Hq, Hkv, D = 2, 4, 2, 16
    k_q, k_k, k_v = mx.random.split(mx.random.key(10), 3)
    q, k, v = normal(k_q, (B, Hq, L, D)), normal(k_k, (B, Hkv, S, D)), normal(k_v, (B, Hkv, S, D))
    as_string = fused_attention(q, k, v, mask="causal")
    as_array = fused_attention(q, k, v, mask=causal_mask(L, S))
    expected = np_attention(q, k, v, 1.0 / math.sqrt(D), "causal")
    assert_close(as_string, expected, 2e-5, 2e-5, dtype=mx.float32)
    assert_close(as_array, expected, 2e-5, 2e-5, dtype=mx.float32)
    # The first query sees exactly keys 0 .. S - L: changing a later key leaves it unchanged.
    if S > S - L + 1:
        v2 = v.at[:, :, S - L + 1 :].add(100.0)
        moved = fused_attention(q, k, v2, mask="causal")
        np.testing.assert_allclose(f64(moved[:, :, 0]), f64(as_string[:, :, 0]), atol=1e-5)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_attention_half_precision_with_float32_mask(dtype):
    """A float32 additive mask with half-precision q/k/v gives a result in the query dtype."""
    B, Hq, Hkv, L, S, D = 2, 4, 2, 3, 7, 16
    k_q, k_k, k_v, k_m = mx.random.split(mx.random.key(11), 4)
    q, k, v = (normal(kk, s, dtype) for kk, s in
               ((k_q, (B, Hq, L, D)), (k_k, (B, Hkv, S, D)), (k_v, (B, Hkv, S, D))))
    mask = additive_mask(k_m, (B, 1, L, S))
    actual = fused_attention(q, k, v, mask=mask)
    assert_close(actual, np_attention(q, k, v, D**-0.5, mask), *ATTN_TOL[dtype], dtype=dtype)


def test_attention_query_heads_share_their_group_kv_head():
    """Query heads 3g .. 3g+2 read kv head g: equal to plain attention with k/v repeated."""
    k_q, k_k, k_v = mx.random.split(mx.random.key(12), 3)
    q, k, v = normal(k_q, (1, 6, 3, 8)), normal(k_k, (1, 2, 5, 8)), normal(k_v, (1, 2, 5, 8))
    grouped = fused_attention(q, k, v, mask="causal")
    repeated = fused_attention(q, mx.repeat(k, 3, axis=1), mx.repeat(v, 3, axis=1), mask="causal")
    np.testing.assert_allclose(f64(grouped), f64(repeated), atol=1e-6)


def test_attention_batch_rows_are_independent():
    """Each batch row of the output equals the output computed on that row alone."""
    k_q, k_k, k_v, k_m = mx.random.split(mx.random.key(13), 4)
    q, k, v = normal(k_q, (3, 4, 2, 8)), normal(k_k, (3, 2, 5, 8)), normal(k_v, (3, 2, 5, 8))
    mask = additive_mask(k_m, (3, 4, 2, 5))
    batched = fused_attention(q, k, v, mask=mask)
    for i in range(3):
        r = slice(i, i + 1)
        single = fused_attention(q[r], k[r], v[r], mask=mask[r])
        np.testing.assert_allclose(f64(batched[r]), f64(single), atol=1e-6)


@pytest.mark.parametrize(
    "q_shape, k_shape, v_shape",
    [
        ((1, 6, 2, 8), (1, 4, 3, 8), (1, 4, 3, 8)),  # Hq not a multiple of Hkv
        ((4, 2, 8), (2, 3, 8), (2, 3, 8)),  # 3-D inputs
        ((2, 4, 2, 8), (3, 2, 3, 8), (3, 2, 3, 8)),  # batch mismatch
        ((1, 4, 2, 8), (1, 2, 3, 16), (1, 2, 3, 16)),  # head size mismatch
        ((1, 4, 2, 8), (1, 2, 3, 8), (1, 2, 5, 8)),  # key / value length mismatch
        ((1, 4, 2, 8), (1, 2, 3, 8), (1, 1, 3, 8)),  # key / value head count mismatch
    ],
)
def test_attention_rejects_mismatched_shapes(q_shape, k_shape, v_shape):
    """Inputs that do not fit [B, Hq, L, D] / [B, Hkv, S, D] raise ValueError."""
    with pytest.raises(ValueError):
        mx.eval(fused_attention(mx.zeros(q_shape), mx.zeros(k_shape), mx.zeros(v_shape)))


@pytest.mark.parametrize("mask", ["bogus", "upper", "Causal"])
def test_attention_rejects_unknown_mask_names(mask):
    """Only "causal" is a known mask name."""
    q, k = mx.zeros((1, 4, 2, 8)), mx.zeros((1, 2, 3, 8))
    with pytest.raises(ValueError, match="mask"):
        mx.eval(fused_attention(q, k, k, mask=mask))


# --- the fused model -----------------------------------------------------------------------


class ConcatCache:
    """A minimal per-layer KV cache (not tiny_llm's, which is week 2 day 2): it concatenates
    keys and values, and its rows start at `start` (an int, or one position per row)."""

    def __init__(self, start: int | mx.array = 0):
        self.start = start
        self.keys = self.values = None
        self.offset = 0

    @property
    def rope_offset(self) -> int | mx.array:
        return self.start + self.offset

    def make_mask(self, L: int, dtype: mx.Dtype = mx.float32):
        return causal_mask(L, self.offset + L, dtype) if L > 1 else None

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = mx.concatenate([self.keys, keys], axis=2)
            self.values = mx.concatenate([self.values, values], axis=2)
        self.offset += keys.shape[2]
        return self.keys, self.values


def make_cache(model: Qwen2Model, start: int | mx.array = 0) -> list[ConcatCache]:
    return [ConcatCache(start) for _ in model.layers]


MODEL_CONFIGS = ["qwen2-untied", "qwen2-tied", "llama-tied"]


def fused_and_reference(name: str, seed: int, dtype: mx.Dtype = mx.float32):
    config = TINY_CONFIGS[name]
    ref = reference_model(config, seed=seed)
    if dtype != mx.float32:
        ref.set_dtype(dtype)
    fused = Qwen2Model(ModelArgs.from_config(config), model_weights(ref), fused=True)
    return config, fused, ref


def random_tokens(config: dict, shape: tuple[int, int], seed: int) -> mx.array:
    return mx.random.randint(0, config["vocab_size"], shape, key=mx.random.key(seed))


@pytest.mark.parametrize("name", MODEL_CONFIGS)
@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (3, 5)])
def test_fused_model_logits_match_mlx_lm(name, shape):
    """Qwen2Model(fused=True) gives mlx-lm's logits on the same random weights (float32).

    mlx-lm runs the same mx.fast kernels, so the logits usually agree bit for bit; 1e-5
    leaves room for float32 sums taken in another order."""
    config, fused, ref = fused_and_reference(name, seed=20)
    tokens = random_tokens(config, shape, seed=21)
    logits = fused(tokens)
    assert logits.shape == (*shape, config["vocab_size"]) and logits.dtype == mx.float32
    assert_close(logits, ref(tokens), 1e-5, 1e-5)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
@pytest.mark.parametrize("name", ["qwen2-untied", "llama-tied"])
def test_fused_model_in_half_precision_matches_mlx_lm(name, dtype):
    """With half-precision weights the logits stay within half-precision error of mlx-lm's.

    Both run the same mx.fast kernels, but the model's own matmuls, residual sums and the
    SwiGLU product round in half precision in a different order; over 2-3 layers that is a
    few units in the last place of logits up to |x| ~ 8 (float16: 2e-2; bfloat16 keeps 8
    significant bits, one unit is 0.03 at |x| = 4, so ten units at that scale: 0.4).
    """
    config, fused, ref = fused_and_reference(name, seed=22, dtype=dtype)
    tokens = random_tokens(config, (2, 8), seed=23)
    logits = fused(tokens)
    assert logits.dtype == dtype
    atol = {mx.float16: 2e-2, mx.bfloat16: 0.4}[dtype]
    assert_close(logits, ref(tokens), atol, 2e-2)


@pytest.mark.parametrize("name", MODEL_CONFIGS)
def test_fused_model_cached_decoding_matches_mlx_lm(name):
    """Prefill 5 tokens, then decode one at a time through a KV cache: the logits equal
    mlx-lm's on the whole sequence (float32, bound as without a cache)."""
    config, fused, ref = fused_and_reference(name, seed=24)
    tokens = random_tokens(config, (2, 10), seed=25)
    cache = make_cache(fused)
    steps = [fused(tokens[:, :5], cache=cache)]
    steps += [fused(tokens[:, i : i + 1], cache=cache) for i in range(5, 10)]
    assert cache[0].offset == 10
    assert_close(mx.concatenate(steps, axis=1), ref(tokens), 1e-5, 1e-5)


def test_fused_model_cached_half_precision_matches_mlx_lm():
    """The same in float16 (bound as in the uncached half-precision test)."""
    config, fused, ref = fused_and_reference("qwen2-untied", seed=26, dtype=mx.float16)
    tokens = random_tokens(config, (2, 9), seed=27)
    cache = make_cache(fused)
    steps = [fused(tokens[:, :4], cache=cache)]
    steps += [fused(tokens[:, i : i + 1], cache=cache) for i in range(4, 9)]
    out = mx.concatenate(steps, axis=1)
    assert out.dtype == mx.float16
    assert_close(out, ref(tokens), 2e-2, 2e-2)


def test_fused_model_per_row_positions():
    """A cache whose rows start at different positions (offset array [B]) gives each row the
    logits it gets from position 0: RoPE attention depends only on relative positions.

    float32 angles at positions up to ~200 are off by up to ~2e-5 rad, hence 1e-4 on the
    logits (ten times the bound at position 0)."""
    config, fused, ref = fused_and_reference("qwen2-untied", seed=28)
    tokens = random_tokens(config, (3, 7), seed=29)
    cache = make_cache(fused, start=mx.array([0, 13, 190]))
    steps = [fused(tokens[:, :4], cache=cache)]
    steps += [fused(tokens[:, i : i + 1], cache=cache) for i in range(4, 7)]
    assert_close(mx.concatenate(steps, axis=1), ref(tokens), 1e-4, 1e-4)


def greedy(model: Qwen2Model, prompt: mx.array, steps: int, cached: bool) -> list[list[int]]:
    """`steps` greedy tokens per row, with a KV cache or by recomputing the whole sequence."""
    out, tokens = [], prompt
    cache = make_cache(model) if cached else None
    feed = prompt
    for _ in range(steps):
        logits = model(feed if cached else tokens, cache=cache)[:, -1]
        nxt = mx.argmax(logits, axis=-1)[:, None]
        out.append(nxt)
        tokens = mx.concatenate([tokens, nxt], axis=1)
        feed = nxt
    return mx.concatenate(out, axis=1).tolist()


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("name", MODEL_CONFIGS)
def test_fused_greedy_tokens_equal_unfused(name, cached):
    """Eight greedy tokens from the fused model equal the unfused (week 1) model's."""
    config, fused, ref = fused_and_reference(name, seed=30)
    plain = Qwen2Model(ModelArgs.from_config(config), model_weights(ref), fused=False)
    prompt = random_tokens(config, (2, 5), seed=31)
    assert greedy(fused, prompt, 8, cached) == greedy(plain, prompt, 8, cached=False)


def test_default_model_fused_matches_mlx_lm(fused_default_model, reference_default_model):
    """The real default model, loaded fused (`load`'s default once this day is done), gives
    mlx-lm's logits.

    Both run the same packed 4-bit matmuls and the same mx.fast kernels, so the logits
    usually agree bit for bit; the bound (1e-3 on logits of range about +-40, 1e-5 on
    probabilities) leaves room for float32 sums taken in another order over 30 layers.
    """
    model, tokenizer = fused_default_model
    assert model.fused
    # Week 1 day 5's first prompt: mlx-lm's logits are computed once for both days.
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    tokens = tokenizer.encode(text)
    assert tokens == reference_default_model.tokenizer.encode(text)
    ours, ref = model(mx.array([tokens]))[0], reference_default_model.logits(tokens)  # L, V
    assert_close(ours, ref, 1e-3, 0)
    assert_close(mx.softmax(ours, axis=-1), mx.softmax(ref, axis=-1), 1e-5, 0)
    assert mx.argmax(ours[-1]).item() == mx.argmax(ref[-1]).item()
