"""Course: week 4 day 4 — evaluation: tasks as folders, held-out checks the agent never sees,
and a report of what the runs did (pass rate, pass@k, steps, tokens, seconds, why each failure
failed). Only checks are evidence; what a model says it did is never counted.

A task is a folder:

    fix-off-by-one/
        task.json       {"prompt": ..., "limits": {"steps": 8, ...}, "editable_paths": [...],
                         "allowed_commands": ["python3"], "visible_checks": [...]}
        workspace/      the files the agent starts from (copied for every run)
        checks.json     the held-out checks: a list of {"kind": "file" | "constant" | "command", ...}

    tasks = load_tasks(Path("examples/agent-tasks"))
    report = evaluate(tasks, lambda task, i: ScriptedModel(...), runs=2, seed=0, out=Path("eval"))
    print(format_report(report))    # also in eval/report.json

Tests: tests/test_week4_day4.py
"""

from __future__ import annotations

import ast
import json
import math
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .core import Action, Limits, Model
from .loop import RunLog, run_agent
from .boundary import PolicyError
from .files import MAX_FILE_BYTES
from .outputs import decode
from .workspace import Workspace, refusal

__all__ = ["CHECK_KINDS", "Task", "check", "describe_check", "evaluate", "format_report", "load_tasks",
           "pass_at_k", "validate_check", "why_failed"]

TASK_FILE, CHECKS_FILE, WORKSPACE_DIR = "task.json", "checks.json", "workspace"
REPORT_FILE = "report.json"
TASK_FIELDS = ("prompt", "limits", "editable_paths", "allowed_commands", "visible_checks")
# kind -> (required fields, optional fields); a file check needs exactly one of equals / contains.
CHECK_KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "file": (("path",), ("equals", "contains", "label")),
    "constant": (("path", "name", "value"), ("label",)),
    "command": (("argv",), ("exit_status", "seconds", "label")),
}
COMMAND_SECONDS = 30.0  # a command check's time limit unless it sets "seconds"
SHOWN = 200  # characters of a command's output quoted in a failure


@dataclass
class Task:
    """One task: its name (the folder's), the prompt the agent gets, its limits, the paths it
    may edit and the commands it may run, its starting workspace, the held-out `checks` and
    the `visible_checks` a run may use itself (week 4 day 5)."""

    name: str
    prompt: str
    limits: Limits
    editable_paths: list[str]
    allowed_commands: list[str]
    workspace: Path
    checks: list[dict]
    visible_checks: list[dict]

    @property
    def folder(self) -> Path:
        return self.workspace.parent

    @classmethod
    def load(cls, folder: Path) -> Task:
        """The task in `folder`: `task.json`, `workspace/` and `checks.json`. Anything missing or
        malformed is a ValueError that names the folder, the file and the field."""
        folder = Path(folder)
        # BEGIN SOLUTION week4-day4
        if not folder.is_dir():
            raise ValueError(f"task {folder}: not a folder")
        spec = _json_object(folder, TASK_FILE)
        unknown = sorted(set(spec) - set(TASK_FIELDS))
        if unknown:
            raise ValueError(f"task {folder}: {TASK_FILE}: unknown field {unknown[0]!r} "
                             f"(known: {', '.join(sorted(TASK_FIELDS))})")
        prompt = spec.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"task {folder}: {TASK_FILE}: prompt must be a non-empty string, got {prompt!r}")
        workspace = folder / WORKSPACE_DIR
        _check_workspace(folder, workspace)
        checks = _json_value(folder, CHECKS_FILE)
        if not isinstance(checks, list) or not checks:
            raise ValueError(f"task {folder}: {CHECKS_FILE} must hold a non-empty list of checks")
        for i, c in enumerate(checks):
            validate_check(c, f"task {folder}: {CHECKS_FILE}[{i}]")
        visible = spec.get("visible_checks", [])
        if not isinstance(visible, list):
            raise ValueError(f"task {folder}: {TASK_FILE}: visible_checks must be a list of checks")
        for i, c in enumerate(visible):
            validate_check(c, f"task {folder}: {TASK_FILE}: visible_checks[{i}]")
        return cls(folder.resolve().name, prompt, _limits(folder, spec.get("limits", {})),
                   _strings(folder, spec, "editable_paths", ["**"]), _strings(folder, spec, "allowed_commands", []),
                   workspace, checks, visible)
        # END SOLUTION


def load_tasks(path: Path) -> list[Task]:
    """The task in `path` (a folder with a `task.json`), or each task folder directly inside
    it, sorted by name."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"tasks {path}: no such folder")
    if (path / TASK_FILE).exists():
        return [Task.load(path)]
    folders = sorted(p for p in path.iterdir() if p.is_dir() and (p / TASK_FILE).exists())
    if not folders:
        raise ValueError(f"tasks {path}: no {TASK_FILE} in it or in any folder directly inside it")
    return [Task.load(f) for f in folders]


def validate_check(spec: Any, where: str) -> None:
    """A ValueError naming `where` unless `spec` is a well-formed check."""
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: a check must be a JSON object, got {spec!r}")
    kind = spec.get("kind")
    if kind not in CHECK_KINDS:
        raise ValueError(f"{where}: unknown kind {kind!r} (known: {', '.join(sorted(CHECK_KINDS))})")
    required, optional = CHECK_KINDS[kind]
    for key in required:
        if key not in spec:
            raise ValueError(f"{where}: a {kind} check needs {key!r}")
    for key in sorted(set(spec) - {"kind", *required, *optional}):
        raise ValueError(f"{where}: unknown field {key!r} of a {kind} check "
                         f"(known: {', '.join(sorted({'kind', *required, *optional}))})")
    if "path" in spec and (not isinstance(spec["path"], str) or not spec["path"]):
        raise ValueError(f"{where}: path must be a non-empty string, got {spec['path']!r}")
    for key in ("name", "label"):
        if key in spec and (not isinstance(spec[key], str) or not spec[key]):
            raise ValueError(f"{where}: {key} must be a non-empty string, got {spec[key]!r}")
    if kind == "file":
        given = [k for k in ("equals", "contains") if k in spec]
        if len(given) != 1:
            raise ValueError(f"{where}: a file check needs exactly one of 'equals' and 'contains', got {given}")
        if not isinstance(spec[given[0]], str):
            raise ValueError(f"{where}: {given[0]} must be a string, got {spec[given[0]]!r}")
    elif kind == "constant":
        if not spec["name"].isidentifier():
            raise ValueError(f"{where}: name must be a Python identifier, got {spec['name']!r}")
    else:
        argv = spec["argv"]
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a for a in argv):
            raise ValueError(f"{where}: argv must be a non-empty list of non-empty strings, got {argv!r}")
        status = spec.get("exit_status", 0)
        if isinstance(status, bool) or not isinstance(status, int):
            raise ValueError(f"{where}: exit_status must be an integer, got {status!r}")
        seconds = spec.get("seconds", COMMAND_SECONDS)
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
            raise ValueError(f"{where}: seconds must be a positive number, got {seconds!r}")


def describe_check(spec: dict) -> str:
    """How a failure names its check: the check's own `label`, or its kind and target."""
    if "label" in spec:
        return spec["label"]
    if spec["kind"] == "constant":
        return f"constant {spec['name']} in {spec['path']}"
    if spec["kind"] == "file":
        return f"file {spec['path']}"
    return "command " + " ".join(spec["argv"])


def check(workspace_root: Path, checks: list[dict]) -> list[str]:
    """The failures of `checks` on the workspace at `workspace_root`, one line each and each
    starting with the check's name (`describe_check`); [] when every check passes.

    Files are read through the workspace's policy boundary (a symlink that leads out is not
    evidence), a constant is read with `ast` (the file is never imported or executed), and a
    command runs as the workspace's `run` tool runs it: in the workspace, with its time and
    output limits and an environment without the caller's secrets."""
    failures = []
    with tempfile.TemporaryDirectory(prefix="tiny-llm-check-") as blobs:
        for i, spec in enumerate(checks):
            validate_check(spec, f"check {i}")
            command = spec["kind"] == "command"
            workspace = Workspace(Path(workspace_root), allowed_commands=(spec["argv"][0],) if command else (),
                                  command_seconds=spec.get("seconds", COMMAND_SECONDS), blob_dir=Path(blobs))
            problem = {"file": _check_file, "constant": _check_constant, "command": _check_command}[spec["kind"]](
                workspace, spec)
            if problem:
                failures.append(f"{describe_check(spec)}: {problem}")
    return failures


def _check_file(workspace: Workspace, spec: dict) -> str | None:
    """None when the file's text equals (or contains) the expected text; else the reason."""
    # BEGIN SOLUTION week4-day4
    text, problem = _read_text(workspace, spec["path"])
    if problem:
        return problem
    if "contains" in spec:
        return None if spec["contains"] in text else f"does not contain {_quote(spec['contains'])}"
    if text == spec["equals"]:
        return None
    got, want = text.splitlines(keepends=True), spec["equals"].splitlines(keepends=True)
    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    here, there = got[i] if i < len(got) else "", want[i] if i < len(want) else ""  # '' past the end
    return f"differs from the expected text at line {i + 1}: {_quote(here)} instead of {_quote(there)}"
    # END SOLUTION


def _check_constant(workspace: Workspace, spec: dict) -> str | None:
    """None when the module-level constant `name` in `path` is assigned the literal `value`
    (the last binding of the name counts, as when the module runs); else the reason."""
    # BEGIN SOLUTION week4-day4
    text, problem = _read_text(workspace, spec["path"])
    if problem:
        return problem
    try:
        tree = ast.parse(text, filename=spec["path"])
    except SyntaxError as e:
        return f"{spec['path']} is not valid Python (line {e.lineno}: {e.msg})"
    name, found = spec["name"], None
    for node in tree.body:  # module level only: a name bound in a function is not the module's constant
        if _binds(node, name):
            found = node
    if found is None:
        return "not defined"
    value_node = found.value if isinstance(found, ast.Assign | ast.AnnAssign) and _simple(found, name) else None
    if value_node is None:
        return f"bound at line {found.lineno} by {_statement(found)}, not a literal assignment"
    try:
        value = ast.literal_eval(value_node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return f"is {ast.unparse(value_node)} at line {found.lineno}, not a literal"
    if not _json_equal(value, spec["value"]):
        return f"is {value!r}, expected {spec['value']!r}"
    return None
    # END SOLUTION


def _check_command(workspace: Workspace, spec: dict) -> str | None:
    """None when the command exits with the expected status (default 0); else the reason,
    with the last line of its output."""
    # BEGIN SOLUTION week4-day4
    argv = spec["argv"]
    try:
        result = workspace.run_command(argv)
    except (ValueError, OSError) as e:  # refused or failed before it started (e.g. not on PATH)
        return f"did not run: {refusal(Action('run', {'command': argv}), e)}"
    status, expected = result.exit_status, spec.get("exit_status", 0)
    if status == expected:
        return None
    output = _last_line(result.output)
    if result.timed_out:
        return (f"timed out after {workspace.command_seconds:g} s: killed, exit status {status}, "
                f"expected exit status {expected}: {output}")
    return f"exit status {status}, expected {expected}: {output}"
    # END SOLUTION


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from `n` runs of which `c` passed: the chance that
    at least one of `k` runs drawn without replacement from the `n` passes,
    1 - C(n - c, k) / C(n, k) (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    # BEGIN SOLUTION week4-day4
    if n - c < k:  # every draw of k runs holds a passing one
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
    # END SOLUTION


def evaluate(tasks: list[Task], make_model: Callable[[Task, int], Model], *, runs: int, seed: int,
             out: Path, on_run: Callable[[Task, dict], None] | None = None) -> dict:
    """Run every task `runs` times and check each run; return the report, also written to
    `out / "report.json"`.

    Run `i` of a task acts on a fresh copy of the task's workspace at `out/<task>/run-<i>/
    workspace`, logs to `out/<task>/run-<i>/run.jsonl`, and uses `make_model(task, i)` with
    seed `seed + i`. A run passes when every held-out check passes on its workspace; the
    run's status (finished, limit, error) and the model's summary are reported, never
    counted. `on_run(task, result)` is called after each run (progress). `out` must be new
    or empty: earlier results are never overwritten."""
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"runs must be a positive integer, got {runs!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    names = [t.name for t in tasks]
    if not tasks or len(set(names)) != len(names):
        raise ValueError(f"evaluate needs tasks with distinct names, got {names}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"out {out} exists and is not an empty folder; earlier results are never overwritten")
    out.mkdir(parents=True, exist_ok=True)
    report_tasks = []
    for task in tasks:
        untouched = check(_copy_workspace(task, out / task.name / "untouched" / WORKSPACE_DIR).root, task.checks)
        results = []
        for i in range(runs):
            results.append(_run_once(task, make_model, i, seed, out))
            if on_run is not None:
                on_run(task, results[-1])
        report_tasks.append(_task_report(task, results, untouched_passes=not untouched))
    report = {"runs": runs, "seed": seed, **_totals(report_tasks, runs), "tasks": report_tasks}
    (out / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    return report


def _run_once(task: Task, make_model: Callable[[Task, int], Model], i: int, seed: int, out: Path) -> dict:
    """Run `i` of `task`: a fresh workspace copy and log under `out`, the loop, the held-out
    checks; the run's record for the report (paths relative to `out`)."""
    run_dir = out / task.name / f"run-{i}"
    # BEGIN SOLUTION week4-day4
    workspace = _copy_workspace(task, run_dir / WORKSPACE_DIR)
    log = run_dir / "run.jsonl"
    try:
        outcome = run_agent(task.prompt, make_model(task, i), workspace, task.limits, RunLog(log), seed=seed + i)
        status, reason, summary = outcome.status, outcome.reason, outcome.summary
        steps, tokens, seconds = outcome.steps, outcome.tokens, outcome.seconds
    except NotImplementedError:  # a course day not done yet: say which, do not score it
        raise
    except Exception as e:  # a broken model or harness fails this run, not the evaluation
        status, reason, summary, steps, tokens, seconds = "error", f"{type(e).__name__}: {e}", "", 0, 0, 0.0
    failures = check(workspace.root, task.checks)  # the evidence: never the summary
    # END SOLUTION
    return {"run": i, "seed": seed + i, "passed": not failures, "failures": failures, "status": status,
            "reason": reason, "summary": summary, "steps": steps, "tokens": tokens, "seconds": round(seconds, 3),
            "workspace": (run_dir / WORKSPACE_DIR).relative_to(out).as_posix(),
            "log": (run_dir / "run.jsonl").relative_to(out).as_posix()}


def _task_report(task: Task, results: list[dict], *, untouched_passes: bool) -> dict:
    n, c = len(results), sum(r["passed"] for r in results)
    return {
        "name": task.name, "runs": n, "passed": c, "pass_rate": c / n,
        "pass_at_k": {str(k): pass_at_k(n, c, k) for k in range(1, n + 1)},
        "steps": sum(r["steps"] for r in results) / n, "tokens": sum(r["tokens"] for r in results) / n,
        "seconds": round(sum(r["seconds"] for r in results) / n, 3),
        "untouched_passes": untouched_passes, "results": results,
    }


def _totals(tasks: list[dict], runs: int) -> dict:
    """Over all tasks: the share of passing runs, and pass@k averaged over the tasks."""
    return {"pass_rate": sum(t["passed"] for t in tasks) / (runs * len(tasks)),
            "pass_at_k": {str(k): sum(t["pass_at_k"][str(k)] for t in tasks) / len(tasks) for k in range(1, runs + 1)}}


def why_failed(result: dict) -> list[str]:
    """Why a run failed, one line each: its failing checks, then how the run ended if it did
    not finish (a limit or an error)."""
    lines = list(result["failures"])
    if result["status"] != "finished":
        lines.append(f"the run ended with {result['status']}" + (f": {result['reason']}" if result["reason"] else ""))
    return lines


def format_report(report: dict) -> str:
    """The report as a table: per task runs, passes, pass@k (k = 1, 2, 5, 10 and the number
    of runs, where there are that many), mean steps, tokens and seconds; then each failed
    run with its reasons."""
    n = report["runs"]
    ks = sorted({k for k in (1, 2, 5, 10, n) if k <= n})
    width = max([len("task"), len("all")] + [len(t["name"]) for t in report["tasks"]])
    head = f"{'task':<{width}}  {'passed':>7}" + "".join(f"  {'pass@' + str(k):>7}" for k in ks)
    lines = [head + f"  {'steps':>6}  {'tokens':>8}  {'seconds':>8}"]
    for t in report["tasks"]:
        lines.append(f"{t['name']:<{width}}  {str(t['passed']) + '/' + str(t['runs']):>7}"
                     + "".join(f"  {t['pass_at_k'][str(k)]:7.2f}" for k in ks)
                     + f"  {t['steps']:6.1f}  {t['tokens']:8.0f}  {t['seconds']:8.1f}")
    total = sum(t["passed"] for t in report["tasks"])
    lines.append(f"{'all':<{width}}  {str(total) + '/' + str(n * len(report['tasks'])):>7}"
                 + "".join(f"  {report['pass_at_k'][str(k)]:7.2f}" for k in ks))
    warnings = [t["name"] for t in report["tasks"] if t["untouched_passes"]]
    if warnings:
        lines.append("tasks whose checks pass on the untouched workspace (they measure nothing): "
                     + ", ".join(warnings))
    failed = [(t["name"], r) for t in report["tasks"] for r in t["results"] if not r["passed"]]
    if failed:
        lines.append("failures:")
        for name, r in failed:
            reasons = why_failed(r)
            lines.append(f"  {name} run {r['run']}: {reasons[0]}")
            lines += [f"  {' ' * len(name)}       {more}" for more in reasons[1:]]
    return "\n".join(lines)


# ---- given helpers ------------------------------------------------------------------------


def _json_value(folder: Path, name: str) -> Any:
    path = folder / name
    if not path.is_file():
        raise ValueError(f"task {folder}: no {name}" + (" (the held-out checks)" if name == CHECKS_FILE else ""))
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"task {folder}: {name} is not UTF-8 text (byte {e.start + 1})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"task {folder}: {name} is not valid JSON "
                         f"(line {e.lineno} column {e.colno}: {e.msg})") from None


def _json_object(folder: Path, name: str) -> dict:
    value = _json_value(folder, name)
    if not isinstance(value, dict):
        raise ValueError(f"task {folder}: {name} must hold a JSON object, got {type(value).__name__}")
    return value


def _limits(folder: Path, spec: Any) -> Limits:
    """`limits` of task.json: any of Limits' fields, positive; the others keep Limits' defaults."""
    known = {f.name: f.type for f in fields(Limits)}
    if not isinstance(spec, dict):
        raise ValueError(f"task {folder}: {TASK_FILE}: limits must be an object with {', '.join(known)}")
    for key, value in spec.items():
        if key not in known:
            raise ValueError(f"task {folder}: {TASK_FILE}: unknown limit {key!r} (known: {', '.join(known)})")
        whole = key != "seconds"
        if isinstance(value, bool) or not isinstance(value, int if whole else int | float) or value <= 0:
            raise ValueError(f"task {folder}: {TASK_FILE}: limits.{key} must be a positive "
                             f"{'integer' if whole else 'number'}, got {value!r}")
    return Limits(**spec)


def _strings(folder: Path, spec: dict, key: str, default: list[str]) -> list[str]:
    value = spec.get(key, default)
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"task {folder}: {TASK_FILE}: {key} must be a list of non-empty strings, got {value!r}")
    return list(value)


def _check_workspace(folder: Path, workspace: Path) -> None:
    """A starting workspace holds plain files and folders only (no symlinks, devices, ...)."""
    if not workspace.is_dir() or workspace.is_symlink():
        raise ValueError(f"task {folder}: no {WORKSPACE_DIR}/ folder (the files the agent starts from)")
    for path in sorted(workspace.rglob("*")):
        mode = path.lstat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            kind = "a symlink" if stat.S_ISLNK(mode) else "not a plain file"
            raise ValueError(f"task {folder}: {path.relative_to(folder).as_posix()} is {kind}; a starting "
                             f"workspace holds plain files and folders only")


def _copy_workspace(task: Task, dest: Path) -> Workspace:
    """A fresh copy of the task's starting workspace at `dest`, with the task's policy; its
    kept outputs go beside it, out of the agent's reach."""
    shutil.copytree(task.workspace, dest, symlinks=True)
    return Workspace(dest, editable_paths=task.editable_paths, allowed_commands=task.allowed_commands,
                     blob_dir=dest.parent / "blobs")


def _read_text(workspace: Workspace, path: str) -> tuple[str, str | None]:
    """(the file's text, None), or ("", why it cannot be read)."""
    try:
        resolved = workspace.resolve(path)
    except PolicyError as e:
        return "", f"refused: {e}"
    if not resolved.is_file():
        return "", "missing" if not resolved.exists() else "not a file"
    if resolved.stat().st_size > MAX_FILE_BYTES:
        return "", f"larger than {MAX_FILE_BYTES} bytes"
    try:
        return resolved.read_text(encoding="utf-8"), None
    except UnicodeDecodeError as e:
        return "", f"not UTF-8 text (byte {e.start + 1})"


def _binds(node: ast.stmt, name: str) -> bool:
    """True when the module-level statement `node` binds `name`, itself or in a block it
    holds (a name bound inside `if`, `for`, `try`, ... cannot be read without running)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name == name
    if isinstance(node, ast.Import | ast.ImportFrom):
        return any((a.asname or a.name.split(".")[0]) == name for a in node.names)
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor):
        targets = [node.target]
    elif isinstance(node, ast.With | ast.AsyncWith):
        targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
    else:
        targets = []
    if any(name in _names(t) for t in targets):
        return True
    blocks = [getattr(node, "body", []), getattr(node, "orelse", []), getattr(node, "finalbody", []),
              *(h.body for h in getattr(node, "handlers", []))]
    return any(_binds(s, name) for block in blocks for s in block if isinstance(s, ast.stmt))


STATEMENTS = {ast.FunctionDef: "a def", ast.AsyncFunctionDef: "a def", ast.ClassDef: "a class",
              ast.Import: "an import", ast.ImportFrom: "an import", ast.AugAssign: "an augmented assignment",
              ast.Assign: "an unpacking assignment", ast.If: "an if block", ast.For: "a for loop",
              ast.While: "a while loop", ast.With: "a with block", ast.Try: "a try block"}


def _statement(node: ast.stmt) -> str:
    return STATEMENTS.get(type(node), f"a {type(node).__name__} statement")


def _names(target: ast.expr) -> set[str]:
    """The names an assignment target binds: `X`, `X, Y`, `[X, *Y]` (not `X.a` or `X[0]`)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Tuple | ast.List):
        return set().union(*(_names(t) for t in target.elts))
    if isinstance(target, ast.Starred):
        return _names(target.value)
    return set()


def _simple(node: ast.Assign | ast.AnnAssign, name: str) -> bool:
    """True for `NAME = value` and `NAME: type = value` (not tuple unpacking)."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return node.value is not None and any(isinstance(t, ast.Name) and t.id == name for t in targets)


def _json_equal(value: Any, expected: Any) -> bool:
    """Python literal `value` equals JSON `expected`, as JSON Schema compares values: tuples
    count as lists, 1 equals 1.0, but True is not 1 (`json_equal`). A set, bytes or a complex
    number spell no JSON value and equal nothing."""
    # The constrain package loads numpy; evaluation needs it only for a constant check.
    from ..constrain.json_schema import json_equal

    def as_json(v: Any) -> Any:
        if isinstance(v, tuple | list):
            return [as_json(x) for x in v]
        return {k: as_json(x) for k, x in v.items()} if isinstance(v, dict) else v

    return json_equal(as_json(value), expected)


def _quote(text: str) -> str:
    shown = text if len(text) <= SHOWN else text[:SHOWN] + "..."
    return repr(shown)


def _last_line(output: bytes) -> str:
    """The last line a command printed that is not blank, stripped and cut to SHOWN
    characters, or "(no output)"."""
    lines = [line.strip() for line in decode(output).splitlines() if line.strip()]
    last = lines[-1] if lines else "(no output)"
    return last if len(last) <= SHOWN else last[:SHOWN] + "..."
