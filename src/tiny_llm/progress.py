"""Engine — course progress: which days a starter has implemented.

Week 2's fast paths switch on by themselves once their day is done, and a command that
needs a missing day can say which.

In the finished engine every day is implemented and every check answers True. In a
student's starter an exercise not yet written raises `NotImplementedError("weekW-dayD: ...")`;
a probe calls the day's code on tiny inputs and looks for exactly that.

Tests: tests/test_progress.py
"""

import re
from collections.abc import Callable

_DAY = re.compile(r"^(week\d+-day\d+):\s*(.*)$", re.S)
_known: dict[str, bool] = {}


def missing_day(error: BaseException) -> tuple[str, str] | None:
    """`(day, what)` when `error` is a starter's `NotImplementedError("weekW-dayD: what")`."""
    if isinstance(error, NotImplementedError) and (m := _DAY.match(str(error))):
        return m[1], m[2].strip()
    return None


def implemented(day: str, probe: Callable[[], object]) -> bool:
    """False when `probe()` raises `day`'s starter `NotImplementedError`; True otherwise
    (remembered per day). Another day's `NotImplementedError` propagates: that day is
    missing too. Any other error counts as implemented: the real call shows it where it
    happens."""
    if day not in _known:
        try:
            probe()
            _known[day] = True
        except NotImplementedError as e:
            found = missing_day(e)
            if found is None or found[0] != day:
                raise
            _known[day] = False
        except Exception:  # a bug in the day's code, reported by the real call
            _known[day] = True
    return _known[day]
