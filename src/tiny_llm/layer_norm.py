"""Course: week 1 day 4 — RMS normalisation.

Tests: tests/test_week1_day4.py, tests/test_progress.py
"""

import mlx.core as mx

# The one default for the RMSNorm epsilon, read by `RMSNorm`, `FusedRMSNorm` and
# `ModelArgs.rms_norm_eps`. 1e-6 is what Hugging Face's Qwen2Config and LlamaConfig assume
# when a config.json omits `rms_norm_eps`; mlx.nn.RMSNorm's 1e-5 is a generic choice, not
# these models'. (Checkpoints state their own value, and the model passes it on.)
DEFAULT_RMS_NORM_EPS = 1e-6


class RMSNorm:
    """`y = x / sqrt(mean(x**2) + eps) * weight` over the last axis."""

    def __init__(self, weight: mx.array, eps: float = DEFAULT_RMS_NORM_EPS):
        self.weight = weight  # D
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        # BEGIN SOLUTION week1-day4
        # Statistics in float32: the mean of squares overflows or rounds badly in float16.
        x32 = x.astype(mx.float32)
        normed = x32 * mx.rsqrt(mx.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight * normed.astype(x.dtype)
        # END SOLUTION
