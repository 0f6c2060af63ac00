"""Number automata: the canonical spellings of the numbers in a range that are multiples of steps.

Every case is checked against Fraction arithmetic: the automaton accepts canonical(x) exactly
when x is inside the bounds, a multiple of every step, an integer if asked, and within the
digits spelled (integral parts of at most max_digits digits or a bound's length, fractions of
at most max_fraction digits or a bound's). Candidates: every decimal with 3 fraction digits in
a window around each bound and 0, seeded random decimals of up to 3 + 3 digits of both signs,
and each bound's neighbours bound +- 10**-k. Spellings that are not canonical are rejected:
exhaustively over all strings of up to 4 characters of `-.0123456789` for small languages.
"""

import itertools
import random
import re
from decimal import Decimal
from fractions import Fraction

import pytest

from tiny_llm.constrain.automata import DFA
from tiny_llm.constrain.limits import MAX_STATES
from tiny_llm.constrain.numbers import canonical, exact, number_dfa, value_dfa

F = Fraction
ALPHABET = "-.0123456789"
CANONICAL = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]*[1-9])?")


# ---- the oracle ----------------------------------------------------------------------------


def _places(x: Fraction) -> int | None:
    """Fraction digits of x's decimal spelling (10**k / denominator an integer for the first
    time; k <= log2(denominator)); None if it does not end."""
    return next((k for k in range(x.denominator.bit_length() + 1) if 10**k % x.denominator == 0), None)


class Expected:
    """The verdict of Fraction arithmetic for one case."""

    def __init__(self, case: dict):
        self.case = case  # the keyword arguments of number_dfa
        self.low, self.high = (None if case.get(k) is None else F(case[k]) for k in ("low", "high"))
        self.steps = [F(q) for q in case.get("multiples", ())]
        bounds = [b for b in (self.low, self.high) if b is not None]
        integral = [len(str(abs(b.numerator) // b.denominator)) for b in bounds]
        self.limit = 10 ** max([case.get("max_digits", 16)] + integral)
        self.fraction = max([case.get("max_fraction", 16)] + [_places(b) or 0 for b in bounds])

    def __call__(self, x: Fraction) -> bool:
        case = self.case
        if self.low is not None and (x < self.low or (x == self.low and case.get("low_exclusive"))):
            return False
        if self.high is not None and (x > self.high or (x == self.high and case.get("high_exclusive"))):
            return False
        if case["integer"] and x.denominator != 1:
            return False
        if any((x / q).denominator != 1 for q in self.steps):
            return False
        return abs(x) < self.limit and _places(x) <= self.fraction


def spelled(text: str) -> bool:
    return CANONICAL.fullmatch(text) is not None and text != "-0"


# ---- cases ---------------------------------------------------------------------------------

CASES = [
    dict(integer=True, low=-(10**15), high=10**15),
    dict(integer=False, low=0, high=1, high_exclusive=True),
    dict(integer=False, low=F("0.1"), low_exclusive=True, high=F("0.25")),
    dict(integer=False, low=F("-7.5"), high=F("-0.125"), high_exclusive=True),
    dict(integer=True, low=-250, high=-3),
    dict(integer=False, low=F("-2.5"), high=F("3.75")),
    dict(integer=False, low=F("-0.001"), low_exclusive=True, high=F("0.001"), high_exclusive=True),
    dict(integer=False, low=0, low_exclusive=True),
    dict(integer=False, high=0),
    dict(integer=False, high=0, high_exclusive=True),
    dict(integer=True, low=F("0.5"), high=F("99.5")),
    dict(integer=False),
    dict(integer=True),
    dict(integer=False, low=F(1, 3), high=F(7, 3), high_exclusive=True),  # bounds that do not end
    dict(integer=True, low=F(-10, 3), high=F(10, 3)),
    # steps
    dict(integer=False, low=0, high=1, multiples=(F("1e-8"),)),
    dict(integer=False, low=-10, high=10, multiples=(F("0.25"),)),
    dict(integer=False, low=F("-3.3"), high=F("4.4"), multiples=(F("0.3"),)),
    dict(integer=False, low=-100, high=100, multiples=(F("0.5"), F("0.75"))),  # lcm 1.5
    dict(integer=True, low=-1000, high=1000, multiples=(F("2.5"),)),  # integers: lcm 5
    dict(integer=False, low=-50, high=50, multiples=(F(1, 3),)),  # finite decimals: integers
    dict(integer=False, low=-50, high=50, multiples=(F(2, 3),)),  # multiples of 2
    dict(integer=False, low=-20, high=20, multiples=(F(7, 12),)),  # multiples of 7/4
    dict(integer=True, multiples=(F(7),)),
    dict(integer=True, low=-999, high=999, multiples=(F(8),)),
    dict(integer=True, low=-999, high=999, multiples=(F(40),)),
    dict(integer=True, low=0, high=5000, multiples=(F(125),)),
    dict(integer=True, low=-999, high=999, multiples=(F(12),)),
    dict(integer=False, low=-5, high=5, multiples=(F("0.04"),)),
    dict(integer=False, low=-F("0.999"), high=F("0.999"), multiples=(F("0.125"),), low_exclusive=True),
    dict(integer=False, multiples=(F(10) ** 10,)),
    dict(integer=False, low=0, high=100, multiples=(F("0.3333"),)),
    # narrow digit limits
    dict(integer=False, max_digits=2, max_fraction=2),
    dict(integer=False, low=F("-0.5"), max_digits=1, max_fraction=1),
    dict(integer=False, high=F("0.125"), max_digits=1, max_fraction=1),  # the bound's 3 digits
    dict(integer=True, low=-5, max_digits=1, multiples=(F(3),)),
]

STEPS = [F("0.5"), F("0.25"), F("0.3"), F(2), F(3), F("0.125"), F(1, 3), F(7, 12), F("0.05"), F(8),
         F(40), F(12), F(75), F(1000), F(6), F("2.5")]


def _random_decimal(rng: random.Random) -> Fraction:
    whole = rng.randrange(1000 if rng.random() < 0.5 else 20)
    count = rng.randrange(4)
    x = whole + F(rng.randrange(10**count), 10**count)
    return -x if rng.random() < 0.5 else x


def _random_cases(count: int) -> list[dict]:
    rng = random.Random(0)
    cases = []
    for _ in range(count):
        case = {"integer": rng.random() < 0.3}
        for side in ("low", "high"):
            if rng.random() < 0.8:
                case[side] = _random_decimal(rng)
                case[f"{side}_exclusive"] = rng.random() < 0.5
        if rng.random() < 0.5:
            case["multiples"] = tuple(rng.sample(STEPS, rng.choice((1, 1, 2))))
        cases.append(case)
    return cases


def _name(case: dict) -> str:
    parts = ["int" if case["integer"] else "num"]
    if "low" in case:
        parts.append(("(" if case.get("low_exclusive") else "[") + str(case["low"]))
    if "high" in case:
        parts.append(str(case["high"]) + (")" if case.get("high_exclusive") else "]"))
    parts.extend(f"x{q}" for q in case.get("multiples", ()))
    parts.extend(f"{k}={case[k]}" for k in ("max_digits", "max_fraction") if k in case)
    return " ".join(parts)


def _candidates(case: dict, rng: random.Random) -> set[Fraction]:
    bounds = [F(case[k]) for k in ("low", "high") if k in case]
    out: set[Fraction] = set()
    for b in bounds + [F(0)]:
        middle = round(b * 1000)
        out.update(F(k, 1000) for k in range(middle - 300, middle + 300))  # within 0.3
        for k in range(10):  # the bound rounded to k places and its neighbours
            near = round(b, k)
            out.update((near - F(1, 10**k), near, near + F(1, 10**k)))
    out.update(_random_decimal(rng) for _ in range(400))
    return out


# ---- the language --------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES + _random_cases(40), ids=_name)
def test_language_matches_arithmetic(case):
    dfa, expected = number_dfa(**case), Expected(case)
    wrong = [text for x in _candidates(case, random.Random(0))
             if dfa.accepts(text := canonical(x)) != expected(x)]
    assert not wrong, f"{len(wrong)} verdicts differ, e.g. {sorted(wrong)[:5]}"


SMALL = [
    dict(integer=False, max_digits=2, max_fraction=2),
    dict(integer=False, low=F("-1.5"), high=F("2.25"), max_digits=1, max_fraction=2),
    dict(integer=True, low=-99, high=99, max_digits=2, multiples=(F(3),)),
    dict(integer=False, low=F("-9.9"), high=F("9.9"), max_digits=1, max_fraction=2, multiples=(F("0.3"),)),
    dict(integer=False, low=0, low_exclusive=True, max_digits=2, max_fraction=2),
    dict(integer=False, high=0, max_digits=2, max_fraction=2),
]


@pytest.mark.parametrize("case", SMALL, ids=_name)
def test_every_short_string(case):
    """All strings of up to 4 characters: accepted exactly when canonical and in the set."""
    dfa, expected = number_dfa(**case), Expected(case)
    for n in range(5):
        for chars in itertools.product(ALPHABET, repeat=n):
            text = "".join(chars)
            want = spelled(text) and expected(F(text))
            assert dfa.accepts(text) == want, text


@pytest.mark.parametrize("text", ["1.50", "-0", "01", "1e3", "1E3", "1.", ".5", "-.5", "--1", "+1",
                                  "1.0", "-0.0", "00", "0.10", " 1", "1 ", "-", "", ".", "1..2",
                                  "1.2.3", "1-2", "0x1", "-00", "10.00"])
def test_spellings_that_are_not_canonical(text):
    for dfa in (number_dfa(integer=False), number_dfa(integer=False, low=-100, high=100)):
        assert not dfa.accepts(text)


def test_moves_only_on_number_characters():
    allowed = {ord(c) for c in ALPHABET}
    for case in CASES:
        dfa = number_dfa(**case)
        for edges in dfa.edges:
            for lo, hi, _ in edges:
                assert set(range(lo, hi + 1)) <= allowed, _name(case)


def test_result_is_minimal_and_small():
    for case in CASES:
        dfa = number_dfa(**case)
        assert dfa.minimized().size == dfa.size, _name(case)
    assert number_dfa(integer=True, low=-(10**15), high=10**15).size < 50
    assert number_dfa(integer=False, low=0, high=1, multiples=(F("1e-8"),)).size < 30
    assert number_dfa(integer=False).size < 60


# ---- digits spelled: the defaults, huge and tiny bounds --------------------------------------


def test_unbounded_sides_stop_at_max_digits():
    dfa = number_dfa(integer=False)
    assert dfa.accepts("9999999999999999") and dfa.accepts("-9999999999999999.5")
    assert not dfa.accepts("10000000000000000") and not dfa.accepts("-10000000000000000")
    assert dfa.accepts("0." + "0" * 15 + "1") and not dfa.accepts("0." + "0" * 16 + "1")
    assert number_dfa(integer=True, low=0, max_digits=3).accepts("999")
    assert not number_dfa(integer=True, low=0, max_digits=3).accepts("1000")


def test_huge_bounds_are_honoured_exactly():
    big = F(10) ** 300
    dfa = number_dfa(integer=False, low=-big, high=big)
    assert dfa.accepts(canonical(big)) and dfa.accepts(canonical(-big))
    assert dfa.accepts(canonical(big - F(1, 10**16))) and dfa.accepts(canonical(F(1, 10**16) - big))
    assert not dfa.accepts(canonical(big + F(1, 2))) and not dfa.accepts(canonical(-big - 1))
    assert dfa.accepts("0") and dfa.accepts("-123.456")

    above = number_dfa(integer=True, low=big)  # the open side stops at 301 digits
    assert above.accepts(canonical(big)) and above.accepts(canonical(10 * big - 1))
    assert not above.accepts(canonical(big - 1)) and not above.accepts(canonical(10 * big))
    below = number_dfa(integer=True, high=-big, high_exclusive=True)
    assert below.accepts(canonical(-big - 1)) and not below.accepts(canonical(-big))
    assert below.accepts(canonical(1 - 10 * big)) and not below.accepts(canonical(-10 * big))


def test_tiny_bounds_are_honoured_exactly():
    tiny = F(1, 10**300)
    dfa = number_dfa(integer=False, low=tiny, low_exclusive=True, high=10 * tiny)
    assert not dfa.accepts(canonical(tiny)) and not dfa.accepts("0")
    assert dfa.accepts(canonical(2 * tiny)) and dfa.accepts(canonical(7 * tiny))
    assert dfa.accepts(canonical(10 * tiny)) and not dfa.accepts(canonical(F(3, 2) * tiny))  # 301 places
    assert not dfa.accepts(canonical(11 * tiny))
    exactly = number_dfa(integer=False, low=F("1e-20"), high=F("1e-20"))
    assert exactly.accepts("0.00000000000000000001") and not exactly.accepts("0")


def test_float_bounds_are_read_from_their_shortest_spelling():
    dfa = number_dfa(integer=False, low=0.1, high=0.3)
    assert dfa.accepts("0.1") and dfa.accepts("0.3") and not dfa.accepts("0.09")


# ---- steps ---------------------------------------------------------------------------------


@pytest.mark.parametrize("step, inside, outside", [
    (F("1e-8"), ["0.00000001", "-0.99999999", "123"], ["0.000000015", "0.000000001"]),
    (F(1, 3), ["0", "3", "-7"], ["0.5", "0.3333"]),  # 1/3: the multiples that end are integers
    (F(2, 3), ["2", "-4", "600"], ["1", "0.6", "3"]),  # 2/3: multiples of 2
    (F(7, 12), ["1.75", "3.5", "-7"], ["0.875", "1.5", "7.5"]),  # 7/12: multiples of 7/4
    (F(10) ** 10, ["0", "-30000000000"], ["1000000000", "15000000000"]),
])
def test_multiples(step, inside, outside):
    dfa = number_dfa(integer=False, multiples=(step,))
    assert all(dfa.accepts(t) for t in inside) and not any(dfa.accepts(t) for t in outside)


def test_several_steps_and_integer_combine():
    dfa = number_dfa(integer=True, multiples=(F("2.5"), F(3)))  # integers: multiples of 15
    assert dfa.accepts("-45") and dfa.accepts("15") and not dfa.accepts("7.5") and not dfa.accepts("5")
    fine = number_dfa(integer=True, multiples=(F("1e-20"),))  # every integer
    assert fine.accepts("-12") and not fine.accepts("0.5")


# ---- empty languages and errors ------------------------------------------------------------


@pytest.mark.parametrize("case", [
    dict(integer=False, low=2, high=1),
    dict(integer=False, low=1, high=1, low_exclusive=True),
    dict(integer=False, low=0, high=0, high_exclusive=True),
    dict(integer=True, low=F("0.2"), high=F("0.8")),
    dict(integer=False, low=1, high=2, multiples=(F(3),)),
    dict(integer=False, low=F("-0.5"), high=F("-0.1"), multiples=(F(1, 3),)),
    dict(integer=True, low=10**16, max_digits=16, high=10**16, high_exclusive=True),
])
def test_empty_languages(case):
    assert number_dfa(**case).is_empty()


def test_one_number():
    assert number_dfa(integer=False, low=F("-2.5"), high=F("-2.5")).finite_strings(5) == ["-2.5"]
    assert number_dfa(integer=True, low=0, high=0).finite_strings(5) == ["0"]


def test_step_must_be_positive():
    with pytest.raises(ValueError, match=r"^json schema: multipleOf must be greater than 0, got -0.5"):
        number_dfa(integer=False, multiples=(F("-0.5"),))
    with pytest.raises(ValueError, match="multipleOf must be greater than 0, got 0"):
        number_dfa(integer=True, multiples=(0,))


def test_step_with_more_fraction_digits_than_spelled():
    with pytest.raises(ValueError, match=r"^json schema: multipleOf 0.00000000000000000001 needs 20 "
                                         r"fraction digits; numbers are spelled with at most 16"):
        number_dfa(integer=False, multiples=(F("1e-20"),))
    with pytest.raises(ValueError, match="multipleOf 0.25 needs 2 fraction digits"):
        number_dfa(integer=False, multiples=(F("0.25"),), max_fraction=1)


def test_state_limit():
    with pytest.raises(ValueError, match=rf"^json schema: the numbers \(multiples of 0.3333, at most 16 "
                                         rf"integral digits\) need more than {MAX_STATES} automaton states"):
        number_dfa(integer=False, multiples=(F("0.3333"),))
    with pytest.raises(ValueError, match=r"the numbers \(>= 0, < 100000000, multiples of 123456\.7,"):
        number_dfa(integer=False, low=0, high=10**8, high_exclusive=True, multiples=(F("123456.7"),))


@pytest.mark.parametrize("key, value", [("max_digits", 0), ("max_digits", 2.0), ("max_fraction", -1),
                                        ("max_fraction", True)])
def test_digit_limits_are_checked(key, value):
    with pytest.raises(ValueError, match=rf"^json schema: {key} must be an int"):
        number_dfa(integer=False, **{key: value})


# ---- spellings of values -------------------------------------------------------------------


@pytest.mark.parametrize("value, text", [
    (0, "0"), (-0.0, "0"), (Decimal("-0"), "0"), (7, "7"), (-12, "-12"), (10**20, "1" + "0" * 20),
    (0.1, "0.1"), (-2.5, "-2.5"), (1e16, "10000000000000000"), (1e300, "1" + "0" * 300),
    (1e-7, "0.0000001"), (1.5e-300, "0." + "0" * 299 + "15"), (123.456, "123.456"),
    (Decimal("1.500"), "1.5"), (Decimal("1E+3"), "1000"), (Decimal("-0.0010"), "-0.001"),
    (F(-5, 2), "-2.5"), (F(1, 1024), "0.0009765625"), (F(30, 3), "10"),
])
def test_canonical(value, text):
    assert canonical(value) == text
    assert exact(value) == F(text)


@pytest.mark.parametrize("value, error", [
    (F(1, 3), ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
    (Decimal("NaN"), ValueError), (True, TypeError), ("1", TypeError), (None, TypeError),
])
def test_canonical_refuses(value, error):
    with pytest.raises(error, match="^json schema: "):
        canonical(value)


def test_value_dfa():
    dfa = value_dfa(F("-0.25"))
    assert dfa.accepts("-0.25") and not dfa.accepts("-0.250") and not dfa.accepts("-.25")
    assert value_dfa(0.0).accepts("0") and not value_dfa(0.0).accepts("-0")
    assert isinstance(dfa, DFA)
    with pytest.raises(ValueError, match="no finite decimal spelling"):
        value_dfa(F(2, 3))
