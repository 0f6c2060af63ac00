"""Engine — numbers as automata: the canonical decimals in a range that are multiples of steps.

    number_dfa(integer=False, low=Fraction(0), high=Fraction(1), high_exclusive=True)
    # accepts "0", "0.5", "0.999"; rejects "1", "-0.5", "0.50", "1e-3"
    number_dfa(integer=True, multiples=(Fraction(5),)).accepts("-15")   # True
    canonical(0.25)   # '0.25'

A JSON schema's numeric keywords (`minimum`, `maximum`, `exclusive*`, `multipleOf`, `type:
integer`) describe a set of numbers. This module writes that set as a `DFA` over the characters
`-0123456789.`, every number in its one *canonical* spelling: an optional `-`, the integral part
without leading zeros (`0` alone is allowed), optionally `.` and fraction digits whose last digit
is not `0`; no exponent and no `-0`. So `1.5`, `-0.25`, `10`, `0`, but not `1.50`, `1.0`, `01`,
`.5`, `1.`, `1e3` or `-0`.

How much is spelled (a narrowing JSON Schema does not make):

- An unbounded side stops at integral parts of `max_digits` digits (16: magnitudes below
  10**16), or of as many digits as a bound has, if more (a bound of 1e300 is honoured exactly).
- Fractions have at most `max_fraction` digits, or as many as a bound has, if more (so 1e-20
  as both bounds leaves "0.00000000000000000001").

Bounds and steps may be int, float, Fraction or Decimal; a float is read from its shortest
spelling (0.1 is 1/10, not the binary value). A bound whose decimals do not end (Fraction(1, 3))
is replaced by the nearest spelled number inside it, which keeps the same numbers.

`multipleOf`: for q = a/b in lowest terms (a, b > 0), x is a multiple of q when x/q is an
integer. Write b = b25 * b' with b25 made of the factors 2 and 5 of b and b' coprime to 10. The
multiples k*a/b of q that have a finite decimal spelling are exactly the multiples of a/b25: the
lowest denominator of k*a/b is b / gcd(k, b), which has no prime factor but 2 and 5 exactly when
b' divides k. So q is replaced by a/b25 (1/3 -> 1, 2/3 -> 2, 7/12 -> 7/4); this is exact, never
a narrowing. Several steps (and `integer`, the step 1) combine into their least common multiple,
lcm(a/b, c/d) = lcm(a, c) / gcd(b, d) in lowest terms. A step needing more fraction digits than
are spelled raises ValueError.

The automaton is built directly, state by state, then minimized. A state holds the syntax read so
far (the count of integral or fraction digits), for each bound how the digits read compare with
the bound's digits at the same places, and the remainder of the digits read modulo the step's
numerator (x is a multiple of A/10**d when x * 10**d is an integer divisible by A). Remainders
with the same future are merged as they appear, so the building holds few more states than
the result. An automaton past `limits.MAX_STATES` states raises ValueError naming the range
and the step.

Tests: tests/test_constrain_numbers.py
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from .automata import DFA, Edge
from .limits import MAX_STATES

__all__ = ["canonical", "exact", "number_dfa", "value_dfa"]

MINUS, DOT, ZERO = ord("-"), ord("."), ord("0")

# How the digits read compare with a bound's digits at the same places.
LT, EQ, GT = -1, 0, 1

Number = int | float | Fraction | Decimal


# ---- values ---------------------------------------------------------------------------------


def exact(value: Number) -> Fraction:
    """The number as a Fraction; a float is read from its shortest spelling (0.1 -> 1/10)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, Decimal)):
        raise TypeError(f"json schema: a number must be int, float, Fraction or Decimal, "
                        f"got {type(value).__name__}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"json schema: a number must be finite, got {value}")
        return Fraction(repr(value))
    if isinstance(value, Decimal) and not value.is_finite():
        raise ValueError(f"json schema: a number must be finite, got {value}")
    return Fraction(value)


def _places(value: Fraction) -> int | None:
    """The count of fraction digits of the decimal spelling, None if it does not end."""
    rest, twos, fives = value.denominator, 0, 0
    while rest % 2 == 0:
        rest, twos = rest // 2, twos + 1
    while rest % 5 == 0:
        rest, fives = rest // 5, fives + 1
    return max(twos, fives) if rest == 1 else None


def canonical(value: Number) -> str:
    """The canonical plain decimal spelling: canonical(Fraction(-5, 2)) == '-2.5',
    canonical(1e20) == '100000000000000000000', canonical(-0.0) == '0'."""
    x = exact(value)
    count = _places(x)
    if count is None:
        raise ValueError(f"json schema: {x} has no finite decimal spelling")
    digits = str(abs(x.numerator) * 10**count // x.denominator).rjust(count + 1, "0")
    text = f"{digits[:-count]}.{digits[-count:]}" if count else digits
    return "-" + text if x < 0 else text


def value_dfa(value: Number) -> DFA:
    """The automaton of the one canonical spelling of `value`."""
    return DFA.literal(canonical(value))


# ---- steps ----------------------------------------------------------------------------------


def _terminating_step(q: Fraction) -> Fraction:
    """The step whose multiples are the multiples of q that have finite decimal spellings."""
    other = q.denominator
    for p in (2, 5):
        while other % p == 0:
            other //= p
    return Fraction(q.numerator, q.denominator // other)


def _combined_step(integer: bool, multiples: tuple[Number, ...]) -> Fraction | None:
    """The step whose multiples are the finite decimals that are multiples of every q (and
    integers if `integer`); None when nothing is asked."""
    step = Fraction(1) if integer else None
    for value in multiples:
        q = exact(value)
        if q <= 0:
            raise ValueError(f"json schema: multipleOf must be greater than 0, got {_spelled(q)}")
        q = _terminating_step(q)
        if step is not None:
            q = Fraction(math.lcm(step.numerator, q.numerator), math.gcd(step.denominator, q.denominator))
        step = q
    return step


def _spelled(x: Fraction) -> str:
    return canonical(x) if _places(x) is not None else str(x)


# ---- bounds ---------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)  # compared by identity: `_bound` makes one per value, fast to hash
class _Bound:
    """A bound of a magnitude (>= 0), as the digits of its canonical spelling."""

    integral: str  # "0" below 1
    fraction: str  # no trailing zero
    exclusive: bool

    def int_digit(self, n: int) -> int:
        return ord(self.integral[n]) - ZERO

    def frac_digit(self, j: int) -> int:
        return ord(self.fraction[j]) - ZERO if j < len(self.fraction) else 0


@dataclass(frozen=True)
class _Side:
    """The magnitudes y with low <= y <= high (or <), read after the sign."""

    low: _Bound
    high: _Bound


@functools.lru_cache(maxsize=64)
def _bound(value: Fraction, exclusive: bool) -> _Bound:
    integral, _, fraction = canonical(value).partition(".")
    return _Bound(integral, fraction, exclusive)


def _side(low: tuple[Fraction, bool], high: tuple[Fraction, bool]) -> _Side | None:
    if low[0] > high[0] or (low[0] == high[0] and (low[1] or high[1])):
        return None
    return _Side(_bound(*low), _bound(*high))


def _sides(low: tuple[Fraction, bool] | None, high: tuple[Fraction, bool] | None,
           cap: Fraction) -> tuple[_Side | None, _Side | None]:
    """The non-negative numbers' magnitudes, then the negative numbers' (both bounds finite)."""
    zero = Fraction(0)
    positive = negative = None
    if high is None or high[0] >= 0:
        positive = _side(low if low is not None and low[0] >= 0 else (zero, False),
                         high if high is not None else (cap, False))
    if low is None or low[0] < 0:
        negative = _side((-high[0], high[1]) if high is not None and high[0] < 0 else (zero, True),
                         (-low[0], low[1]) if low is not None else (cap, False))
    return positive, negative


def _rounded(bound: Fraction, exclusive: bool, up: bool, digits: int) -> tuple[Fraction, bool]:
    """A bound without a finite spelling, as the nearest one with `digits` fraction digits
    inside it: the numbers spelled with that many digits are the same on both sides of it."""
    if _places(bound) is not None:
        return bound, exclusive
    scaled = bound * 10**digits
    return Fraction(math.ceil(scaled) if up else math.floor(scaled), 10**digits), False


# ---- the automaton --------------------------------------------------------------------------


def number_dfa(*, integer: bool, low: Number | None = None, low_exclusive: bool = False,
               high: Number | None = None, high_exclusive: bool = False,
               multiples: tuple[Number, ...] = (), max_digits: int = 16,
               max_fraction: int = 16) -> DFA:
    """The minimal automaton of the canonical spellings of the numbers x with low <= x (< if
    `low_exclusive`), x <= high (<), x/q an integer for every q in `multiples`, and x an
    integer if `integer`; a bound None is no bound. Empty (`DFA.empty()`) if no number is left.

    Raises ValueError (`json schema: ...`) for a step <= 0, a step needing more fraction
    digits than are spelled, or an automaton of more than `limits.MAX_STATES` states."""
    if isinstance(max_digits, bool) or not isinstance(max_digits, int) or max_digits < 1:
        raise ValueError(f"json schema: max_digits must be an int >= 1, got {max_digits!r}")
    if isinstance(max_fraction, bool) or not isinstance(max_fraction, int) or max_fraction < 0:
        raise ValueError(f"json schema: max_fraction must be an int >= 0, got {max_fraction!r}")
    bounds = [exact(b) for b in (low, high) if b is not None]
    fraction = max([max_fraction] + [_places(b) or 0 for b in bounds])
    integral = max([max_digits] + [len(str(abs(b.numerator) // b.denominator)) for b in bounds])
    step = _combined_step(integer, multiples)
    if step is None:
        modulus, fraction_digits = 1, fraction
    else:
        fraction_digits = _places(step)
        if fraction_digits > fraction:
            raise ValueError(f"json schema: multipleOf {canonical(step)} needs {fraction_digits} "
                             f"fraction digits; numbers are spelled with at most {fraction}")
        modulus = int(step * 10**fraction_digits)
    lower = None if low is None else _rounded(exact(low), low_exclusive, True, fraction_digits)
    upper = None if high is None else _rounded(exact(high), high_exclusive, False, fraction_digits)
    cap = 10**integral - Fraction(1, 10**fraction_digits)  # the largest magnitude spelled
    positive, negative = _sides(lower, upper, cap)
    if positive is None and negative is None:
        return DFA.empty()
    builder = _Builder(positive, negative, modulus, fraction_digits)
    what = _describe(lower, upper, step, integral)
    return _explore(builder, what)


def _describe(low: tuple[Fraction, bool] | None, high: tuple[Fraction, bool] | None,
              step: Fraction | None, integral: int) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low[1] else '>='} {canonical(low[0])}")
    if high is not None:
        parts.append(f"{'<' if high[1] else '<='} {canonical(high[0])}")
    if step is not None:
        parts.append(f"multiples of {canonical(step)}")
    parts.append(f"at most {integral} integral digits")
    return ", ".join(parts)


State = tuple
Status = tuple[_Bound, int] | None  # a bound and how the digits compare; None: settled


class _Builder:
    """The moves of the number automaton, one state at a time.

    States: "start"; ("i", n, zero, low, high, r) in the integral part: n digits read, `zero`
    if the part is "0", r the digits' value modulo the step's numerator A (one representative
    of its class); ("f", j, ends, low, high, t) in the fraction: j digits read, `ends` if the
    last digit is not 0 and t = 0, t what the fraction digits still to come, in units of
    10**-d, must add modulo A. `low` and `high` are (bound, status) while a bound is not yet
    settled, None once the number is inside it whatever follows. States hold bounds, not sides,
    so the positive and the negative numbers share states once their different bounds settle
    (after "5" the lower bounds 0 and "greater than 0" are both passed)."""

    def __init__(self, positive: _Side | None, negative: _Side | None, modulus: int, fraction: int):
        self.sides = (positive, negative)
        self.modulus = modulus
        self.fraction = fraction  # d: at most d fraction digits; x * 10**d is an integer
        self.reach = len(str(modulus - 1))  # 10**reach >= A: past it, remainders just rotate
        self.classes: dict[tuple, int] = {}
        self.representative: dict[int, int] = {}

    def start(self) -> State:
        return ("start",)

    def moves(self, state: State) -> list[tuple[int, State]]:
        if state[0] == "start":
            positive, negative = self.sides
            out = [(MINUS, _first(negative))] if negative is not None else []
            if positive is not None:
                out.extend(self._integral_moves(_first(positive)))
            return out
        if state[0] == "i":
            return self._integral_moves(state)
        return self._fraction_moves(state)

    def accepts(self, state: State) -> bool:
        if state[0] == "start":
            return False
        phase, count, flag, low, high, rest = state
        if phase == "f":
            return flag and _ends_inside(count, low, high)
        closed = _close(count, low, high) if count else None
        return (closed is not None and _ends_inside(0, *closed)
                and rest * 10**self.fraction % self.modulus == 0)

    def _integral_moves(self, state: State) -> list[tuple[int, State]]:
        _, n, zero, low, high, r = state
        out = []
        if n and self.fraction:
            closed = _close(n, low, high)
            t = -r * 10**self.fraction % self.modulus
            if closed is not None and t < 10**self.fraction:
                out.append((DOT, ("f", 0, False, *closed, t)))
        if zero:
            return out
        for digit in range(10):
            statuses = _integral_digit(n, low, high, digit)
            if statuses is not None:
                rest = self._class((r * 10 + digit) % self.modulus)
                out.append((ZERO + digit, ("i", n + 1, n == 0 and digit == 0, *statuses, rest)))
        return out

    def _fraction_moves(self, state: State) -> list[tuple[int, State]]:
        _, j, _, low, high, t = state
        if j == self.fraction:
            return []
        weight = 10 ** (self.fraction - j - 1)  # the digit's worth in units of 10**-d
        out = []
        for digit in range(10):
            statuses = _fraction_digit(j, low, high, digit)
            rest = (t - digit * weight) % self.modulus
            if statuses is not None and rest < weight:  # else no later digits can make it 0
                out.append((ZERO + digit, ("f", j + 1, digit != 0 and rest == 0, *statuses, rest)))
        return out

    def _class(self, r: int) -> int:
        """One representative of the remainders with the same future as r: those for which
        every string of digits appended makes a multiple of A for both or for neither. For k
        digits appended that is the smallest c < 10**k with r * 10**k + c = 0 mod A (if any);
        past 10**reach >= A only r * 10**reach mod A matters."""
        known = self.representative.get(r)
        if known is not None:
            return known
        a = self.modulus
        needs = tuple(need if (need := -r * 10**k % a) < 10**k else -1 for k in range(self.reach))
        key = (needs, r * 10**self.reach % a)
        self.representative[r] = self.classes.setdefault(key, r)
        return self.representative[r]


def _first(side: _Side) -> State:
    return ("i", 0, False, (side.low, EQ), (side.high, EQ), 0)


def _integral_digit(n: int, low: Status, high: Status, digit: int) -> tuple[Status, Status] | None:
    """The bounds after the (n+1)-th integral digit; None if the upper bound is passed."""
    bound, status = high
    if n + 1 > len(bound.integral):
        return None
    if status == EQ:
        status = _compare(digit, bound.int_digit(n))
    if n + 1 == len(bound.integral) and status == GT:
        return None
    high = (bound, status)
    if low is not None:
        bound, status = low
        if n + 1 > len(bound.integral):
            return None, high
        if status == EQ:
            status = _compare(digit, bound.int_digit(n))
        low = None if n + 1 == len(bound.integral) and status == GT else (bound, status)
    return low, high


def _close(n: int, low: Status, high: Status) -> tuple[Status, Status] | None:
    """The bounds when the integral part ends after n digits: (bound, EQ) if it equals the
    bound's integral part, the fraction digits then decide; None if below the lower bound."""
    if low is not None and (n < len(low[0].integral) or low[1] == LT):
        return None
    if n < len(high[0].integral) or high[1] == LT:
        high = None
    return low, high


def _fraction_digit(j: int, low: Status, high: Status, digit: int) -> tuple[Status, Status] | None:
    """The bounds after the (j+1)-th fraction digit; None if out of them."""
    if low is not None:
        status = _compare(digit, low[0].frac_digit(j))
        if status == LT:
            return None
        low = None if status == GT else low
    if high is not None:
        status = _compare(digit, high[0].frac_digit(j))
        if status == GT:
            return None
        high = None if status == LT else high
    return low, high


def _ends_inside(j: int, low: Status, high: Status) -> bool:
    """Whether the number ending after j fraction digits is inside the bounds: a bound still
    EQ has had its digits matched, so it is the bound itself once j covers them."""
    if low is not None and (j < len(low[0].fraction) or low[0].exclusive):
        return False
    return high is None or j < len(high[0].fraction) or not high[0].exclusive


def _compare(a: int, b: int) -> int:
    return (a > b) - (a < b)


def _explore(builder: _Builder, what: str) -> DFA:
    """Every state reachable from the start, numbered in order of discovery, then minimized."""
    start = builder.start()
    ids = {start: 0}
    order = [start]
    edges: list[tuple[Edge, ...]] = []
    accepting = []
    for sid, state in enumerate(order):  # `order` grows while it is walked
        moves = []
        for code, target in builder.moves(state):
            if target not in ids:
                if len(order) == MAX_STATES:
                    raise ValueError(f"json schema: the numbers ({what}) need more than "
                                     f"{MAX_STATES} automaton states; narrower bounds or a coarser "
                                     "multipleOf need fewer")
                ids[target] = len(order)
                order.append(target)
            moves.append((code, ids[target]))
        edges.append(_ranges(moves))
        if builder.accepts(state):
            accepting.append(sid)
    return DFA(edges, accepting).minimized()


def _ranges(moves: list[tuple[int, int]]) -> tuple[Edge, ...]:
    """Moves on single characters (in increasing order) as ranges, neighbours with one target
    joined."""
    out: list[Edge] = []
    for code, target in moves:
        if out and out[-1][2] == target and out[-1][1] + 1 == code:
            out[-1] = (out[-1][0], code, target)
        else:
            out.append((code, code, target))
    return tuple(out)
