"""RMS normalisation."""

import mlx.core as mx


class RMSNorm:
    """`y = x / sqrt(mean(x**2) + eps) * weight` over the last axis."""

    def __init__(self, weight: mx.array, eps: float = 1e-5):
        self.weight = weight  # D
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        # BEGIN SOLUTION week1-day4
        # Statistics in float32: the mean of squares overflows or rounds badly in float16.
        x32 = x.astype(mx.float32)
        normed = x32 * mx.rsqrt(mx.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight * normed.astype(x.dtype)
        # END SOLUTION
