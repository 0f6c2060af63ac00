"""Course: week 4 day 1 — the agent loop: one action per step, every event in an append-only run log.

    log = RunLog(Path("runs/fix-add.jsonl"))
    outcome = run_agent("Make add() return a + b.", model, workspace, Limits(steps=10), log)
    outcome.status       # "finished" | "limit" | "error"
    RunLog.read(log.path)  # [Event("start", 0, ...), Event("proposal", 0, ...), ...]

Each step the model proposes one action (a JSON object the schema of `actions` allows), the
loop checks it, performs it through the toolbox and shows the model what happened. A refused
or failed action is an observation the model reads, not an exception; a model that fails is
an "error" event and the run's end. The log is the run's checkpoint: every event is one line,
written, flushed and fsynced before the loop goes on, so a run killed at any instant leaves a
log that `session.resume` continues from.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from .actions import FINISH, action_schema, describe_tools, parse_action
from .core import Action, Event, Limits, Model, Observation, Proposal, Tool, Toolbox

__all__ = ["KINDS", "Digests", "Outcome", "RunLog", "observation_message", "run_agent", "system_prompt"]

KINDS = ("start", "proposal", "intent", "observation", "steer", "compaction", "limit", "error", "finish")
# The fields each kind of event must hold (a log that lacks one cannot be replayed).
FIELDS = {"start": ("task", "messages"), "proposal": ("text",), "intent": ("tool", "args"),
          "observation": ("text", "ok"), "steer": ("text",), "compaction": ("keep_last",), "limit": ("limit",),
          "error": ("reason",), "finish": ("summary",)}


class RunLog:
    """An append-only JSONL file, one `Event` per line. Each line is written with one
    `write` on a file opened for appending, then flushed to the disk (`fsync`) before
    `append` returns: lines already there are never rewritten, and a killed process loses at
    most the event it had not appended yet."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()

    def append(self, event: Event) -> None:
        if event.kind not in KINDS:
            raise ValueError(f"event kind must be one of {', '.join(KINDS)}, got {event.kind!r}")
        line = json.dumps(event.to_json(), ensure_ascii=False, allow_nan=False) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def read(path: Path) -> list[Event]:
        """The events of the log at `path`. ValueError("run log PATH:LINE: why") for a line
        that is not one JSON event (a known kind, an integer step and the kind's fields), and
        for a missing file."""
        path = Path(path)
        try:
            text = path.read_bytes().decode("utf-8")
        except FileNotFoundError:
            raise ValueError(f"run log {path}: no such file") from None
        except UnicodeDecodeError as e:
            line = path.read_bytes()[: e.start].count(b"\n") + 1
            raise ValueError(f"run log {path}:{line}: not UTF-8 text") from None
        events = []
        for number, line in enumerate(text.splitlines(), 1):
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"run log {path}:{number}: not JSON ({e.msg})") from None
            if not isinstance(data, dict) or data.get("kind") not in KINDS:
                raise ValueError(f"run log {path}:{number}: not an event (kind must be one of {', '.join(KINDS)})")
            step = data.get("step")
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise ValueError(f"run log {path}:{number}: step must be an integer >= 0, got {step!r}")
            missing = [f for f in FIELDS[data["kind"]] if f not in data]
            if missing:
                raise ValueError(f"run log {path}:{number}: a {data['kind']} event without {missing[0]!r}")
            events.append(Event.from_json(data))
        return events


@dataclass
class Outcome:
    """How a run ended: `status` "finished" (the model called finish; `summary` is its
    words, not evidence), "limit" or "error" (`reason` says which and why); the steps taken
    (counted from the run's first step), the tokens (prompt + completion) and wall seconds."""

    status: str
    summary: str
    steps: int
    tokens: int
    seconds: float
    reason: str = ""


@runtime_checkable
class Digests(Protocol):
    """A toolbox that can say which files an action may change and what they hold (a
    `Workspace`). The loop records those digests with each intent, so that a run killed
    during an effect can tell on resume whether the effect happened."""

    def touched(self, action: Action) -> list[str]: ...

    def digest(self, path: str) -> str | None: ...


def system_prompt(task: str, tools: Sequence[Tool]) -> str:
    """The system message of a run on `task` with `tools`: how to answer, and the tools. The
    task itself is not repeated here: it is the first user message (ValueError if empty)."""
    if not isinstance(task, str) or not task.strip():
        raise ValueError(f"task must be a non-empty text, got {task!r}")
    return (
        "You are a coding agent. You work in a workspace through tools, one action per reply.\n"
        'Each reply is exactly one JSON object: {"tool": NAME, "args": {...}}, nothing else.\n'
        "After each action you get an observation. The user's first message is the task; later "
        "messages of the operator may steer you. When the task is done, call finish with a short "
        "summary.\n\nTools:\n" + describe_tools(tools)
    )


def observation_message(observation: Observation) -> dict:
    """The user message that shows the model an observation."""
    prefix = "Observation" if observation.ok else "Observation (refused)"
    return {"role": "user", "content": f"{prefix}: {observation.text}"}


def check_limits(limits: Limits) -> None:
    if not isinstance(limits, Limits):
        raise ValueError(f"limits must be a Limits, got {type(limits).__name__}")
    for name in ("steps", "tokens"):
        value = getattr(limits, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"limits.{name} must be an integer >= 0, got {value!r}")
    if isinstance(limits.seconds, bool) or not isinstance(limits.seconds, int | float) or not limits.seconds >= 0:
        raise ValueError(f"limits.seconds must be a number >= 0, got {limits.seconds!r}")


def limit_reached(limits: Limits, step: int, tokens: int, seconds: float) -> dict | None:
    """The first limit a run at `step` having used `tokens` and `seconds` has reached, as the
    data of its "limit" event, or None."""
    for name, used, allowed in (("steps", step, limits.steps), ("tokens", tokens, limits.tokens),
                                ("seconds", seconds, limits.seconds)):
        if used >= allowed:
            return {"limit": name, "used": used, "allowed": allowed}
    return None


def perform(toolbox: Toolbox, action: Action) -> Observation:
    """The toolbox's observation of `action`; a ValueError or OSError it raises (a path
    refused, a file that vanished) becomes a refused observation: a fact for the model."""
    try:
        return toolbox.perform(action)
    except (ValueError, OSError) as e:
        return Observation(str(e) or type(e).__name__, ok=False)


def intent_data(toolbox: Toolbox, action: Action) -> dict:
    """An "intent" event's data: the action and, when the toolbox can tell, the digests of
    the files it may change, taken before it runs."""
    data = {"tool": action.tool, "args": action.args}
    if isinstance(toolbox, Digests):
        data["before"] = {p: toolbox.digest(p) for p in toolbox.touched(action)}
    return data


def observation_data(observation: Observation) -> dict:
    receipt = observation.receipt.to_json() if observation.receipt else None
    return {"text": observation.text, "ok": observation.ok, "receipt": receipt}


def run_agent(task: str, model: Model, toolbox: Toolbox, limits: Limits, log: RunLog, *,
              seed: int | None = None, messages: list[dict] | None = None, start_step: int = 0,
              on_step: Callable[[int, list[dict]], None] | None = None,
              tokens_used: int = 0, seconds_used: float = 0.0) -> Outcome:
    """Run the agent on `task` until it finishes or a limit is reached, appending every event
    to `log`.

    The conversation starts as `[system, user(task)]`, or `messages` (a resumed or forked
    run, whose next step is `start_step`). Steps are numbered from the run's first, and
    `limits.steps` bounds that number: a run resumed at step k has `limits.steps - k` left.
    Tokens and seconds count from `tokens_used` and `seconds_used`, what the run spent
    before (0 for a fork: a branch's budget is its own).

    Each step: check the limits ("limit"), ask the model for one proposal under the action
    schema ("proposal", with its token counts; step `s` samples with seed `seed + s`),
    parse it, and either finish ("finish") or record the intent with the digests of the
    files it may change ("intent") before performing it, then its observation
    ("observation"). A proposal that does not parse is a refused observation; a model that
    raises is an "error". `on_step(step, messages)` runs after each step's observation (it
    may change `messages` in place: compaction)."""
    check_limits(limits)
    tools = tuple(toolbox.tools)
    schema = action_schema(tools)
    if messages is None:
        messages = [{"role": "system", "content": system_prompt(task, tools)}, {"role": "user", "content": task}]
    messages = [dict(m) for m in messages]
    log.append(Event("start", start_step, {"task": task, "messages": messages, "tools": [t.name for t in tools],
                                           "limits": {"steps": limits.steps, "tokens": limits.tokens,
                                                      "seconds": limits.seconds}, "seed": seed}))
    began = time.monotonic()
    step, tokens = start_step, tokens_used

    def seconds() -> float:
        return round(seconds_used + time.monotonic() - began, 3)

    def outcome(status: str, summary: str = "", reason: str = "") -> Outcome:
        return Outcome(status, summary, step, tokens, seconds(), reason)

    while True:
        # BEGIN SOLUTION week4-day1
        hit = limit_reached(limits, step, tokens, seconds())
        if hit is not None:
            log.append(Event("limit", step, {**hit, "seconds": seconds()}))
            return outcome("limit", reason=f"{hit['limit']} limit reached ({hit['used']} of {hit['allowed']})")
        try:
            proposal = model.propose(messages, schema, seed=None if seed is None else seed + step)
        except NotImplementedError:  # a course day not done yet is not the model's failure
            raise
        except Exception as e:
            reason = f"the model failed: {type(e).__name__}: {e}"
            log.append(Event("error", step, {"reason": reason, "seconds": seconds()}))
            return outcome("error", reason=reason)
        tokens += proposal.prompt_tokens + proposal.completion_tokens
        log.append(Event("proposal", step, proposal_data(proposal, seconds())))
        try:
            action = parse_action(proposal.text, tools)
        except ValueError as e:
            observation = Observation(f"invalid action: {e}", ok=False)
        else:
            if action.tool == FINISH.name:
                log.append(Event("finish", step, {"summary": action.args["summary"], "seconds": seconds()}))
                step += 1
                return outcome("finished", summary=action.args["summary"])
            log.append(Event("intent", step, intent_data(toolbox, action)))
            observation = perform(toolbox, action)
        log.append(Event("observation", step, observation_data(observation)))
        messages += [{"role": "assistant", "content": proposal.text}, observation_message(observation)]
        step += 1
        # END SOLUTION
        if on_step is not None:
            on_step(step - 1, messages)


def proposal_data(proposal: Proposal, seconds: float) -> dict:
    return {"text": proposal.text, "prompt_tokens": proposal.prompt_tokens,
            "completion_tokens": proposal.completion_tokens, "cached_tokens": proposal.cached_tokens,
            "seconds": seconds}
