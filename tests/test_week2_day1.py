"""Week 2, day 1: unpacking affine-quantized weights."""

import mlx.core as mx
import numpy as np
import pytest

from tiny_llm.quantize import dequantize

# mx.dequantize computes scale * q + bias in the scales' dtype, as the exercise does; the
# remaining differences are one rounding of that product in half precision.
TOL = {mx.float32: 1e-6, mx.float16: 2e-3, mx.bfloat16: 1.6e-2}


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("shape", [(1, 128), (7, 256), (64, 512)])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_dequantize_matches_mlx(bits, group_size, shape, dtype):
    """Unpacked values equal mx.dequantize's for every bit width, group size and dtype."""
    w = mx.random.normal(shape, key=mx.random.key(bits * 1000 + group_size + shape[0])).astype(dtype)
    packed, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
    ours = dequantize(packed, scales, biases, group_size, bits)
    ref = mx.dequantize(packed, scales, biases, group_size=group_size, bits=bits)
    assert ours.shape == shape and ours.dtype == ref.dtype == dtype
    np.testing.assert_allclose(np.array(ours.astype(mx.float32)), np.array(ref.astype(mx.float32)),
                               atol=TOL[dtype], rtol=TOL[dtype])


def test_packing_order_by_hand():
    """One uint32 holding the 4-bit values 0..7, lowest bits first: 0x76543210."""
    packed = mx.array([[0x76543210, 0xFEDCBA98]], dtype=mx.uint32)  # values 0..15
    scales = mx.array([[0.5]], dtype=mx.float32)
    biases = mx.array([[-1.0]], dtype=mx.float32)
    out = dequantize(packed, scales, biases, group_size=16, bits=4)
    assert out.tolist() == [[0.5 * q - 1.0 for q in range(16)]]


def test_two_bit_and_eight_bit_by_hand():
    """2-bit: 16 values per word; 8-bit: 4 values per word, each with its group's scale."""
    two = dequantize(mx.array([[0b11100100] + [0] * 1], dtype=mx.uint32),
                     mx.array([[1.0]]), mx.array([[0.0]]), group_size=32, bits=2)
    assert two.tolist()[0][:5] == [0.0, 1.0, 2.0, 3.0, 0.0]
    eight = dequantize(mx.array([[0x04030201, 0x08070605]], dtype=mx.uint32),
                       mx.array([[1.0, 10.0]]), mx.array([[0.0, 0.5]]), group_size=4, bits=8)
    assert eight.tolist() == [[1.0, 2.0, 3.0, 4.0, 50.5, 60.5, 70.5, 80.5]]


@pytest.mark.parametrize("module, bits", [("model.embed_tokens", 8), ("model.layers.3.mlp.down_proj", 4)])
def test_default_model_tables_unpack_like_mlx(default_model_dir, module, bits):
    """The real default model's 8-bit embedding rows and a 4-bit layer unpack like MLX's."""
    arrays = mx.load(str(default_model_dir / "model.safetensors"))
    w, scales, biases = (arrays[f"{module}.{k}"][:64] for k in ("weight", "scales", "biases"))
    assert w.shape[1] * 32 // bits == scales.shape[1] * 32  # group size 32
    ours = dequantize(w, scales, biases, 32, bits)
    ref = mx.dequantize(w, scales, biases, group_size=32, bits=bits)
    # float16 scales: one rounding of scale * q + bias.
    np.testing.assert_allclose(np.array(ours.astype(mx.float32)), np.array(ref.astype(mx.float32)),
                               atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("bits", [3, 5, 16])
def test_unsupported_bit_widths_are_refused(bits):
    with pytest.raises(ValueError, match=f"bits must be one of \\(2, 4, 8\\), got {bits}"):
        dequantize(mx.zeros((1, 4), dtype=mx.uint32), mx.ones((1, 1)), mx.zeros((1, 1)), 32, bits)
