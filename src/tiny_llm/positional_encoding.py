"""Course: week 1 day 2 — rotary positional encoding (RoPE)."""

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

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        """`x [B, L, H, D]` (D >= dims) with token positions `offset .. offset + L - 1`;
        `offset` is an int, or an array `[B]` with one start position per row."""
        # BEGIN SOLUTION week1-day2
        B, L, H, D = x.shape
        if D < self.dims:
            raise ValueError(f"RoPE dims={self.dims} exceeds the head dimension {D}")
        half = self.dims // 2
        # Angles in float32: positions times frequencies lose the low digits in float16.
        inv_freq = self.base ** (-mx.arange(0, half, dtype=mx.float32) * 2.0 / self.dims)
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
