"""Course: week 4 day 1 — the agent loop: one action per step, every event in an append-only run log.

    log = RunLog(Path("runs/fix-add.jsonl"))
    outcome = run_agent("Make add() return a + b.", model, workspace, Limits(steps=10), log)
    outcome.status       # "finished" | "limit" | "error"
    RunLog.read(log.path)  # [Event("start", 0, ...), Event("proposal", 0, ...), ...]
    RunLog.load(log.path).notice  # None, or a line about a torn last line that was set aside

Each step the model proposes one action (a JSON object the schema of `actions` allows), the
loop checks it, performs it through the toolbox and shows the model what happened. A refused
or failed action is an observation the model reads, not an exception; a model that fails is
an "error" event and the run's end. The log is the run's checkpoint: every event is one line,
written, flushed and fsynced before the loop goes on, so a run killed at any instant leaves a
log that `session.resume` continues from. A model that keeps proposing an action that was
refused is told so, and `Limits.repeats` such proposals in a row end the run.

Tests: tests/test_week4_day1.py, tests/test_week4_day3.py, tests/test_agent_cli.py
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

from .actions import FINISH, action_schema, describe_tools, parse_action
from .core import Action, Event, Limits, Model, Observation, Proposal, Tool, Toolbox

__all__ = ["KINDS", "Digests", "LogContents", "Outcome", "Refusals", "RunLog", "observation_message", "run_agent",
           "system_prompt"]

KINDS = ("start", "proposal", "intent", "observation", "steer", "compaction", "limit", "error", "finish", "torn")
# The fields each kind of event must hold (a log that lacks one cannot be replayed).
FIELDS = {"start": ("task", "messages"), "proposal": ("text",), "intent": ("tool", "args"),
          "observation": ("text", "ok"), "steer": ("text",), "compaction": ("keep_last",), "limit": ("limit",),
          "error": ("reason",), "finish": ("summary",), "torn": ("line",)}


class BadLine(ValueError):
    """A log line that is not an event: the reason, and whether the line may be what a crash
    in the middle of a write leaves (`fragment`: not UTF-8, or not JSON)."""

    def __init__(self, why: str, *, fragment: bool):
        super().__init__(why)
        self.fragment = fragment


def parse_line(line: bytes) -> Event:
    """The event of one log line (without its line break); `BadLine` says why it is not one
    (a known kind, an integer step and the kind's fields)."""
    try:
        data = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadLine("not UTF-8 text", fragment=True) from None
    except json.JSONDecodeError as e:
        raise BadLine(f"not JSON ({e.msg})", fragment=True) from None
    if not isinstance(data, dict) or data.get("kind") not in KINDS:
        raise BadLine(f"not an event (kind must be one of {', '.join(KINDS)})", fragment=False)
    step = data.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise BadLine(f"step must be an integer >= 0, got {step!r}", fragment=False)
    missing = [f for f in FIELDS[data["kind"]] if f not in data]
    if missing:
        raise BadLine(f"a {data['kind']} event without {missing[0]!r}", fragment=False)
    return Event.from_json(data)


@dataclass(frozen=True)
class LogContents:
    """What a run log holds: its events in order, and the number of a torn last line that
    was set aside (None: there is none)."""

    path: Path
    events: list[Event]
    torn: int | None = None

    @property
    def notice(self) -> str | None:
        """One line for the operator about a torn last line, or None."""
        if self.torn is None:
            return None
        return f"run log {self.path}:{self.torn}: a torn last line (a crash mid-write) was set aside"


class RunLog:
    """An append-only JSONL file, one `Event` per line. Each line is written to the file
    opened for appending, then flushed to the disk (`fsync`) before `append` returns: lines
    already there are never rewritten, and a killed process loses at most the event it had
    not appended yet.

    A crash in the middle of that write can leave the last line torn: part of an event,
    without its line break. Reading sets it aside. The next `append` ends it with a line
    break and a "torn" event that names its line, then writes its own event, so the torn
    line stays where it is and every later read sets it aside too."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()

    def append(self, event: Event) -> None:
        if event.kind not in KINDS:
            raise ValueError(f"event kind must be one of {', '.join(KINDS)}, got {event.kind!r}")
        line = _line(event)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":  # the last line has no line break
                line = self._end_last_line(event.step) + line
            rest = memoryview(line)
            while rest:  # a short write (a full disk) goes on, or raises, never passes as a whole line
                rest = rest[os.write(fd, rest):]
            os.fsync(fd)
        finally:
            os.close(fd)

    def _end_last_line(self, step: int) -> bytes:
        """What ends a last line that has no line break: the break alone for a whole event,
        and for a torn line also a "torn" event with its number (at `step`, the step of the
        event about to be appended)."""
        data = self.path.read_bytes()
        try:
            parse_line(data[data.rfind(b"\n") + 1:])
        except BadLine as e:
            if e.fragment:
                return b"\n" + _line(Event("torn", step, {"line": data.count(b"\n") + 1}))
        return b"\n"

    @staticmethod
    def read(path: Path) -> list[Event]:
        """The events of the log at `path` (see `load`)."""
        return RunLog.load(path).events

    @staticmethod
    def load(path: Path) -> LogContents:
        """The events of the log at `path`, "torn" events included. A torn last line (no line
        break, not UTF-8 or not JSON) is set aside and named in `torn`, and so is a torn line
        followed by the "torn" event `append` wrote after it. ValueError("run log PATH:LINE:
        why") for any other line that is not one JSON event (a known kind, an integer step
        and the kind's fields), and for a missing file."""
        path = Path(path)
        try:
            lines = path.read_bytes().split(b"\n")
        except FileNotFoundError:
            raise ValueError(f"run log {path}: no such file") from None
        last = lines.pop()  # b"" when the file ends with a line break, as it should

        def error(number: int, why: BadLine) -> ValueError:
            return ValueError(f"run log {path}:{number}: {why}")

        events: list[Event] = []
        torn = None  # (number, why) of a torn line: the next line must be the "torn" event naming it
        for number, line in enumerate(lines, 1):
            try:
                event = parse_line(line)
            except BadLine as e:
                if torn is None and e.fragment:
                    torn = (number, e)
                    continue
                raise error(*(torn or (number, e))) from None
            if torn is not None and not (event.kind == "torn" and event.data["line"] == torn[0]):
                raise error(*torn)
            torn = None
            events.append(event)
        if torn is not None:
            raise error(*torn)
        if last:
            try:
                events.append(parse_line(last))
            except BadLine as e:
                if not e.fragment:
                    raise error(len(lines) + 1, e) from None
                return LogContents(path, events, torn=len(lines) + 1)
        return LogContents(path, events)


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
    for name, least in (("steps", 0), ("tokens", 0), ("repeats", 1)):
        value = getattr(limits, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"limits.{name} must be an integer >= {least}, got {value!r}")
    if isinstance(limits.seconds, bool) or not isinstance(limits.seconds, int | float) or not limits.seconds >= 0:
        raise ValueError(f"limits.seconds must be a number >= 0, got {limits.seconds!r}")


class Refusals:
    """What a run has seen refused: the last step at which each proposal was refused (by
    `refusal_key`), and `streak`, how many times in a row the latest one (`last`) was proposed
    and refused. A proposal refused before is told so; `Limits.repeats` in a row end the run."""

    def __init__(self):
        self.steps: dict[str, int] = {}
        self.last: str | None = None
        self.streak = 0

    @classmethod
    def of(cls, events: Sequence[Event]) -> Refusals:
        """The refusals of the steps in a run log's `events` (a resumed run counts on from them)."""
        refusals, keys = cls(), {}
        for event in events:
            if event.kind == "proposal":
                keys[event.step] = refusal_key(event.data["text"])
            elif event.kind == "intent":
                keys[event.step] = refusal_key(Action(event.data["tool"], event.data["args"]))
            elif event.kind == "observation" and event.step in keys:
                refusals.note(keys[event.step], event.step, Observation(event.data["text"], event.data["ok"]))
        return refusals

    def note(self, key: str, step: int, observation: Observation) -> Observation:
        """Count the observation of proposal `key` at `step`, and return it as the model is to
        see it: a refusal of what was refused before says so, and when."""
        if observation.ok:
            self.last, self.streak = None, 0
            return observation
        self.streak = self.streak + 1 if key == self.last else 1
        self.last, before = key, self.steps.get(key)
        self.steps[key] = step
        if before is None:
            return observation
        return replace(observation, text=f"refused again: this same action was refused at step {before}: "
                                         f"{observation.text}")


def refusal_key(proposed: Action | str) -> str:
    """How `Refusals` knows a proposal: an action by its tool and arguments (keys sorted), as
    JSON; text that is not an action by itself, as a JSON string."""
    value = [proposed.tool, proposed.args] if isinstance(proposed, Action) else proposed
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def limit_reached(limits: Limits, step: int, tokens: int, seconds: float, refusals: Refusals) -> dict | None:
    """The first limit a run at `step` having used `tokens` and `seconds`, whose latest
    refused proposal came `refusals.streak` times in a row, has reached, as the data of its
    "limit" event (with the proposal, for "repeats"), or None."""
    for name, used, allowed in (("steps", step, limits.steps), ("tokens", tokens, limits.tokens),
                                ("seconds", seconds, limits.seconds), ("repeats", refusals.streak, limits.repeats)):
        if used >= allowed:
            hit = {"limit": name, "used": used, "allowed": allowed}
            return (hit | {"proposal": refusals.last}) if name == "repeats" else hit
    return None


def limit_reason(hit: dict) -> str:
    """The reason of a run's "limit" outcome, from the data `limit_reached` gave."""
    if hit["limit"] == "repeats":
        return f"the same refused action was proposed {hit['used']} times in a row: {hit['proposal']}"
    return f"{hit['limit']} limit reached ({hit['used']} of {hit['allowed']})"


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
              tokens_used: int = 0, seconds_used: float = 0.0, refusals: Refusals | None = None) -> Outcome:
    """Run the agent on `task` until it finishes or a limit is reached, appending every event
    to `log`.

    The conversation starts as `[system, user(task)]`, or `messages` (a resumed or forked
    run, whose next step is `start_step`). Steps are numbered from the run's first, and
    `limits.steps` bounds that number: a run resumed at step k has `limits.steps - k` left.
    Tokens and seconds count from `tokens_used` and `seconds_used`, what the run spent
    before (0 for a fork: a branch's budget is its own), and refusals from `refusals`, the
    run's so far (`Refusals.of(events)` for a resumed run; None: none).

    Each step: check the limits ("limit"), ask the model for one proposal under the action
    schema ("proposal", with its token counts; step `s` samples with seed `seed + s`),
    parse it, and either finish ("finish") or record the intent with the digests of the
    files it may change ("intent") before performing it, then its observation
    ("observation"). A proposal that does not parse is a refused observation; a model that
    raises is an "error". A refusal of what was refused before says so in its observation
    (`Refusals.note`), and `limits.repeats` of them in a row are a "limit".
    `on_step(step, messages)` runs after each step's observation (it may change `messages`
    in place: compaction)."""
    check_limits(limits)
    tools = tuple(toolbox.tools)
    schema = action_schema(tools)
    if messages is None:
        messages = [{"role": "system", "content": system_prompt(task, tools)}, {"role": "user", "content": task}]
    messages = [dict(m) for m in messages]
    log.append(Event("start", start_step, {"task": task, "messages": messages, "tools": [t.name for t in tools],
                                           "limits": {"steps": limits.steps, "tokens": limits.tokens,
                                                      "seconds": limits.seconds, "repeats": limits.repeats},
                                           "seed": seed}))
    refusals = Refusals() if refusals is None else refusals
    began = time.monotonic()
    step, tokens = start_step, tokens_used

    def seconds() -> float:
        return round(seconds_used + time.monotonic() - began, 3)

    def outcome(status: str, summary: str = "", reason: str = "") -> Outcome:
        return Outcome(status, summary, step, tokens, seconds(), reason)

    while True:
        # BEGIN SOLUTION week4-day1
        hit = limit_reached(limits, step, tokens, seconds(), refusals)
        if hit is not None:
            log.append(Event("limit", step, {**hit, "seconds": seconds()}))
            return outcome("limit", reason=limit_reason(hit))
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
            action, observation = None, Observation(f"invalid action: {e}", ok=False)
        else:
            if action.tool == FINISH.name:
                log.append(Event("finish", step, {"summary": action.args["summary"], "seconds": seconds()}))
                step += 1
                return outcome("finished", summary=action.args["summary"])
            log.append(Event("intent", step, intent_data(toolbox, action)))
            observation = perform(toolbox, action)
        observation = refusals.note(refusal_key(proposal.text if action is None else action), step, observation)
        log.append(Event("observation", step, observation_data(observation)))
        messages += [{"role": "assistant", "content": proposal.text}, observation_message(observation)]
        step += 1
        # END SOLUTION
        if on_step is not None:
            on_step(step - 1, messages)


def _line(event: Event) -> bytes:
    """An event as one line of the log."""
    return (json.dumps(event.to_json(), ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def proposal_data(proposal: Proposal, seconds: float) -> dict:
    return {"text": proposal.text, "prompt_tokens": proposal.prompt_tokens,
            "completion_tokens": proposal.completion_tokens, "cached_tokens": proposal.cached_tokens,
            "seconds": seconds}
