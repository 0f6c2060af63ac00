"""Course: week 4 day 5 — fork and select: K branches from one point of a run, on one shared
prompt prefix and separate workspace copies; the visible checks choose one, and why is recorded.

    chosen, branches, report = fork(messages, step, workspace, make_model, 4, limits=limits,
                                    seeds=[0, 1, 2, 3], checks=task.visible_checks, run_dir=out)
    report["reason"]            # "2 of 4 branches pass the visible checks; branch 3 took the fewest steps (5)"
    report["saved_tokens"]      # prompt tokens the branches took from the prefix cache at their first step

Every branch starts from the same conversation (plus, for a steered branch, the operator's
message as one more user turn), so with the in-process engine and one `PrefixCache` shared
by the branches' models, the conversation is prefilled once: each later branch's first step
finds its pages in the cache. Each branch acts on its own copy of the workspace and writes
its own run log (`run_dir/branch-<i>.jsonl`); `run_dir/select.json` records every branch's
outcome, check failures and tokens, the chosen branch and the reason in words.

Tests: tests/test_week4_day5.py
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .core import Limits, Model
from .evaluate import check, validate_check
from .loop import Outcome, RunLog, run_agent
from .session import replay
from .workspace import Workspace

__all__ = ["Branch", "branch_tokens", "fork", "fork_point", "prefix_savings", "select"]


@dataclass
class Branch:
    """One branch of a fork: its position, the seed and steer it ran with, its workspace
    copy, how its run ended, the visible checks it failed ([] when it passes) and its log."""

    index: int
    seed: int | None
    steer: str | None
    workspace: Workspace
    outcome: Outcome
    failures: list[str]
    log: Path

    @property
    def passed(self) -> bool:
        """True when every visible check passes (what the model said is not evidence)."""
        return not self.failures


def fork(
    messages: list[dict],
    step: int,
    workspace: Workspace,
    make_model: Callable[[int], Model],
    k: int,
    *,
    limits: Limits,
    seeds: Sequence[int | None] | None = None,
    steers: Sequence[str | None] | None = None,
    checks: list[dict],
    run_dir: Path,
) -> tuple[Branch, list[Branch], dict]:
    """Run `k` branches from `messages` (a run's conversation before its step `step`) and
    choose one. Branch `i` runs `make_model(i)` with seed `seeds[i]` (default `i`), after
    `steers[i]` (None: no steer) appended as a user message, on `workspace.copy(run_dir /
    f"workspace-{i}")`, logging to `run_dir / f"branch-{i}.jsonl"`; then `checks` (the task's
    visible checks) are run on its copy. The original workspace is never touched.
    `limits` bound each branch as they bound a run: steps count from the run's first step
    (a fork at step 3 under 10 steps has 7 left), tokens and seconds from the fork. Share
    one `PrefixCache` between the models `make_model` returns (`EngineModel(...,
    prefix_cache=cache)`) and every branch after the first finds the conversation in it.

    Returns the chosen branch, all branches in order, and the report also written to
    `run_dir / "select.json"`."""
    seeds, steers = _plan(k, seeds, steers)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    if not messages:
        raise ValueError("messages must hold the run's conversation (at least its system message), got none")
    for n, spec in enumerate(checks):
        validate_check(spec, f"check {n}")
    task = _task(messages)
    run_dir = Path(run_dir)
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise ValueError(f"run_dir {run_dir} exists and is not an empty folder; earlier branches are never overwritten")
    if workspace.root == run_dir.resolve() or workspace.root in run_dir.resolve().parents:
        raise ValueError(f"run_dir {run_dir} is inside the workspace {workspace.root}; keep the branches outside it")
    run_dir.mkdir(parents=True, exist_ok=True)
    # Run each branch: its own workspace copy and log, the shared messages plus its steer,
    # its own model and seed; then check its copy.
    # BEGIN SOLUTION week4-day5
    branches = []
    for i in range(k):
        start = [dict(m) for m in messages]  # the shared prefix, identical for every branch
        if steers[i] is not None:
            start.append({"role": "user", "content": steers[i]})
        copy = workspace.copy(run_dir / f"workspace-{i}")
        log = run_dir / f"branch-{i}.jsonl"
        outcome = run_agent(task, make_model(i), copy, limits, RunLog(log), seed=seeds[i], messages=start,
                            start_step=step)
        branches.append(Branch(i, seeds[i], steers[i], copy, outcome, check(copy.root, checks), log))
    # END SOLUTION
    chosen, reason = select(branches)
    report = {
        "from_step": step,
        "checks": checks,
        "branches": [_branch_json(b) for b in branches],
        "chosen": chosen.index,
        "reason": reason,
        **prefix_savings(branches),
    }
    (run_dir / "select.json").write_text(json.dumps(report, indent=2) + "\n")
    return chosen, branches, report


def fork_point(log: Path) -> tuple[list[dict], int]:
    """Where the run of `log` stands: its conversation (steers included) and its next step,
    as `fork` takes them. The run's workspace is the one to fork: it holds every effect up to
    that point."""
    messages, step, _ = replay(RunLog.read(Path(log)))
    return messages, step


def select(branches: Sequence[Branch]) -> tuple[Branch, str]:
    """The branch to keep and why, in words: branches that pass the visible checks first,
    then fewer steps, then fewer tokens, then the lower index."""
    if not branches:
        raise ValueError("select needs at least one branch, got none")
    # Choose by (fails, steps, tokens, index) and explain the choice by the first of those
    # keys that sets it apart.
    # BEGIN SOLUTION week4-day5
    total = len(branches)
    passing = [b for b in branches if b.passed]
    pool = passing or list(branches)
    steps = min(b.outcome.steps for b in pool)
    fewest = [b for b in pool if b.outcome.steps == steps]
    tokens = min(b.outcome.tokens for b in fewest)
    cheapest = [b for b in fewest if b.outcome.tokens == tokens]
    chosen = min(cheapest, key=lambda b: b.index)
    i = chosen.index
    if total == 1:
        return chosen, f"branch {i} is the only branch (it {'passes' if passing else 'fails'} the visible checks)"
    if len(passing) == 1:
        return chosen, f"branch {i} is the only one of {total} branches that passes the visible checks"
    head = (f"{len(passing)} of {total} branches pass the visible checks" if passing
            else f"none of the {total} branches passes the visible checks")
    if len(fewest) == 1:
        return chosen, f"{head}; branch {i} took the fewest steps ({steps})"
    if len(cheapest) == 1:
        everyone = "both" if len(pool) == 2 else f"all {len(pool)}"
        tie = (f"{everyone} took {_plural(steps, 'step')}" if len(fewest) == len(pool)
               else f"{len(fewest)} of them took the fewest steps ({steps})")
        return chosen, f"{head}; {tie}, and branch {i} used the fewest tokens ({tokens})"
    return chosen, (f"{head}; branches {_names(sorted(b.index for b in cheapest))} tie on the fewest steps "
                    f"({steps}) and tokens ({tokens}), and branch {i} has the lowest index")
    # END SOLUTION


def branch_tokens(log: Path) -> dict:
    """A branch's prompt tokens from its run log: all prompt tokens of its proposals, those
    taken from the prefix cache, and both at its first step."""
    proposals = [e.data for e in RunLog.read(Path(log)) if e.kind == "proposal"]
    first = proposals[0] if proposals else {}
    return {
        "prompt_tokens": sum(p.get("prompt_tokens", 0) for p in proposals),
        "cached_tokens": sum(p.get("cached_tokens", 0) for p in proposals),
        "first_prompt_tokens": first.get("prompt_tokens", 0),
        "first_cached_tokens": first.get("cached_tokens", 0),
    }


def prefix_savings(branches: Sequence[Branch]) -> dict:
    """What the shared prefix saved: `saved_tokens`, the prompt tokens the branches took from
    the prefix cache at their first step (the shared conversation, not prefilled again), and
    over all their steps `prompt_tokens`, `cached_tokens` and `prefilled_tokens`."""
    # BEGIN SOLUTION week4-day5
    counts = [branch_tokens(b.log) for b in branches]
    prompt = sum(c["prompt_tokens"] for c in counts)
    cached = sum(c["cached_tokens"] for c in counts)
    return {"prompt_tokens": prompt, "cached_tokens": cached, "prefilled_tokens": prompt - cached,
            "saved_tokens": sum(c["first_cached_tokens"] for c in counts)}
    # END SOLUTION


def _branch_json(branch: Branch) -> dict:
    o = branch.outcome
    return {
        "index": branch.index, "seed": branch.seed, "steer": branch.steer, "log": str(branch.log),
        "workspace": str(branch.workspace.root), "passed": branch.passed, "failures": branch.failures,
        "outcome": {"status": o.status, "summary": o.summary, "steps": o.steps, "tokens": o.tokens,
                    "seconds": o.seconds, "reason": o.reason},
        "tokens": o.tokens, **branch_tokens(branch.log),
    }


def _plan(k: int, seeds, steers) -> tuple[list[int | None], list[str | None]]:
    """Each branch's seed and steer, checked against `k`."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (the number of branches) must be an integer >= 1, got {k!r}")
    seeds = list(range(k)) if seeds is None else list(seeds)
    steers = [None] * k if steers is None else list(steers)
    for name, values in (("seeds", seeds), ("steers", steers)):
        if len(values) != k:
            raise ValueError(f"{name} must have one entry per branch ({k}), got {len(values)}")
    for s in seeds:
        if s is not None and (isinstance(s, bool) or not isinstance(s, int)):
            raise ValueError(f"a seed must be an integer or None, got {s!r}")
    for s in steers:
        if s is not None and (not isinstance(s, str) or not s.strip()):
            raise ValueError(f"a steer must be a non-empty string or None, got {s!r}")
    return seeds, steers


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _names(indices: list[int]) -> str:
    """`[1, 2, 3]` as "1, 2 and 3"."""
    return ", ".join(map(str, indices[:-1])) + f" and {indices[-1]}"


def _task(messages: list[dict]) -> str:
    """The task of the run the messages come from: its first user message."""
    for m in messages:
        if m.get("role") == "user":
            return m.get("content", "")
    raise ValueError("messages hold no user message (the task): fork from a run's conversation")
