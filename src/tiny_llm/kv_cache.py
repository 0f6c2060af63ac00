"""Key/value cache: each layer keeps the keys and values of the tokens it has seen."""

import mlx.core as mx


class KVCache:
    """Keys and values `[B, H, S, D]` of one layer, grown in blocks of `step` positions."""

    step = 256

    def __init__(self):
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0  # number of positions stored

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Append `keys/values [B, H, L, D]`; return everything stored, `[B, H, offset, D]`."""
        B, H, L, D = keys.shape
        needed = self.offset + L
        if self.keys is None or needed > self.keys.shape[2]:
            # Grow by whole blocks so that most steps write in place instead of copying.
            size = (needed + self.step - 1) // self.step * self.step
            new_k = mx.zeros((B, H, size, D), dtype=keys.dtype)
            new_v = mx.zeros((B, H, size, values.shape[-1]), dtype=values.dtype)
            if self.keys is not None:
                new_k[:, :, : self.offset] = self.keys[:, :, : self.offset]
                new_v[:, :, : self.offset] = self.values[:, :, : self.offset]
            self.keys, self.values = new_k, new_v
        self.keys[:, :, self.offset : needed] = keys
        self.values[:, :, self.offset : needed] = values
        self.offset = needed
        return self.keys[:, :, :needed], self.values[:, :, :needed]
