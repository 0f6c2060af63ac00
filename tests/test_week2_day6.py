"""Week 2, day 6: our own quantized matrix product (and the float one built on its tiles),
a C++ MLX primitive for the CPU, against MLX's own ops."""

import mlx.core as mx
import numpy as np
import pytest

from conftest import EPS
from tiny_llm import kernels
from tiny_llm.quantize import QuantizedWeight, project


# Every test here runs our kernel: on the CPU, built (the error says why not).
pytestmark = pytest.mark.usefixtures("kernels_on_the_cpu")


def random_quantized(N, K, dtype, group_size, bits, seed):
    keys = mx.random.split(mx.random.key(seed))
    w = mx.random.normal((N, K), key=keys[0])
    packed, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
    return packed, scales.astype(dtype), biases.astype(dtype)


def reference_qmm(x, packed, scales, biases, group_size, bits):
    """MLX's op on float32 copies: exact to float32 summation."""
    return mx.quantized_matmul(x.astype(mx.float32), packed, scales.astype(mx.float32),
                               biases.astype(mx.float32), transpose=True, group_size=group_size, bits=bits)


# Our kernel sums in float32 and rounds once at the end; the reference sums in float32 too
# (MLX's op on float32 copies of the same numbers), so the results differ by the output's
# rounding plus float32 reassociation: a few units (EPS) of the dtype relative to the
# largest output.
def assert_close(ours, ref, dtype, ulps=4):
    ours32, ref32 = np.array(ours.astype(mx.float32)), np.array(ref.astype(mx.float32))
    bound = ulps * EPS[dtype] * max(1.0, np.abs(ref32).max())
    assert np.abs(ours32 - ref32).max() <= bound, f"max error {np.abs(ours32 - ref32).max()} > {bound}"


# M: decode (1, 2), the first tiled size past the decode path (7), prefill (64, 300). K and N
# are not multiples of the tiles (4 rows of x, 2, 16 and 64 rows of W, 8 or 16 features).
CASES = [  # (M, K, N, dtype, group_size, bits)
    (1, 576, 1536, mx.float16, 32, 4), (1, 96, 257, mx.float32, 32, 8), (2, 192, 100, mx.bfloat16, 64, 4),
    (7, 384, 33, mx.float32, 128, 4), (7, 160, 70, mx.float16, 32, 8), (64, 576, 300, mx.float16, 32, 4),
    (64, 256, 17, mx.bfloat16, 128, 8), (300, 128, 65, mx.float32, 64, 4), (3, 32, 1, mx.float32, 32, 4),
    (300, 64 * 3, 129, mx.bfloat16, 64, 8),
]


@pytest.mark.parametrize("M, K, N, dtype, group_size, bits", CASES)
def test_quantized_matmul_equals_mlx(M, K, N, dtype, group_size, bits):
    packed, scales, biases = random_quantized(N, K, dtype, group_size, bits, seed=M * 7 + N)
    x = mx.random.normal((M, K), key=mx.random.key(M + K)).astype(dtype)
    ours = kernels.quantized_matmul(x, packed, scales, biases, group_size, bits)
    assert ours.shape == (M, N) and ours.dtype == dtype
    assert_close(ours, reference_qmm(x, packed, scales, biases, group_size, bits), dtype)


def test_packing_by_hand():
    """One row of 32 4-bit values 0..7 repeated (0x76543210), scale 0.5, bias -1, times ones:
    4 * (0.5 * (0 + ... + 7) - 8) = 4 * (14 - 8) = 24."""
    w = mx.array([[0x76543210] * 4], dtype=mx.uint32)
    y = kernels.quantized_matmul(mx.ones((1, 32)), w, mx.array([[0.5]]), mx.array([[-1.0]]), 32, 4)
    assert y.tolist() == [[24.0]]
    x = mx.arange(32, dtype=mx.float32)[None] * mx.array([[1.0], [0.0], [2.0], [1.0], [-1.0]])  # 5 rows: tiled
    y = kernels.quantized_matmul(x, w, mx.array([[0.5]]), mx.array([[-1.0]]), 32, 4)
    values = np.array([0.5 * (k % 8) - 1.0 for k in range(32)])
    expected = np.array(x) @ values
    assert np.array(y)[:, 0].tolist() == expected.tolist()


def test_leading_axes_and_fused_bias():
    packed, scales, biases = random_quantized(40, 128, mx.float32, 64, 4, seed=3)
    x = mx.random.normal((2, 3, 128), key=mx.random.key(4))
    bias = mx.random.normal((40,), key=mx.random.key(5))
    ours = kernels.quantized_matmul(x, packed, scales, biases, 64, 4, bias=bias)
    ref = reference_qmm(x, packed, scales, biases, 64, 4) + bias
    assert ours.shape == (2, 3, 40)
    assert_close(ours, ref, mx.float32)


@pytest.mark.parametrize("M", [1, 9])
def test_threads_give_the_same_bits(M):
    """Each output is summed by one thread in the same order, whatever the thread count."""
    packed, scales, biases = random_quantized(300, 576, mx.float16, 32, 4, seed=11)
    x = mx.random.normal((M, 576), key=mx.random.key(12)).astype(mx.float16)
    results = []
    for n in (1, 2, 3):
        with kernels.threads(n):
            results.append(np.array(kernels.quantized_matmul(x, packed, scales, biases, 32, 4).astype(mx.float32)))
    assert (results[0] == results[1]).all() and (results[0] == results[2]).all()
    assert_close(mx.array(results[0]), reference_qmm(x, packed, scales, biases, 32, 4), mx.float16)


@pytest.mark.parametrize("M, K, N, dtype", [(1, 96, 70, mx.float32), (2, 64, 33, mx.float16), (7, 200, 129, mx.bfloat16),
                                            (64, 576, 100, mx.float32), (300, 40, 17, mx.float16)])
def test_float_matmul_equals_mlx(M, K, N, dtype):
    x = mx.random.normal((M, K), key=mx.random.key(M)).astype(dtype)
    w = mx.random.normal((N, K), key=mx.random.key(N)).astype(dtype)
    bias = mx.random.normal((N,), key=mx.random.key(K)).astype(dtype)
    ours = kernels.matmul(x, w, bias)
    ref = x.astype(mx.float32) @ w.astype(mx.float32).T + bias.astype(mx.float32)
    assert ours.shape == (M, N) and ours.dtype == dtype
    assert_close(ours, ref, dtype, ulps=4 if dtype != mx.float32 else 64)  # float32: K-long sums reassociated


def test_the_engine_multiplies_with_the_kernel(monkeypatch):
    """`project` (every linear layer of the model) goes through our primitive on the CPU, and
    through MLX's op once the kernels are turned off; both give the same numbers."""
    packed, scales, biases = random_quantized(64, 128, mx.float16, 32, 4, seed=21)
    qw = QuantizedWeight(packed, scales, biases, 32, 4)
    x = mx.random.normal((3, 128), key=mx.random.key(22)).astype(mx.float16)
    ext = kernels.extension()
    ext.probe("week2-day6")  # the day's functions run (a starter's stub raises here)
    calls = []
    real = ext.quantized_matmul
    monkeypatch.setattr(kernels, "extension", lambda: type("Ext", (), {
        "quantized_matmul": staticmethod(lambda *a: calls.append(a) or real(*a)), "probe": ext.probe})())
    with_kernel = project(x, qw)
    assert len(calls) == 1
    before = kernels.enable(False)
    try:
        without = project(x, qw)
    finally:
        kernels.enable(before)
    assert len(calls) == 1
    assert_close(with_kernel, reference_qmm(x, packed, scales, biases, 32, 4), mx.float16)
    # MLX's op sums in half precision on the CPU: it is further from the float32 result.
    np.testing.assert_allclose(np.array(with_kernel.astype(mx.float32)), np.array(without.astype(mx.float32)),
                               atol=0.1, rtol=0.02)


def test_default_model_greedy_tokens_equal_mlx_lm(default_model_dir, reference_default_model):
    """The default model on our kernels writes mlx-lm's greedy tokens."""
    import tiny_llm

    kernels.extension().probe("week2-day6")  # the day's functions run (a starter's stub raises here)
    model, tokenizer = tiny_llm.load(str(default_model_dir))
    # Week 2 day 2's prompt and length: mlx-lm's tokens are computed once for both days.
    ids = tokenizer.encode("Once upon a time, in a small village,")
    ours = [r.token for r in tiny_llm.stream_generate(model, tokenizer, ids, max_tokens=16)]
    assert ours == reference_default_model.greedy(ids, 16)


def test_a_row_gets_the_same_bits_alone_and_in_a_batch():
    """Decode (1 row), a few rows and a prompt of many take different paths through the
    kernel, with the same arithmetic per output: row 5's result does not change."""
    packed, scales, biases = random_quantized(130, 576, mx.float16, 32, 4, seed=31)
    x = mx.random.normal((70, 576), key=mx.random.key(32)).astype(mx.float16)
    alone = np.array(kernels.quantized_matmul(x[5:6], packed, scales, biases, 32, 4).astype(mx.float32))
    for rows in (x[4:7], x[:9], x):
        at = 5 - (4 if rows.shape[0] == 3 else 0)
        batched = np.array(kernels.quantized_matmul(rows, packed, scales, biases, 32, 4).astype(mx.float32))
        assert (batched[at] == alone[0]).all()
    w = mx.random.normal((33, 100), key=mx.random.key(33))  # K not a multiple of 8: the rest too
    y = mx.random.normal((9, 100), key=mx.random.key(34))
    one = np.array(kernels.matmul(y[6:7], w))
    assert (np.array(kernels.matmul(y, w))[6] == one[0]).all()
