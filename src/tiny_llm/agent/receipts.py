"""Engine — what an effect may touch: the paths whose digests its receipt records before and
after it (and a run log records before it starts, so a resumed run can tell whether the
effect happened).

Tests: tests/test_week4_day2.py, tests/test_week4_day3.py, tests/test_week4_day5.py
"""

from __future__ import annotations

import os

from .boundary import Boundary
from .core import Action
from .files import walk

__all__ = ["EFFECTS", "TREE_FILES", "touched", "tree"]

EFFECTS = ("edit", "write", "run")  # the tools whose observations carry a receipt
TREE_FILES = 1000  # a run's receipt covers at most this many files (the first, by path)


def touched(boundary: Boundary, action: Action) -> list[str]:
    """The workspace-relative paths `action` may change. edit, write: the real path they name
    (when the boundary allows the write). run: every regular file under the root (`tree`),
    since a command may change any of them. Other tools, and actions the boundary or their
    arguments refuse: []."""
    args = action.args if isinstance(action.args, dict) else {}
    if action.tool in ("edit", "write"):
        try:
            real = boundary.resolve(args.get("path"), write=True)
        except (OSError, ValueError):  # a refused path (PolicyError) or one the file system cannot hold
            return []
        return [] if real.is_dir() else [boundary.rel(real)]
    if action.tool == "run":
        command = args.get("command")
        if (not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command)
                or command[0] not in boundary.allowed_commands):
            return []
        return tree(boundary)
    return []


def tree(boundary: Boundary) -> list[str]:
    """The readable regular files under the root (single links, not through symlinks), by
    path; at most TREE_FILES."""
    files = []
    for rel, kind in walk(boundary.root, boundary.root, None):
        if kind == "file" and os.access(boundary.root / rel, os.R_OK):
            files.append(rel)
            if len(files) == TREE_FILES:
                break
    return files
