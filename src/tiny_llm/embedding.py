"""Course: week 1 day 5 — token embedding, also usable as the tied output projection.

Tests: tests/test_week1_day5.py, tests/test_progress.py
"""

import mlx.core as mx

from .quantize import QuantizedWeight, project, quantized_linear


class Embedding:
    """Look-up table `weight [V, D]`."""

    def __init__(self, weight: mx.array):
        self.weight = weight  # V, D

    def __call__(self, tokens: mx.array) -> mx.array:
        """`tokens [...]` (integers) -> `[..., D]`."""
        # BEGIN SOLUTION week1-day5
        return self.weight[tokens]
        # END SOLUTION

    def as_linear(self, x: mx.array) -> mx.array:
        """Tied output head: `x [..., D]` -> logits `[..., V]`."""
        # BEGIN SOLUTION week1-day5
        return project(x, self.weight)  # x @ weight.T (on the CPU, our kernel once week 2 day 6 is done)
        # END SOLUTION


class QuantizedEmbedding(Embedding):
    """The same table kept quantized: rows are unpacked when looked up, and the tied head
    multiplies with the packed weights."""

    def __init__(self, weight: QuantizedWeight):
        self.weight = weight

    def __call__(self, tokens: mx.array) -> mx.array:
        w = self.weight
        return mx.dequantize(w.weight[tokens], w.scales[tokens], w.biases[tokens],
                             group_size=w.group_size, bits=w.bits)

    def as_linear(self, x: mx.array) -> mx.array:
        return quantized_linear(x, self.weight)
