"""Course: week 4 day 2 — the workspace: the agent's tools (list, read, search, edit, write,
run) behind one boundary, bounded outputs kept whole in a content-addressed store, and a
receipt for every effect.

    ws = Workspace(root, editable_paths=["src/**"], allowed_commands=["python"])
    ws.perform(Action("read", {"path": "src/app.py", "start_line": 1, "end_line": 20}))
    ws.perform(Action("edit", {"path": "src/app.py", "old": "x = 1", "new": "x = 2"})).receipt

What the tools may touch is decided in one place, `boundary.py`: every path passes
`Boundary.resolve`, and every command is what `Boundary.command` prepares (an allowed program,
an environment without the parent's secrets, the machine's sandbox). `perform` checks each
call's arguments against its tool's schema (`actions.check_value`, the check the loop uses),
and turns every refusal and failure into `Observation(ok=False, text=...)`; it never raises
for what a model wrote.

A command runs under resource limits (`runner.py`) and its receipt records how it ended
(exit status, time limit, output dropped). Every file an effect may change is kept in the
blob store before and after it (by content: an unchanged file costs nothing), so any step can
be undone (`restore`).

Tests: tests/test_week4_day2.py, tests/test_week4_day3.py, tests/test_week4_day5.py
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Sequence
from copy import deepcopy
from pathlib import Path

from . import blobs, receipts, runner
from .actions import check_value
from .boundary import Boundary, PolicyError, show
from .core import Action, Observation, Receipt, ToolError
from .files import read_bytes, walk, write_bytes
from .outputs import decode, head_end, tail_start
from .runner import CommandResult, closing_lines
from .sandbox import CommandLimits
from .tools import DEFAULT_DEPTH, MAX_ENTRIES, MAX_MATCHES, make_tools

__all__ = ["Workspace", "refusal", "replace_once"]

Handler = Callable[[dict], tuple[str, CommandResult | None]]  # a tool: its text, and a command's result


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


def refusal(action: Action, error: Exception) -> str:
    """How a tool's refusal or failure reads in its observation: `<tool>: <reason>`, on one
    line (an OSError by the path it concerns and its reason)."""
    if isinstance(error, (PolicyError, ToolError)):
        return f"{action.tool}: {error}"
    if isinstance(error, OSError):
        path = action.args.get("path") if isinstance(action.args, dict) else None
        where = f"{show(path)}: " if isinstance(path, str) else ""
        return f"{action.tool}: {where}{error.strerror or type(error).__name__}"
    return f"{action.tool}: {str(error).splitlines()[0] if str(error) else type(error).__name__}"


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
        self.boundary = Boundary(root, editable_paths=editable_paths, allowed_commands=allowed_commands,
                                 unsandboxed=unsandboxed)
        if (isinstance(command_seconds, bool) or not isinstance(command_seconds, (int, float))
                or not 0 < command_seconds < float("inf")):
            raise ValueError(f"command_seconds: a number of seconds > 0, got {command_seconds!r}")
        if isinstance(output_bytes, bool) or not isinstance(output_bytes, int) or output_bytes < 64:
            raise ValueError(f"output_bytes: an integer >= 64, got {output_bytes!r}")
        if not isinstance(command_limits, CommandLimits):
            raise ValueError(f"command_limits: a CommandLimits, got {command_limits!r}")
        self.root = self.boundary.root
        self.editable_paths = self.boundary.editable_paths
        self.allowed_commands = self.boundary.allowed_commands
        self.unsandboxed = unsandboxed
        self.command_limits = command_limits
        self.command_seconds = float(command_seconds)
        self.output_bytes = output_bytes
        if blob_dir is None:
            blob_dir = Path(tempfile.mkdtemp(prefix="tiny-llm-blobs-"))
        blob_dir = Path(os.path.realpath(blob_dir))
        if blob_dir == self.root or self.root in blob_dir.parents:
            raise ValueError(f"blob_dir: {blob_dir} is inside the workspace; keep it outside")
        self.blobs = blobs.BlobStore(blob_dir)
        self.blob_dir = blob_dir
        self.tools = make_tools(self.editable_paths, self.allowed_commands)
        self._schemas = {t.name: t.parameters for t in self.tools}
        self._handlers: dict[str, Handler] = {
            "list": self._list, "read": self._read, "search": self._search,
            "edit": self._edit, "write": self._write, "run": self._run,
        }

    # ---- the boundary's two doors, and what receipts and undo are made of ------------------

    def rel(self, path: Path) -> str:
        """A path under the root as the tools show it: relative, with `/`; the root is `.`."""
        return self.boundary.rel(path)

    def resolve(self, path: str, *, write: bool = False) -> Path:
        """The real path `path` names inside the workspace, or PolicyError (`Boundary.resolve`)."""
        return self.boundary.resolve(path, write=write)

    def digest(self, path: str) -> str | None:
        """The SHA-256 (hex) of the file at `path`, None if nothing is there, its bytes kept in
        the blob folder (`blobs.file_digest`)."""
        return blobs.file_digest(self.boundary, self.blobs, path)

    def touched(self, action: Action) -> list[str]:
        """The paths `action` may change (`receipts.touched`); after a run the list also holds
        the files it created. `digest` never raises for a path this returns."""
        return receipts.touched(self.boundary, action)

    def tree(self) -> list[str]:
        """The readable regular files under the root, by path (`receipts.tree`)."""
        return receipts.tree(self.boundary)

    def restore(self, state: dict[str, str | None]) -> tuple[list[str], list[str]]:
        """Put back the kept bytes of each path of `state` (`blobs.restore`): the paths
        written and the paths removed."""
        return blobs.restore(self.boundary, self.blobs, state)

    def read_blob(self, blob: str, start: int, end: int) -> bytes:
        """Bytes `start` to `end` of a kept output, at most `output_bytes` of them."""
        return self.blobs.read(blob, start, end, self.output_bytes)

    def reap(self) -> str:
        """Kill a command a killed agent left running (`runner.reap`); what was done, or ""."""
        return runner.reap(self._running_file())

    def _running_file(self) -> Path:
        return self.blob_dir / "running.json"

    # ---- outputs: a bounded preview, the whole bytes kept ----------------------------------

    def cut(self, data: bytes) -> str:
        """An output as the model sees it: whole if it fits in `output_bytes`; otherwise its
        head and tail (about half of `output_bytes` each, cut between characters) around one
        line that names the blob keeping all of it and the range to read next."""
        # BEGIN SOLUTION week4-day2
        n = len(data)
        if n <= self.output_bytes:
            return decode(data)
        blob = self.blobs.keep(data)
        head = head_end(data, self.output_bytes // 2)
        tail = tail_start(data, n - (self.output_bytes - self.output_bytes // 2))
        nxt = min(tail, head + self.output_bytes)
        note = (f"[... {tail - head} of {n} bytes not shown; all of them are kept as blob {blob}: "
                f'read {{"blob": "{blob}", "start": {head}, "end": {nxt}}} for the next ones]')
        before = decode(data[:head])
        return before + ("" if before.endswith("\n") else "\n") + note + "\n" + decode(data[tail:])
        # END SOLUTION

    # ---- receipts ---------------------------------------------------------------------------

    def _with_receipt(self, action: Action, handler: Handler) -> Observation:
        """Perform an effect and record it: the digests of the paths `touched` names before
        and after (a path absent on one side is None there), the arguments, and for a command
        how it ended (exit status, timed out, bytes dropped). An effect refused before it
        starts raises, and leaves no receipt."""
        # BEGIN SOLUTION week4-day2
        before = {p: self.digest(p) for p in self.touched(action)}
        text, result = handler(action.args)
        after = {p: self.digest(p) for p in self.touched(action)}
        paths = sorted(before.keys() | after.keys())
        ended = (result.exit_status, result.timed_out, result.dropped_bytes) if result else (None, None, None)
        receipt = Receipt(action.tool, deepcopy(action.args), {p: before.get(p) for p in paths},
                          {p: after.get(p) for p in paths}, *ended)
        return Observation(text, ok=ended[0] in (None, 0), receipt=receipt)
        # END SOLUTION

    # ---- perform ----------------------------------------------------------------------------

    def perform(self, action: Action) -> Observation:
        """Do `action` and say what happened. Arguments its tool's schema refuses are
        `Observation(ok=False, text="<tool> args ...")` (`actions.check_value`'s reason);
        refused paths and commands, and failures, `Observation(ok=False, text="<tool>:
        <reason>")`; never exceptions."""
        tool = action.tool
        if tool not in self._handlers:
            return Observation(f"unknown tool {show(str(tool))} (tools: {', '.join(self._handlers)})", ok=False)
        try:
            check_value(action.args, self._schemas[tool], f"{tool} args")
        except ValueError as e:
            return Observation(str(e), ok=False)
        try:
            if tool in receipts.EFFECTS:
                return self._with_receipt(action, self._handlers[tool])
            text, _ = self._handlers[tool](action.args)
            return Observation(text)
        except (ValueError, OSError) as e:  # ValueError: also a name the file system cannot encode
            return Observation(refusal(action, e), ok=False)

    # ---- the tools (each returns its text and, for run, the command's result) -------------

    def _list(self, args: dict) -> tuple[str, None]:
        real = self.resolve(args.get("path", "."))
        if not real.exists():
            raise ToolError(f"{show(args.get('path', '.'))} does not exist")
        if not real.is_dir():
            return self.rel(real) + "\n", None
        marks = {"dir": "/", "file": "", "link": "@", "fifo": "|", "socket": "=", "other": ""}
        lines = []
        for rel, kind in walk(self.root, real, args.get("depth", DEFAULT_DEPTH)):
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
        lines = read_bytes(real, show(path)).splitlines(keepends=True)
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
        files = [(self.rel(real), "file")] if real.is_file() else walk(self.root, real, None)
        out, n = [], 0
        for rel, kind in files:
            if kind != "file":
                continue
            try:
                data = read_bytes(self.root / rel, rel)
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
        data = read_bytes(real, show(path))
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{show(path)} is not UTF-8 text") from None
        new = replace_once(text, args["old"], args["new"], path=show(path)).encode()
        write_bytes(real, new, stat.S_IMODE(os.stat(real).st_mode))
        return f"edited {self.rel(real)}: {len(data)} -> {len(new)} bytes\n", None

    def _write(self, args: dict) -> tuple[str, None]:
        path = args["path"]
        real = self.resolve(path, write=True)
        if os.path.lexists(real):
            raise ToolError(f"{show(path)} exists; write makes new files only (use edit)")
        data = args["content"].encode()
        real.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(real, data, None)
        return f"wrote {self.rel(real)}: {len(data)} bytes\n", None

    def run_command(self, argv: Sequence[str]) -> CommandResult:
        """Run `argv` as the `run` tool does: the boundary's command (PolicyError or ToolError
        when it refuses), with a new home folder removed afterwards, under the workspace's
        limits and time limit."""
        home = Path(tempfile.mkdtemp(prefix="tiny-llm-home-"))
        try:
            command = self.boundary.command(argv, home)
            return runner.run(command, self.command_limits, self.command_seconds, self._running_file())
        finally:
            shutil.rmtree(home, ignore_errors=True)

    def _run(self, args: dict) -> tuple[str, CommandResult]:
        result = self.run_command(args["command"])
        text = self.cut(result.output)
        if text and not text.endswith("\n"):
            text += "\n"
        return text + closing_lines(result, seconds=self.command_seconds, limits=self.command_limits), result

    def describe_sandbox(self) -> str:
        """One line: how commands run here (the sandbox and the limits, or why unsandboxed)."""
        sandbox, why = self.boundary.sandbox()
        limits = f"limits: {self.command_limits.describe()}, {self.command_seconds:g} s wall clock"
        if sandbox is not None:
            return f"sandbox: {sandbox.describe()}; {limits}"
        if self.unsandboxed:
            return f"sandbox: none, commands run unsandboxed (--unsandboxed-commands; {why}); {limits}"
        return f"sandbox: none, commands are refused ({why}); {limits}"

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
