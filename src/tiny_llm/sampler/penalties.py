"""Engine — repetition, presence and frequency penalties: the one home of their formulas.

Tests: tests/test_sampler_engine.py, tests/test_sampler_facade.py, tests/test_sampler_fast.py
"""

import mlx.core as mx


def token_counts(tokens: mx.array, vocab_size: int, batch: int) -> mx.array:
    """How often each token occurs: `tokens [T]` (shared by all rows) or `[B, T]` -> `[B, V]`."""
    if tokens.ndim == 1:
        counts = mx.zeros((vocab_size,), dtype=mx.int32).at[tokens].add(1)
        return mx.broadcast_to(counts, (batch, vocab_size))
    B, _ = tokens.shape
    rows = mx.broadcast_to(mx.arange(B)[:, None], tokens.shape)  # B, T: each token's own row
    return mx.zeros((B, vocab_size), dtype=mx.int32).at[rows, tokens].add(1)


def apply_repetition(logits: mx.array, counts: mx.array, penalty: float | mx.array) -> mx.array:
    """Divide positive logits of seen tokens by `penalty`, multiply negative ones."""
    penalised = mx.where(logits < 0, logits * penalty, logits / penalty)
    return mx.where(counts > 0, penalised, logits)


def apply_presence(logits: mx.array, counts: mx.array, penalty: float | mx.array) -> mx.array:
    """Subtract `penalty` once from every seen token."""
    return logits - penalty * (counts > 0).astype(logits.dtype)


def apply_frequency(logits: mx.array, counts: mx.array, penalty: float | mx.array) -> mx.array:
    """Subtract `penalty` once per occurrence."""
    return logits - penalty * counts.astype(logits.dtype)
