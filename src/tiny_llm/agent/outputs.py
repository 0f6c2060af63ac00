"""Engine — outputs as the model reads them: bytes as text, and where a preview's head ends
and its tail starts (at a line break when one is near, never inside a UTF-8 character).
`Workspace.cut` builds the preview of a long output from these.

Tests: tests/test_week4_day2.py, tests/test_week4_day3.py, tests/test_week4_day5.py
"""

from __future__ import annotations

__all__ = ["decode", "head_end", "tail_start"]


def _utf8_start(data: bytes, i: int) -> int:
    """The first character boundary at or after byte `i` (UTF-8 continuation bytes are
    10xxxxxx; a character has at most three of them). In bytes that are not UTF-8: `i`."""
    j = i
    while j < len(data) and data[j] & 0xC0 == 0x80 and j - i < 3:
        j += 1
    return j if j == len(data) or data[j] & 0xC0 != 0x80 else i


def _utf8_end(data: bytes, i: int) -> int:
    """The last character boundary at or before byte `i`. In bytes that are not UTF-8: `i`."""
    j = i
    while 0 < j < len(data) and data[j] & 0xC0 == 0x80 and i - j < 3:
        j -= 1
    return j if j == len(data) or data[j] & 0xC0 != 0x80 else i


def head_end(data: bytes, limit: int) -> int:
    """Where a preview's head ends, at most `limit` bytes in: after the last newline in the
    second half of those bytes, else at the last character boundary."""
    nl = data.rfind(b"\n", limit // 2, limit)
    return nl + 1 if nl >= 0 else _utf8_end(data, limit)


def tail_start(data: bytes, start: int) -> int:
    """Where a preview's tail starts, at least at byte `start`: after the first newline in
    the first half of the bytes from there, else at the first character boundary."""
    nl = data.find(b"\n", start, start + (len(data) - start) // 2)
    return nl + 1 if nl >= 0 else _utf8_start(data, start)


def decode(data: bytes) -> str:
    """Bytes as text for the model: UTF-8, with any other byte written as `\\xNN`."""
    return data.decode("utf-8", errors="backslashreplace")

