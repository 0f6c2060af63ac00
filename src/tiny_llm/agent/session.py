"""Course: week 4 day 3 — sessions: a run's log is its checkpoint; resume, compaction and steering.

    messages, step, receipts = replay(RunLog.read(path))   # the conversation, rebuilt
    steer(path, "Leave the tests alone; fix add() only.")   # a paused run gets a word from the operator
    outcome = resume(path, model, workspace, Limits(steps=20))

`resume` continues a run that stopped (a limit, an error, a kill) from its log alone: the
conversation is replayed, a step the kill cut short is settled (its proposal is not asked
for again, and an effect the workspace already shows is not performed again), and the loop
goes on. `compact` replaces a conversation's completed old turns by a summary made from the
receipts, the same summary for the same turns, so a replay that meets a "compaction" event
rebuilds the very messages the run went on with.

Tests: tests/test_week4_day3.py, tests/test_week4_day5.py
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from .actions import FINISH, parse_action
from .core import Action, Event, Limits, Model, Observation, Receipt, Toolbox
from .loop import (Digests, Outcome, Refusals, RunLog, intent_data, observation_data, observation_message,
                   perform, run_agent)
from .models import count_tokens

__all__ = ["SUMMARY", "compact", "compactor", "replay", "resume", "spent", "steer", "undo"]

SUMMARY = "Summary of the earlier steps of this run (compacted)."  # the first line of a summary
OPERATOR = "Operator messages:"
RECEIPTS = "Effects so far, one receipt a line (tool, args, file digests before and after, exit status):"


def replay(events: list[Event]) -> tuple[list[dict], int, list[Receipt]]:
    """From a run log's events: the conversation as the model would see it next, the next
    step, and the receipts of every effect, in order. A "start" event holds the conversation
    at its step; each step adds the proposal's text (assistant) and its observation (user);
    a "steer" adds the operator's message; a "compaction" compacts as the run did."""
    if not events or events[0].kind != "start":
        raise ValueError("a run log starts with a 'start' event")
    messages: list[dict] = []
    step = 0
    receipts: list[Receipt] = []
    proposals: dict[int, str] = {}  # step -> the text the model proposed
    # BEGIN SOLUTION week4-day3
    for event in events:
        if event.kind == "start":
            messages, step = [dict(m) for m in event.data["messages"]], event.step
        elif event.kind == "proposal":
            proposals[event.step] = event.data["text"]
        elif event.kind == "observation":
            if event.step not in proposals:
                raise ValueError(f"the observation of step {event.step} has no proposal before it")
            observation = Observation(event.data["text"], event.data["ok"])
            messages += [{"role": "assistant", "content": proposals[event.step]}, observation_message(observation)]
            if event.data.get("receipt"):
                receipts.append(Receipt.from_json(event.data["receipt"]))
            step = event.step + 1
        elif event.kind == "steer":
            messages.append({"role": "user", "content": event.data["text"]})
        elif event.kind == "compaction":
            messages = compact(messages, receipts, keep_last=event.data["keep_last"])
        elif event.kind == "finish":
            step = event.step + 1
    # END SOLUTION
    return messages, step, receipts


def spent(events: list[Event]) -> tuple[int, float]:
    """What a run has used so far: tokens (prompt + completion of every proposal) and wall
    seconds (the latest its events recorded)."""
    tokens = sum(e.data.get("prompt_tokens", 0) + e.data.get("completion_tokens", 0)
                 for e in events if e.kind == "proposal")
    seconds = max((e.data["seconds"] for e in events if "seconds" in e.data), default=0.0)
    return tokens, seconds


def resume(log_path: Path, model: Model, toolbox: Toolbox, limits: Limits, *, seed: int | None = None,
           budget: int | None = None, keep_last: int = 2,
           count: Callable[[list[dict]], int] = count_tokens) -> Outcome:
    """Continue the run logged at `log_path` (stopped by a limit or an error, or killed) on
    `toolbox`, appending to the same log; `limits` count what the run spent before. A
    finished run is only reported. `seed`: the run's own unless given. `budget`: compact
    when the conversation passes that many tokens (`count`), keeping the last `keep_last`
    turns (see `compactor`).

    A step the run was cut short in is completed, never started over: its proposal is used
    as logged. An "intent" without its "observation" is settled by the digests it recorded
    of the files it may change: if the workspace still holds them, the effect has not
    happened and is performed now; if not, it happened, and its observation is made from the
    workspace as it is (a receipt with the digests before and now). So no effect is applied
    twice and none is lost."""
    began = time.monotonic()  # the settled step counts in the run's time
    log_path = Path(log_path)
    events = RunLog.read(log_path)
    messages, step, receipts = replay(events)
    starts = [e for e in events if e.kind == "start"]
    tokens, seconds = spent(events)
    finish = next((e for e in events if e.kind == "finish"), None)
    if finish is not None:
        return Outcome("finished", finish.data["summary"], step, tokens, seconds)
    seed = starts[-1].data.get("seed") if seed is None else seed
    task = starts[0].data["task"]
    log = RunLog(log_path)
    tools = tuple(toolbox.tools)
    proposal = next((e for e in events if e.kind == "proposal" and e.step == step), None)
    intent = next((e for e in events if e.kind == "intent" and e.step == step), None)
    if proposal is not None:  # the run was killed inside this step: complete it
        try:
            action = parse_action(proposal.data["text"], tools)
        except ValueError as e:
            observation = Observation(f"invalid action: {e}", ok=False)
        else:
            if action.tool == FINISH.name:
                log.append(Event("finish", step, {"summary": action.args["summary"], "seconds": seconds}))
                return Outcome("finished", action.args["summary"], step + 1, tokens, seconds)
            if intent is None:
                log.append(Event("intent", step, intent_data(toolbox, action)))
                observation = perform(toolbox, action)
            else:
                reap = getattr(toolbox, "reap", None)  # the interrupted command is gone before we look
                if callable(reap):
                    reap()
                observation = settle(intent, action, toolbox)
        log.append(Event("observation", step, observation_data(observation)))
        messages += [{"role": "assistant", "content": proposal.data["text"]}, observation_message(observation)]
        step += 1
    on_step = compactor(log, budget, keep_last=keep_last, count=count) if budget is not None else None
    return run_agent(task, model, toolbox, limits, log, seed=seed, messages=messages, start_step=step,
                     refusals=Refusals.of(RunLog.read(log_path)),
                     on_step=on_step, tokens_used=tokens, seconds_used=seconds + time.monotonic() - began)


def settle(intent: Event, action: Action, toolbox: Toolbox) -> Observation:
    """The observation of an action whose intent was logged but whose observation was not.
    The files it may change (those the intent recorded, and any `touched` names now, such as
    files a command created) are compared with the digests the intent recorded (absent then:
    None): all the same, the effect has not happened and is performed now; any different,
    it happened before the kill, and the observation is made from the workspace as it is."""
    before = intent.data.get("before")
    if before is None or not isinstance(toolbox, Digests):
        return Observation("the run stopped during this action, and this toolbox cannot tell whether it took "
                           "effect: it was not performed again", ok=False)
    # BEGIN SOLUTION week4-day3
    paths = sorted(set(before) | set(toolbox.touched(action)))
    was = {p: before.get(p) for p in paths}
    now = {p: toolbox.digest(p) for p in paths}
    if now == was:
        return perform(toolbox, action)
    changed = ", ".join(p for p in paths if now[p] != was[p])
    return Observation(f"done before the run stopped: {action.tool} changed {changed} (settled from the "
                       "workspace on resume; no exit status or output was kept)", ok=True,
                       receipt=Receipt(action.tool, action.args, before=was, after=now))
    # END SOLUTION


def compact(messages: list[dict], receipts: list[Receipt], *, keep_last: int) -> list[dict]:
    """`messages` with the completed turns before the last `keep_last` replaced by one user
    message: a summary made only from `receipts` (every one, verbatim as JSON) and the
    operator's messages among those turns. The system message and the task stay; a turn is
    an assistant message and the user messages after it. The same arguments give the same
    messages; with nothing to compact, `messages` comes back unchanged (as a new list)."""
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
        raise ValueError(f"keep_last must be an integer >= 0, got {keep_last!r}")
    head, rest = messages[:2], messages[2:]
    # BEGIN SOLUTION week4-day3
    starts = [i for i, m in enumerate(rest) if m["role"] == "assistant"]
    cut = starts[-keep_last] if 0 < keep_last <= len(starts) else (0 if keep_last else len(rest))
    old, kept = rest[:cut], rest[cut:]
    if not any(m["role"] == "assistant" for m in old):
        return [dict(m) for m in messages]
    operator = []
    for m in old:
        if m["role"] != "user" or m["content"].startswith("Observation"):
            continue
        if m["content"].startswith(SUMMARY):  # an earlier summary: its operator messages carry over
            lines = m["content"].split("\n")
            operator += [line[2:] for line in lines[lines.index(OPERATOR) + 1:]] if OPERATOR in lines else []
        else:
            operator.append(json.dumps(m["content"], ensure_ascii=False))
    lines = [SUMMARY, RECEIPTS]
    lines += [f"- {json.dumps(r.to_json(), sort_keys=True, ensure_ascii=False)}" for r in receipts] or ["- none"]
    if operator:
        lines += [OPERATOR, *(f"- {text}" for text in operator)]
    return [dict(m) for m in head] + [{"role": "user", "content": "\n".join(lines)}] + [dict(m) for m in kept]
    # END SOLUTION


def compactor(log: RunLog, budget: int, *, keep_last: int = 2,
              count: Callable[[list[dict]], int] = count_tokens) -> Callable[[int, list[dict]], None]:
    """An `on_step` for `run_agent`: when the conversation passes `budget` tokens (by
    `count`; `EngineModel.count_tokens` counts exactly), compact it in place from the
    receipts in `log` and append a "compaction" event (which `replay` repeats)."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be a positive integer (tokens), got {budget!r}")

    def on_step(step: int, messages: list[dict]) -> None:
        before = count(messages)
        if before <= budget:
            return
        _, _, receipts = replay(RunLog.read(log.path))
        compacted = compact(messages, receipts, keep_last=keep_last)
        if len(compacted) == len(messages) and compacted == messages:
            return  # nothing old enough to compact
        log.append(Event("compaction", step, {"keep_last": keep_last, "tokens_before": before,
                                              "tokens_after": count(compacted)}))
        messages[:] = compacted

    return on_step


def steer(log_path: Path, text: str) -> None:
    """Add the operator's `text` to the paused run logged at `log_path` (a "steer" event):
    `resume` shows it to the model as a user message before its next step. ValueError for an
    empty text, a corrupt log, or a run that has finished."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"a steering message must be a non-empty text, got {text!r}")
    log_path = Path(log_path)
    events = RunLog.read(log_path)
    if any(e.kind == "finish" for e in events):
        raise ValueError(f"run log {log_path}: the run has finished; only a paused run can be steered")
    _, step, _ = replay(events)
    RunLog(log_path).append(Event("steer", step, {"text": text}))


def state_before(events: list[Event], step: int) -> dict[str, str | None]:
    """What every file the run's effects from `step` on touched held before that step: for
    each path, the digest before the first effect at or after `step` that touched it (None:
    no file). An effect cut short by a kill (an intent without its observation) counts with
    the digests its intent recorded."""
    observed = {e.step for e in events if e.kind == "observation"}
    state: dict[str, str | None] = {}
    for event in events:
        if event.step < step:
            continue
        if event.kind == "observation" and event.data.get("receipt"):
            before = Receipt.from_json(event.data["receipt"]).before
        elif event.kind == "intent" and event.step not in observed:
            before = event.data.get("before") or {}
        else:
            continue
        for path, digest in before.items():
            state.setdefault(path, digest)
    return state


def undo(log_path: Path, workspace, to_step: int = 0) -> tuple[list[str], list[str]]:
    """Put `workspace` back as it was before step `to_step` of the run logged at `log_path`
    (0: before the run), from the bytes its blob folder kept of every file an effect touched,
    and log it: a "steer" event, so a resumed run's model reads that the operator undid those
    steps, with what was written and removed under "undo". A command the run left running is
    killed first. Returns the paths written and the paths removed."""
    log_path = Path(log_path)
    events = RunLog.read(log_path)
    _, step, _ = replay(events)
    if isinstance(to_step, bool) or not isinstance(to_step, int) or not 0 <= to_step <= step:
        raise ValueError(f"to_step: a step of this run, 0 to {step}, got {to_step!r}")
    workspace.reap()
    written, removed = workspace.restore(state_before(events, to_step))
    text = f"The operator undid steps {to_step} to {step - 1}: the workspace is as it was before step {to_step}."
    RunLog(log_path).append(Event("steer", step, {"text": text, "undo": {"to_step": to_step, "written": written,
                                                                         "removed": removed}}))
    return written, removed
