"""Week 1, day 1: softmax, linear, scaled dot-product attention and multi-head attention."""

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import assert_close, normal

from tiny_llm.attention import SimpleMultiHeadAttention, scaled_dot_product_attention_simple
from tiny_llm.basics import linear, softmax

DTYPES = [mx.float32, mx.float16, mx.bfloat16]

# --- softmax -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape, axis",
    [((7,), 0), ((3, 5), -1), ((3, 5), 0), ((2, 3, 4), 1), ((2, 3, 4), -1), ((4, 1, 9), 0)],
)
def test_softmax_matches_mlx(shape, axis, dtype):
    """softmax equals mx.softmax along the given axis, for several shapes and dtypes."""
    x = normal(mx.random.key(0), shape, dtype, scale=3.0)
    assert_close(softmax(x, axis=axis), mx.softmax(x, axis=axis), dtype)


def test_softmax_exact_small_distribution():
    """softmax of log-probabilities gives back those probabilities."""
    p = mx.array([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    np.testing.assert_allclose(np.array(softmax(mx.log(p))), np.array(p), atol=1e-6, rtol=1e-6)


def test_softmax_large_logits_and_minus_inf():
    """softmax stays finite for huge logits and gives -inf logits zero probability."""
    x = mx.array([[1000.0, 1000.0, -mx.inf], [-1000.0, 0.0, -mx.inf]])
    expected = np.array([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]], dtype=np.float32)
    np.testing.assert_allclose(np.array(softmax(x)), expected, atol=1e-6, rtol=0)


# --- linear --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(
    "x_shape, out_features", [((5, 8), 3), ((2, 3, 16), 24), ((1, 1, 4), 1)]
)
def test_linear_matches_matmul(x_shape, out_features, with_bias, dtype):
    """linear equals x @ w.T (+ b) for several shapes and dtypes, with and without bias."""
    k_x, k_w, k_b = mx.random.split(mx.random.key(1), 3)
    in_features = x_shape[-1]
    x = normal(k_x, x_shape, dtype)
    w = normal(k_w, (out_features, in_features), dtype, scale=in_features**-0.5)
    b = normal(k_b, (out_features,), dtype) if with_bias else None
    expected = x @ w.T if b is None else x @ w.T + b
    assert_close(linear(x, w, b), expected, dtype)


def test_linear_exact_small_case():
    """linear on a hand-made 1x2 input gives the hand-computed output."""
    x = mx.array([[1.0, 2.0]])
    w = mx.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    b = mx.array([10.0, 20.0, 30.0])
    np.testing.assert_array_equal(np.array(linear(x, w)), [[1.0, 2.0, 3.0]])
    np.testing.assert_array_equal(np.array(linear(x, w, b)), [[11.0, 22.0, 33.0]])


# --- scaled_dot_product_attention_simple ---------------------------------------------------


def make_mask(kind: str, key: mx.array, B: int, L: int, S: int, dtype: mx.Dtype):
    """None, a dense additive mask [B, 1, L, S], or a 0/-inf mask [L, S] that keeps key 0."""
    if kind == "none":
        return None
    if kind == "additive":
        return normal(key, (B, 1, L, S), dtype)
    keep = mx.random.uniform(shape=(L, S), key=key) > 0.4
    keep = keep | (mx.arange(S) == 0)[None, :]  # every query sees at least one key
    return mx.where(keep, 0.0, -mx.inf).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_kind", ["none", "additive", "blocking"])
@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize(
    "B, H, L, S, D", [(1, 1, 4, 4, 8), (2, 3, 5, 7, 16), (3, 2, 1, 6, 8)]
)
def test_sdpa_simple_matches_mlx_fast(B, H, L, S, D, scale, mask_kind, dtype):
    """scaled_dot_product_attention_simple equals mx.fast.scaled_dot_product_attention."""
    k_q, k_k, k_v, k_m = mx.random.split(mx.random.key(2), 4)
    q = normal(k_q, (B, H, L, D), dtype)
    k = normal(k_k, (B, H, S, D), dtype)
    v = normal(k_v, (B, H, S, D), dtype)
    mask = make_mask(mask_kind, k_m, B, L, S, dtype)
    expected = mx.fast.scaled_dot_product_attention(
        q, k, v, scale=1.0 / math.sqrt(D) if scale is None else scale, mask=mask
    )
    actual = scaled_dot_product_attention_simple(q, k, v, scale=scale, mask=mask)
    assert_close(actual, expected, dtype)


def test_sdpa_simple_exact_small_cases():
    """A zero query averages the values; a query matching one key strongly selects its value."""
    k = mx.array([[10.0, 0.0], [0.0, 10.0]])
    v = mx.array([[1.0, 2.0], [3.0, 4.0]])
    zero_q = mx.zeros((1, 2))
    np.testing.assert_allclose(
        np.array(scaled_dot_product_attention_simple(zero_q, k, v)), [[2.0, 3.0]], atol=1e-6
    )
    sharp_q = mx.array([[10.0, 0.0]])  # scores [100, 0] with scale 1
    np.testing.assert_allclose(
        np.array(scaled_dot_product_attention_simple(sharp_q, k, v, scale=1.0)),
        [[1.0, 2.0]],
        atol=1e-6,
    )
    # The mask drops key 0, so the same query now gets value 1.
    mask = mx.array([[-mx.inf, 0.0]])
    np.testing.assert_allclose(
        np.array(scaled_dot_product_attention_simple(sharp_q, k, v, scale=1.0, mask=mask)),
        [[3.0, 4.0]],
        atol=1e-6,
    )


def test_sdpa_simple_batch_row_equals_single_row():
    """Each batch row of the attention output equals the output computed on that row alone."""
    k_q, k_k, k_v = mx.random.split(mx.random.key(3), 3)
    q = normal(k_q, (3, 2, 4, 8), mx.float32)
    k = normal(k_k, (3, 2, 6, 8), mx.float32)
    v = normal(k_v, (3, 2, 6, 8), mx.float32)
    batched = scaled_dot_product_attention_simple(q, k, v)
    for i in range(3):
        single = scaled_dot_product_attention_simple(q[i : i + 1], k[i : i + 1], v[i : i + 1])
        assert_close(batched[i : i + 1], single, mx.float32)


@pytest.mark.parametrize(
    "q_shape, k_shape, v_shape",
    [
        ((1, 2, 4, 8), (1, 2, 4, 16), (1, 2, 4, 16)),  # head sizes of query and key differ
        ((1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 6, 8)),  # key and value lengths differ
    ],
)
def test_sdpa_simple_rejects_mismatched_shapes(q_shape, k_shape, v_shape):
    """Mismatched query/key/value shapes raise a ValueError naming the shapes."""
    q, k, v = mx.zeros(q_shape), mx.zeros(k_shape), mx.zeros(v_shape)
    with pytest.raises(ValueError, match="attention shapes do not match"):
        scaled_dot_product_attention_simple(q, k, v)


# --- SimpleMultiHeadAttention --------------------------------------------------------------


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize(
    "B, L, S, E, H", [(1, 4, 4, 16, 2), (2, 3, 6, 32, 4), (2, 1, 5, 24, 3)]
)
def test_simple_multi_head_attention_matches_mlx_nn(B, L, S, E, H, with_mask, dtype):
    """SimpleMultiHeadAttention equals mlx.nn.MultiHeadAttention with the same weights."""
    keys = mx.random.split(mx.random.key(4), 8)
    wq, wk, wv, wo = (normal(keys[i], (E, E), dtype, scale=E**-0.5) for i in range(4))
    query = normal(keys[4], (B, L, E), dtype)
    key = normal(keys[5], (B, S, E), dtype)
    value = normal(keys[6], (B, S, E), dtype)
    mask = normal(keys[7], (B, 1, L, S), dtype) if with_mask else None

    reference = nn.MultiHeadAttention(E, H, bias=False)
    reference.query_proj.weight = wq
    reference.key_proj.weight = wk
    reference.value_proj.weight = wv
    reference.out_proj.weight = wo
    expected = reference(query, key, value, mask=mask)

    ours = SimpleMultiHeadAttention(E, H, wq, wk, wv, wo)
    assert_close(ours(query, key, value, mask=mask), expected, dtype)


def test_simple_multi_head_attention_rejects_bad_configuration():
    """A hidden size not divisible by the heads, or a mis-shaped weight, raises ValueError."""
    w = mx.zeros((12, 12))
    with pytest.raises(ValueError, match="hidden_size=12 must be divisible by num_heads=5"):
        SimpleMultiHeadAttention(12, 5, w, w, w, w)
    with pytest.raises(ValueError, match=r"wk has shape \(12, 8\), expected \(12, 12\)"):
        SimpleMultiHeadAttention(12, 3, w, mx.zeros((12, 8)), w, w)
