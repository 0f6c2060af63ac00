"""Week 1, day 2: rotary positional encoding (RoPE) on the [B, L, H, D] layout."""

import math

import mlx.core as mx
import numpy as np
import pytest

from tiny_llm.positional_encoding import RoPE

DTYPES = [mx.float32, mx.float16, mx.bfloat16]

# (atol, rtol) per dtype. float16 keeps 11 significant bits and bfloat16 only 8, so inputs
# and outputs rounded to half precision differ from the oracle by about one unit in the
# last place of values of order 1.
TOLERANCES = {
    mx.float32: (1e-5, 1e-5),
    mx.float16: (1e-2, 1e-2),
    mx.bfloat16: (5e-2, 5e-2),
}


def rope_tolerance(dtype: mx.Dtype, last_position: int) -> tuple[float, float]:
    """(atol, rtol) for positions up to `last_position`.

    In float32 the angle `position * freq` is off by about `position * 1.2e-7` rad, so the
    absolute error of the rotated features grows with the position.
    """
    atol, rtol = TOLERANCES[dtype]
    if dtype == mx.float32:
        atol *= 1 + last_position / 32
    return atol, rtol


def assert_close(actual: mx.array, expected: mx.array, atol: float, rtol: float) -> None:
    """Same shape, same dtype, and values within `atol` / `rtol`."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    np.testing.assert_allclose(
        np.array(actual.astype(mx.float32)),
        np.array(expected.astype(mx.float32)),
        atol=atol,
        rtol=rtol,
    )


def reference_rope(x: mx.array, dims: int, traditional: bool, base: float, offset: int):
    """mx.fast.rope, which wants positions on axis -2: [B, L, H, D] -> [B, H, L, D] and back."""
    y = mx.fast.rope(
        x.transpose(0, 2, 1, 3), dims, traditional=traditional, base=base, scale=1.0, offset=offset
    )
    return y.transpose(0, 2, 1, 3)  # B, L, H, D


SHAPES = [(1, 1, 1, 16), (2, 5, 4, 16), (1, 8, 4, 64), (3, 1, 4, 64)]  # B, L, H, D


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0, 7, 100])
@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_rope_matches_mlx_fast(shape, traditional, offset, dtype):
    """RoPE over all head features equals mx.fast.rope for both layouts and several offsets."""
    B, L, H, D = shape
    x = mx.random.normal(shape, key=mx.random.key(0)).astype(dtype)
    actual = RoPE(D, base=10000.0, traditional=traditional)(x, offset=offset)
    expected = reference_rope(x, D, traditional, 10000.0, offset)
    assert_close(actual, expected, *rope_tolerance(dtype, offset + L))


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("base", [500.0, 1_000_000.0])
def test_rope_matches_mlx_fast_other_bases(base, traditional):
    """RoPE honours `base` (Qwen2 uses 1e6) exactly as mx.fast.rope does."""
    x = mx.random.normal((2, 6, 2, 32), key=mx.random.key(1))
    actual = RoPE(32, base=base, traditional=traditional)(x, offset=3)
    expected = reference_rope(x, 32, traditional, base, 3)
    assert_close(actual, expected, *rope_tolerance(mx.float32, 9))


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims, D", [(16, 64), (32, 64), (8, 16)])
def test_rope_partial_dims_rotates_only_first_features(dims, D, traditional, dtype):
    """With dims < D only the first dims features rotate, as in mx.fast.rope; the rest pass."""
    x = mx.random.normal((2, 5, 3, D), key=mx.random.key(2)).astype(dtype)
    actual = RoPE(dims, traditional=traditional)(x, offset=7)
    assert_close(
        actual, reference_rope(x, dims, traditional, 10000.0, 7), *rope_tolerance(dtype, 12)
    )
    np.testing.assert_array_equal(
        np.array(actual[..., dims:].astype(mx.float32)), np.array(x[..., dims:].astype(mx.float32))
    )


@pytest.mark.parametrize("traditional", [False, True])
def test_rope_position_zero_is_identity(traditional):
    """The token at position 0 is not rotated."""
    x = mx.random.normal((2, 1, 4, 16), key=mx.random.key(3))
    np.testing.assert_allclose(
        np.array(RoPE(16, traditional=traditional)(x, offset=0)), np.array(x), atol=1e-6, rtol=0
    )


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("position", [1, 3])
def test_rope_exact_two_features(position, traditional):
    """With D = 2 the unit vector (1, 0) at position p becomes (cos p, sin p) in both layouts."""
    x = mx.array([1.0, 0.0]).reshape(1, 1, 1, 2)
    actual = RoPE(2, traditional=traditional)(x, offset=position).reshape(2)
    np.testing.assert_allclose(
        np.array(actual), [math.cos(position), math.sin(position)], atol=1e-6, rtol=0
    )


def test_rope_exact_layouts_pair_different_features():
    """Traditional rotates pairs (x0, x1), (x2, x3); half-split rotates (x0, x2), (x1, x3)."""
    # D = 4, base = 100: pair 0 turns by p rad, pair 1 by p / 10 rad.
    e0 = mx.array([1.0, 0.0, 0.0, 0.0]).reshape(1, 1, 1, 4)
    e1 = mx.array([0.0, 1.0, 0.0, 0.0]).reshape(1, 1, 1, 4)
    c1, s1, c02, s02 = math.cos(1.0), math.sin(1.0), math.cos(0.2), math.sin(0.2)

    def rotated(traditional: bool, x: mx.array, position: int) -> np.ndarray:
        return np.array(RoPE(4, base=100.0, traditional=traditional)(x, offset=position)).ravel()

    np.testing.assert_allclose(rotated(False, e0, 1), [c1, 0, s1, 0], atol=1e-6)
    np.testing.assert_allclose(rotated(False, e1, 2), [0, c02, 0, s02], atol=1e-6)
    np.testing.assert_allclose(rotated(True, e0, 1), [c1, s1, 0, 0], atol=1e-6)
    np.testing.assert_allclose(rotated(True, e1, 1), [-s1, c1, 0, 0], atol=1e-6)


@pytest.mark.parametrize("traditional", [False, True])
def test_rope_offset_continues_positions(traditional):
    """Encoding a suffix with offset k equals the tail of encoding the whole sequence."""
    x = mx.random.normal((2, 9, 3, 16), key=mx.random.key(4))
    rope = RoPE(16, traditional=traditional)
    whole = rope(x, offset=0)
    tail = rope(x[:, 4:], offset=4)
    assert_close(tail, whole[:, 4:], *rope_tolerance(mx.float32, 9))


def test_rope_batch_row_equals_single_row():
    """Each batch row of the output equals the output computed on that row alone."""
    x = mx.random.normal((3, 5, 2, 16), key=mx.random.key(5))
    rope = RoPE(16)
    batched = rope(x, offset=2)
    for i in range(3):
        single = rope(x[i : i + 1], offset=2)
        assert_close(batched[i : i + 1], single, *rope_tolerance(mx.float32, 7))


@pytest.mark.parametrize("dims", [15, 1, 0, -4])
def test_rope_rejects_odd_or_non_positive_dims(dims):
    """Odd or non-positive dims raise a ValueError naming the value."""
    with pytest.raises(ValueError, match=rf"RoPE dims must be a positive even number, got {dims}"):
        RoPE(dims)


@pytest.mark.parametrize("base", [0.0, -10000.0])
def test_rope_rejects_non_positive_base(base):
    """A base that is not positive raises a ValueError."""
    with pytest.raises(ValueError, match="RoPE base must be positive"):
        RoPE(16, base=base)


def test_rope_rejects_dims_larger_than_head():
    """Rotating more features than the head has raises a ValueError."""
    with pytest.raises(ValueError, match="RoPE dims=32 exceeds the head dimension 16"):
        RoPE(32)(mx.zeros((1, 2, 1, 16)))


@pytest.mark.parametrize("dims, base", [(16, 10_000.0), (64, 1_000_000.0), (2, 500.0)])
def test_inverse_frequencies_exact(dims, base):
    """Pair i turns by base ** (-2 i / dims) per position, in float32."""
    inv = RoPE(dims, base=base).inverse_frequencies()
    assert inv.dtype == mx.float32 and inv.shape == (dims // 2,)
    want = base ** (-2.0 * np.arange(dims // 2) / dims)
    np.testing.assert_allclose(np.array(inv), want, rtol=2e-6)


def test_rope_turns_by_its_inverse_frequencies():
    """`__call__` takes its angles from `inverse_frequencies()`, so that a subclass that
    rescales them (RoPE scaling for long contexts) changes the rotation: all zero turns
    nothing, all pi/2 turns pair (x1, x2) into (-x2, x1) at position 1."""

    class Still(RoPE):
        def inverse_frequencies(self):
            return mx.zeros((self.dims // 2,))

    class Quarter(RoPE):
        def inverse_frequencies(self):
            return mx.full((self.dims // 2,), math.pi / 2)

    x = mx.random.normal((1, 2, 3, 8), key=mx.random.key(5))
    np.testing.assert_allclose(np.array(Still(8)(x, offset=9)), np.array(x), atol=1e-6)
    y = np.array(Quarter(8)(x, offset=1))[0, 0]  # position 1
    x0 = np.array(x)[0, 0]
    np.testing.assert_allclose(y, np.concatenate([-x0[:, 4:], x0[:, :4]], axis=-1), atol=1e-6)
