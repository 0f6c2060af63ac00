"""Engine — the command runner: start a prepared command (`boundary.Command`) under its
resource limits, read all of its output, kill it at its time limit, leave nothing it started
running, and say how it ended as a typed `CommandResult`.

    result = run(command, CommandLimits(), seconds=30.0, record=blob_dir / "running.json")
    result.exit_status, result.timed_out, result.dropped_bytes, result.output
    closing_lines(result, seconds=30.0, limits=CommandLimits())   # "[exit status 0]\\n"

While a command runs, its process group and start time are noted in `record`, so an agent
killed in the middle can have the command killed when it resumes (`reap`).

Tests: tests/test_week4_day2.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from .boundary import Command
from .files import write_bytes
from .sandbox import CommandLimits, PidsCgroup, child_setup

__all__ = ["KEEP_BYTES", "CommandResult", "closing_lines", "reap", "run"]

KEEP_BYTES = 16 << 20  # a command's output beyond this is dropped (the rest is kept)


@dataclass(frozen=True)
class CommandResult:
    """How a command ended: its output (stdout and stderr as they came, the first
    KEEP_BYTES), its exit status (a negative signal number when a signal killed it),
    `timed_out` when it was killed at its time limit, the bytes of output dropped beyond
    KEEP_BYTES, and whether it ran in a sandbox."""

    output: bytes
    exit_status: int
    timed_out: bool
    dropped_bytes: int
    sandboxed: bool

    def __post_init__(self):
        if self.dropped_bytes < 0:
            raise ValueError(f"dropped_bytes: an integer >= 0, got {self.dropped_bytes!r}")


def run(command: Command, limits: CommandLimits, seconds: float, record: Path) -> CommandResult:
    """Run `command` with no input, its output and errors read together, in a session of its
    own under `limits` (and a pids cgroup where one can be made); after `seconds` of wall
    clock its process group is killed. Whatever it left running is killed too when it ends."""
    cgroup = None
    try:
        cgroup = PidsCgroup.make(limits.processes)
        proc = subprocess.Popen(list(command.argv), executable=command.program, cwd=command.cwd, env=command.env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=child_setup(limits, cgroup))
        _mark_running(record, proc.pid)
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
            status = proc.wait(timeout=seconds)
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
        record.unlink(missing_ok=True)
    return CommandResult(b"".join(chunks), status, timed_out, dropped[0], command.sandbox is not None)


def closing_lines(result: CommandResult, *, seconds: float, limits: CommandLimits) -> str:
    """The lines that end a command's observation, made from its result: the bytes dropped
    (if any), then how it ended — the time limit of `seconds` it was killed at, or its exit
    status and the limit of `limits` that status shows it ran into — and whether it ran
    unsandboxed."""
    text = f"[{result.dropped_bytes} more bytes of output were dropped]\n" if result.dropped_bytes else ""
    unsandboxed = "" if result.sandboxed else "; not sandboxed (--unsandboxed-commands)"
    if result.timed_out:
        return text + f"[timed out after {seconds:g} s: killed, exit status {result.exit_status}{unsandboxed}]\n"
    return text + f"[exit status {result.exit_status}{_limit_hit(result.exit_status, limits)}{unsandboxed}]\n"


def _limit_hit(status: int, limits: CommandLimits) -> str:
    """Which limit a command's exit status shows it ran into (a signal the limit sends:
    directly, or as bubblewrap reports it, 128 + the signal), or ""."""
    signals = {signal.SIGXCPU: f"CPU time limit ({limits.cpu_seconds} s)",
               signal.SIGXFSZ: f"file size limit ({limits.file_bytes} bytes)"}
    for number, what in signals.items():
        if status in (-number, 128 + number):
            return f": killed by the {what}"
    return ""


# ---- no command outlives the agent ----------------------------------------------------------


def _mark_running(record: Path, pid: int) -> None:
    """Note the running command (its process group and start time) in `record`: a run resumed
    after the agent was killed can make sure it is gone (`reap`)."""
    write_bytes(record, json.dumps({"pid": pid, "start": _start_time(pid)}).encode(), None)


def reap(record: Path) -> str:
    """Kill a command a killed agent left running (noted in `record`), and wait until it is
    gone; return what was done, "" if nothing was running. The process is recognised by its
    start time, so a new process that reuses the number is left alone."""
    try:
        noted = json.loads(record.read_text())
        pid, start = int(noted["pid"]), noted["start"]
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
    record.unlink(missing_ok=True)
    return said


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
