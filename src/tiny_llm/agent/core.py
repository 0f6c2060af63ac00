"""Engine — the agent's shared vocabulary: tools, actions, observations, receipts, limits, the
events of a run log and the error a tool raises when it cannot do what it was asked. Week 4's
days build on these (`actions`, `loop`, `workspace`, `session`, `evaluate`, `fork`); nothing
here decides anything.

Tests: tests/test_week4_day3.py, tests/test_week4_day1.py, tests/test_week4_day2.py
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Action", "Event", "Limits", "Model", "Observation", "Proposal", "Receipt", "Tool", "ToolError", "Toolbox"]


@dataclass(frozen=True)
class Tool:
    """One tool the model may call: its name, what it does (shown to the model) and the JSON
    schema of its arguments (an object schema)."""

    name: str
    description: str
    parameters: dict


@dataclass(frozen=True)
class Action:
    """One proposed step: a tool and its arguments (`finish` ends the run with `args["summary"]`)."""

    tool: str
    args: dict


class ToolError(ValueError):
    """A tool that cannot do what it was asked (no such file, an edit that does not apply…);
    the message is the reason, on one line."""


@dataclass(frozen=True)
class Receipt:
    """What an effect did, for the record: the tool and arguments, the SHA-256 of each touched
    file before and after (None: absent), and for a command that ran, how it ended: its exit
    status, whether it was killed at its time limit (`timed_out`) and how many bytes of its
    output were dropped beyond what is kept (`dropped_bytes`). Those three are None for an
    effect that is not a command, and `timed_out` and `dropped_bytes` for a receipt read from
    a log written before they were recorded (unknown)."""

    tool: str
    args: dict
    before: dict[str, str | None] = field(default_factory=dict)
    after: dict[str, str | None] = field(default_factory=dict)
    exit_status: int | None = None
    timed_out: bool | None = None
    dropped_bytes: int | None = None

    def __post_init__(self):
        status, dropped = self.exit_status, self.dropped_bytes
        if status is not None and (isinstance(status, bool) or not isinstance(status, int)):
            raise ValueError(f"exit_status: an integer or None, got {status!r}")
        if self.timed_out is not None and not isinstance(self.timed_out, bool):
            raise ValueError(f"timed_out: True, False or None, got {self.timed_out!r}")
        if dropped is not None and (isinstance(dropped, bool) or not isinstance(dropped, int) or dropped < 0):
            raise ValueError(f"dropped_bytes: an integer >= 0 or None, got {dropped!r}")

    def to_json(self) -> dict:
        """The receipt as a run log holds it. `timed_out` and `dropped_bytes` appear only when
        known, so a receipt read from an older log writes back as it was (a compaction summary
        made from it is the same text)."""
        known = {k: v for k, v in (("timed_out", self.timed_out), ("dropped_bytes", self.dropped_bytes))
                 if v is not None}
        return {"tool": self.tool, "args": self.args, "before": self.before, "after": self.after,
                "exit_status": self.exit_status, **known}

    @classmethod
    def from_json(cls, data: dict) -> Receipt:
        return cls(data["tool"], data["args"], data.get("before", {}), data.get("after", {}),
                   data.get("exit_status"), data.get("timed_out"), data.get("dropped_bytes"))


@dataclass(frozen=True)
class Observation:
    """What the model sees after an action: `ok` False for a refused or failed action (with
    the reason in `text`), and the receipt of any effect."""

    text: str
    ok: bool = True
    receipt: Receipt | None = None


@dataclass(frozen=True)
class Limits:
    """A run's budget: steps, tokens (prompt + completion, all steps) and wall seconds; and
    `repeats`, how many times in a row the model may propose an action that is refused each
    time, the same tool with the same arguments, before the run ends (it is stuck)."""

    steps: int = 20
    tokens: int = 100_000
    seconds: float = 600.0
    repeats: int = 3


@dataclass(frozen=True)
class Proposal:
    """A model's answer to one step: the text it wrote (one JSON action) and its token counts
    (`cached`: prompt tokens taken from the prefix cache, not prefilled again)."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class Model(Protocol):
    """What proposes the actions: the in-process engine, an OpenAI-compatible endpoint, or a
    script. `schema` is the JSON schema every proposal must match (enforced while decoding
    where the model can do that)."""

    def propose(self, messages: list[dict], schema: dict, *, seed: int | None = None) -> Proposal: ...


class Toolbox(Protocol):
    """The tools an agent acts through (the workspace's, or a test's)."""

    tools: tuple[Tool, ...]

    def perform(self, action: Action) -> Observation: ...


@dataclass(frozen=True)
class Event:
    """One line of a run log: `kind` is one of "start", "proposal", "intent", "observation",
    "steer", "compaction", "limit", "error", "finish", "torn" (the line before it is torn: a
    crash mid-write); `step` the step it belongs to; `data` the rest (JSON values only)."""

    kind: str
    step: int
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"kind": self.kind, "step": self.step, **self.data}

    @classmethod
    def from_json(cls, data: dict) -> Event:
        rest = {k: v for k, v in data.items() if k not in ("kind", "step")}
        return cls(data["kind"], data["step"], rest)
