"""Course: week 4 day 2 — the workspace: the agent's tools (list, read, search, edit, write,
run) behind one policy boundary, bounded outputs kept whole in a content-addressed store,
and a receipt for every effect.

    ws = Workspace(root, editable_paths=["src/**"], allowed_commands=["python"])
    ws.perform(Action("read", {"path": "src/app.py", "start_line": 1, "end_line": 20}))
    ws.perform(Action("edit", {"path": "src/app.py", "old": "x = 1", "new": "x = 2"})).receipt

Every path a tool is given passes `resolve`: it must stay inside the root, component by
component, through any symlinks, and name a regular file or a directory. `perform` turns
every refusal and failure into `Observation(ok=False, text="<tool>: <reason>")`; it never
raises for what a model wrote.

`run` decides which programs may start, where (the root), for how long, with how much
output and with which environment (no secrets of the parent); what an allowed program does
once it runs is bounded by the operating system: every command runs in a sandbox
(`sandbox.py`: bubblewrap on Linux, Seatbelt on macOS) under resource limits, and where no
sandbox can be made, `run` is refused unless the workspace was made `unsandboxed=True`.

Every file an effect may change is kept in the blob store before and after it (by content:
an unchanged file costs nothing), so any step can be undone (`restore`).

Longer than one module should be: the path policy, the six tools, kept outputs and
receipts, the command runner and undo all work through the same root and `resolve`; the
seam to cut next is the policy (`resolve`, `prepare_command`) into a module of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from copy import deepcopy
from pathlib import Path

from .core import Action, Observation, Receipt, Tool
from .sandbox import CommandLimits, PidsCgroup, Policy, Sandbox, child_setup, find_sandbox, readable_folders

__all__ = ["PolicyError", "ToolError", "Workspace", "replace_once"]

MAX_SYMLINKS = 40  # symlinks one path may pass through (as Linux's ELOOP limit)
MAX_FILE_BYTES = 16 << 20  # larger files are refused by read and edit, skipped by search
KEEP_BYTES = 16 << 20  # a command's output beyond this is dropped (the rest is kept)
MAX_MATCHES = 200  # search stops after this many matching lines
MAX_ENTRIES = 2000  # list stops after this many entries
TREE_FILES = 1000  # a run's receipt covers at most this many files (the first, by path)
DEFAULT_DEPTH, MAX_DEPTH = 2, 20  # list's levels of directories
EFFECTS = ("edit", "write", "run")  # the tools whose observations carry a receipt
BLOB = re.compile(r"[0-9a-f]{64}")  # a blob's name: the SHA-256 of its bytes, in hex


class PolicyError(ValueError):
    """A path or a command the workspace refuses; the message is the reason, on one line."""


class ToolError(ValueError):
    """A tool that cannot do what it was asked (no such file, an edit that does not apply…);
    the message is the reason, on one line."""


def show(path: str) -> str:
    """A path as it appears in a one-line message: quoted, control characters escaped."""
    return json.dumps(path, ensure_ascii=False)


def replace_once(text: str, old: str, new: str, *, path: str = "the file") -> str:
    """`text` with `old` replaced by `new`, if `old` occurs exactly once (overlapping
    occurrences count: "aa" occurs twice in "aaa"); ToolError naming the count otherwise."""
    # BEGIN SOLUTION week4-day2
    if not old:
        raise ToolError("the old text is empty; give the exact text to replace")
    first = text.find(old)
    if first < 0:
        raise ToolError(f"the old text does not occur in {path}; read the file and copy the text exactly")
    count, at = 1, text.find(old, first + 1)
    while at >= 0:
        count += 1
        at = text.find(old, at + 1)
    if count > 1:
        raise ToolError(f"the old text occurs {count} times in {path}; include more of the "
                        "surrounding text so that it occurs once")
    return text[:first] + new + text[first + len(old):]
    # END SOLUTION


def glob_regex(pattern: str) -> re.Pattern:
    """A compiled regular expression for a glob over workspace-relative paths: `*` and `?`
    stay inside one component, `[...]` is a character class, and a `**` component matches
    any number of components (none included)."""
    parts, out = pattern.split("/"), []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
            continue
        j, piece = 0, []
        while j < len(part):
            c = part[j]
            if c == "*":
                piece.append("[^/]*")
            elif c == "?":
                piece.append("[^/]")
            elif c == "[" and (close := part.find("]", j + 2)) > 0:
                body = part[j + 1:close]
                body = "^" + body[1:] if body.startswith("!") else body
                piece.append("[" + body.replace("\\", "\\\\") + "]")
                j = close
            else:
                piece.append(re.escape(c))
            j += 1
        out.append("".join(piece) + ("" if last else "/"))
    return re.compile("".join(out) + r"\Z")


def _open_regular(path: Path) -> int:
    """A file descriptor for reading the regular file at `path`. The final component is
    opened without following a symlink and without blocking, so a FIFO or device put there
    after `resolve` cannot hang the agent; anything but a regular file is a ToolError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ToolError(f"{show(str(path.name))} is not a regular file")
    return fd


def _read_bytes(path: Path, what: str) -> bytes:
    """A regular file's bytes; ToolError if it is larger than MAX_FILE_BYTES."""
    with os.fdopen(_open_regular(path), "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ToolError(f"{what} is larger than {MAX_FILE_BYTES} bytes")
    return data


def _write_bytes(path: Path, data: bytes, mode: int | None) -> None:
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


class Workspace:
    """A folder the agent works in (implements `core.Toolbox`).

    `editable_paths`: glob patterns, relative to the root (`**` spans folders), that `edit`
    and `write` may change. `allowed_commands`: the command names `run` may start (looked up
    on PATH, the running interpreter's folder first, so `python` is this Python).
    `command_seconds` and `output_bytes` bound a run's time and every output's preview.
    `blob_dir`: where whole outputs, and the files effects change, are kept by their SHA-256
    (outside the root; a new temporary folder by default). `command_limits`: the resources
    each command may use. `unsandboxed`: run commands without a sandbox where none can be
    made (each command's observation says so); by default `run` is refused there."""

    def __init__(self, root: Path, *, editable_paths: Sequence[str] = ("**",),
                 allowed_commands: Sequence[str] = (), command_seconds: float = 30.0,
                 output_bytes: int = 4000, blob_dir: Path | None = None,
                 command_limits: CommandLimits = CommandLimits(), unsandboxed: bool = False):
        if not Path(root).is_dir():
            raise ValueError(f"root: {root} is not a folder")
        self.root = Path(os.path.realpath(root))
        self._roots = {self.root.parts, Path(os.path.abspath(root)).parts}  # for absolute symlinks
        for name, value in (("editable_paths", editable_paths), ("allowed_commands", allowed_commands)):
            if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
                raise ValueError(f"{name}: a sequence of non-empty strings, got {value!r}")
        for p in editable_paths:
            if p.startswith("/") or ".." in p.split("/"):
                raise ValueError(f"editable_paths: {p!r} must be relative to the root, without '..'")
        for c in allowed_commands:
            if "/" in c:
                raise ValueError(f"allowed_commands: {c!r} must be a command name, not a path")
        if (isinstance(command_seconds, bool) or not isinstance(command_seconds, (int, float))
                or not 0 < command_seconds < float("inf")):
            raise ValueError(f"command_seconds: a number of seconds > 0, got {command_seconds!r}")
        if isinstance(output_bytes, bool) or not isinstance(output_bytes, int) or output_bytes < 64:
            raise ValueError(f"output_bytes: an integer >= 64, got {output_bytes!r}")
        if not isinstance(command_limits, CommandLimits):
            raise ValueError(f"command_limits: a CommandLimits, got {command_limits!r}")
        if not isinstance(unsandboxed, bool):
            raise ValueError(f"unsandboxed: True or False, got {unsandboxed!r}")
        self.command_limits = command_limits
        self.unsandboxed = unsandboxed
        self._sandbox: tuple[Sandbox | None, str] | None = None  # found at the first command
        self.editable_paths = tuple(editable_paths)
        self.allowed_commands = tuple(allowed_commands)
        self.command_seconds = float(command_seconds)
        self.output_bytes = output_bytes
        self._editable = [glob_regex(p) for p in self.editable_paths]
        if blob_dir is None:
            blob_dir = Path(tempfile.mkdtemp(prefix="tiny-llm-blobs-"))
        blob_dir = Path(os.path.realpath(blob_dir))
        if blob_dir == self.root or self.root in blob_dir.parents:
            raise ValueError(f"blob_dir: {blob_dir} is inside the workspace; keep it outside")
        blob_dir.mkdir(parents=True, exist_ok=True)
        self.blob_dir = blob_dir
        self.tools = make_tools(self.editable_paths, self.allowed_commands)
        self._schemas = {t.name: t.parameters for t in self.tools}
        self._handlers: dict[str, Callable[[dict], tuple[str, int | None]]] = {
            "list": self._list, "read": self._read, "search": self._search,
            "edit": self._edit, "write": self._write, "run": self._run,
        }

    # ---- the policy boundary ---------------------------------------------------------------

    def rel(self, path: Path) -> str:
        """A path under the root as the tools show it: relative, with `/`; the root is `.`."""
        return path.relative_to(self.root).as_posix() or "."

    def resolve(self, path: str, *, write: bool = False) -> Path:
        """The real path `path` names inside the workspace, or PolicyError with the reason.

        Refused: an empty path, a NUL byte, an absolute path, any `..` component, a symlink
        (at any component, through any chain) whose target leaves the root, more than
        MAX_SYMLINKS symlinks, a FIFO, socket or device file, a regular file with more than
        one hard link (it may share its bytes with a file outside), and with `write`, the
        root itself or a real path that no pattern of `editable_paths` matches. A path that
        does not exist yet is fine (it is checked up to where it stops existing)."""
        # BEGIN SOLUTION week4-day2
        if not isinstance(path, str) or not path:
            raise PolicyError("the path is empty; give a path relative to the workspace root")
        if "\0" in path:
            raise PolicyError(f"{show(path)}: a path cannot hold a NUL byte")
        if path.startswith("/"):
            raise PolicyError(f"{show(path)}: absolute paths are refused; give a path relative to the workspace root")
        if ".." in path.split("/"):
            raise PolicyError(f"{show(path)}: '..' is refused; paths stay inside the workspace")
        # Walk one component at a time from the root. A symlink's target replaces it in the
        # queue (relative to the folder that holds it), so a chain of symlinks is followed
        # hop by hop and every hop must stay inside.
        parts, current, hops, via = deque(path.split("/")), self.root, 0, ""
        while parts:
            part = parts.popleft()
            if part in ("", "."):
                continue
            if part == "..":  # only a symlink's target brings one here
                if current == self.root:
                    raise PolicyError(f"{show(path)}: the symlink {show(via)} leads out of the workspace")
                current = current.parent
                continue
            candidate = current / part
            if not candidate.is_symlink():
                current = candidate
                continue
            hops += 1
            via = self.rel(candidate)
            if hops > MAX_SYMLINKS:
                raise PolicyError(f"{show(path)}: more than {MAX_SYMLINKS} symlinks (a loop?)")
            target = os.readlink(candidate)
            if target.startswith("/"):
                components = Path(target).parts
                inside = [r for r in self._roots if components[:len(r)] == r]
                if not inside:
                    raise PolicyError(f"{show(path)}: the symlink {show(via)} leads out of the workspace")
                current, rest = self.root, components[len(inside[0]):]
            else:
                rest = target.split("/")
            parts.extendleft(reversed(rest))
        try:
            st = os.lstat(current)
        except (FileNotFoundError, NotADirectoryError):
            st = None
        if st is not None:
            kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device file"),
                     (stat.S_ISBLK, "a device file"))
            for test, kind in kinds:
                if test(st.st_mode):
                    raise PolicyError(f"{show(path)} is {kind}; only regular files and folders are allowed")
            if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
                raise PolicyError(f"{show(path)} is neither a regular file nor a folder")
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                raise PolicyError(f"{show(path)} has {st.st_nlink} hard links; it may share its bytes "
                                  "with a file outside the workspace")
        if write:
            rel = self.rel(current)
            if rel == ".":
                raise PolicyError(f"{show(path)} is the workspace root, not a file")
            if not any(p.match(rel) for p in self._editable):
                raise PolicyError(f"{show(path)} is outside the editable paths ({', '.join(self.editable_paths)})")
        return current
        # END SOLUTION

    def prepare_command(self, argv: list[str], home: Path) -> tuple[str, dict[str, str]]:
        """The executable for `argv` and the environment a run gets. PolicyError unless argv[0]
        is one of `allowed_commands`, ToolError if it is not on PATH. The environment holds
        PATH (this interpreter's folder, then the parent's absolute folders outside the
        root), LANG and HOME=`home`, and nothing else of the parent's: no API keys, tokens or
        credentials leak into what the agent runs."""
        # BEGIN SOLUTION week4-day2
        name = argv[0]
        if name not in self.allowed_commands:
            allowed = ", ".join(self.allowed_commands) or "none"
            raise PolicyError(f"{show(name)} is not an allowed command (allowed: {allowed})")
        # Only absolute folders outside the root: a relative entry such as "bin" would be
        # looked up from the root, where the agent can write a program of that name.
        folders = [os.path.dirname(sys.executable)] + os.environ.get("PATH", os.defpath).split(os.pathsep)
        path = os.pathsep.join(dict.fromkeys(
            f for f in folders if os.path.isabs(f) and not Path(os.path.realpath(f)).is_relative_to(self.root)))
        executable = shutil.which(name, path=path)
        if executable is None:
            raise ToolError(f"{show(name)} is allowed but not found on PATH")
        env = {"PATH": path, "LANG": os.environ.get("LANG") or "C.UTF-8", "HOME": str(home)}
        return executable, env
        # END SOLUTION

    # ---- outputs: a bounded preview, the whole bytes kept ----------------------------------

    def keep(self, data: bytes) -> str:
        """Store `data` in the blob folder under its SHA-256 (once); return the digest."""
        digest = hashlib.sha256(data).hexdigest()
        target = self.blob_dir / digest
        if not target.exists():
            _write_bytes(target, data, None)
        return digest

    def read_blob(self, blob: str, start: int, end: int) -> bytes:
        """Bytes `start` to `end` (exclusive) of a kept output; at most `output_bytes` of them,
        and `end` past the blob's size reads to its end. ToolError for a bad range or an
        unknown blob."""
        if not isinstance(blob, str) or not BLOB.fullmatch(blob):
            raise ToolError("blob must be 64 lowercase hex digits (the SHA-256 an earlier output named)")
        if start < 0 or end < start:
            raise ToolError(f"bad byte range {start}..{end}: need 0 <= start <= end")
        if end - start > self.output_bytes:
            raise ToolError(f"a blob range is at most {self.output_bytes} bytes (asked {end - start})")
        try:
            with open(self.blob_dir / blob, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if start > size:
                    raise ToolError(f"start {start} is past the end of the blob ({size} bytes)")
                f.seek(start)
                return f.read(end - start)
        except FileNotFoundError:
            raise ToolError(f"no kept output has the digest {blob}") from None

    def cut(self, data: bytes) -> str:
        """An output as the model sees it: whole if it fits in `output_bytes`; otherwise its
        head and tail (about half of `output_bytes` each, cut between characters) around one
        line that names the blob keeping all of it and the range to read next."""
        # BEGIN SOLUTION week4-day2
        n = len(data)
        if n <= self.output_bytes:
            return decode(data)
        blob = self.keep(data)
        head = head_end(data, self.output_bytes // 2)
        tail = tail_start(data, n - (self.output_bytes - self.output_bytes // 2))
        nxt = min(tail, head + self.output_bytes)
        note = (f"[... {tail - head} of {n} bytes not shown; all of them are kept as blob {blob}: "
                f'read {{"blob": "{blob}", "start": {head}, "end": {nxt}}} for the next ones]')
        before = decode(data[:head])
        return before + ("" if before.endswith("\n") else "\n") + note + "\n" + decode(data[tail:])
        # END SOLUTION

    # ---- receipts ---------------------------------------------------------------------------

    def digest(self, path: str) -> str | None:
        """The SHA-256 (hex) of the file at `path`, None if nothing is there; PolicyError if
        the policy refuses the path, ToolError if it names a folder. The file's bytes are
        kept in the blob folder under that digest, for `restore`."""
        real = self.resolve(path)
        if not os.path.lexists(real):
            return None
        if real.is_dir():
            raise ToolError(f"{show(path)} is a folder")
        return self._keep_file(real)

    def _keep_file(self, real: Path) -> str:
        """The SHA-256 of a regular file, its bytes kept in the blob folder under it (copied
        while hashed; a blob already there is not written again)."""
        h = hashlib.sha256()
        tmp = self.blob_dir / f".incoming-{os.getpid()}-{threading.get_ident()}"
        with os.fdopen(_open_regular(real), "rb") as f, open(tmp, "wb") as out:
            while chunk := f.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
        digest = h.hexdigest()
        if (self.blob_dir / digest).exists():
            tmp.unlink()
        else:
            os.replace(tmp, self.blob_dir / digest)
        return digest

    def touched(self, action: Action) -> list[str]:
        """The workspace-relative paths `action` may change, for receipts and for a log that
        records them before the effect. edit, write: the real path they name (when the policy
        allows the write). run: every regular file under the root (not through symlinks; the
        first TREE_FILES by path), since a command may change any of them; after a run the
        list also holds the files it created. Other tools, and actions the policy or their
        arguments refuse: []. `digest` never raises for a path this returns."""
        args = action.args if isinstance(action.args, dict) else {}
        if action.tool in ("edit", "write"):
            path = args.get("path")
            try:
                real = self.resolve(path, write=True)
            except (PolicyError, OSError, ValueError):
                return []
            return [] if real.is_dir() else [self.rel(real)]
        if action.tool == "run":
            command = args.get("command")
            if (not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command)
                    or command[0] not in self.allowed_commands):
                return []
            return self.tree()
        return []

    def tree(self) -> list[str]:
        """The readable regular files under the root (single links, not through symlinks),
        by path; at most TREE_FILES."""
        files = []
        for rel, kind in self._walk(self.root, None):
            if kind == "file" and os.access(self.root / rel, os.R_OK):
                files.append(rel)
                if len(files) == TREE_FILES:
                    break
        return files

    def _with_receipt(self, action: Action, handler: Callable[[dict], tuple[str, int | None]]) -> Observation:
        """Perform an effect and record it: the digests of the paths `touched` names before
        and after (a path absent on one side is None there), the arguments and the exit
        status. An effect refused before it starts raises, and leaves no receipt."""
        # BEGIN SOLUTION week4-day2
        before = {p: self.digest(p) for p in self.touched(action)}
        text, status = handler(action.args)
        after = {p: self.digest(p) for p in self.touched(action)}
        paths = sorted(before.keys() | after.keys())
        receipt = Receipt(action.tool, deepcopy(action.args), {p: before.get(p) for p in paths},
                          {p: after.get(p) for p in paths}, status)
        return Observation(text, ok=status in (None, 0), receipt=receipt)
        # END SOLUTION

    # ---- perform ----------------------------------------------------------------------------

    def perform(self, action: Action) -> Observation:
        """Do `action` and say what happened. Bad arguments, refused paths and commands, and
        failures are `Observation(ok=False, text="<tool>: <reason>")`, never exceptions."""
        tool = action.tool
        if tool not in self._handlers:
            return Observation(f"unknown tool {show(str(tool))} (tools: {', '.join(self._handlers)})", ok=False)
        reason = check_args(self._schemas[tool], action.args)
        if reason:
            return Observation(f"{tool}: {reason}", ok=False)
        try:
            if tool in EFFECTS:
                return self._with_receipt(action, self._handlers[tool])
            text, _ = self._handlers[tool](action.args)
            return Observation(text)
        except (PolicyError, ToolError) as e:
            return Observation(f"{tool}: {e}", ok=False)
        except OSError as e:
            where = f"{show(action.args['path'])}: " if isinstance(action.args.get("path"), str) else ""
            return Observation(f"{tool}: {where}{e.strerror or type(e).__name__}", ok=False)
        except ValueError as e:  # e.g. a name the file system cannot encode
            return Observation(f"{tool}: {str(e).splitlines()[0] if str(e) else type(e).__name__}", ok=False)

    # ---- the tools (each returns its text and, for run, the exit status) -------------------

    def _walk(self, top: Path, depth: int | None) -> Iterator[tuple[str, str]]:
        """(relative path, kind) under `top`, depth first in name order, `depth` levels deep
        (None: all). Symlinks are reported, never followed; kind is one of dir, file, link,
        fifo, socket, other."""
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
            yield self.rel(Path(entry.path)), kind
            if kind == "dir" and (depth is None or depth > 1):
                yield from self._walk(Path(entry.path), None if depth is None else depth - 1)

    def _list(self, args: dict) -> tuple[str, None]:
        real = self.resolve(args.get("path", "."))
        if not real.exists():
            raise ToolError(f"{show(args.get('path', '.'))} does not exist")
        if not real.is_dir():
            return self.rel(real) + "\n", None
        marks = {"dir": "/", "file": "", "link": "@", "fifo": "|", "socket": "=", "other": ""}
        lines = []
        for rel, kind in self._walk(real, args.get("depth", DEFAULT_DEPTH)):
            if len(lines) == MAX_ENTRIES:
                lines.append(f"[list stopped at {MAX_ENTRIES} entries]")
                break
            lines.append(rel + marks[kind])
        return self.cut("".join(line + "\n" for line in lines).encode()) if lines else "(empty)\n", None

    def _read(self, args: dict) -> tuple[str, None]:
        if "blob" in args:
            return decode(self.read_blob(args["blob"], args["start"], args["end"])), None
        path = args["path"]
        real = self.resolve(path)
        if not real.exists():
            raise ToolError(f"{show(path)} does not exist")
        if real.is_dir():
            raise ToolError(f"{show(path)} is a folder; use list")
        lines = _read_bytes(real, show(path)).splitlines(keepends=True)
        start, end = args.get("start_line", 1), args.get("end_line", max(len(lines), 1))
        if start > max(len(lines), 1):
            raise ToolError(f"start_line {start} is past the end of {show(path)} ({len(lines)} lines)")
        if end < start:
            raise ToolError(f"end_line {end} is before start_line {start}")
        return self.cut(b"".join(lines[start - 1:end])), None

    def _search(self, args: dict) -> tuple[str, None]:
        pattern, path = args["pattern"], args.get("path", ".")
        if args.get("regex", False):
            # An automaton, not `re`: one pass over each line whatever the pattern, where
            # backtracking could stall a step on a pattern such as (a+)+$.
            from ..constrain.automata import DFA, TooLarge

            try:
                matcher = DFA.from_search(pattern).accepts
            except TooLarge:
                raise ToolError(f"the regular expression {show(pattern)} needs too large an automaton (a long "
                                "counted repetition, such as .{30}?); search with a simpler one") from None
            except ValueError as e:
                raise ToolError(f"bad regular expression: {str(e).removeprefix('regex: ')}") from None
        else:
            def matcher(line: str) -> bool:
                return pattern in line
        real = self.resolve(path)
        if not real.exists():
            raise ToolError(f"{show(path)} does not exist")
        files = [(self.rel(real), "file")] if real.is_file() else self._walk(real, None)
        out, n = [], 0
        for rel, kind in files:
            if kind != "file":
                continue
            try:
                data = _read_bytes(self.root / rel, rel)
            except (ToolError, OSError):
                continue
            if b"\0" in data:  # a binary file
                continue
            for number, raw in enumerate(data.splitlines(), 1):  # the lines `read` counts
                line = decode(raw)
                if matcher(line):
                    if n == MAX_MATCHES:
                        out.append(f"[search stopped at {MAX_MATCHES} matches]")
                        return self.cut("".join(o + "\n" for o in out).encode()), None
                    out.append(f"{rel}:{number}:{line}")
                    n += 1
        return self.cut("".join(o + "\n" for o in out).encode()) if out else "no matches\n", None

    def _edit(self, args: dict) -> tuple[str, None]:
        path = args["path"]
        real = self.resolve(path, write=True)
        if not real.exists():
            raise ToolError(f"{show(path)} does not exist; use write to create a file")
        if real.is_dir():
            raise ToolError(f"{show(path)} is a folder")
        data = _read_bytes(real, show(path))
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{show(path)} is not UTF-8 text") from None
        new = replace_once(text, args["old"], args["new"], path=show(path)).encode()
        _write_bytes(real, new, stat.S_IMODE(os.stat(real).st_mode))
        return f"edited {self.rel(real)}: {len(data)} -> {len(new)} bytes\n", None

    def _write(self, args: dict) -> tuple[str, None]:
        path = args["path"]
        real = self.resolve(path, write=True)
        if os.path.lexists(real):
            raise ToolError(f"{show(path)} exists; write makes new files only (use edit)")
        data = args["content"].encode()
        real.parent.mkdir(parents=True, exist_ok=True)
        _write_bytes(real, data, None)
        return f"wrote {self.rel(real)}: {len(data)} bytes\n", None

    def sandbox(self) -> tuple[Sandbox | None, str]:
        """The sandbox commands run in, or None and why there is none (found once)."""
        if self._sandbox is None:
            self._sandbox = find_sandbox()
        return self._sandbox

    def describe_sandbox(self) -> str:
        """One line: how commands run here (the sandbox and the limits, or why unsandboxed)."""
        sandbox, why = self.sandbox()
        limits = f"limits: {self.command_limits.describe()}, {self.command_seconds:g} s wall clock"
        if sandbox is not None:
            return f"sandbox: {sandbox.describe()}; {limits}"
        if self.unsandboxed:
            return f"sandbox: none, commands run unsandboxed (--unsandboxed-commands; {why}); {limits}"
        return f"sandbox: none, commands are refused ({why}); {limits}"

    def _run(self, args: dict) -> tuple[str, int]:
        argv = args["command"]
        if any("\0" in a for a in argv):
            raise ToolError("an argument cannot hold a NUL byte")
        sandbox, why = self.sandbox()
        if sandbox is None and not self.unsandboxed:
            raise PolicyError(f"{why}; or let commands run without one (--unsandboxed-commands)")
        home = Path(tempfile.mkdtemp(prefix="tiny-llm-home-"))
        cgroup = None
        try:
            executable, env = self.prepare_command(argv, home)
            if sandbox is not None:
                policy = Policy(self.root, readable_folders([executable], keep_out=[self.root, Path.home()]), home)
                command, program = sandbox.wrap(argv, executable, policy), sandbox.program
            else:
                command, program = argv, executable
            cgroup = PidsCgroup.make(self.command_limits.processes)
            proc = subprocess.Popen(command, executable=program, cwd=self.root, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=child_setup(self.command_limits, cgroup))
            self._mark_running(proc.pid)
            chunks, dropped = [], [0]

            def drain() -> None:  # read all of it, so the child never blocks on a full pipe
                kept = 0
                while chunk := proc.stdout.read1(1 << 16):
                    room = KEEP_BYTES - kept
                    chunks.append(chunk[:room])
                    kept += min(len(chunk), room)
                    dropped[0] += max(0, len(chunk) - room)

            reader = threading.Thread(target=drain, daemon=True)
            reader.start()
            timed_out = False
            try:
                status = proc.wait(timeout=self.command_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc.pid)
                status = proc.wait()
            _kill_group(proc.pid)  # what it left running in the background goes too
            reader.join(timeout=5)
            proc.stdout.close()
        finally:
            if cgroup is not None:
                cgroup.close()  # and what left the process group, within the command's cgroup
            self._running_file().unlink(missing_ok=True)
            shutil.rmtree(home, ignore_errors=True)
        text = self.cut(b"".join(chunks))
        if text and not text.endswith("\n"):
            text += "\n"
        if dropped[0]:
            text += f"[{dropped[0]} more bytes of output were dropped]\n"
        unsandboxed = "" if sandbox is not None else "; not sandboxed (--unsandboxed-commands)"
        if timed_out:
            text += f"[timed out after {self.command_seconds:g} s: killed, exit status {status}{unsandboxed}]\n"
        else:
            text += f"[exit status {status}{self._limit_hit(status)}{unsandboxed}]\n"
        return text, status

    def _limit_hit(self, status: int) -> str:
        """Which limit a command's exit status shows it ran into (a signal the limit sends:
        directly, or as bubblewrap reports it, 128 + the signal), or ""."""
        signals = {signal.SIGXCPU: f"CPU time limit ({self.command_limits.cpu_seconds} s)",
                   signal.SIGXFSZ: f"file size limit ({self.command_limits.file_bytes} bytes)"}
        for number, what in signals.items():
            if status in (-number, 128 + number):
                return f": killed by the {what}"
        return ""

    # ---- no command outlives the agent ------------------------------------------------------

    def _running_file(self) -> Path:
        return self.blob_dir / "running.json"

    def _mark_running(self, pid: int) -> None:
        """Note the running command (its process group and start time) beside the blobs: a run
        resumed after the agent was killed can make sure it is gone (`reap`)."""
        _write_bytes(self._running_file(), json.dumps({"pid": pid, "start": _start_time(pid)}).encode(), None)

    def reap(self) -> str:
        """Kill a command a killed agent left running (in this blob folder's record), and wait
        until it is gone; return what was done, "" if nothing was running. The process is
        recognised by its start time, so a new process that reuses the number is left alone."""
        try:
            record = json.loads(self._running_file().read_text())
            pid, start = int(record["pid"]), record["start"]
        except (OSError, ValueError, KeyError, TypeError):
            return ""
        said = ""
        if start is not None and _start_time(pid) == start:
            _kill_group(pid)
            for _ in range(500):
                if _start_time(pid) != start:
                    break
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                threading.Event().wait(0.01)
            said = f"killed the command the stopped run left running (process group {pid})"
        self._running_file().unlink(missing_ok=True)
        return said

    # ---- undo -------------------------------------------------------------------------------

    def restore(self, state: dict[str, str | None]) -> tuple[list[str], list[str]]:
        """Make each path of `state` hold the kept bytes of its digest (None: no file there),
        through the path policy (a path now leading out of the workspace is refused). Returns
        the paths written and the paths removed; PolicyError/ToolError for what cannot be."""
        written, removed = [], []
        for path, digest in sorted(state.items()):
            real = self.resolve(path)
            now = self.digest(path) if os.path.lexists(real) and not real.is_dir() else None
            if now == digest:
                continue
            if digest is None:
                real.unlink()
                removed.append(path)
                continue
            blob = self.blob_dir / digest
            if not BLOB.fullmatch(digest) or not blob.is_file():
                raise ToolError(f"{show(path)}: its bytes ({digest[:12]}...) are not in the blob folder {self.blob_dir}")
            if real.is_dir():
                raise ToolError(f"{show(path)} is a folder now; move it away first")
            real.parent.mkdir(parents=True, exist_ok=True)
            _write_bytes(real, blob.read_bytes(), None)
            written.append(path)
        return written, removed

    # ---- copies -----------------------------------------------------------------------------

    def copy(self, dest: Path) -> Workspace:
        """A new workspace at `dest` (which must not exist, outside this root) with the same
        files, symlinks as symlinks, the same settings and the same blob folder. FIFOs,
        sockets and device files are not copied."""
        dest = Path(os.path.abspath(dest))
        if os.path.lexists(dest):
            raise ValueError(f"dest: {dest} exists")
        if self.root in Path(os.path.realpath(dest)).parents:
            raise ValueError(f"dest: {dest} is inside the workspace")

        def special(folder: str, names: list[str]) -> list[str]:
            return [n for n in names if not (stat.S_ISREG(m := os.lstat(os.path.join(folder, n)).st_mode)
                                             or stat.S_ISDIR(m) or stat.S_ISLNK(m))]

        shutil.copytree(self.root, dest, symlinks=True, ignore=special)
        return Workspace(dest, editable_paths=self.editable_paths, allowed_commands=self.allowed_commands,
                         command_seconds=self.command_seconds, output_bytes=self.output_bytes,
                         blob_dir=self.blob_dir, command_limits=self.command_limits, unsandboxed=self.unsandboxed)


def _start_time(pid: int) -> str | None:
    """When process `pid` started (field 22 of /proc/PID/stat, in clock ticks since boot), or
    None if it is gone or a zombie. Without /proc (macOS): "?" while the process exists."""
    if not os.path.isdir("/proc"):
        try:
            os.kill(pid, 0)
            return "?"
        except OSError:
            return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ---- the tools' argument schemas --------------------------------------------------------------

PATH_ARG = {"type": "string", "description": "a path relative to the workspace root"}


def make_tools(editable_paths: Sequence[str], allowed_commands: Sequence[str]) -> tuple[Tool, ...]:
    """The six tools with the JSON schemas of their arguments. `run`'s first argument is
    one of the allowed commands (an enum the grammar enforces while decoding)."""
    command: dict = {"type": "array", "items": {"type": "string"}, "minItems": 1}
    if allowed_commands:
        command["prefixItems"] = [{"enum": list(allowed_commands)}]
    lines = {"type": "object", "properties": {"path": PATH_ARG, "start_line": {"type": "integer", "minimum": 1},
                                              "end_line": {"type": "integer", "minimum": 1}},
             "required": ["path"], "additionalProperties": False}
    blob = {"type": "object", "properties": {"blob": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                                             "start": {"type": "integer", "minimum": 0},
                                             "end": {"type": "integer", "minimum": 0}},
            "required": ["blob", "start", "end"], "additionalProperties": False}
    editable = ", ".join(editable_paths)
    allowed = ", ".join(allowed_commands) or "none are allowed here"
    return (
        Tool("list", f"List a folder's entries, {DEFAULT_DEPTH} levels deep by default (folders end with /, "
                     "symlinks with @).",
             {"type": "object", "properties": {"path": PATH_ARG, "depth": {"type": "integer", "minimum": 1,
                                                                           "maximum": MAX_DEPTH}},
              "additionalProperties": False}),
        Tool("read", "Read a text file, or lines start_line to end_line of it (from 1, inclusive); or bytes "
                     "start to end of a long output kept as a blob.", {"anyOf": [lines, blob]}),
        Tool("search", f"Find lines that contain a text (or match a regular expression if regex is true) in "
                       f"the files under a path; at most {MAX_MATCHES} lines, as path:line:text.",
             {"type": "object", "properties": {"pattern": {"type": "string", "minLength": 1},
                                               "regex": {"type": "boolean"}, "path": PATH_ARG},
              "required": ["pattern"], "additionalProperties": False}),
        Tool("edit", f"Replace the exact text old by new in a file; old must occur exactly once. Editable: "
                     f"{editable}.",
             {"type": "object", "properties": {"path": PATH_ARG, "old": {"type": "string", "minLength": 1},
                                               "new": {"type": "string"}},
              "required": ["path", "old", "new"], "additionalProperties": False}),
        Tool("write", f"Create a new file with the given content (never overwrites). Editable: {editable}.",
             {"type": "object", "properties": {"path": PATH_ARG, "content": {"type": "string"}},
              "required": ["path", "content"], "additionalProperties": False}),
        Tool("run", f"Run a command in the workspace root, without a shell: command is the argument list. "
                    f"Commands: {allowed}.",
             {"type": "object", "properties": {"command": command}, "required": ["command"],
              "additionalProperties": False}),
    )


def check_args(schema: dict, value: object, name: str = "arguments") -> str | None:
    """Why `value` does not fit `schema` (the keywords the tools use, except enums: a
    command's name is the policy's to refuse), or None if it fits."""
    if "anyOf" in schema:
        options = schema["anyOf"]
        reasons = [check_args(o, value, name) for o in options]
        if None in reasons:
            return None
        keys = set(value) if isinstance(value, dict) else set()
        return max(zip(options, reasons), key=lambda o: len(keys & set(o[0].get("properties", {}))))[1]
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            return f"{name} must be a JSON object"
        for key in schema.get("required", ()):
            if key not in value:
                return f"missing argument {key!r}"
        props = schema.get("properties", {})
        for key, v in value.items():
            if key not in props:
                return f"unknown argument {show(str(key))} (arguments: {', '.join(props)})"
            if reason := check_args(props[key], v, key):
                return reason
    elif kind == "string":
        if not isinstance(value, str):
            return f"{name} must be a string"
        if len(value) < schema.get("minLength", 0):
            return f"{name} must not be empty"
        if "pattern" in schema and not re.search(schema["pattern"], value):
            return f"{name} must match {schema['pattern']}"
    elif kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{name} must be an integer"
        if value < schema.get("minimum", value):
            return f"{name} must be >= {schema['minimum']}"
        if value > schema.get("maximum", value):
            return f"{name} must be <= {schema['maximum']}"
    elif kind == "boolean":
        if not isinstance(value, bool):
            return f"{name} must be true or false"
    elif kind == "array":
        if not isinstance(value, list):
            return f"{name} must be a list"
        if len(value) < schema.get("minItems", 0):
            return f"{name} must have at least {schema['minItems']} item(s)"
        for i, item in enumerate(value):
            if reason := check_args(schema.get("items", {}), item, f"{name}[{i}]"):
                return reason
    return None
