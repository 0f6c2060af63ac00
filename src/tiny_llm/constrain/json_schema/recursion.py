"""Engine — the process's recursion limit, raised while a schema compiles and put back after.

    with recursion_limit(3000):    # at least 3000 inside, the previous limit again after
        compile_deeply_nested_schema()

Compiling recurses a dozen frames per level of a schema's nesting, more than Python's default
limit allows at `MAX_NESTING` levels. The limit is global to the process and threads compile
at once (the server compiles each request's grammar), so it is raised by the first block
entered and put back when the last one leaves, also when compilation raises.

Tests: tests/test_constrain_json_schema.py
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Raised:
    """How many blocks are inside, and the limit to put back when the last leaves."""

    def __init__(self):
        self.lock = threading.Lock()
        self.inside = 0
        self.before = 0


_RAISED = _Raised()


@contextmanager
def recursion_limit(limit: int) -> Iterator[None]:
    """Run the block with a recursion limit of at least `limit`; the limit in force before
    the first of the blocks running at once is put back when the last one ends."""
    if limit < 1:
        raise ValueError(f"recursion limit: limit must be at least 1, got {limit}")
    state = _RAISED
    with state.lock:
        if state.inside == 0:
            state.before = sys.getrecursionlimit()
        state.inside += 1
        if sys.getrecursionlimit() < limit:
            sys.setrecursionlimit(limit)
    try:
        yield
    finally:
        with state.lock:
            state.inside -= 1
            if state.inside == 0:
                sys.setrecursionlimit(state.before)
