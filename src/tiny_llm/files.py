"""Engine — where the caches live (converted models, built kernels) and how processes share them.

Tests: tests/test_progress.py
"""

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def cache_root() -> Path:
    """Where converted models and built kernels live: `$TINY_LLM_CACHE`, else
    `$XDG_CACHE_HOME/tiny-llm` (`~/.cache/tiny-llm`)."""
    if "TINY_LLM_CACHE" in os.environ:
        return Path(os.environ["TINY_LLM_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tiny-llm"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) for the `with` block: processes
    that would make the same thing at once (test workers, ranks) make it once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
