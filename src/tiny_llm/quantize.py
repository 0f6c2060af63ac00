"""Course: week 2 day 1 — affine-quantized weights: packed integers, a scale and a bias per group.

A row of `I` values is cut into groups of `group_size`; each value is stored as a `bits`-bit
integer q, and stands for `scale * q + bias` of its group. 32 // bits integers are packed
into each uint32, lowest bits first (MLX's layout).

Tests: tests/test_week2_day1.py, tests/test_loader.py, tests/test_models.py
"""

from dataclasses import dataclass
from typing import TypeAlias

import mlx.core as mx

from . import kernels
from .basics import linear

SUPPORTED_BITS = (2, 4, 8)


@dataclass(frozen=True)
class QuantizedWeight:
    """A weight `[O, I]` kept quantized: `weight [O, I * bits / 32]` (uint32), `scales` and
    `biases` `[O, I / group_size]`. Stacked experts (`[X, O, I]`) carry the same leading axis
    on all three."""

    weight: mx.array
    scales: mx.array
    biases: mx.array
    group_size: int
    bits: int

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.weight.shape[:-1], self.weight.shape[-1] * 32 // self.bits)

    @property
    def dtype(self) -> mx.Dtype:
        return self.scales.dtype  # what dequantized values and products come out as

    def arrays(self) -> list[mx.array]:
        return [self.weight, self.scales, self.biases]


# A weight the model multiplies with: an array, or a `QuantizedWeight` kept packed (what a
# quantized checkpoint gives for its projections, embedding table and lm_head unless loaded
# with `dequantize=True`). Norm weights and biases are never quantized: plain `mx.array`.
Weight: TypeAlias = mx.array | QuantizedWeight


def dequantize(w: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int) -> mx.array:
    """Unpack `w [O, I * bits / 32]` (uint32) into `[O, I]` values `scale * q + bias`, in the
    dtype of `scales`. Same result as `mx.dequantize(w, scales, biases, group_size, bits)`."""
    # BEGIN SOLUTION week2-day1
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits}")
    O, packed = w.shape
    per_word = 32 // bits
    shifts = mx.arange(per_word, dtype=mx.uint32) * bits  # lowest bits hold the first value
    mask = mx.array((1 << bits) - 1, dtype=mx.uint32)
    q = (w[..., None] >> shifts) & mask  # O, packed, per_word
    I = packed * per_word
    q = q.reshape(O, I // group_size, group_size).astype(scales.dtype)  # O, groups, g
    values = q * scales[..., None] + biases[..., None]
    return values.reshape(O, I)
    # END SOLUTION


def quantized_linear(x: mx.array, qw: QuantizedWeight, bias: mx.array | None = None) -> mx.array:
    """`x @ W.T (+ bias)` without unpacking W: `x [..., I]` -> `[..., O]`. On the CPU, once
    week 2 day 6 is done, through our own kernel; else `mx.quantized_matmul`."""
    if _kernel_fits(x, qw.weight) and qw.bits in kernels.BITS and qw.group_size in kernels.GROUP_SIZES:
        return kernels.extension().quantized_matmul(x, qw.weight, qw.scales, qw.biases, bias, qw.group_size, qw.bits)
    y = mx.quantized_matmul(x, qw.weight, qw.scales, qw.biases, transpose=True,
                            group_size=qw.group_size, bits=qw.bits)
    return y if bias is None else y + bias


def project(x: mx.array, w: Weight, bias: mx.array | None = None) -> mx.array:
    """`linear(x, w, bias)`, or its quantized form when `w` is kept quantized. On the CPU,
    once week 2 day 6 is done, both run on our own kernels."""
    if isinstance(w, QuantizedWeight):
        return quantized_linear(x, w, bias)
    if _kernel_fits(x, w) and w.dtype in kernels.FLOATS:
        return kernels.extension().matmul(x, w, bias)
    return linear(x, w, bias)


def _kernel_fits(x: mx.array, w: mx.array) -> bool:
    """The engine's kernels take this product: a 2-D weight (stacked experts go to MLX's
    gather ops), float activations, the kernels on and their day done."""
    return w.ndim == 2 and x.dtype in kernels.FLOATS and kernels.active("week2-day6")
