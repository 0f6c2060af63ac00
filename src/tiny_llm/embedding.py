"""Token embedding, also usable as the tied output projection."""

import mlx.core as mx


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
        return x @ self.weight.T
        # END SOLUTION
