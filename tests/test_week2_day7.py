"""Week 2, day 7: the step's overhead — count a decode step's primitives, then run each
decoder layer as one primitive (`kernels/step.cpp`'s loops inside `decode_layer`), with the
same results as the model on MLX ops."""

import collections

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from conftest import tiny_model
from tiny_llm import fused_step, kernels
from tiny_llm.quantize import QuantizedWeight
from tiny_llm.qwen2 import ModelArgs, Qwen2Model

pytestmark = pytest.mark.usefixtures("kernels_on_the_cpu")


def the_day_is_done() -> None:
    """The day's C++ loops run (in a starter their stubs raise the day's NotImplementedError
    here, not deep inside a test that would then fail for another reason)."""
    kernels.extension().probe("week2-day7")


def test_count_primitives_by_hand():
    """Three ops on two constants: three primitives, by name; constants are not counted."""
    a, b = mx.array([1.0, 2.0]), mx.array([3.0, 4.0])
    counts = fused_step.count_primitives(lambda: mx.exp(a + b) * b)
    assert counts == collections.Counter({"Add": 1, "Exp": 1, "Multiply": 1})
    assert fused_step.count_primitives(lambda: (a + b, a - b)) == collections.Counter({"Add": 1, "Subtract": 1})


def unfused(monkeypatch):
    """Run the model's layers on MLX ops for the rest of the test."""
    monkeypatch.setattr(fused_step, "decode", lambda model, tokens, cache: None)


def test_a_decode_step_is_one_primitive_per_layer(default_model, monkeypatch):
    """The default model's decode step: 30 layer primitives and a few dozen others, against
    thousands on MLX ops."""
    the_day_is_done()
    model, tokenizer = default_model
    prompt = mx.array(tokenizer.encode("Why is the sky blue?"))[None]
    cache = model.make_cache()
    token = mx.argmax(model(prompt, cache=cache)[:, -1], axis=-1)[:, None]
    mx.eval(token)
    fused = fused_step.count_primitives(lambda: model(token, cache=cache))
    assert fused["TinyLLMDecodeLayer"] == len(model.layers) == 30
    assert sum(fused.values()) < 100, fused
    unfused(monkeypatch)
    cache = model.make_cache()
    mx.eval(model(prompt, cache=cache))
    plain = fused_step.count_primitives(lambda: model(token, cache=cache))
    assert plain["TinyLLMDecodeLayer"] == 0 and sum(plain.values()) > 2000


def quantized(weights: dict, bits: int = 4, group_size: int = 32) -> dict:
    """The projections kept quantized (MLX's affine format), the rest as they are."""
    out = {}
    for name, w in weights.items():
        if name.endswith("_proj.weight"):
            out[name] = QuantizedWeight(*mx.quantize(w, group_size=group_size, bits=bits), group_size, bits)
        else:
            out[name] = w
    return out


def build(name: str, bits: int, dtype: mx.Dtype, **overrides) -> Qwen2Model:
    """A seeded random model of `TINY_CONFIGS[name]`, its weights in `dtype`, the projections
    quantized to `bits` (0: float)."""
    model, ref = tiny_model(name, seed=7, **overrides)
    weights = {k: v.astype(dtype) for k, v in tree_flatten(ref.parameters())}
    return Qwen2Model(model.args, quantized(weights, bits) if bits else weights)


def decode_logits(model, prompt, steps):
    """Logits of `steps` decode steps after `prompt` on a fresh `KVCache`, fed fixed tokens
    (a random model's near-ties would let two paths choose differently), and the cache."""
    cache = model.make_cache()
    mx.eval(model(prompt, cache=cache))
    out = []
    for i in range(steps):
        out.append(model(mx.array([[(7 * i + 2) % 50]]), cache=cache))
        mx.eval(out[-1])
    return mx.concatenate(out, axis=1), cache


# Our layer keeps the residual stream and every intermediate in float32, rounded to the
# activations' dtype where MLX's ops would store them; the sums are reassociated. float32:
# a few units of float32; half precision: a few units of the dtype relative to the logits.
TOLERANCE = {mx.float32: 2e-4, mx.float16: 3e-2, mx.bfloat16: 1.5e-1}

CASES = [("qwen2-untied", 0, mx.float32, {}), ("qwen2-untied", 4, mx.float16, {}),
         ("qwen2-untied", 8, mx.bfloat16, {}),
         ("llama-tied", 4, mx.float32, dict(hidden_size=64, intermediate_size=96, num_attention_heads=4)),
         ("llama-tied", 0, mx.float16, dict(rope_traditional=True)),
         ("llama-untied", 4, mx.float32, dict(hidden_size=64, intermediate_size=128, mlp_bias=True,
                                              attention_bias=True))]


@pytest.mark.parametrize("name, bits, dtype, overrides", CASES)
def test_fused_steps_equal_mlx_ops(name, bits, dtype, overrides, monkeypatch):
    """Float, 4- and 8-bit weights, q/k/v, o and MLP biases, both RoPE layouts, tied and
    untied heads: the same logits and the same cache as the layers on MLX ops."""
    the_day_is_done()
    model = build(name, bits, dtype, **overrides)
    prompt = mx.array([[3, 17, 5, 9, 22, 4, 11]])
    fused, cache = decode_logits(model, prompt, steps=6)
    assert model._fused_step is not None  # the steps ran fused
    unfused(monkeypatch)
    plain, plain_cache = decode_logits(model, prompt, steps=6)
    scale = float(mx.abs(plain.astype(mx.float32)).max())
    error = float(mx.abs(fused.astype(mx.float32) - plain.astype(mx.float32)).max())
    assert error <= TOLERANCE[dtype] * max(1.0, scale), (error, scale)
    n = cache[0].offset
    assert n == plain_cache[0].offset == prompt.shape[1] + 6
    for ours, theirs in zip(cache, plain_cache):
        for a, b in ((ours.keys, theirs.keys), (ours.values, theirs.values)):
            diff = mx.abs(a[:, :, :n].astype(mx.float32) - b[:, :, :n].astype(mx.float32)).max()
            assert float(diff) <= TOLERANCE[dtype] * max(1.0, float(mx.abs(b[:, :, :n].astype(mx.float32)).max()))


def test_default_model_writes_mlx_lm_greedy_tokens_fused(default_model_dir, reference_default_model, monkeypatch):
    """The default model, decoding fused, writes mlx-lm's greedy tokens."""
    the_day_is_done()
    import mlx_lm

    import tiny_llm

    calls = []
    step = fused_step.FusedDecodeStep.__call__
    monkeypatch.setattr(fused_step.FusedDecodeStep, "__call__", lambda self, *a: calls.append(1) or step(self, *a))
    prompt = "Write one sentence about the sea."
    model, tokenizer = tiny_llm.load(str(default_model_dir))
    ours = [r.token for r in tiny_llm.stream_generate(model, tokenizer, prompt, max_tokens=24)]
    ref = [r.token for r in mlx_lm.stream_generate(reference_default_model.model, reference_default_model.tokenizer,
                                                   prompt, max_tokens=24)]
    assert ours == ref
    assert len(calls) >= len(ours) - 2  # every decode step but the first ran fused


def test_decode_layer_checks_its_arguments():
    """A layer whose arrays do not match its spec is refused when the op is built."""
    the_day_is_done()
    ext = kernels.extension()
    spec = ext.layer_spec(8, 16, 2, 1, 4, 1e-5, 0.5, False, [0] * 7, [0] * 7, [False] * 7, False, 1e-5)
    h = mx.zeros((1, 1, 8))
    keys = mx.zeros((1, 1, 16, 4))
    cos = mx.zeros((8, 2))
    with pytest.raises(ValueError, match="weights do not match"):
        ext.decode_layer(h, keys, keys, None, mx.array([0], dtype=mx.int32), cos, cos, [mx.ones(8)], spec, 1)
    with pytest.raises(ValueError, match="h must be"):
        ext.decode_layer(mx.zeros((1, 2, 8)), keys, keys, None, mx.array([0], dtype=mx.int32), cos, cos, [], spec, 1)
    with pytest.raises(ValueError, match="seven projections"):
        ext.layer_spec(8, 16, 2, 1, 4, 1e-5, 0.5, False, [0] * 6, [0] * 7, [False] * 7, False, 1e-5)


def test_a_model_that_does_not_fit_runs_on_mlx_ops():
    """Qwen3's per-head norms are not in the layer primitive: its steps run on MLX ops."""
    the_day_is_done()
    args = ModelArgs(model_type="qwen3", hidden_size=32, num_hidden_layers=1, intermediate_size=48,
                     num_attention_heads=2, vocab_size=50, head_dim=16)
    from tiny_llm.qwen2 import expected_weight_shapes

    weights = {k: mx.ones(s) * 0.01 for k, s in expected_weight_shapes(args).items()}
    model = Qwen2Model(args, weights)
    assert fused_step.unfit_reason(model) == "per-head query and key norms (Qwen3)"
    cache = model.make_cache()
    model(mx.array([[1, 2]]), cache=cache)
    assert fused_step.decode(model, mx.array([[3]]), cache) is None


def test_a_prompt_gives_the_same_bits_whatever_its_chunks(default_model):
    """A prompt's positions go through the same ops however it is cut into chunks (a chunk
    of one token is not a decode step): the cache and the last position's logits are the
    same bits for chunks of 16 (one of them a single token) and one chunk."""
    the_day_is_done()
    from tiny_llm.model import prefill

    model, tokenizer = default_model
    tokens = mx.array([tokenizer.encode("Name a colour, then tell me why you like it so much, please, and say which one you would paint a room with.")[:18]])
    assert tokens.shape[1] == 18  # chunks of 16: 16 positions, then 1, then the last
    runs = []
    for step in (16, 64):
        cache = model.make_cache()
        logits = prefill(model, tokens, cache, step)
        runs.append((np.array(logits.astype(mx.float32)), np.array(cache[7].keys[:, :, :18].astype(mx.float32))))
    assert (runs[0][0] == runs[1][0]).all() and (runs[0][1] == runs[1][1]).all()
