"""Course: week 2 days 2, 4 and 5 — key/value caches, for one sequence and for a changing batch.

Each layer keeps the keys and values of the tokens it has seen, so a decode step feeds the
model one new token instead of the whole sequence.

`KVCache` holds one sequence (or a batch of sequences of the same length); `BatchKVCache`
holds a batch of left-padded sequences of different lengths, and lets rows leave
(`filter`) and join (`extend`) between decode steps.

Tests: tests/test_week2_day2.py, tests/test_week2_day4.py, tests/test_week2_day5.py
"""

import mlx.core as mx

from . import kernels
from .attention import causal_mask


class KVCache:
    """Keys and values `[B, H, S, D]` of one layer, grown in blocks of `step` positions.

    `offset` is the number of positions stored; the model asks the cache for the RoPE
    position of its next token (`rope_offset`) and for the attention mask (`make_mask`).
    """

    step = 256

    def __init__(self):
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0

    @property
    def rope_offset(self) -> int | mx.array:
        """The position of the next token: an int, or `[B]` per-row positions."""
        return self.offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Append `keys/values [B, H, L, D]`; return everything stored, `[B, H, offset, D]`."""
        # BEGIN SOLUTION week2-day2
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
        # END SOLUTION

    def attend(self, q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array | None:
        """Store `k/v [B, Hkv, L, D]`, then attention of `q [B, Hq, L, D]` over the buffers
        read in place by our kernel (week 3 day 6), causal from `offset`. None where the
        kernel does not run (another device, kernels off, the day not done)."""
        if not kernels.active("week3-day6"):
            return None
        start = self.offset
        self.update_and_fetch(k, v)
        return kernels.dense_attention(q, self.keys, self.values, start, scale)

    def make_mask(self, L: int, dtype: mx.Dtype = mx.float32) -> mx.array | None:
        """The additive mask for `L` new queries against the `offset + L` keys they will
        see (call before `update_and_fetch`); None when no key needs masking (`L == 1`)."""
        # BEGIN SOLUTION week2-day2
        return causal_mask(L, self.offset + L, dtype) if L > 1 else None
        # END SOLUTION

    def trim(self, n: int) -> int:
        """Forget the last `n` positions (at most `offset`); return how many were dropped.
        The storage stays allocated and is overwritten by the next update."""
        # BEGIN SOLUTION week2-day2
        if n < 0:
            raise ValueError(f"trim needs n >= 0, got {n}")
        n = min(n, self.offset)
        self.offset -= n
        return n
        # END SOLUTION

    @property
    def nbytes(self) -> int:
        """Bytes allocated for keys and values (including the unused tail of the block)."""
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


class BatchKVCache(KVCache):
    """A batch of sequences of different lengths, left-padded to a common length.

    Row `b` holds `left_padding[b]` unused slots, then its tokens; its token in slot `s`
    sits at position `s - left_padding[b]`, so RoPE sees the same positions as when the row
    runs alone. The mask hides every row's padding slots.
    """

    def attend(self, q: mx.array, k: mx.array, v: mx.array, scale: float) -> None:
        """Rows of a batch cache are left-padded: their masks come from `make_mask`."""
        return None

    def __init__(self, left_padding: list[int]):
        super().__init__()
        if not left_padding or any(p < 0 for p in left_padding):
            raise ValueError(f"left_padding must be a non-empty list of counts >= 0, got {left_padding!r}")
        self.left_padding = list(left_padding)

    @property
    def batch_size(self) -> int:
        return len(self.left_padding)

    @property
    def rope_offset(self) -> mx.array:
        # BEGIN SOLUTION week2-day4
        return mx.array([self.offset - p for p in self.left_padding], dtype=mx.int32)
        # END SOLUTION

    def make_mask(self, L: int, dtype: mx.Dtype = mx.float32) -> mx.array | None:
        """`[B, 1, L, offset + L]`: causal, minus each row's padding slots. A query in a
        padding slot still sees itself, so that no row of the softmax is empty (its output
        is never read)."""
        # BEGIN SOLUTION week2-day4
        S = self.offset + L
        if L == 1 and not any(self.left_padding):
            return None
        query = mx.arange(S - L, S)[None, :, None]  # 1, L, 1: the queries' slots
        key = mx.arange(S)[None, None, :]  # 1, 1, S
        pad = mx.array(self.left_padding)[:, None, None]  # B, 1, 1
        keep = ((key <= query) & (key >= pad)) | (key == query)  # B, L, S
        return mx.where(keep, 0.0, -mx.inf).astype(dtype)[:, None]  # B, 1, L, S
        # END SOLUTION

    def filter(self, rows: list[int]) -> None:
        """Keep only `rows` (in that order), and drop the padding every kept row shares."""
        # BEGIN SOLUTION week2-day4
        if not rows:
            raise ValueError("filter needs at least one row to keep")
        idx = mx.array(rows)
        self.left_padding = [self.left_padding[r] for r in rows]
        if self.keys is not None:
            self.keys, self.values = self.keys[idx], self.values[idx]
            shared = min(self.left_padding)
            if shared:
                self.keys = self.keys[:, :, shared:]
                self.values = self.values[:, :, shared:]
                self.offset -= shared
                self.left_padding = [p - shared for p in self.left_padding]
        # END SOLUTION

    def extend(self, other: "BatchKVCache") -> None:
        """Append the rows of `other` after this cache's rows. The shorter side is padded
        on the left so that both end at the same slot."""
        # BEGIN SOLUTION week2-day5
        S = max(self.offset, other.offset)

        def aligned(cache: "BatchKVCache") -> tuple[mx.array, mx.array, list[int]]:
            shift = S - cache.offset
            k, v = cache.keys[:, :, : cache.offset], cache.values[:, :, : cache.offset]
            if shift:
                B, H, _, D = k.shape
                k = mx.concatenate([mx.zeros((B, H, shift, D), k.dtype), k], axis=2)
                v = mx.concatenate([mx.zeros((B, H, shift, v.shape[-1]), v.dtype), v], axis=2)
            return k, v, [p + shift for p in cache.left_padding]

        if self.keys is None:  # nothing stored yet: take the other rows as they are
            self.keys, self.values = other.keys, other.values
            self.left_padding, self.offset = list(other.left_padding), other.offset
            return
        k1, v1, p1 = aligned(self)
        k2, v2, p2 = aligned(other)
        self.keys = mx.concatenate([k1, k2.astype(k1.dtype)])
        self.values = mx.concatenate([v1, v2.astype(v1.dtype)])
        self.left_padding = p1 + p2
        self.offset = S
        # END SOLUTION

    def trim(self, n: int) -> int:
        if n > 0 and self.offset - n < max(self.left_padding):
            raise ValueError(
                f"cannot trim {n} positions: a row holds only {self.offset - max(self.left_padding)} tokens"
            )
        return super().trim(n)
