"""Week 1, day 3: causal masks, grouped-query attention and the Qwen2 / Llama attention layer."""

import math

import mlx.core as mx
import numpy as np
import pytest
from conftest import assert_close, normal
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import llama as mlx_llama
from mlx_lm.models import qwen2 as mlx_qwen2
from mlx_lm.models.base import create_causal_mask

from tiny_llm.attention import (
    causal_mask,
    check_attention_inputs,
    scaled_dot_product_attention_grouped,
)
from tiny_llm.qwen2 import ModelArgs, Qwen2MultiHeadAttention

# --- causal_mask ---------------------------------------------------------------------------

NEG_INF = -np.inf


def test_causal_mask_exact_queries_at_the_end():
    """L=3, S=5: query i sits at position 2 + i and sees keys 0 .. 2 + i."""
    expected = np.array(
        [
            [0, 0, 0, NEG_INF, NEG_INF],
            [0, 0, 0, 0, NEG_INF],
            [0, 0, 0, 0, 0],
        ],
        dtype=np.float32,
    )
    np.testing.assert_array_equal(np.array(causal_mask(3, 5)), expected)


def test_causal_mask_exact_square_and_single_query():
    """L=S=3 is lower-triangular; a single query sees every key."""
    expected = np.array(
        [[0, NEG_INF, NEG_INF], [0, 0, NEG_INF], [0, 0, 0]], dtype=np.float32
    )
    np.testing.assert_array_equal(np.array(causal_mask(3, 3)), expected)
    np.testing.assert_array_equal(np.array(causal_mask(1, 4)), np.zeros((1, 4), np.float32))


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("L, S", [(1, 1), (4, 4), (2, 7), (5, 9), (6, 6)])
def test_causal_mask_matches_mlx_lm(L, S, dtype):
    """causal_mask keeps exactly the keys mlx-lm's create_causal_mask keeps, in the asked dtype."""
    mask = causal_mask(L, S, dtype)
    assert mask.shape == (L, S)
    assert mask.dtype == dtype
    keep = np.array(create_causal_mask(L, offset=S - L))  # bool [L, S], True = visible
    values = np.array(mask.astype(mx.float32))
    np.testing.assert_array_equal(values == 0, keep)
    np.testing.assert_array_equal(values == -np.inf, ~keep)


@pytest.mark.parametrize("L, S", [(2, 1), (6, 5)])
def test_causal_mask_rejects_more_queries_than_keys(L, S):
    """L > S raises a ValueError naming both sizes."""
    with pytest.raises(ValueError, match=f"causal_mask needs L <= S, got L={L}, S={S}"):
        causal_mask(L, S)


# --- scaled_dot_product_attention_grouped --------------------------------------------------

GQA_SHAPES = [  # B, Hq, Hkv, L, S, D
    (1, 4, 4, 5, 5, 16),  # ratio 1
    (2, 4, 2, 3, 7, 16),  # ratio 2, L != S
    (2, 7, 1, 4, 6, 8),  # ratio 7 (multi-query)
    (1, 6, 2, 1, 9, 32),  # ratio 3, one query
]


def make_mask(kind: str, key: mx.array, B: int, Hq: int, L: int, S: int, dtype: mx.Dtype):
    """None, "causal", or an additive array [B, Hq, L, S], [B, 1, L, S] or [L, S]."""
    if kind in ("none", "causal"):
        return None if kind == "none" else "causal"
    shape = {"per_head": (B, Hq, L, S), "per_batch": (B, 1, L, S), "2d": (L, S)}[kind]
    return normal(key, shape, dtype)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "per_head", "per_batch", "2d"])
@pytest.mark.parametrize("B, Hq, Hkv, L, S, D", GQA_SHAPES)
def test_sdpa_grouped_matches_mlx_fast(B, Hq, Hkv, L, S, D, mask_kind, dtype):
    """Grouped attention equals mx.fast.scaled_dot_product_attention (native GQA) per mask kind."""
    k_q, k_k, k_v, k_m = mx.random.split(mx.random.key(0), 4)
    q = normal(k_q, (B, Hq, L, D), dtype)
    k = normal(k_k, (B, Hkv, S, D), dtype)
    v = normal(k_v, (B, Hkv, S, D), dtype)
    mask = make_mask(mask_kind, k_m, B, Hq, L, S, dtype)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(D), mask=mask)
    assert_close(scaled_dot_product_attention_grouped(q, k, v, mask=mask), expected, dtype)


@pytest.mark.parametrize("B, Hq, Hkv, L, S, D", GQA_SHAPES)
def test_sdpa_grouped_explicit_scale(B, Hq, Hkv, L, S, D):
    """An explicit scale replaces 1/sqrt(D), as in mx.fast.scaled_dot_product_attention."""
    k_q, k_k, k_v = mx.random.split(mx.random.key(1), 3)
    q = normal(k_q, (B, Hq, L, D), mx.float32)
    k = normal(k_k, (B, Hkv, S, D), mx.float32)
    v = normal(k_v, (B, Hkv, S, D), mx.float32)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.7, mask="causal")
    actual = scaled_dot_product_attention_grouped(q, k, v, scale=0.7, mask="causal")
    assert_close(actual, expected, mx.float32)


def test_sdpa_grouped_causal_string_equals_causal_mask_array():
    """mask="causal" gives the same result as the additive causal_mask(L, S) array."""
    k_q, k_k, k_v = mx.random.split(mx.random.key(2), 3)
    q = normal(k_q, (2, 6, 3, 16), mx.float32)
    k = normal(k_k, (2, 3, 8, 16), mx.float32)
    v = normal(k_v, (2, 3, 8, 16), mx.float32)
    as_string = scaled_dot_product_attention_grouped(q, k, v, mask="causal")
    as_array = scaled_dot_product_attention_grouped(q, k, v, mask=causal_mask(3, 8))
    assert_close(as_string, as_array, mx.float32)


def test_sdpa_grouped_query_heads_share_their_group_kv_head():
    """Query heads 2g and 2g+1 attend to kv head g: equal to plain attention on repeated k/v."""
    k_q, k_k, k_v = mx.random.split(mx.random.key(3), 3)
    q = normal(k_q, (1, 4, 3, 8), mx.float32)
    k = normal(k_k, (1, 2, 5, 8), mx.float32)
    v = normal(k_v, (1, 2, 5, 8), mx.float32)
    repeated = mx.fast.scaled_dot_product_attention(
        q, mx.repeat(k, 2, axis=1), mx.repeat(v, 2, axis=1), scale=8**-0.5
    )
    assert_close(scaled_dot_product_attention_grouped(q, k, v), repeated, mx.float32)


def test_sdpa_grouped_batch_row_equals_single_row():
    """Each batch row of the output equals the output computed on that row alone."""
    k_q, k_k, k_v, k_m = mx.random.split(mx.random.key(4), 4)
    q = normal(k_q, (3, 4, 2, 8), mx.float32)
    k = normal(k_k, (3, 2, 5, 8), mx.float32)
    v = normal(k_v, (3, 2, 5, 8), mx.float32)
    mask = normal(k_m, (3, 4, 2, 5), mx.float32)
    batched = scaled_dot_product_attention_grouped(q, k, v, mask=mask)
    for i in range(3):
        row = slice(i, i + 1)
        single = scaled_dot_product_attention_grouped(q[row], k[row], v[row], mask=mask[row])
        assert_close(batched[row], single, mx.float32)


def test_sdpa_grouped_rejects_heads_not_a_multiple():
    """Hq not a multiple of Hkv raises a ValueError naming both head counts."""
    q, k = mx.zeros((1, 6, 2, 8)), mx.zeros((1, 4, 3, 8))
    with pytest.raises(ValueError, match="Hq=6 must be a multiple of Hkv=4"):
        scaled_dot_product_attention_grouped(q, k, k)


def test_sdpa_grouped_rejects_batch_mismatch():
    """Query and key with different batch sizes raise a ValueError."""
    q, k = mx.zeros((2, 4, 2, 8)), mx.zeros((3, 2, 3, 8))
    with pytest.raises(ValueError, match="batch and head size must agree"):
        scaled_dot_product_attention_grouped(q, k, k)


def test_sdpa_grouped_rejects_bad_layouts_and_mask_names():
    """3-D inputs, key/value length mismatch and unknown mask strings raise ValueError."""
    with pytest.raises(ValueError, match="attention shapes do not match"):
        scaled_dot_product_attention_grouped(
            mx.zeros((4, 2, 8)), mx.zeros((2, 3, 8)), mx.zeros((2, 3, 8))
        )
    with pytest.raises(ValueError, match="attention shapes do not match"):
        scaled_dot_product_attention_grouped(
            mx.zeros((1, 4, 2, 8)), mx.zeros((1, 2, 3, 8)), mx.zeros((1, 2, 5, 8))
        )
    with pytest.raises(ValueError, match="mask must be an array, None or 'causal', got 'upper'"):
        scaled_dot_product_attention_grouped(
            mx.zeros((1, 4, 2, 8)), mx.zeros((1, 2, 3, 8)), mx.zeros((1, 2, 3, 8)), mask="upper"
        )


def test_check_attention_inputs():
    """The checks grouped attention (and week 2's fused kernel) share: inputs that fit pass
    and return None; a 3-D value, or "causal" with more queries than keys, raise."""
    q, k = mx.zeros((1, 4, 2, 8)), mx.zeros((1, 2, 3, 8))
    assert check_attention_inputs(q, k, k, "causal") is None
    assert check_attention_inputs(q, k, mx.zeros((1, 2, 3, 5)), mx.zeros((2, 3))) is None
    with pytest.raises(ValueError, match="attention shapes do not match"):
        check_attention_inputs(q, k, mx.zeros((1, 2, 3)))
    with pytest.raises(ValueError, match="a causal mask needs L <= S, got L=4, S=3"):
        check_attention_inputs(mx.zeros((1, 4, 4, 8)), k, k, "causal")
    with pytest.raises(ValueError, match="attention shapes do not match"):
        scaled_dot_product_attention_grouped(q, k, mx.zeros((1, 2, 3)))


# --- Qwen2MultiHeadAttention vs mlx-lm -----------------------------------------------------

BASE_CONFIG = dict(num_hidden_layers=1, vocab_size=64, rms_norm_eps=1e-6, tie_word_embeddings=True)

QWEN2_CONFIGS = {
    "qwen2-gqa2": dict(
        BASE_CONFIG, model_type="qwen2", hidden_size=64, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, rope_theta=1_000_000.0,
    ),
    "qwen2-gqa7": dict(
        BASE_CONFIG, model_type="qwen2", hidden_size=56, intermediate_size=80,
        num_attention_heads=7, num_key_value_heads=1, rope_theta=10_000.0,
    ),
}

LLAMA_CONFIGS = {
    "llama-gqa3": dict(
        BASE_CONFIG, model_type="llama", hidden_size=48, intermediate_size=64,
        num_attention_heads=6, num_key_value_heads=2, rope_theta=100_000.0,
    ),
    # head_dim * heads != hidden_size, as in some Llama-family checkpoints.
    "llama-head-dim": dict(
        BASE_CONFIG, model_type="llama", hidden_size=48, intermediate_size=64,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10_000.0,
    ),
    # Interleaved RoPE and biases on q/k/v/o.
    "llama-traditional-bias": dict(
        BASE_CONFIG, model_type="llama", hidden_size=32, intermediate_size=48,
        num_attention_heads=4, num_key_value_heads=4, rope_theta=10_000.0,
        rope_traditional=True, attention_bias=True,
    ),
}


def random_attention(module_file, config: dict, dtype: mx.Dtype, seed: int):
    """mlx-lm's Attention for `config` with seeded normal weights (std 0.15), and its weights."""
    reference = module_file.Attention(module_file.ModelArgs.from_dict(config))
    params = tree_flatten(reference.parameters())
    keys = mx.random.split(mx.random.key(seed), len(params))
    new = [(name, normal(k, p.shape, dtype, scale=0.15)) for (name, p), k in zip(params, keys)]
    reference.update(tree_unflatten(new))
    return reference, dict(new)


def check_attention_parity(module_file, config, B, L, mask, dtype):
    reference, weights = random_attention(module_file, config, dtype, seed=B * 100 + L)
    ours = Qwen2MultiHeadAttention(ModelArgs.from_config(config), weights)
    x = normal(mx.random.key(7), (B, L, config["hidden_size"]), dtype)
    assert_close(ours(x, mask=mask), reference(x, mask=mask), dtype)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("mask", ["causal", None])
@pytest.mark.parametrize("B, L", [(1, 1), (2, 6), (1, 9)])
@pytest.mark.parametrize("name", sorted(QWEN2_CONFIGS))
def test_qwen2_attention_matches_mlx_lm(name, B, L, mask, dtype):
    """Qwen2MultiHeadAttention equals mlx_lm.models.qwen2.Attention on the same random weights."""
    check_attention_parity(mlx_qwen2, QWEN2_CONFIGS[name], B, L, mask, dtype)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("B, L", [(1, 1), (2, 6)])
@pytest.mark.parametrize("name", sorted(LLAMA_CONFIGS))
def test_llama_attention_matches_mlx_lm(name, B, L, dtype):
    """Qwen2MultiHeadAttention on a Llama config equals mlx_lm.models.llama.Attention."""
    check_attention_parity(mlx_llama, LLAMA_CONFIGS[name], B, L, "causal", dtype)


def test_qwen2_attention_reads_weights_under_prefix():
    """Weights stored under a Hugging Face prefix give the same layer as unprefixed ones."""
    config = QWEN2_CONFIGS["qwen2-gqa7"]
    reference, weights = random_attention(mlx_qwen2, config, mx.float32, seed=13)
    prefix = "model.layers.3.self_attn."
    prefixed = {prefix + name: w for name, w in weights.items()}
    ours = Qwen2MultiHeadAttention(ModelArgs.from_config(config), prefixed, prefix)
    x = normal(mx.random.key(14), (1, 4, 56), mx.float32)
    assert_close(ours(x, mask="causal"), reference(x, mask="causal"), mx.float32)


@pytest.mark.parametrize("offset", [5, 40])
def test_qwen2_attention_is_invariant_to_a_common_offset(offset):
    """Shifting every position by one offset leaves self-attention unchanged (RoPE is relative)."""
    config = QWEN2_CONFIGS["qwen2-gqa2"]
    _, weights = random_attention(mlx_qwen2, config, mx.float32, seed=15)
    ours = Qwen2MultiHeadAttention(ModelArgs.from_config(config), weights)
    x = normal(mx.random.key(16), (2, 5, 64), mx.float32)
    # Angles p * freq in float32 lose about p * 1.2e-7 rad, so allow more than the base 1e-5.
    np.testing.assert_allclose(
        np.array(ours(x, mask="causal", offset=offset)),
        np.array(ours(x, mask="causal", offset=0)),
        atol=1e-4,
        rtol=1e-4,
    )


def test_qwen3_attention_normalises_queries_and_keys_before_rope():
    """Qwen3 normalises each head's queries and keys (`q_norm`, `k_norm`, over head_dim)
    before RoPE: with those norms (here mx.fast.rms_norm, so this day needs no other) the
    attention equals mlx_lm.models.qwen3.Attention."""
    from mlx_lm.models import qwen3 as mlx_qwen3

    config = dict(BASE_CONFIG, model_type="qwen3", hidden_size=64, intermediate_size=96, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=24, rope_theta=1_000_000.0, max_position_embeddings=512)
    reference, weights = random_attention(mlx_qwen3, config, mx.float32, seed=17)
    weights = {k: (1.0 + v if k.endswith("norm.weight") else v) for k, v in weights.items()}
    reference.update(tree_unflatten(list(weights.items())))
    ours = Qwen2MultiHeadAttention(ModelArgs.from_config(config), weights)
    ours.q_norm = lambda t: mx.fast.rms_norm(t, weights["q_norm.weight"], 1e-6)
    ours.k_norm = lambda t: mx.fast.rms_norm(t, weights["k_norm.weight"], 1e-6)
    x = normal(mx.random.key(18), (2, 5, 64), mx.float32)
    assert_close(ours(x, mask="causal"), reference(x, mask="causal"), mx.float32)
