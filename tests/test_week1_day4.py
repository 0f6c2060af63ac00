"""Week 1, day 4: SiLU, RMSNorm and the SwiGLU MLP of Qwen2 / Llama."""

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import assert_close, normal
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import llama as mlx_llama
from mlx_lm.models import qwen2 as mlx_qwen2

from tiny_llm.basics import silu
from tiny_llm.layer_norm import RMSNorm
from tiny_llm.qwen2 import ModelArgs, Qwen2MLP

DTYPES = [mx.float32, mx.float16, mx.bfloat16]

# --- silu ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7,), (3, 16), (2, 4, 33)])
def test_silu_matches_mlx_nn(shape, dtype):
    """silu equals mlx.nn.silu for several shapes and dtypes."""
    x = normal(mx.random.key(0), shape, dtype, scale=4.0)
    assert_close(silu(x), nn.silu(x), dtype)


def test_silu_exact_values():
    """silu(0) = 0, silu(1) = 1 / (1 + e^-1); silu(x) -> x for large x, -> 0 for very negative x."""
    x = mx.array([0.0, 1.0, -1.0, 30.0, -30.0])
    sigmoid = lambda t: 1.0 / (1.0 + math.exp(-t))  # noqa: E731
    expected = [0.0, sigmoid(1.0), -sigmoid(-1.0), 30.0, -30.0 * sigmoid(-30.0)]
    np.testing.assert_allclose(np.array(silu(x)), expected, atol=1e-6, rtol=1e-6)


# --- RMSNorm -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps", [1e-5, 1e-6])
@pytest.mark.parametrize("shape", [(4, 16), (2, 3, 64), (1, 1, 128)])
def test_rms_norm_matches_mlx_fast(shape, eps, dtype):
    """RMSNorm equals mx.fast.rms_norm for several shapes, eps values and dtypes."""
    k_x, k_w = mx.random.split(mx.random.key(1), 2)
    x = normal(k_x, shape, dtype, scale=2.0)
    weight = (1.0 + normal(k_w, shape[-1:], mx.float32, scale=0.2)).astype(dtype)
    assert_close(RMSNorm(weight, eps)(x), mx.fast.rms_norm(x, weight, eps), dtype)


def test_rms_norm_exact_small_case():
    """x = (3, 4): the root mean square is sqrt(12.5), and the weight scales each feature."""
    x = mx.array([[3.0, 4.0]])
    rms = math.sqrt(12.5)
    np.testing.assert_allclose(
        np.array(RMSNorm(mx.array([1.0, 2.0]), eps=0.0)(x)),
        [[3.0 / rms, 8.0 / rms]],
        atol=1e-6,
        rtol=1e-6,
    )


def test_rms_norm_eps_inside_the_root():
    """eps is added to the mean square: (3, 4) with eps = 1 is divided by sqrt(13.5); 0 stays 0."""
    x = mx.array([[3.0, 4.0], [0.0, 0.0]])
    rms = math.sqrt(12.5 + 1.0)
    np.testing.assert_allclose(
        np.array(RMSNorm(mx.ones((2,)), eps=1.0)(x)),
        [[3.0 / rms, 4.0 / rms], [0.0, 0.0]],
        atol=1e-6,
        rtol=1e-6,
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps", [1e-2, 1e-1])
def test_rms_norm_small_inputs_match_mlx_fast(eps, dtype):
    """For inputs far below sqrt(eps), eps dominates the statistics as in mx.fast.rms_norm."""
    x = normal(mx.random.key(10), (3, 24), dtype, scale=0.05)
    weight = mx.ones((24,), dtype=dtype)
    assert_close(RMSNorm(weight, eps)(x), mx.fast.rms_norm(x, weight, eps), dtype)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_rms_norm_large_half_precision_inputs(dtype):
    """Features near 1000 (squares beyond float16's 65504) still normalise like mx.fast.rms_norm."""
    x = (1000.0 + normal(mx.random.key(2), (2, 32), mx.float32, scale=50.0)).astype(dtype)
    weight = mx.ones((32,), dtype=dtype)
    actual = RMSNorm(weight, 1e-6)(x)
    assert np.isfinite(np.array(actual.astype(mx.float32))).all()
    assert_close(actual, mx.fast.rms_norm(x, weight, 1e-6), dtype)


def test_rms_norm_batch_row_equals_single_row():
    """Each row is normalised on its own statistics: a batched call equals row-by-row calls."""
    x = normal(mx.random.key(3), (3, 4, 16), mx.float32)
    norm = RMSNorm(normal(mx.random.key(4), (16,), mx.float32), 1e-5)
    batched = norm(x)
    for i in range(3):
        assert_close(batched[i : i + 1], norm(x[i : i + 1]), mx.float32)


def test_rms_norm_default_eps_is_the_models():
    """Without an eps, RMSNorm uses ModelArgs' default rms_norm_eps (1e-6, as in Hugging Face's
    Qwen2 and Llama configs). Inputs of size 1e-3 tell it apart from mlx.nn's 1e-5."""
    config = dict(qwen2_config(8, 8))
    del config["rms_norm_eps"]
    eps = ModelArgs.from_config(config).rms_norm_eps
    assert eps == 1e-6
    x = normal(mx.random.key(6), (2, 32), mx.float32, scale=1e-3)
    weight = mx.ones((32,))
    actual = RMSNorm(weight)(x)
    assert_close(actual, mx.fast.rms_norm(x, weight, eps), mx.float32)
    assert not np.allclose(np.array(actual), np.array(mx.fast.rms_norm(x, weight, 1e-5)), rtol=1e-2)


# --- Qwen2MLP vs mlx-lm --------------------------------------------------------------------


def randomize(module, dtype: mx.Dtype, seed: int, scale: float) -> dict[str, mx.array]:
    """Give `module` seeded normal weights (std `scale`) in `dtype`; return them by name."""
    params = tree_flatten(module.parameters())
    keys = mx.random.split(mx.random.key(seed), len(params))
    new = [(name, normal(k, p.shape, dtype, scale=scale)) for (name, p), k in zip(params, keys)]
    module.update(tree_unflatten(new))
    return dict(new)


def qwen2_config(E: int, I: int) -> dict:
    return dict(
        model_type="qwen2", hidden_size=E, num_hidden_layers=1, intermediate_size=I,
        num_attention_heads=2, num_key_value_heads=2, vocab_size=64, rms_norm_eps=1e-6,
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B, L, E, I", [(1, 1, 16, 32), (2, 5, 32, 64), (1, 3, 64, 160)])
def test_qwen2_mlp_matches_mlx_lm(B, L, E, I, dtype):
    """Qwen2MLP equals mlx_lm.models.qwen2.MLP on the same random weights."""
    reference = mlx_qwen2.MLP(E, I)
    weights = randomize(reference, dtype, seed=E + I, scale=0.2)
    assert sorted(weights) == ["down_proj.weight", "gate_proj.weight", "up_proj.weight"]
    ours = Qwen2MLP(ModelArgs.from_config(qwen2_config(E, I)), weights)
    x = normal(mx.random.key(5), (B, L, E), dtype)
    assert_close(ours(x), reference(x), dtype)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_llama_mlp_with_bias_matches_mlx_lm(dtype):
    """With mlp_bias, Qwen2MLP equals mlx_lm.models.llama.MLP including its three biases."""
    config = dict(qwen2_config(32, 48), model_type="llama", mlp_bias=True)
    reference = mlx_llama.MLP(mlx_llama.ModelArgs.from_dict(config))
    weights = randomize(reference, dtype, seed=6, scale=0.2)
    assert "down_proj.bias" in weights
    ours = Qwen2MLP(ModelArgs.from_config(config), weights)
    x = normal(mx.random.key(7), (2, 4, 32), dtype)
    assert_close(ours(x), reference(x), dtype)


def test_qwen2_mlp_reads_weights_under_prefix():
    """Weights stored under a Hugging Face prefix give the same MLP as unprefixed ones."""
    reference = mlx_qwen2.MLP(16, 24)
    weights = randomize(reference, mx.float32, seed=8, scale=0.2)
    prefix = "model.layers.0.mlp."
    ours = Qwen2MLP(
        ModelArgs.from_config(qwen2_config(16, 24)),
        {prefix + name: w for name, w in weights.items()},
        prefix,
    )
    x = normal(mx.random.key(9), (1, 3, 16), mx.float32)
    assert_close(ours(x), reference(x), mx.float32)
