"""Course: week 1 day 2 — rotary positional encoding (RoPE).

Tests: tests/test_week1_day2.py, tests/test_models.py, tests/test_progress.py
"""

import math

import mlx.core as mx


class RoPE:
    """Rotate pairs of features by an angle proportional to the token position.

    `dims` features of each head are rotated (the rest pass through). Pair `i` turns by
    `position * base ** (-2 i / dims)`. Two layouts exist:

    - traditional (interleaved): pairs are `(x[2i], x[2i + 1])` (GGUF / Meta checkpoints);
    - non-traditional (half-split): pairs are `(x[i], x[i + dims/2])` (Hugging Face).
    """

    def __init__(self, dims: int, base: float = 10000.0, traditional: bool = False):
        # BEGIN SOLUTION week1-day2
        if dims <= 0 or dims % 2:
            raise ValueError(f"RoPE dims must be a positive even number, got {dims}")
        if not base > 0:
            raise ValueError(f"RoPE base must be positive, got {base}")
        self.dims = dims
        self.base = float(base)
        self.traditional = traditional
        # END SOLUTION

    def inverse_frequencies(self) -> mx.array:
        """`[dims / 2]` float32: the angle pair `i` turns by per position, `base ** (-2 i / dims)`."""
        # BEGIN SOLUTION week1-day2
        # In float32: positions times frequencies lose the low digits in float16.
        return self.base ** (-mx.arange(0, self.dims // 2, dtype=mx.float32) * 2.0 / self.dims)
        # END SOLUTION

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        """`x [B, L, H, D]` (D >= dims) with token positions `offset .. offset + L - 1`;
        `offset` is an int, or an array `[B]` with one start position per row."""
        # BEGIN SOLUTION week1-day2
        B, L, H, D = x.shape
        if D < self.dims:
            raise ValueError(f"RoPE dims={self.dims} exceeds the head dimension {D}")
        half = self.dims // 2
        inv_freq = self.inverse_frequencies()  # half
        start = offset[:, None] if isinstance(offset, mx.array) else offset  # B, 1 or int
        positions = (mx.arange(L)[None, :] + start).astype(mx.float32)  # 1 or B, L
        theta = positions[..., None] * inv_freq  # 1 or B, L, half
        cos = mx.cos(theta)[:, :, None, :]  # 1 or B, L, 1, half
        sin = mx.sin(theta)[:, :, None, :]
        rot, rest = x[..., : self.dims], x[..., self.dims :]
        if self.traditional:
            pairs = rot.reshape(B, L, H, half, 2)
            x1, x2 = pairs[..., 0], pairs[..., 1]
        else:
            x1, x2 = rot[..., :half], rot[..., half:]
        y1 = x1 * cos - x2 * sin
        y2 = x1 * sin + x2 * cos
        if self.traditional:
            y = mx.stack([y1, y2], axis=-1).reshape(B, L, H, self.dims)
        else:
            y = mx.concatenate([y1, y2], axis=-1)
        y = y.astype(x.dtype)
        return y if rest.shape[-1] == 0 else mx.concatenate([y, rest], axis=-1)
        # END SOLUTION


# Context extension: how each checkpoint's `rope_scaling` changes the frequencies.
ROPE_SCALING_TYPES = ("default", "linear", "llama3")


def rope_scaling_type(scaling: dict | None) -> str:
    """The kind of a `config.json` `rope_scaling` entry (`type` or `rope_type`); `ValueError`
    for a kind tiny-llm does not implement, or a `factor` it needs and lacks."""
    if scaling is None:
        return "default"
    kind = scaling.get("rope_type", scaling.get("type")) or "default"
    if kind not in ROPE_SCALING_TYPES:
        raise ValueError(f"unsupported rope_scaling type {kind!r}: tiny-llm implements "
                         f"{', '.join(ROPE_SCALING_TYPES)}")
    if kind != "default":
        factor = scaling.get("factor")
        if not isinstance(factor, (int, float)) or not factor > 0:
            raise ValueError(f"rope_scaling {kind!r} needs a positive factor, got {factor!r}")
    if kind == "llama3":
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        if not 0 < low < high:
            raise ValueError(f"rope_scaling 'llama3' needs 0 < low_freq_factor < high_freq_factor, "
                             f"got {low!r} and {high!r}")
    return kind


class ScaledRoPE(RoPE):
    """RoPE with a checkpoint's `rope_scaling` applied to its frequencies, for contexts
    longer than the model was first trained on:

    - `linear` (position interpolation): every frequency divided by `factor`;
    - `llama3`: frequencies whose wavelength exceeds `original_max_position_embeddings /
      low_freq_factor` divided by `factor`, those shorter than `... / high_freq_factor`
      kept, and the band between blended smoothly.

    `fused` runs it as one `mx.fast.rope` call with these frequencies."""

    def __init__(self, dims: int, base: float, traditional: bool, scaling: dict, fused: bool = False):
        super().__init__(dims, base=base, traditional=traditional)
        self.kind = rope_scaling_type(scaling)
        self.scaling = dict(scaling)
        self.fused = fused

    def inverse_frequencies(self) -> mx.array:
        inv = super().inverse_frequencies()
        if self.kind == "default":
            return inv
        factor = float(self.scaling["factor"])
        if self.kind == "linear":
            return inv / factor
        low = float(self.scaling.get("low_freq_factor", 1.0))
        high = float(self.scaling.get("high_freq_factor", 4.0))
        context = float(self.scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        smooth = (context / wavelen - low) / (high - low)  # 0 at the long end of the band, 1 at the short
        blended = inv * ((1 - smooth) / factor + smooth)
        return mx.where(wavelen > context / low, inv / factor, mx.where(wavelen < context / high, inv, blended))

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        if not self.fused:
            return super().__call__(x, offset)
        y = mx.fast.rope(x.swapaxes(1, 2), self.dims, traditional=self.traditional, base=None, scale=1.0,
                         offset=offset, freqs=1.0 / self.inverse_frequencies())  # B, H, L, D
        return y.swapaxes(1, 2)
