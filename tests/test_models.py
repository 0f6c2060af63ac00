"""The dense architectures beyond Qwen2 and Llama 2: Qwen3 (per-head q/k norms, explicit
head_dim) and Llama 3 / linear RoPE scaling — logits against mlx-lm's models, frequencies
against mlx-lm's RoPE classes, and the errors for what tiny-llm does not implement."""

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import assert_half_precision_close, model_weights, reference_model, save_dir

from tiny_llm.loader import load_model
from tiny_llm.positional_encoding import ScaledRoPE
from tiny_llm.quantize import QuantizedWeight
from tiny_llm.qwen2 import ModelArgs, Qwen2Model

LLAMA3_SCALING = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=16)
CONFIGS = {
    # Qwen3: no biases, q/k norms, head_dim 24 while hidden_size / heads is 16, tied head.
    "qwen3": dict(
        model_type="qwen3", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, vocab_size=128, rms_norm_eps=1e-6,
        rope_theta=1_000_000.0, tie_word_embeddings=True, max_position_embeddings=512,
    ),
    # Llama 3.x: RoPE scaled the llama3 way; the original context (16) is shorter than the
    # test's sequences, so positions past it are checked.
    "llama3": dict(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=64,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=112, rms_norm_eps=1e-5,
        rope_theta=500_000.0, tie_word_embeddings=True, max_position_embeddings=1024,
        rope_scaling=LLAMA3_SCALING,
    ),
    # Linear scaling (position interpolation) on a Qwen2.
    "qwen2-linear": dict(
        model_type="qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128, rms_norm_eps=1e-6,
        rope_theta=10_000.0, tie_word_embeddings=False, rope_scaling={"type": "linear", "factor": 4.0},
    ),
}
TOKENS = mx.array(np.random.default_rng(1).integers(0, 112, (2, 40)))


def close(a, b, tol):
    np.testing.assert_allclose(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)), atol=tol, rtol=tol)


def same_logits(a, b, dtype):
    if dtype == mx.float32:
        close(a, b, 1e-4)
    else:
        assert_half_precision_close(a, b)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_equal_mlx_lm_with_and_without_a_cache(name, dtype, fused):
    from mlx_lm.models.cache import make_prompt_cache

    config = CONFIGS[name]
    ref = reference_model(config, seed=2)
    if dtype != mx.float32:
        ref.set_dtype(dtype)
    model = Qwen2Model(ModelArgs.from_config(config), model_weights(ref), fused=fused)
    logits = model(TOKENS)
    assert logits.dtype == dtype
    same_logits(logits, ref(TOKENS), dtype)
    cache, ref_cache = model.make_cache(), make_prompt_cache(ref)
    same_logits(model(TOKENS[:, :30], cache=cache), ref(TOKENS[:, :30], cache=ref_cache), dtype)
    for t in range(30, 34):  # decode steps past the original context of llama3's scaling
        same_logits(model(TOKENS[:, t:t + 1], cache=cache), ref(TOKENS[:, t:t + 1], cache=ref_cache), dtype)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_batched_rows_equal_single_rows(name):
    config = CONFIGS[name]
    model = Qwen2Model(ModelArgs.from_config(config), model_weights(reference_model(config, seed=3)))
    both = model(TOKENS)
    for b in range(2):
        close(model(TOKENS[b:b + 1])[0], both[b], 1e-5)


def test_qwen3_attention_normalises_queries_and_keys():
    """Without its q/k norms (weights set so the norms are not the identity) Qwen3 gives
    other logits: the norms are really applied."""
    config = CONFIGS["qwen3"]
    weights = model_weights(reference_model(config, seed=4))
    model = Qwen2Model(ModelArgs.from_config(config), weights)
    assert model.layers[0].self_attn.q_norm is not None
    plain = dict(weights)
    for key in [k for k in plain if k.endswith(("q_norm.weight", "k_norm.weight"))]:
        plain[key] = mx.ones_like(plain[key]) * 3.0
    other = Qwen2Model(ModelArgs.from_config(config), plain)
    assert float(mx.abs(model(TOKENS) - other(TOKENS)).max()) > 1e-2


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_quantized_checkpoint_equals_mlx_lm_quantized(tmp_path, name):
    config = CONFIGS[name]
    ref = reference_model(config, seed=5)
    nn.quantize(ref, group_size=32, bits=4, class_predicate=lambda p, m: isinstance(m, (nn.Linear, nn.Embedding)))
    mx.eval(ref.parameters())
    model = load_model(save_dir(tmp_path / name, {**config, "quantization": {"group_size": 32, "bits": 4}},
                                model_weights(ref)))
    assert isinstance(model.layers[0].self_attn.wq, QuantizedWeight)
    close(model(TOKENS), ref(TOKENS), 1e-4)


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("offset", [0, 15, 100, 5000])
def test_llama3_rope_equals_mlx_lm_beyond_the_original_context(offset, traditional):
    from mlx_lm.models.rope_utils import Llama3RoPE

    dims = 32
    x = mx.random.normal((1, 4, 3, dims), key=mx.random.key(offset))  # B, L, H, D
    ours = ScaledRoPE(dims, 500_000.0, traditional, LLAMA3_SCALING)
    ref = Llama3RoPE(dims, traditional=traditional, base=500_000.0, scaling_config=LLAMA3_SCALING)
    want = ref(x.swapaxes(1, 2), offset=offset).swapaxes(1, 2)
    close(ours(x, offset=offset), want, 2e-4 if offset == 5000 else 1e-5)
    fused = ScaledRoPE(dims, 500_000.0, traditional, LLAMA3_SCALING, fused=True)
    close(fused(x, offset=offset), want, 1e-5)


def test_llama3_frequencies_by_band():
    """Long wavelengths (past original context / low_freq_factor) are divided by the factor,
    short ones (below original context / high_freq_factor) kept, the band between blended;
    against mlx-lm's frequencies (it stores their inverses)."""
    from mlx_lm.models.rope_utils import Llama3RoPE

    scaling = dict(LLAMA3_SCALING, original_max_position_embeddings=8192)
    rope = ScaledRoPE(128, 500_000.0, False, scaling)
    inv = np.array(rope.inverse_frequencies())
    plain = 500_000.0 ** (-np.arange(0, 128, 2) / 128)
    wavelen = 2 * np.pi / plain
    assert (wavelen < 2048).any() and (wavelen > 8192).any() and ((wavelen > 2048) & (wavelen < 8192)).any()
    np.testing.assert_allclose(inv[wavelen < 2048], plain[wavelen < 2048], rtol=1e-6)
    np.testing.assert_allclose(inv[wavelen > 8192], plain[wavelen > 8192] / 8.0, rtol=1e-6)
    ref = Llama3RoPE(128, base=500_000.0, scaling_config=scaling)
    np.testing.assert_allclose(inv, 1.0 / np.array(ref._freqs), rtol=1e-5)


@pytest.mark.parametrize("offset", [0, 100, 5000])
def test_linear_rope_equals_mlx_lm(offset):
    x = mx.random.normal((2, 3, 2, 16), key=mx.random.key(offset + 1))
    ours = ScaledRoPE(16, 10_000.0, False, {"type": "linear", "factor": 4.0})
    want = nn.RoPE(16, base=10_000.0, scale=0.25)(x.swapaxes(1, 2), offset=offset).swapaxes(1, 2)
    close(ours(x, offset=offset), want, 1e-4)


@pytest.mark.parametrize("scaling, message", [
    ({"rope_type": "yarn", "factor": 4.0}, "unsupported rope_scaling type 'yarn': tiny-llm implements default, linear, llama3"),
    ({"type": "dynamic", "factor": 2.0}, "unsupported rope_scaling type 'dynamic'"),
    ({"type": "linear"}, "rope_scaling 'linear' needs a positive factor, got None"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0},
     "needs 0 < low_freq_factor < high_freq_factor, got 4.0 and 1.0"),
])
def test_unsupported_rope_scaling_is_refused(scaling, message):
    with pytest.raises(ValueError, match=message):
        ModelArgs.from_config(dict(CONFIGS["llama3"], rope_scaling=scaling))


@pytest.mark.parametrize("model_type", ["gpt2", "mixtral", "qwen3_next"])
def test_unsupported_model_type_names_the_supported_ones(model_type):
    with pytest.raises(ValueError, match=f"unsupported model_type '{model_type}': tiny-llm runs "
                                         "qwen2, llama, qwen3, qwen2_moe, qwen3_moe"):
        ModelArgs.from_config(dict(CONFIGS["qwen3"], model_type=model_type))


@pytest.mark.parametrize("change, message", [
    (dict(num_experts=0), "num_experts must be a positive integer for qwen3_moe, got 0"),
    (dict(num_experts_per_tok=9), "num_experts_per_tok=9 exceeds num_experts=8"),
    (dict(decoder_sparse_step=0), "decoder_sparse_step must be a positive integer"),
])
def test_bad_mixture_of_experts_configs_are_refused(change, message):
    config = dict(CONFIGS["qwen3"], model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2,
                  moe_intermediate_size=32)
    with pytest.raises(ValueError, match=message):
        ModelArgs.from_config({**config, **change})


def test_a_missing_expert_is_named(tmp_path):
    config = dict(CONFIGS["qwen3"], model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=32, num_hidden_layers=1)
    weights = {f"model.layers.0.mlp.experts.{e}.up_proj.weight": mx.zeros((32, 64)) for e in range(3)}
    with pytest.raises(ValueError, match=r"missing weight 'model.layers.0.mlp.experts.3.up_proj.weight' "
                                         r"\(config num_experts=4\)"):
        load_model(save_dir(tmp_path / "m", config, weights))


def test_gguf_with_rope_frequencies_is_refused(tmp_path, monkeypatch):
    import tiny_llm

    monkeypatch.setenv("TINY_LLM_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "llama3.gguf"
    mx.save_gguf(str(path), {"token_embd.weight": mx.zeros((8, 4)), "rope_freqs.weight": mx.ones((2,))},
                 {"general.architecture": "llama"})
    with pytest.raises(ValueError, match="scales RoPE with a rope_freqs tensor.*load the model's MLX or "
                                         "Hugging Face directory instead"):
        tiny_llm.load(str(path))
