"""Course: week 4 day 2 — the sandbox: what an allowed command does, bounded by the operating
system instead of by argument checks.

The workspace's boundary (`boundary.py`) decides which programs `run` may start; once
`python3` starts, it can open any file the user can, connect anywhere and fork without end.
So every command runs inside a sandbox made from the same policy:

    sandbox = find_sandbox()                 # bubblewrap on Linux, Seatbelt on macOS, or why not
    argv = sandbox.wrap(["python3", "-m", "pytest"], executable, Policy(root, readable, home))
    subprocess.Popen(argv, preexec_fn=CommandLimits().apply, ...)

On Linux, `bwrap_args` builds bubblewrap's arguments: the system folders read-only, the
folders the allowed programs live in read-only, the workspace the only writable folder, a
private `/tmp` and home, every other folder absent (the user's home, the task's held-out
checks), new network, PID, IPC and UTS namespaces (no network at all, not even the host's
loopback), no capabilities, and the sandbox killed when the agent dies. On macOS,
`seatbelt_profile` writes the same policy as a `sandbox-exec` profile. `CommandLimits`
are the resource limits every command runs under (CPU seconds, memory, processes, file
size, open files), set in the child before it starts the program.

Tests: tests/test_week4_day2.py, tests/test_agent_sandbox.py
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CommandLimits", "Policy", "Sandbox", "bwrap_args", "find_sandbox", "readable_folders",
           "seatbelt_profile"]

# The system folders a program needs (its libraries, its interpreter's standard library when
# it lives in /usr), bound read-only where they exist; everything else of the host is absent.
SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Of /etc, only what programs read to start: the loader's cache, users and groups by name,
# the time zone, alternatives and TLS roots; not the rest (keys, shadow passwords, configs).
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
                "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/localtime", "/etc/ssl",
                "/etc/ca-certificates", "/etc/mime.types")
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap; "
                "Arch: pacman -S bubblewrap)")


@dataclass(frozen=True)
class CommandLimits:
    """The resources one command may use (each a `setrlimit` in the child, before it starts
    the program; a limit the process may not raise again). `cpu_seconds`: CPU time, then
    SIGKILL; `memory_bytes`: address space, so an allocation past it fails; `processes`:
    processes and threads at once (a fork past it fails); `file_bytes`: the largest file it
    may write; `open_files`: file descriptors at once."""

    cpu_seconds: int = 60
    memory_bytes: int = 2 << 30
    processes: int = 128
    file_bytes: int = 256 << 20
    open_files: int = 256

    def __post_init__(self):
        for name in ("cpu_seconds", "memory_bytes", "processes", "file_bytes", "open_files"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: a positive integer, got {value!r}")

    def describe(self) -> str:
        return (f"CPU {self.cpu_seconds} s, memory {self.memory_bytes >> 20} MiB, {self.processes} processes, "
                f"files up to {self.file_bytes >> 20} MiB, {self.open_files} open files")

    def rlimits(self, running: int = 0) -> list[tuple[int, int]]:
        """(resource, limit) pairs for `setrlimit`. `running`: processes the user already runs,
        since the kernel counts a user's processes across the machine (RLIMIT_NPROC)."""
        limits = [(resource.RLIMIT_CPU, self.cpu_seconds), (resource.RLIMIT_AS, self.memory_bytes),
                  (resource.RLIMIT_FSIZE, self.file_bytes), (resource.RLIMIT_NOFILE, self.open_files)]
        if hasattr(resource, "RLIMIT_NPROC"):
            limits.append((resource.RLIMIT_NPROC, running + self.processes))
        return limits


def user_tasks(uid: int) -> int:
    """The processes and threads `uid` runs now (what RLIMIT_NPROC counts), from /proc."""
    count = 0
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[1]) == uid:  # the effective uid
                count += int(fields.get("Threads", "1"))
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return count


class PidsCgroup:
    """A cgroup of its own for one command, with `pids.max` (Linux, when the agent may make
    one: as root, where RLIMIT_NPROC binds nobody). `join_fd` is written by the child before it
    starts the program, so everything it starts is counted; `close` kills what is left and
    removes the group."""

    _made = 0

    def __init__(self, folder: Path, limit: int):
        self.folder = folder
        (folder / "pids.max").write_text(str(limit))
        self.join_fd = os.open(folder / "cgroup.procs", os.O_WRONLY)

    @classmethod
    def make(cls, limit: int) -> PidsCgroup | None:
        if not sys.platform.startswith("linux") or os.geteuid() != 0:
            return None
        PidsCgroup._made += 1
        name = f"tiny-llm-{os.getpid()}-{PidsCgroup._made}"
        for parent in _pids_hierarchies():
            folder = parent / name
            try:
                folder.mkdir()
            except OSError:
                continue
            try:
                return cls(folder, limit)
            except OSError:
                folder.rmdir()
        return None

    def close(self) -> None:
        os.close(self.join_fd)
        for _ in range(100):
            try:
                pids = (self.folder / "cgroup.procs").read_text().split()
                for pid in pids:
                    try:
                        os.kill(int(pid), 9)
                    except ProcessLookupError:
                        pass
                self.folder.rmdir()
                return
            except OSError:  # still exiting
                time.sleep(0.01)


def _pids_hierarchies() -> list[Path]:
    """Where a pids cgroup can be made: cgroup v1's pids hierarchy, or the cgroup v2 group
    this process is in (when it offers the pids controller to its children)."""
    found = []
    if os.path.isfile("/sys/fs/cgroup/pids/cgroup.procs"):
        found.append(Path("/sys/fs/cgroup/pids"))
    try:
        mounts = [line.split()[1] for line in open("/proc/self/mounts") if line.split()[2:3] == ["cgroup2"]]
        own = next(line.strip()[3:] for line in open("/proc/self/cgroup") if line.startswith("0::"))
    except (OSError, StopIteration):
        return found
    for mount in mounts:
        group = Path(mount + own)
        try:
            if "pids" not in (group / "cgroup.subtree_control").read_text().split():
                (group / "cgroup.subtree_control").write_text("+pids")
            found.append(group)
        except OSError:
            continue
    return found


def child_setup(limits: CommandLimits, cgroup: PidsCgroup | None):
    """What the child runs after fork, before it starts the program (`preexec_fn`): join the
    command's cgroup, then set each limit, the hard one as the soft one (a program cannot raise it)."""
    running = 0 if os.geteuid() == 0 else user_tasks(os.getuid())
    pairs = limits.rlimits(running)

    def setup() -> None:
        if cgroup is not None:
            os.write(cgroup.join_fd, b"0")  # "0": the writing process
        for which, value in pairs:
            # CPU: the soft limit sends SIGXCPU (the status names the limit), the hard one a
            # second later SIGKILL, for a program that catches the first.
            resource.setrlimit(which, (value, value + (which == resource.RLIMIT_CPU)))

    return setup


@dataclass(frozen=True)
class Policy:
    """What a sandboxed command may see: `root` (the workspace, the one writable folder),
    `readable` (folders or files it may read: the allowed programs' installations) and
    `home` (its own empty home folder, writable, gone after the command)."""

    root: Path
    readable: tuple[Path, ...]
    home: Path


def bwrap_args(bwrap: str, policy: Policy, argv: Sequence[str], executable: str) -> list[str]:
    """The command line that runs `argv` (its program at `executable`) under bubblewrap with
    `policy`: a new mount namespace holding only what the policy names, new network, PID,
    IPC, UTS and (where allowed) user namespaces, no capabilities, a new session (no
    terminal to inject keys into), killed with the agent (`--die-with-parent`).

    The order of the mounts matters: bubblewrap makes them in order, so `/tmp` (a private
    tmpfs) comes before any bind that may live inside it, and the workspace comes last."""
    # BEGIN SOLUTION week4-day2
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]
    for path in SYSTEM_FOLDERS + SYSTEM_FILES:
        if os.path.lexists(path):
            args += ["--ro-bind", path, path]  # a symlink (/bin -> usr/bin) is bound as the link
    for path in policy.readable:
        args += ["--ro-bind", str(path), str(path)]
    args += ["--dir", str(policy.home), "--bind", str(policy.root), str(policy.root), "--chdir", str(policy.root)]
    return args + ["--", executable, *argv[1:]]
    # END SOLUTION


def _scheme(text: str) -> str:
    """A string literal of Seatbelt's profile language (a Scheme dialect)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def seatbelt_profile(policy: Policy) -> str:
    """A `sandbox-exec` profile (macOS) with the policy of `bwrap_args`: everything denied
    but running programs, reading the system and the readable paths, reading and writing
    the workspace and the home folder; no network. Used as `sandbox-exec -p PROFILE ...`."""
    system = ["/usr", "/bin", "/sbin", "/System", "/Library", "/private/etc", "/private/var/db/timezone",
              "/dev", "/opt/homebrew", "/usr/local"]
    read = "\n".join(f"  (subpath {_scheme(p)})" for p in system + [str(p) for p in policy.readable])
    write = "\n".join(f"  (subpath {_scheme(str(p))})" for p in (policy.root, policy.home))
    return (
        "(version 1)\n"
        "(deny default)\n"
        "(allow process-exec process-fork)\n"
        "(allow signal (target same-sandbox))\n"
        "(allow sysctl-read)\n"
        "(allow file-read-metadata)\n"
        f"(allow file-read*\n{read}\n{write})\n"
        f"(allow file-write*\n{write}\n  (literal \"/dev/null\"))\n"
        "(deny network*)\n"
    )


def readable_folders(executables: Sequence[str], *, keep_out: Sequence[Path]) -> tuple[Path, ...]:
    """What the programs at `executables` need to read beyond the system folders: for each
    one (and each link of its symlink chain) the installation it lives in (the folder above
    its `bin/`, such as a virtual environment or a Python built in the home folder), or the
    file alone when that folder holds any of `keep_out` (the workspace, the home folder) or
    is a system folder already bound."""
    found: dict[Path, None] = {}
    for executable in executables:
        path, seen = Path(os.path.abspath(executable)), 0
        while True:
            prefix = path.parent.parent if path.parent.name in ("bin", "sbin") else None
            if prefix is not None and any(str(prefix) == f or str(prefix).startswith(f + "/") for f in SYSTEM_FOLDERS):
                pass  # inside /usr and friends: bound already
            elif prefix is None or str(prefix) == "/" or any(k == prefix or prefix in k.parents for k in keep_out):
                found[path] = None
            else:
                found[prefix] = None
            if not path.is_symlink() or seen == 40:
                break
            path, seen = Path(os.path.normpath(path.parent / os.readlink(path))), seen + 1
    if any(p.name.startswith("python") for p in map(Path, executables)):
        for prefix in (sys.prefix, sys.base_prefix):  # a venv's python needs its base installation too
            p = Path(prefix)
            if not any(k == p or p in k.parents for k in keep_out) and not str(p).startswith("/usr"):
                found[p] = None
    # A folder inside another one listed is bound by it already.
    folders = list(found)
    return tuple(p for p in folders if not any(q != p and q in p.parents for q in folders))


@dataclass(frozen=True)
class Sandbox:
    """The sandbox `run` wraps commands in: `kind` "bubblewrap" or "seatbelt", the program
    that makes it and its version."""

    kind: str
    program: str
    version: str = ""

    def wrap(self, argv: Sequence[str], executable: str, policy: Policy) -> list[str]:
        if self.kind == "bubblewrap":
            return bwrap_args(self.program, policy, argv, executable)
        return [self.program, "-p", seatbelt_profile(policy), executable, *argv[1:]]

    def describe(self) -> str:
        what = (f"bubblewrap {self.version} ({self.program})" if self.kind == "bubblewrap"
                else f"Seatbelt ({self.program})")
        return (f"{what}: the workspace is the only writable folder, the system read-only, no network, "
                f"a private /tmp and home" + (", its own process namespace" if self.kind == "bubblewrap" else ""))


def find_sandbox() -> tuple[Sandbox | None, str]:
    """The sandbox this machine can make, and "" — or None and one line saying what is
    missing and how to install it. On Linux, bubblewrap must also start a sandbox here
    (user namespaces may be switched off): it is tried once with `true`."""
    if sys.platform == "darwin":
        program = shutil.which("sandbox-exec") or ("/usr/bin/sandbox-exec"
                                                   if os.path.exists("/usr/bin/sandbox-exec") else None)
        if program is None:
            return None, "no sandbox: sandbox-exec (Seatbelt) is not on this Mac"
        return Sandbox("seatbelt", program), ""
    if not sys.platform.startswith("linux"):
        return None, f"no sandbox: tiny-llm sandboxes commands on Linux and macOS only, not on {sys.platform}"
    program = shutil.which("bwrap")
    if program is None:
        return None, f"no sandbox: bubblewrap (bwrap) is not installed; {INSTALL_HINT}"
    probe = [program, "--unshare-all", "--die-with-parent", "--cap-drop", "ALL",
             *(a for p in SYSTEM_FOLDERS if os.path.lexists(p) for a in ("--ro-bind", p, p)), "--", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
        version = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"no sandbox: {program} does not start ({e})"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return None, (f"no sandbox: {program} cannot make a sandbox here ({why}); user namespaces may be "
                      "switched off (sysctl kernel.unprivileged_userns_clone=1)")
    return Sandbox("bubblewrap", program, version[-1] if version else ""), ""
