"""Engine — the workspace's six tools as the model sees them: names, descriptions and the JSON
schemas of their arguments. The schemas are what day 1 compiles into the decoding grammar
and what `actions.check_value` checks every call against; the descriptions say the
workspace's policy (which paths are editable, which commands are allowed).

Tests: tests/test_week4_day2.py
"""

from __future__ import annotations

from collections.abc import Sequence

from .core import Tool

__all__ = ["DEFAULT_DEPTH", "MAX_DEPTH", "MAX_ENTRIES", "MAX_MATCHES", "make_tools"]

MAX_MATCHES = 200  # search stops after this many matching lines
MAX_ENTRIES = 2000  # list stops after this many entries
DEFAULT_DEPTH, MAX_DEPTH = 2, 20  # list's levels of directories

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
