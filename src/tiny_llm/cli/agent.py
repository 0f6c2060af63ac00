"""Engine — `tiny-llm agent run`, `undo` and `eval`: a coding agent acting on a workspace, its
steps undone, and its evaluation on task folders with held-out checks (week 4).

    tiny-llm agent run --workspace DIR --allow-command python3 "Fix the off-by-one in ranges.py"
    tiny-llm agent run --workspace DIR --resume LOG [--steer "Run the demo first."]
    tiny-llm agent undo LOG --workspace DIR [--to-step N]
    tiny-llm agent eval examples/agent-tasks --scripted --runs 2 --seed 0

The model is the in-process engine (`--model`, the default model by default), an
OpenAI-compatible endpoint (`--base-url`), or a script of actions (`--scripted`). Commands
run in the operating system's sandbox (bubblewrap, Seatbelt), or are refused where there is
none unless `--unsandboxed-commands` is given. Every argument is checked before a model
loads; bad input is one line and exit status 2.

Tests: tests/test_agent_cli.py, tests/test_week4_day4.py
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ..defaults import TEMPERATURE
from .common import UserError, load, user_text
from .options import add_model_options

SCRIPT_FILE = "solution.json"  # a task folder's scripted solution, for `eval --scripted`


def add_parser(commands) -> argparse.ArgumentParser:
    from ..agent.core import Limits

    limits = Limits()  # the defaults' one home
    agent = commands.add_parser("agent", help="a coding agent: run it on a workspace, or evaluate it on tasks")
    actions = agent.add_subparsers(dest="agent_command", metavar="ACTION", required=True)

    run = actions.add_parser("run", help="run the agent on a workspace (or resume a run from its log)")
    run.add_argument("task", nargs="?", default=None, help="what to do (a resumed run takes it from its log)")
    run.add_argument("--workspace", required=True, metavar="DIR", help="the folder the agent works in")
    run.add_argument("--allow-command", action="append", default=[], metavar="C",
                     help="a command the agent may run (argv[0], e.g. python3); repeat for more (default: none)")
    run.add_argument("--editable", action="append", default=None, metavar="GLOB",
                     help="a path pattern the agent may edit or write; repeat for more (default: every path)")
    run.add_argument("--max-steps", dest="limit_steps", type=int, default=limits.steps,
                     help=f"the most actions the run takes (default {limits.steps})")
    run.add_argument("--max-tokens", dest="limit_tokens", type=int, default=limits.tokens,
                     help=f"the most tokens the run uses, prompt and completion, all steps (default {limits.tokens})")
    run.add_argument("--seconds", dest="limit_seconds", type=float, default=limits.seconds,
                     help=f"the most wall-clock seconds the run takes (default {limits.seconds:g})")
    run.add_argument("--max-repeats", dest="limit_repeats", type=int, default=limits.repeats,
                     help=f"end the run when the model proposes an action refused each time this many times in a "
                          f"row (default {limits.repeats})")
    run.add_argument("--log", default=None, metavar="PATH",
                     help="the run log to write (JSON lines; default: a new file in the temporary folder); "
                          "it must not exist yet")
    run.add_argument("--resume", default=None, metavar="LOG",
                     help="continue the run of this log (appending to it) instead of starting one")
    run.add_argument("--steer", default=None, metavar="TEXT",
                     help="with --resume: an operator's message the model reads before its next step")
    run.add_argument("--seed", type=int, default=None, help="the run's seed (step i samples with seed + i)")
    run.add_argument("--scripted", default=None, metavar="FILE",
                     help="a scripted model instead of a real one: a JSON list of actions "
                          '({"tool": ..., "args": {...}}), proposed in order')
    run.add_argument("--unsandboxed-commands", action="store_true",
                     help="where no sandbox can be made (bubblewrap on Linux, Seatbelt on macOS), run commands "
                          "without one instead of refusing them; each command's observation says so")
    run.add_argument("--verbose", action="store_true", help="print the sandbox and limits commands run under")
    for flag, (what, default) in _command_limit_flags().items():
        run.add_argument(flag, type=int, default=default, metavar="N", help=f"{what} (default {default})")
    _add_model_choice(run)

    undo = actions.add_parser("undo", help="put a workspace back as it was before a step of a run (logged)")
    undo.add_argument("log", metavar="LOG", help="the run's log")
    undo.add_argument("--workspace", required=True, metavar="DIR", help="the folder the run worked in")
    undo.add_argument("--to-step", type=int, default=0, metavar="N",
                      help="undo steps N and later (default 0: everything the run did)")

    ev = actions.add_parser("eval", help="run the agent on task folders and check each run with held-out checks")
    ev.add_argument("tasks", metavar="TASKS", help="a task folder, or a folder of task folders")
    ev.add_argument("--runs", type=int, default=1, help="runs per task (default 1); pass@k for k = 1 .. runs")
    ev.add_argument("--seed", type=int, default=0, help="run i of a task runs with seed + i (default 0)")
    ev.add_argument("--out", default=None, metavar="DIR",
                    help="where each run's workspace and log and report.json go: a new or empty folder "
                         "(default: a new folder in the temporary folder)")
    ev.add_argument("--scripted", nargs="?", const=SCRIPT_FILE, default=None, metavar="FILE",
                    help=f"a scripted model per task: the JSON list of actions in FILE of each task folder "
                         f"(default {SCRIPT_FILE})")
    _add_model_choice(ev)
    return agent


def _add_model_choice(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser, generation=False)
    parser.add_argument("--base-url", default=None, metavar="URL",
                        help="an OpenAI-compatible endpoint (e.g. http://127.0.0.1:8080/v1 of `tiny-llm serve`) "
                             "instead of the in-process engine; --model then names the served model")
    parser.add_argument("--api-key", default=None, metavar="KEY", help="with --base-url: the endpoint's API key")
    parser.add_argument("--temp", dest="temperature", type=float, default=TEMPERATURE,
                        help=f"sampling temperature of the model's actions (default {TEMPERATURE:g}: greedy; "
                             "step i of a run samples with the run's seed + i)")


def run(args: argparse.Namespace) -> int:
    return {"run": run_agent_command, "eval": eval_command, "undo": undo_command}[args.agent_command](args)


# ---- tiny-llm agent run ------------------------------------------------------------------


def run_agent_command(args: argparse.Namespace) -> int:
    from ..agent.core import Limits
    from ..agent.loop import RunLog, run_agent

    workspace_root = _folder(args.workspace, "--workspace")
    for command in args.allow_command:
        _command_exists(command, "--allow-command")
    for flag, value in (("--max-steps", args.limit_steps), ("--max-tokens", args.limit_tokens),
                        ("--seconds", args.limit_seconds)):
        if not value > 0:
            raise UserError(f"{flag} must be positive, got {value:g}")
    limits = Limits(args.limit_steps, args.limit_tokens, args.limit_seconds,
                    _positive(args.limit_repeats, "--max-repeats"))
    if args.resume is not None:
        if args.task is not None:
            raise UserError("a resumed run takes its task from its log: drop the task text, or drop --resume")
        if args.log is not None:
            raise UserError("--resume LOG appends to LOG: drop --log")
        log_path = Path(args.resume)
        if not log_path.is_file():
            raise UserError(f"--resume {log_path}: no such run log")
        try:
            contents = RunLog.load(log_path)
        except ValueError as e:
            raise UserError(str(e)) from None
        events = contents.events
        if not events:
            raise UserError(f"--resume {log_path}: the run log is empty; start a new run instead")
        if args.steer is not None:
            _nonempty(user_text(args.steer, "--steer"), "--steer")
            if any(e.kind == "finish" for e in events):
                raise UserError(f"--resume {log_path}: the run has finished; only a paused run can be steered")
    else:
        if args.steer is not None:
            raise UserError("--steer needs --resume LOG: a steer is added to a paused run")
        if args.task is None:
            raise UserError('the task is missing: pass what to do as text, e.g. tiny-llm agent run --workspace DIR '
                            '"Fix the off-by-one in ranges.py"')
        task = _nonempty(user_text(args.task, "the task"), "the task")
        log_path = Path(args.log) if args.log else Path(tempfile.mkdtemp(prefix="tiny-llm-run-")) / "run.jsonl"
        if log_path.exists() and (not log_path.is_file() or log_path.stat().st_size):  # an empty one holds no run
            raise UserError(f"--log {log_path} exists; a run log is never rewritten: resume it with --resume "
                            f"{log_path}, or pass another --log")
    script = _script(Path(args.scripted), "--scripted") if args.scripted else None
    workspace = _workspace(workspace_root, args, log_path)
    proposed = sum(e.kind == "proposal" for e in events) if args.resume is not None else 0
    model = _model(args, scripted=script, start=proposed)  # a resumed script goes on where the log stops
    print(f"log: {log_path}", file=sys.stderr)
    if args.verbose:
        print(workspace.describe_sandbox(), file=sys.stderr)
    if args.resume is not None:
        from ..agent.session import resume, steer

        if contents.notice:
            print(contents.notice, file=sys.stderr)
        if args.steer is not None:
            steer(log_path, args.steer)
        outcome = resume(log_path, model, workspace, limits, seed=args.seed)
    else:
        outcome = run_agent(task, model, workspace, limits, RunLog(log_path), seed=args.seed, on_step=_show_step)
    said = outcome.summary if outcome.status == "finished" else outcome.reason
    print(f"{outcome.status}: {said}" if said else outcome.status)
    print(f"{outcome.steps} steps, {outcome.tokens} tokens, {outcome.seconds:.1f} s; log: {log_path}", file=sys.stderr)
    return 0 if outcome.status == "finished" else 1


def _show_step(step: int, messages: list[dict]) -> None:
    """Progress on standard error: the action of each step and the first line of what it saw."""
    action = next((m["content"] for m in reversed(messages) if m["role"] == "assistant"), "")
    seen = messages[-1]["content"] if messages and messages[-1]["role"] == "user" else ""
    first = seen.strip().splitlines()[0] if seen.strip() else ""
    print(f"step {step}: {_cut(action, 160)}\n    {_cut(first, 160)}", file=sys.stderr, flush=True)


def _workspace(root: Path, args: argparse.Namespace, log_path: Path):
    from ..agent.workspace import Workspace

    seconds, limits = _command_limits(args)
    try:
        return Workspace(root, editable_paths=tuple(args.editable or ("**",)),
                         allowed_commands=tuple(args.allow_command),
                         blob_dir=_blob_dir(log_path), command_seconds=seconds, command_limits=limits,
                         unsandboxed=args.unsandboxed_commands)
    except ValueError as e:
        raise UserError(f"--workspace {root}: {e}") from None


def _command_limit_flags() -> dict[str, tuple[str, int]]:
    """The flags of the limits every command runs under, with their help and defaults."""
    from ..agent.sandbox import CommandLimits
    from ..agent.workspace import Workspace

    limits = CommandLimits()
    seconds = int(Workspace.__init__.__kwdefaults__["command_seconds"])
    return {"--command-seconds": ("wall-clock seconds a command may run", seconds),
            "--command-cpu-seconds": ("CPU seconds a command may use", limits.cpu_seconds),
            "--command-memory-mb": ("MiB of memory (address space) a command may use", limits.memory_bytes >> 20),
            "--command-processes": ("processes and threads a command may run at once", limits.processes),
            "--command-file-mb": ("MiB a command may write to one file", limits.file_bytes >> 20),
            "--command-open-files": ("files a command may hold open at once", limits.open_files)}


def _command_limits(args: argparse.Namespace):
    """The workspace's command limits from the flags; one line for a value that is not positive."""
    from ..agent.sandbox import CommandLimits

    for flag in _command_limit_flags():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value < 1:
            raise UserError(f"{flag} must be a positive integer, got {value}")
    return args.command_seconds, CommandLimits(
        cpu_seconds=args.command_cpu_seconds, memory_bytes=args.command_memory_mb << 20,
        processes=args.command_processes, file_bytes=args.command_file_mb << 20, open_files=args.command_open_files)


def _blob_dir(log_path: Path) -> Path:
    """Where a run keeps whole outputs and the files its effects changed: beside its log."""
    return log_path.parent / f"{log_path.stem}-blobs"


# ---- tiny-llm agent undo -----------------------------------------------------------------


def undo_command(args: argparse.Namespace) -> int:
    from ..agent.loop import RunLog
    from ..agent.session import undo
    from ..agent.boundary import PolicyError
    from ..agent.core import ToolError
    from ..agent.workspace import Workspace

    root = _folder(args.workspace, "--workspace")
    log_path = Path(args.log)
    if not log_path.is_file():
        raise UserError(f"{log_path}: no such run log")
    try:
        RunLog.read(log_path)  # a log that cannot be read is one line, before anything is touched
        workspace = Workspace(root, blob_dir=_blob_dir(log_path))
        written, removed = undo(log_path, workspace, args.to_step)
    except ValueError as e:  # PolicyError and ToolError too: a path or a blob that cannot be restored
        kind = "" if type(e) in (ValueError, PolicyError, ToolError) else f"{type(e).__name__}: "
        raise UserError(f"{kind}{e}".replace("to_step:", "--to-step:")) from None
    print(f"undid step {args.to_step} and later of {log_path}: {_count(len(written), 'file')} restored, "
          f"{len(removed)} removed" + "".join(f"\n  restored {p}" for p in written)
          + "".join(f"\n  removed {p}" for p in removed))
    return 0


# ---- tiny-llm agent eval -----------------------------------------------------------------


def eval_command(args: argparse.Namespace) -> int:
    from ..agent.evaluate import REPORT_FILE, evaluate, format_report, load_tasks

    if args.runs < 1:
        raise UserError(f"--runs must be a positive integer, got {args.runs}")
    try:
        tasks = load_tasks(Path(args.tasks))
    except ValueError as e:
        raise UserError(str(e)) from None
    for task in tasks:
        commands = {*task.allowed_commands, *(c["argv"][0] for c in task.checks + task.visible_checks
                                              if c["kind"] == "command")}
        for command in sorted(commands):
            _command_exists(command, f"task {task.name}: command")
    scripts = {t.name: _script(t.folder / args.scripted, f"task {t.name}: --scripted") for t in tasks} \
        if args.scripted else None
    out = Path(args.out) if args.out is not None else None
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} exists and is not an empty folder; earlier results are never overwritten")
    if scripts is not None:
        from ..agent.models import ScriptedModel

        _no_model_flags(args)

        def make_model(task, i):
            return ScriptedModel(list(scripts[task.name]))
    else:
        model = _model(args, scripted=None)  # one model for every run: the engine keeps its prefix cache

        def make_model(task, i):
            return model
    out = out if out is not None else Path(tempfile.mkdtemp(prefix="tiny-llm-eval-"))
    print(f"evaluating {len(tasks)} task{'s' * (len(tasks) != 1)}, {args.runs} run{'s' * (args.runs != 1)} each; "
          f"runs and logs in {out}", file=sys.stderr)
    started = time.perf_counter()
    report = evaluate(tasks, make_model, runs=args.runs, seed=args.seed, out=out, on_run=_show_run)
    print(format_report(report))
    print(f"report: {out / REPORT_FILE} ({time.perf_counter() - started:.1f} s)")
    return 0


def _show_run(task, result: dict) -> None:
    from ..agent.evaluate import why_failed

    verdict = "passed" if result["passed"] else f"failed: {why_failed(result)[0]}"
    print(f"{task.name} run {result['run']}: {verdict} ({result['steps']} steps, {result['tokens']} tokens, "
          f"{result['seconds']:.1f} s)", file=sys.stderr, flush=True)


# ---- shared -------------------------------------------------------------------------------


def _model(args: argparse.Namespace, *, scripted: list | None, start: int = 0):
    """The model of the flags: a script (from its item `start`), an OpenAI-compatible
    endpoint, or the in-process engine (loaded last, once every other argument has been
    checked)."""
    from ..agent.models import EndpointModel, EngineModel, ScriptedModel

    if scripted is not None:
        _no_model_flags(args)
        return ScriptedModel(scripted, start=start)
    if args.base_url is not None:
        if not args.base_url.startswith(("http://", "https://")):
            raise UserError(f"--base-url must be an http:// or https:// URL, got {args.base_url!r}")
        try:
            return EndpointModel(args.base_url, model=args.model, temperature=args.temperature,
                                 **({"api_key": args.api_key} if args.api_key else {}))
        except ValueError as e:
            raise UserError(str(e)) from None
    if args.api_key is not None:
        raise UserError("--api-key goes with --base-url")
    if not args.temperature >= 0:
        raise UserError(f"--temp must be >= 0, got {args.temperature:g}")
    model, tokenizer = load(args)
    return EngineModel(model, tokenizer, temperature=args.temperature)


def _no_model_flags(args: argparse.Namespace) -> None:
    if args.base_url or args.api_key or args.model != "default":
        raise UserError("--scripted replaces the model: drop --model, --base-url and --api-key")


def _script(path: Path, flag: str) -> list:
    """The actions of a scripted solution: a JSON list of objects."""
    if not path.is_file():
        raise UserError(f"{flag} {path}: no such file")
    try:
        actions = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{flag} {path}: not a JSON file ({e})") from None
    if not isinstance(actions, list) or not actions or not all(isinstance(a, dict) for a in actions):
        raise UserError(f"{flag} {path}: expected a non-empty JSON list of actions "
                        '({"tool": ..., "args": {...}})')
    return actions


def _folder(path: str, flag: str) -> Path:
    folder = Path(path)
    if not folder.exists():
        raise UserError(f"{flag} {folder}: no such folder")
    if not folder.is_dir():
        raise UserError(f"{flag} {folder}: not a folder")
    return folder


def _command_exists(command: str, what: str) -> None:
    """A command the workspace's `run` may start: a name (not a path) found on PATH, where
    `run` looks (this interpreter's folder first)."""
    if "/" in command:
        raise UserError(f"{what} {command!r}: give a command name, not a path")
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", os.defpath)])
    if shutil.which(command, path=path) is None:
        raise UserError(f"{what} {command!r}: no such command on PATH")


def _positive(value: int, flag: str) -> int:
    if not value > 0:
        raise UserError(f"{flag} must be positive, got {value}")
    return value


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _nonempty(text: str, what: str) -> str:
    if not text.strip():
        raise UserError(f"{what} is empty")
    return text


def _cut(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."
