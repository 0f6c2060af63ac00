"""Course: week 1 days 1 and 4 — building blocks: softmax and linear (day 1), SiLU (day 4).

Tests: tests/test_week1_day1.py, tests/test_week1_day4.py
"""

import mlx.core as mx


def softmax(x: mx.array, axis: int = -1) -> mx.array:
    """Numerically stable softmax along `axis`; the result has the dtype of `x`."""
    # BEGIN SOLUTION week1-day1
    # Sums in float32: in float16 the normaliser loses digits once V is large.
    x32 = x.astype(mx.float32)
    e = mx.exp(x32 - mx.max(x32, axis=axis, keepdims=True))
    return (e / mx.sum(e, axis=axis, keepdims=True)).astype(x.dtype)
    # END SOLUTION


def linear(x: mx.array, w: mx.array, bias: mx.array | None = None) -> mx.array:
    """`x @ w.T + bias` with `x [..., I]`, `w [O, I]`, `bias [O]` -> `[..., O]`."""
    # BEGIN SOLUTION week1-day1
    y = x @ w.T
    return y if bias is None else y + bias
    # END SOLUTION


def silu(x: mx.array) -> mx.array:
    """SiLU (swish): `x * sigmoid(x)`."""
    # BEGIN SOLUTION week1-day4
    return x * mx.sigmoid(x)
    # END SOLUTION
