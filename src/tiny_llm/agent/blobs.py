"""Engine — the blob store: bytes kept under their SHA-256 in a folder outside the workspace
(whole outputs the model saw a preview of, and each version of a file an effect touched), the
digests receipts record, and undo, which puts kept bytes back.

    store = BlobStore(blob_dir)
    digest = file_digest(boundary, store, "src/app.py")   # and its bytes are kept
    restore(boundary, store, {"src/app.py": digest, "new.py": None})

Tests: tests/test_week4_day2.py, tests/test_week4_day3.py, tests/test_week4_day5.py
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from pathlib import Path

from .boundary import Boundary, show
from .core import ToolError
from .files import open_regular, write_bytes

__all__ = ["BLOB", "BlobStore", "file_digest", "restore"]

BLOB = re.compile(r"[0-9a-f]{64}")  # a blob's name: the SHA-256 of its bytes, in hex


class BlobStore:
    """A folder of blobs, each named by the SHA-256 of its bytes (made if missing)."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder

    def keep(self, data: bytes) -> str:
        """Store `data` under its SHA-256 (once); return the digest."""
        digest = hashlib.sha256(data).hexdigest()
        target = self.folder / digest
        if not target.exists():
            write_bytes(target, data, None)
        return digest

    def keep_file(self, real: Path) -> str:
        """The SHA-256 of a regular file, its bytes kept under it (copied while hashed; a blob
        already there is not written again)."""
        h = hashlib.sha256()
        tmp = self.folder / f".incoming-{os.getpid()}-{threading.get_ident()}"
        with os.fdopen(open_regular(real), "rb") as f, open(tmp, "wb") as out:
            while chunk := f.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
        digest = h.hexdigest()
        if (self.folder / digest).exists():
            tmp.unlink()
        else:
            os.replace(tmp, self.folder / digest)
        return digest

    def read(self, blob: str, start: int, end: int, limit: int) -> bytes:
        """Bytes `start` to `end` (exclusive) of a kept blob; at most `limit` of them, and `end`
        past the blob's size reads to its end. ToolError for a bad range or an unknown blob."""
        if not isinstance(blob, str) or not BLOB.fullmatch(blob):
            raise ToolError("blob must be 64 lowercase hex digits (the SHA-256 an earlier output named)")
        if start < 0 or end < start:
            raise ToolError(f"bad byte range {start}..{end}: need 0 <= start <= end")
        if end - start > limit:
            raise ToolError(f"a blob range is at most {limit} bytes (asked {end - start})")
        try:
            with open(self.folder / blob, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if start > size:
                    raise ToolError(f"start {start} is past the end of the blob ({size} bytes)")
                f.seek(start)
                return f.read(end - start)
        except FileNotFoundError:
            raise ToolError(f"no kept output has the digest {blob}") from None


def file_digest(boundary: Boundary, store: BlobStore, path: str) -> str | None:
    """The SHA-256 (hex) of the file at `path`, None if nothing is there; PolicyError if the
    boundary refuses the path, ToolError if it names a folder. The file's bytes are kept in
    `store` under that digest, for `restore`."""
    real = boundary.resolve(path)
    if not os.path.lexists(real):
        return None
    if real.is_dir():
        raise ToolError(f"{show(path)} is a folder")
    return store.keep_file(real)


def restore(boundary: Boundary, store: BlobStore, state: dict[str, str | None]) -> tuple[list[str], list[str]]:
    """Make each path of `state` hold the kept bytes of its digest (None: no file there),
    through the boundary (a path now leading out of the workspace is refused). Returns the
    paths written and the paths removed; PolicyError/ToolError for what cannot be."""
    written, removed = [], []
    for path, digest in sorted(state.items()):
        real = boundary.resolve(path)
        now = file_digest(boundary, store, path) if os.path.lexists(real) and not real.is_dir() else None
        if now == digest:
            continue
        if digest is None:
            real.unlink()
            removed.append(path)
            continue
        blob = store.folder / digest
        if not BLOB.fullmatch(digest) or not blob.is_file():
            raise ToolError(f"{show(path)}: its bytes ({digest[:12]}...) are not in the blob folder {store.folder}")
        if real.is_dir():
            raise ToolError(f"{show(path)} is a folder now; move it away first")
        real.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(real, blob.read_bytes(), None)
        written.append(path)
    return written, removed
