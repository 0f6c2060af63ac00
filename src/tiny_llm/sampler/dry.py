"""Engine — DRY ("don't repeat yourself"): penalise tokens that would extend a repeated sequence.

For each candidate token t, n is the length of the longest suffix of the history that also
occurred earlier immediately followed by t. Tokens with n >= allowed_length lose
`multiplier * base ** (n - allowed_length)`. A repeat never reaches back past the latest
sequence breaker, and a token that is itself a one-token breaker is never penalised
(llama.cpp's rules; multi-token breakers match as exact token sequences).

Tests: tests/test_sampler_engine.py, tests/test_sampler_facade.py, tests/test_sampler_fast.py
"""

from collections.abc import Sequence

import numpy as np

FLOAT_MAX_LOG = 88.7228391  # log of float32's largest value: the exponent's ceiling


def _z_array(s: Sequence[int]) -> list[int]:
    """z[i] = length of the longest common prefix of s and s[i:] (z[0] = len(s))."""
    n = len(s)
    z = [0] * n
    if n:
        z[0] = n
    left = right = 0
    for i in range(1, n):
        if i < right:
            z[i] = min(right - i, z[i - left])
        while i + z[i] < n and s[z[i]] == s[i + z[i]]:
            z[i] += 1
        if i + z[i] > right:
            left, right = i, i + z[i]
    return z


def _since_last_breaker(history: Sequence[int], breakers: Sequence[tuple[int, ...]]) -> int:
    """How many of the latest tokens follow the most recent breaker occurrence."""
    n = len(history)
    limit = n
    for b in breakers:
        k = len(b)
        for end in range(n, k - 1, -1):  # latest occurrence ends at `end` (exclusive)
            if tuple(history[end - k : end]) == b:
                limit = min(limit, n - end)
                break
    return limit


def dry_penalties(
    history: Sequence[int],
    *,
    multiplier: float,
    base: float,
    allowed_length: int,
    last_n: int,
    breakers: Sequence[tuple[int, ...]],
) -> dict[int, float]:
    """token -> amount to subtract from its logit."""
    if multiplier == 0 or last_n == 0:
        return {}
    window = list(history if last_n < 0 else history[-last_n:])
    n = len(window)
    if n <= allowed_length:
        return {}
    limit = _since_last_breaker(window, breakers)
    z = _z_array(window[::-1])  # z[i]: common suffix of window and window[: n - i]
    longest: dict[int, int] = {}
    for i in range(1, n):
        length = min(z[i], limit)
        if length >= allowed_length:
            token = window[n - i]
            if length > longest.get(token, 0):
                longest[token] = length
    single = {b[0] for b in breakers if len(b) == 1}
    max_exponent = FLOAT_MAX_LOG / np.log(base) if base > 1.000001 else 0
    out = {}
    for token, length in longest.items():
        if token in single:
            continue
        exponent = length - allowed_length
        if max_exponent > 0 and exponent > max_exponent:
            exponent = max_exponent
        out[token] = multiplier * base**exponent
    return out
