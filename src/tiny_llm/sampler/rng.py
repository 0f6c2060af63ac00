"""Engine — counter-based randomness: one uniform per row from `(seed, draw number, stream)`.

A row's numbers depend only on its own seed and on how many tokens it has drawn, never on
the other rows of the batch; the same numbers come out on every device.

Tests: tests/test_sampler_draw_order.py
"""

import mlx.core as mx

# Stream ids: the token draw, XTC's coin and the draw again after a grammar rejected the
# first one are independent. Speculative decoding's acceptance tests and draws have a
# stream of their own; it shares GRAMMAR's number because it never runs with a grammar.
DRAW, XTC, GRAMMAR = 0, 1, 2
SPECULATIVE = GRAMMAR


def mix(x: mx.array) -> mx.array:
    """A 32-bit integer hash with good avalanche (all bits of x affect all bits out)."""
    x = x ^ (x >> 16)
    x = x * mx.array(0x7FEB352D, dtype=mx.uint32)
    x = x ^ (x >> 15)
    x = x * mx.array(0x846CA68B, dtype=mx.uint32)
    return x ^ (x >> 16)


def bits(seeds: mx.array, counters: mx.array, stream: int) -> mx.array:
    """`[B]` uint32: each row's 32 random bits for this draw (what its uniform is made from)."""
    h = mix(seeds.astype(mx.uint32))
    h = mix(h ^ counters.astype(mx.uint32))
    return mix(h ^ mx.array((stream * 0x9E3779B9 + 0x632BE5AB) & 0xFFFFFFFF, dtype=mx.uint32))


def uniform(seeds: mx.array, counters: mx.array, stream: int) -> mx.array:
    """`[B]` floats in the open interval (0, 1) with 23 random bits each."""
    # The top 23 bits, centred in their bucket: (k + 0.5) / 2**23 is exact in float32, so
    # the result is never 0 or 1.
    return ((bits(seeds, counters, stream) >> 9).astype(mx.float32) + 0.5) * (1.0 / (1 << 23))
