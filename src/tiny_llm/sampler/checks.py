"""Engine — argument checks shared by every entry point: one clear `ValueError` each.

Tests: tests/test_sampler_engine.py, tests/test_sampler_facade.py, tests/test_sampler_fast.py
"""

import math
import numbers


class RowError(ValueError):
    """A problem with one row of a batch (`row`, its index in the logits): the other rows
    can be sampled without it. Raised before any state changes."""

    def __init__(self, row: int, message: str):
        super().__init__(f"row {row}: {message}")
        self.row = row
        self.reason = message


def check_int(name: str, value, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an int; `ValueError` naming `name` if it is not an integer in range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    _check_range(name, value, minimum, maximum, False, False)
    return int(value)


def check_float(
    name: str,
    value,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    min_open: bool = False,
    max_open: bool = False,
) -> float:
    """`value` as a float; `ValueError` if it is not a real number in range (NaN never is)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    _check_range(name, value, minimum, maximum, min_open, max_open)
    return float(value)


def _check_range(name, value, minimum, maximum, min_open, max_open) -> None:
    low_bad = minimum is not None and (value <= minimum if min_open else value < minimum)
    high_bad = maximum is not None and (value >= maximum if max_open else value > maximum)
    if low_bad or high_bad:
        lo = "(-inf" if minimum is None else ("(" if min_open else "[") + f"{minimum}"
        hi = "inf)" if maximum is None else f"{maximum}" + (")" if max_open else "]")
        raise ValueError(f"{name} must be in {lo}, {hi}, got {value!r}")
