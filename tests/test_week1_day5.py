"""Week 1, day 5: embedding, the transformer block, the whole model, and the real default model."""

import importlib

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import TINY_CONFIGS, model_weights, reference_model

from tiny_llm.embedding import Embedding
from tiny_llm.qwen2 import ModelArgs, Qwen2Model, Qwen2TransformerBlock

# Half precision keeps ~3 significant digits: compare with looser bounds there.
TOL = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 2e-2}


def close(a: mx.array, b: mx.array, atol: float, rtol: float | None = None):
    np.testing.assert_allclose(
        np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)),
        atol=atol, rtol=atol if rtol is None else rtol,
    )


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_embedding_lookup_matches_nn_embedding(dtype):
    """Embedding(tokens) returns the weight rows that mlx.nn.Embedding returns."""
    mx.random.seed(1)
    ref = nn.Embedding(50, 16)
    ref.weight = mx.random.normal((50, 16)).astype(dtype)
    tokens = mx.random.randint(0, 50, (3, 7))
    ours = Embedding(ref.weight)
    assert mx.array_equal(ours(tokens), ref(tokens))


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_embedding_as_linear_matches_nn_embedding(dtype):
    """as_linear(x) equals nn.Embedding.as_linear (x @ weight.T), the tied output head."""
    mx.random.seed(2)
    weight = mx.random.normal((50, 16)).astype(dtype)
    ref = nn.Embedding(50, 16)
    ref.weight = weight
    x = mx.random.normal((2, 5, 16)).astype(dtype)
    close(Embedding(weight).as_linear(x), ref.as_linear(x), atol=TOL[dtype] * 10)


@pytest.mark.parametrize("name", ["qwen2-untied", "llama-tied"])
@pytest.mark.parametrize("L", [1, 6])
def test_transformer_block_matches_mlx_lm(name, L):
    """One decoder block (norms, attention with RoPE, SwiGLU, residuals) equals mlx-lm's."""
    config = TINY_CONFIGS[name]
    ref_model = reference_model(config, seed=3)
    ref_block = ref_model.model.layers[1]
    weights = model_weights(ref_model)
    ours = Qwen2TransformerBlock(ModelArgs.from_config(config), weights, "model.layers.1.")
    mx.random.seed(4)
    x = mx.random.normal((2, L, config["hidden_size"]))
    mask = "causal" if L > 1 else None
    close(ours(x, mask=mask), ref_block(x, mask=mask), atol=1e-4)


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (3, 5)])
def test_model_logits_match_mlx_lm(name, shape):
    """Whole-model logits [B, L, V] equal mlx-lm's on the same random weights (tied and untied)."""
    config = TINY_CONFIGS[name]
    ref = reference_model(config, seed=5)
    ours = Qwen2Model(ModelArgs.from_config(config), model_weights(ref))
    tokens = mx.random.randint(0, config["vocab_size"], shape, key=mx.random.key(6))
    logits = ours(tokens)
    assert logits.shape == (*shape, config["vocab_size"])
    close(logits, ref(tokens), atol=2e-4)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_model_in_half_precision_matches_mlx_lm(dtype):
    """With float16/bfloat16 weights the logits stay within half-precision error of mlx-lm's."""
    config = TINY_CONFIGS["qwen2-untied"]
    ref = reference_model(config, seed=7)
    ref.set_dtype(dtype)
    ours = Qwen2Model(ModelArgs.from_config(config), model_weights(ref))
    tokens = mx.random.randint(0, config["vocab_size"], (2, 8), key=mx.random.key(8))
    logits = ours(tokens)
    assert logits.dtype == dtype
    # Two layers of half-precision matmuls: rounding differences of a few units in the last
    # place add up. bfloat16 keeps 8 significant bits (one unit is 0.03 at |x| = 4, and
    # logits reach |x| = 8), so its bound is ten units at that scale.
    close(logits, ref(tokens), atol={mx.float16: 2e-2, mx.bfloat16: 0.4}[dtype], rtol=2e-2)


def test_batch_rows_are_independent():
    """Each row of a batch gives the logits it gives alone (no mixing across the batch)."""
    config = TINY_CONFIGS["llama-tied"]
    ref = reference_model(config, seed=9)
    ours = Qwen2Model(ModelArgs.from_config(config), model_weights(ref))
    tokens = mx.random.randint(0, config["vocab_size"], (3, 6), key=mx.random.key(10))
    batch = ours(tokens)
    for row in range(3):
        close(batch[row : row + 1], ours(tokens[row : row + 1]), atol=1e-5)


def test_model_rejects_a_cache_of_the_wrong_depth():
    """A cache made for another depth is refused with the two layer counts."""
    config = TINY_CONFIGS["llama-untied"]
    ours = Qwen2Model(ModelArgs.from_config(config), model_weights(reference_model(config)))
    with pytest.raises(ValueError, match="cache has 1 layers, the model 2"):
        ours(mx.array([[1, 2]]), cache=ours.make_cache()[:1])


PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea. Use simple words, please.",
]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_default_model_matches_mlx_lm(course_default_model, reference_default_model, prompt):
    """The real default model gives mlx-lm's logits on a chat prompt.

    Both multiply the same packed 4-bit weights with mx.quantized_matmul and unpack the same
    8-bit embedding rows. What differs is tiny-llm's own RMSNorm, RoPE and attention against
    mlx-lm's fused kernels: float32 rounding in another order, over 30 layers. That moves
    logits (range about +-40) by about 0.01; the bound is 0.05, and 5e-4 on probabilities.
    """
    model, tokenizer = course_default_model
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    tokens = tokenizer.encode(text)
    assert tokens == reference_default_model.tokenizer.encode(text)
    ours, ref = model(mx.array([tokens]))[0], reference_default_model.logits(tokens)  # L, V
    close(ours, ref, atol=0.05, rtol=0)
    close(mx.softmax(ours, axis=-1), mx.softmax(ref, axis=-1), atol=5e-4, rtol=0)
    assert mx.argmax(ours[-1]).item() == mx.argmax(ref[-1]).item()
