"""Course: week 4 day 2 — the security boundary: which paths the agent's tools may read and
write, and what a command it runs gets (its program, environment, folder and sandbox).

    boundary = Boundary(root, editable_paths=["src/**"], allowed_commands=["python"], unsandboxed=False)
    boundary.resolve("src/app.py", write=True)   # the real path inside the root, or PolicyError
    boundary.command(["python", "-m", "pytest"], home)  # what to start, or PolicyError / ToolError

Every path a tool is given passes `resolve`: it must stay inside the root, component by
component, through any symlinks, and name a regular file or a folder; a write must also land
on a path an `editable_paths` pattern matches. A command must be named in `allowed_commands`;
it is found on a PATH the agent cannot plant programs on, gets an environment with nothing of
the parent's secrets, starts in the root, and runs in the machine's sandbox (`sandbox.py`) —
or, where none can be made, is refused unless the boundary was made `unsandboxed=True`.
Everything else the workspace does goes through these two doors.

Tests: tests/test_week4_day2.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .core import ToolError
from .sandbox import Policy, Sandbox, find_sandbox, readable_folders

__all__ = ["Boundary", "Command", "PolicyError", "glob_regex", "show"]

MAX_SYMLINKS = 40  # symlinks one path may pass through (as Linux's ELOOP limit)


class PolicyError(ValueError):
    """A path or a command the workspace refuses; the message is the reason, on one line."""


def show(path: str) -> str:
    """A path as it appears in a one-line message: quoted, control characters escaped."""
    return json.dumps(path, ensure_ascii=False)


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


@dataclass(frozen=True)
class Command:
    """A command ready to start: `argv` as the process gets it (wrapped by the sandbox when
    there is one), the `program` file to execute, its whole environment, its working folder
    and the sandbox it runs in (None: unsandboxed)."""

    argv: tuple[str, ...]
    program: str
    env: dict[str, str]
    cwd: Path
    sandbox: Sandbox | None


class Boundary:
    """The policy of one workspace root (its defaults are `Workspace`'s). `editable_paths`:
    glob patterns, relative to the root (`**` spans folders), that writes may change.
    `allowed_commands`: the command names a command may start (looked up on PATH, the running
    interpreter's folder first, so `python` is this Python). `unsandboxed`: run commands
    without a sandbox where none can be made."""

    def __init__(self, root: Path, *, editable_paths: Sequence[str], allowed_commands: Sequence[str],
                 unsandboxed: bool):
        if not Path(root).is_dir():
            raise ValueError(f"root: {root} is not a folder")
        for name, value in (("editable_paths", editable_paths), ("allowed_commands", allowed_commands)):
            if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
                raise ValueError(f"{name}: a sequence of non-empty strings, got {value!r}")
        for p in editable_paths:
            if p.startswith("/") or ".." in p.split("/"):
                raise ValueError(f"editable_paths: {p!r} must be relative to the root, without '..'")
        for c in allowed_commands:
            if "/" in c:
                raise ValueError(f"allowed_commands: {c!r} must be a command name, not a path")
        if not isinstance(unsandboxed, bool):
            raise ValueError(f"unsandboxed: True or False, got {unsandboxed!r}")
        self.root = Path(os.path.realpath(root))
        self._roots = {self.root.parts, Path(os.path.abspath(root)).parts}  # for absolute symlinks
        self.editable_paths = tuple(editable_paths)
        self.allowed_commands = tuple(allowed_commands)
        self.unsandboxed = unsandboxed
        self._editable = [glob_regex(p) for p in self.editable_paths]
        self._sandbox: tuple[Sandbox | None, str] | None = None  # found at the first command

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

    def sandbox(self) -> tuple[Sandbox | None, str]:
        """The sandbox commands run in, or None and why there is none (found once)."""
        if self._sandbox is None:
            self._sandbox = find_sandbox()
        return self._sandbox

    def command(self, argv: Sequence[str], home: Path) -> Command:
        """What starts for `argv` with the home folder `home`: `prepare_command`'s program and
        environment, in the root, wrapped in the sandbox, whose policy makes the root the one
        writable folder and lets the program read its own installation. ToolError for an
        argument with a NUL byte; PolicyError where no sandbox can be made, unless
        `unsandboxed`."""
        if any("\0" in a for a in argv):
            raise ToolError("an argument cannot hold a NUL byte")
        sandbox, why = self.sandbox()
        if sandbox is None and not self.unsandboxed:
            raise PolicyError(f"{why}; or let commands run without one (--unsandboxed-commands)")
        executable, env = self.prepare_command(list(argv), home)
        if sandbox is None:
            return Command(tuple(argv), executable, env, self.root, None)
        policy = Policy(self.root, readable_folders([executable], keep_out=[self.root, Path.home()]), home)
        return Command(tuple(sandbox.wrap(argv, executable, policy)), sandbox.program, env, self.root, sandbox)
