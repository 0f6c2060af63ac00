"""Week 3, day 4: mixture of experts — routing, experts applied with a gather, the MoE layer,
and whole Qwen3-MoE / Qwen2-MoE models against mlx-lm's."""

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import assert_close, assert_half_precision_close, model_weights, reference_model, save_dir

from tiny_llm.loader import load_model
from tiny_llm.moe import Experts, MoEBlock, expert_linear, route
from tiny_llm.quantize import QuantizedWeight
from tiny_llm.qwen2 import ModelArgs, Qwen2MLP, Qwen2Model

MOE_CONFIGS = {
    # Qwen3-MoE: per-head q/k norms, 8 experts, 2 per token, renormalised weights; layer 1
    # keeps a dense MLP (mlp_only_layers); head_dim is not hidden_size / heads.
    "qwen3_moe": dict(
        model_type="qwen3_moe", hidden_size=64, num_hidden_layers=3, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, vocab_size=128, rms_norm_eps=1e-6,
        rope_theta=1_000_000.0, tie_word_embeddings=False, max_position_embeddings=512, num_experts=8,
        num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[1], moe_intermediate_size=32,
        norm_topk_prob=True,
    ),
    # Qwen2-MoE: q/k/v biases, 6 experts, 3 per token, weights not renormalised, a shared
    # expert behind a sigmoid gate.
    "qwen2_moe": dict(
        model_type="qwen2_moe", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128, rms_norm_eps=1e-6,
        rope_theta=1_000_000.0, tie_word_embeddings=False, num_experts=6, num_experts_per_tok=3,
        moe_intermediate_size=32, shared_expert_intermediate_size=64,
    ),
}
TOKENS = mx.array(np.random.default_rng(0).integers(0, 128, (2, 24)))


def moe_model(name: str, seed: int = 0, dtype: mx.Dtype = mx.float32):
    """tiny-llm's model with seeded random weights of `dtype`, and mlx-lm's with the same
    weights. mlx-lm's sparse layers cannot run in half precision on MLX's CPU backend (its
    `gather_mm` takes float32 only): there the reference computes in float32 with the
    weights rounded to `dtype`."""
    config = MOE_CONFIGS[name]
    ref = reference_model(config, seed=seed)
    if dtype != mx.float32:
        ref.set_dtype(dtype)
    model = Qwen2Model(ModelArgs.from_config(config), model_weights(ref))
    if dtype != mx.float32 and mx.default_device() == mx.cpu:
        ref.set_dtype(mx.float32)
    return model, ref


def numpy_route(logits: np.ndarray, k: int, normalize: bool):
    """The reference: softmax in float64, experts by probability (ties: lower index first)."""
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    experts = np.argsort(-p, axis=-1, kind="stable")[..., :k]
    weights = np.take_along_axis(p, experts, axis=-1)
    if normalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return experts, weights


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_route_picks_the_most_probable_experts(k, normalize):
    logits = np.random.default_rng(k).normal(0, 2, (3, 7, 16)).astype(np.float32)
    experts, weights = route(mx.array(logits), k, normalize)
    want_e, want_w = numpy_route(logits.astype(np.float64), k, normalize)
    assert experts.dtype == mx.int32 and weights.dtype == mx.float32
    np.testing.assert_array_equal(np.array(experts), want_e)
    np.testing.assert_allclose(np.array(weights), want_w, rtol=1e-5, atol=1e-7)
    if normalize:
        np.testing.assert_allclose(np.array(weights).sum(axis=-1), 1.0, rtol=1e-6)


def test_route_breaks_ties_by_the_lower_expert_index():
    """Equal router scores: the lower index wins, also across the k-th place; weights of
    tied experts are equal."""
    logits = np.array([[1.0, 3.0, 3.0, 0.0, 3.0, 2.0],   # three-way tie at the top, k = 2
                       [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],   # all equal
                       [5.0, -1.0, 2.0, 2.0, 2.0, 2.0]],  # tie across the k-th place
                      dtype=np.float32)
    experts, weights = route(mx.array(logits), 2, normalize=False)
    assert np.array(experts).tolist() == [[1, 2], [0, 1], [0, 2]]
    want_e, want_w = numpy_route(logits.astype(np.float64), 2, False)
    np.testing.assert_array_equal(np.array(experts), want_e)
    np.testing.assert_allclose(np.array(weights), want_w, rtol=1e-6)
    experts, weights = route(mx.array(logits), 2, normalize=True)
    np.testing.assert_allclose(np.array(weights)[:2], 0.5, rtol=1e-6)


def test_route_rejects_a_k_outside_the_experts():
    with pytest.raises(ValueError, match="k must be between 1 and the number of experts 4, got 5"):
        route(mx.zeros((2, 4)), 5, False)
    with pytest.raises(ValueError, match="got 0"):
        route(mx.zeros((2, 4)), 0, False)


def per_token_reference(x: np.ndarray, w: np.ndarray, experts: np.ndarray) -> np.ndarray:
    """Token by token, slot by slot: `x @ w[expert].T`."""
    B, L, k = experts.shape
    out = np.zeros((B, L, k, 1, w.shape[1]))
    for b in range(B):
        for t in range(L):
            for j in range(k):
                out[b, t, j, 0] = x[b, t, 0, 0] @ w[experts[b, t, j]].T
    return out


def test_expert_linear_applies_each_slots_expert():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 5, 1, 1, 16)).astype(np.float32)
    w = rng.normal(size=(6, 12, 16)).astype(np.float32)
    experts = rng.integers(0, 6, (2, 5, 3)).astype(np.int32)
    got = expert_linear(mx.array(x), mx.array(w), mx.array(experts))
    assert got.shape == (2, 5, 3, 1, 12)
    np.testing.assert_allclose(np.array(got), per_token_reference(x, w, experts), rtol=1e-5, atol=1e-5)


def test_expert_linear_keeps_quantized_experts_packed():
    """Quantized experts are multiplied packed (`mx.gather_qmm`): the same products as the
    dequantized weights, up to float32 summation order."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(1, 4, 1, 1, 64)).astype(np.float32)
    w = mx.array(rng.normal(size=(5, 32, 64)).astype(np.float32))
    packed, scales, biases = mx.quantize(w, group_size=32, bits=4)
    qw = QuantizedWeight(packed, scales, biases, 32, 4)
    assert qw.shape == (5, 32, 64)
    experts = rng.integers(0, 5, (1, 4, 2)).astype(np.int32)
    got = expert_linear(mx.array(x), qw, mx.array(experts))
    values = np.array(mx.dequantize(packed, scales, biases, group_size=32, bits=4))
    np.testing.assert_allclose(np.array(got), per_token_reference(x, values, experts), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(MOE_CONFIGS))
def test_moe_block_equals_mlx_lm(name):
    """One sparse layer (router, experts, shared expert) against mlx-lm's block."""
    _, ref = moe_model(name, seed=5)
    block = ref.model.layers[0].mlp
    weights = {f"mlp.{k}": v for k, v in model_weights(block).items()}
    args = ModelArgs.from_config(MOE_CONFIGS[name])
    shared = Qwen2MLP(args, weights, "mlp.shared_expert.") if args.shared_expert_intermediate_size else None
    ours = MoEBlock(weights, "mlp.", args.num_experts_per_tok, args.norm_topk_prob, shared)
    x = mx.random.normal((2, 9, 64), key=mx.random.key(6))
    assert_close(ours(x), block(x), mx.float32)


def test_experts_equal_mlx_lm_switch_glu():
    _, ref = moe_model("qwen3_moe", seed=7)
    switch = ref.model.layers[0].mlp.switch_mlp
    ours = Experts({f"s.{k}": v for k, v in model_weights(switch).items()}, "s.")
    x = mx.random.normal((2, 9, 64), key=mx.random.key(8))
    experts = mx.array(np.random.default_rng(8).integers(0, 8, (2, 9, 2)).astype(np.int32))
    assert_close(ours(x, experts), switch(x, experts), mx.float32)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("name", sorted(MOE_CONFIGS))
def test_moe_model_logits_equal_mlx_lm(name, dtype):
    """Whole models: without a cache, and prefill then decode through a cache."""
    from mlx_lm.models.cache import make_prompt_cache

    model, ref = moe_model(name, seed=9, dtype=dtype)

    def same(got, want):
        if dtype == mx.float32:
            np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-4, rtol=1e-4)
        else:
            assert_half_precision_close(got, want)

    got = model(TOKENS)
    assert got.dtype == dtype
    same(got, ref(TOKENS))
    cache, ref_cache = model.make_cache(), make_prompt_cache(ref)
    model(TOKENS[:, :20], cache=cache), ref(TOKENS[:, :20], cache=ref_cache)
    for t in range(20, 24):
        same(model(TOKENS[:, t:t + 1], cache=cache), ref(TOKENS[:, t:t + 1], cache=ref_cache))


@pytest.mark.parametrize("name", sorted(MOE_CONFIGS))
def test_batched_rows_equal_single_rows(name):
    """Routing is per token: a row's logits do not depend on the other rows of the batch."""
    model, _ = moe_model(name, seed=10)
    both = model(TOKENS)
    for b in range(2):
        np.testing.assert_allclose(np.array(model(TOKENS[b:b + 1])[0]), np.array(both[b]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(MOE_CONFIGS))
def test_hugging_face_layout_loads_with_experts_stacked(tmp_path, name):
    """A Hugging Face directory stores each expert apart (`mlp.experts.3.up_proj.weight`):
    the loader stacks them and the logits equal mlx-lm's."""
    config = MOE_CONFIGS[name]
    ref = reference_model(config, seed=11)
    weights = {}
    for key, value in model_weights(ref).items():
        if ".switch_mlp." in key:
            for e in range(config["num_experts"]):
                weights[key.replace(".switch_mlp.", f".experts.{e}.")] = value[e]
        else:
            weights[key] = value
    model = load_model(save_dir(tmp_path / name, config, weights))
    np.testing.assert_allclose(np.array(model(TOKENS)), np.array(ref(TOKENS)), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", sorted(MOE_CONFIGS))
def test_quantized_moe_checkpoint_keeps_experts_packed(tmp_path, name):
    """An MLX-quantized checkpoint (experts included, 4-bit; the router 8-bit, as mlx-lm's
    converter leaves it) loads with the experts packed and gives mlx-lm's quantized logits."""
    config = MOE_CONFIGS[name]
    ref = reference_model(config, seed=12)

    def predicate(path, module):
        if path.endswith("mlp.gate") or path.endswith("shared_expert_gate"):
            return {"group_size": 32, "bits": 8} if path.endswith("mlp.gate") else False
        return hasattr(module, "to_quantized")

    nn.quantize(ref, group_size=32, bits=4, class_predicate=predicate)
    mx.eval(ref.parameters())
    quantization = {"group_size": 32, "bits": 4}
    for i in range(config["num_hidden_layers"]):
        quantization[f"model.layers.{i}.mlp.gate"] = {"group_size": 32, "bits": 8}
    model = load_model(save_dir(tmp_path / name, {**config, "quantization": quantization}, model_weights(ref)))
    experts = model.layers[0].mlp.experts
    assert isinstance(experts.w_gate, QuantizedWeight) and experts.w_gate.shape == (config["num_experts"], 32, 64)
    assert model.layers[0].mlp.router.bits == 8
    np.testing.assert_allclose(np.array(model(TOKENS)), np.array(ref(TOKENS)), atol=1e-4, rtol=1e-4)
    # Unpacked on request: float32 experts, the same values (products differ by rounding).
    unpacked = load_model(tmp_path / name, dequantize=True)
    assert unpacked.layers[0].mlp.experts.w_gate.dtype == mx.float32
    np.testing.assert_allclose(np.array(unpacked(TOKENS)), np.array(ref(TOKENS)), atol=1e-3, rtol=1e-3)
