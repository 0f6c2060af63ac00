"""Engine — the workspace's file access, below the boundary's decisions: reading a regular
file without following its last component or blocking on a FIFO, writing a file in one step,
and walking a folder without following symlinks.

Paths reach these functions after `Boundary.resolve` let them through; what they add is what
a check cannot promise about the moment after it (a FIFO put where a file was, a process
killed in the middle of a write).

Tests: tests/test_week4_day2.py, tests/test_week4_day3.py, tests/test_week4_day5.py
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from .boundary import show
from .core import ToolError

__all__ = ["MAX_FILE_BYTES", "open_regular", "read_bytes", "walk", "write_bytes"]

MAX_FILE_BYTES = 16 << 20  # larger files are refused by read and edit, skipped by search


def open_regular(path: Path) -> int:
    """A file descriptor for reading the regular file at `path`. The final component is
    opened without following a symlink and without blocking, so a FIFO or device put there
    after `resolve` cannot hang the agent; anything but a regular file is a ToolError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ToolError(f"{show(path.name)} is not a regular file")
    return fd


def read_bytes(path: Path, what: str) -> bytes:
    """A regular file's bytes; ToolError if it is larger than MAX_FILE_BYTES."""
    with os.fdopen(open_regular(path), "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ToolError(f"{what} is larger than {MAX_FILE_BYTES} bytes")
    return data


def write_bytes(path: Path, data: bytes, mode: int | None) -> None:
    """Replace `path` with `data` in one step (a temporary file beside it, then a rename): a
    file is its old bytes or its new ones, never half of each, even if the process dies."""
    tmp = path.with_name(f".{path.name}.tiny-llm-{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644 if mode is None else mode)
    try:
        if mode is not None:
            os.fchmod(fd, mode)  # the umask narrowed what os.open set
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def walk(root: Path, top: Path, depth: int | None) -> Iterator[tuple[str, str]]:
    """(path relative to `root`, kind) under `top`, depth first in name order, `depth` levels
    deep (None: all). Symlinks are reported, never followed; kind is one of dir, file (a
    regular file with one link), link, fifo, socket, other."""
    try:
        entries = sorted(os.scandir(top), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:  # gone since the folder was read
            continue
        mode = st.st_mode
        kind = ("link" if stat.S_ISLNK(mode) else "dir" if stat.S_ISDIR(mode)
                else "file" if stat.S_ISREG(mode) and st.st_nlink == 1 else "fifo" if stat.S_ISFIFO(mode)
                else "socket" if stat.S_ISSOCK(mode) else "other")
        yield Path(entry.path).relative_to(root).as_posix(), kind
        if kind == "dir" and (depth is None or depth > 1):
            yield from walk(root, Path(entry.path), None if depth is None else depth - 1)
