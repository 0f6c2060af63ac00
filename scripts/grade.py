#!/usr/bin/env python3
"""Grade the course: run the instructor's tests of chosen days against a tree's `src/tiny_llm`.

    python scripts/grade.py [--root SUBMISSION] [--days week1-day1,...] [--json results.json]
                            [--points-per-day 10] [--test-timeout 300] [--timeout 1800]

Prints a table (day, passed, total, score). With --json, writes Gradescope's
`results.json` (see scripts/gradescope_results.schema.json). Each day is worth
--points-per-day points, split evenly over its tests.

Only the submission's `src/tiny_llm` is graded: each day runs in a fresh temporary tree
made of this repository's `tests/`, `examples/` and `pyproject.toml` (its pytest settings)
and a copy of the submission's `src/tiny_llm`, so a submission's own tests, conftest or
pytest settings change nothing. The test ids come from this repository's tree, so a
submission that cannot even be imported still gets one failed entry per test.

A test that runs longer than --test-timeout seconds is stopped and failed; so is a test
during which the process dies. The grader then starts pytest again on the tests that have no
result yet (the plugin `scripts/grade_plugin.py` reports each start and each result as it
happens). Importing and collecting get --test-timeout seconds too. --timeout caps the whole
day: tests not run by then fail. The grader always finishes and always writes results.json.
"""

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import DAYS, ROOT, test_file  # noqa: E402

PLUGIN = Path(__file__).resolve().parent / "grade_plugin.py"
# What a grading tree takes from this repository (the submission gives only src/tiny_llm).
INSTRUCTOR_FILES = ("pyproject.toml", "conftest.py", "tests", "examples")
PACKAGE = Path("src") / "tiny_llm"
MAX_OUTPUT = 4000  # characters of failure text kept per test
PROCESS_TAIL = 1500  # characters of a dead process's own output quoted in its message
POLL = 0.05  # seconds between looks at a running test process
DEFAULT_TEST_TIMEOUT = 300.0
DEFAULT_DAY_TIMEOUT = 1800.0


@dataclass(frozen=True)
class Limits:
    test: float  # seconds one test (or importing and collecting) may take
    day: float  # seconds one day may take in all


@dataclass
class Run:
    """What one pytest process reported, and how it ended."""

    collected: list[str] | None = None  # None: collection never finished
    collect_errors: list[str] = field(default_factory=list)
    results: dict[str, tuple[bool, str]] = field(default_factory=dict)
    current: str | None = None  # started, no result yet
    fatal: str = ""
    ended: str = "exit"  # "exit", "test-timeout" (stopped by us) or "day-timeout"
    returncode: int | None = None
    output: str = ""  # the tail of the process's stdout and stderr


def _trim(text: str, limit: int = MAX_OUTPUT) -> str:
    text = text.strip()
    return text if len(text) <= limit else "...\n" + text[-limit:]


def _ignore_junk(folder: str, names: list[str]) -> set[str]:
    return {n for n in names if n in ("__pycache__", ".pytest_cache") or n.endswith(".pyc")}


def make_tree(dest: Path, package: Path | None) -> Path:
    """A grading tree in `dest`: the instructor's INSTRUCTOR_FILES and, when given, a copy of
    the `tiny_llm` package folder `package` as `dest/src/tiny_llm`. Returns `dest/src`."""
    for name in INSTRUCTOR_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=_ignore_junk)
        elif source.is_file():
            shutil.copy2(source, dest / name)
    (dest / "src").mkdir()
    if package is not None:
        shutil.copytree(package, dest / PACKAGE, ignore=_ignore_junk, symlinks=False)
    return dest / "src"


def _status(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def run_pytest(tree: Path, src: Path, files: list[str], limits: Limits, deadline: float, work: Path,
               select: list[str] | None = None, collect_only: bool = False, check_src: bool = True) -> Run:
    """Run pytest in `tree` on `files` with `src` first on the path, watching its events.

    Stops the process when a test has run longer than `limits.test`, when nothing has
    started for that long (importing, collecting, or stuck between tests), or at `deadline`.
    """
    events, log = work / "events.jsonl", work / "output.txt"
    events.unlink(missing_ok=True)
    plugin_dir = work / "plugin"  # a folder of its own: nothing graded can shadow the plugin
    plugin_dir.mkdir(exist_ok=True)
    shutil.copy2(PLUGIN, plugin_dir / "grade_plugin.py")
    # No PYTEST_ADDOPTS, PYTEST_PLUGINS or an outer pytest's variables: only our options apply.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "TINY_LLM_GRADE_")) and k != "PYTHONSTARTUP"}
    env.update(PYTHONPATH=os.pathsep.join([str(plugin_dir), str(src)]), TINY_LLM_GRADE_EVENTS=str(events))
    if select is not None:
        (work / "select.txt").write_text("".join(f"{t}\n" for t in select))
        env["TINY_LLM_GRADE_SELECT"] = str(work / "select.txt")
    if check_src:
        env["TINY_LLM_GRADE_SRC"] = str(src)
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "grade_plugin",
            "--rootdir", str(tree), "-q", "--tb=short"]
    if (tree / "pyproject.toml").is_file():
        args += ["-c", str(tree / "pyproject.toml")]
    if collect_only:
        args.append("--collect-only")
    run = Run()
    with open(log, "wb") as out:
        proc = subprocess.Popen([*args, *files], cwd=tree, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _watch(proc, events, run, limits, deadline)
        finally:
            if proc.poll() is None:
                _kill(proc)
    run.returncode = proc.returncode
    run.output = _process_output(log.read_text(errors="replace"))
    return run


def _process_output(text: str) -> str:
    """What to quote of a test process's output: from a fatal error's report (a segfault's
    stack, where it happened first) when there is one, else the end."""
    fatal = text.rfind("Fatal Python error")
    if fatal >= 0 and len(text) - fatal > PROCESS_TAIL:
        return text[fatal : fatal + PROCESS_TAIL].rstrip() + "\n..."
    return _trim(text, PROCESS_TAIL)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the test process and anything it started
    except ProcessLookupError:
        pass
    proc.wait()


def _watch(proc: subprocess.Popen, events: Path, run: Run, limits: Limits, deadline: float) -> None:
    offset, pending = 0, b""
    since = time.monotonic()  # when the current test started, or the last event with none running
    while True:
        exited = proc.poll() is not None  # read the events after the exit is seen: none are lost
        if events.exists():
            with open(events, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if _apply(run, line):
                    since = time.monotonic()
        if exited:
            return
        now = time.monotonic()
        if now >= deadline:
            run.ended = "day-timeout"
        elif now - since > limits.test:
            run.ended = "test-timeout"
        else:
            time.sleep(POLL)
            continue
        _kill(proc)
        return


def _apply(run: Run, line: bytes) -> bool:
    """Record one event line; True when it was a valid event."""
    try:
        event = json.loads(line.decode("utf-8", "replace"))
        kind = event["event"]
        if kind == "start":
            run.current = str(event["id"])
        elif kind == "result":
            run.results[str(event["id"])] = (bool(event["passed"]), str(event.get("text", "")))
            run.current = None
        elif kind == "collected":
            run.collected = [str(i) for i in event["ids"]]
        elif kind == "collect_error":
            run.collect_errors.append(f"collecting {event['id']} failed:\n{event.get('text', '')}")
        elif kind == "fatal":
            run.fatal = str(event.get("text", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return False  # a line cut short by a dying process
    return True


def _with_output(message: str, run: Run) -> str:
    return f"{message}\n\nThe test process's last output:\n{run.output}" if run.output else message


def grade_tests(package: Path | None, file: str, ids: list[str], limits: Limits, work: Path) -> dict[str, tuple[bool, str]]:
    """Run the tests `ids` of `file` against the `tiny_llm` folder `package`: id -> (passed, text).

    Each pytest process runs the tests that have no result yet. When one is stopped or dies
    during a test, that test fails and a new process takes the rest; when a process made no
    progress at all, the tests left fail with its reason.
    """
    deadline = time.monotonic() + limits.day
    results: dict[str, tuple[bool, str]] = {}
    attempt = 0
    while remaining := [t for t in ids if t not in results]:
        attempt += 1
        if time.monotonic() >= deadline:
            for t in remaining:
                results[t] = (False, f"not run: the day's time limit of {limits.day:g} s (--timeout) was reached first")
            break
        run_dir = work / f"run{attempt}"
        run_dir.mkdir()
        tree = run_dir / "tree"
        tree.mkdir()
        try:
            src = make_tree(tree, package)
        except OSError as e:  # shutil.Error too: a submission whose files cannot be copied
            for t in remaining:
                results[t] = (False, f"cannot copy the submission's {PACKAGE}: {e}")
            break
        run = run_pytest(tree, src, [file], limits, deadline, run_dir, select=remaining)
        shutil.rmtree(tree, ignore_errors=True)
        before = len(results)
        results.update((t, r) for t, r in run.results.items() if t in remaining)
        if run.current in remaining and run.current not in results:
            results[run.current] = (False, _died_during(run, limits))
        if run.collected is not None:
            missing = "\n\n".join(run.collect_errors) or _with_output(
                f"this test was not collected in the graded tree ({_status(run.returncode)})", run)
            for t in remaining:
                if t not in run.collected and t not in results:
                    results[t] = (False, missing)
        if len(results) == before:  # nothing ran: a new process would fare no better
            why = _nothing_ran(run, limits)
            for t in remaining:
                results[t] = (False, why)
            break
    return {t: (passed, _trim(text)) for t, (passed, text) in results.items()}


def _died_during(run: Run, limits: Limits) -> str:
    if run.ended == "test-timeout":
        return f"timed out after {limits.test:g} s (--test-timeout); the grader stopped the test"
    if run.ended == "day-timeout":
        return f"timed out: the day's time limit of {limits.day:g} s (--timeout) was reached during this test"
    return _with_output(f"the test process ended abnormally ({_status(run.returncode)}) during this test", run)


def _nothing_ran(run: Run, limits: Limits) -> str:
    if run.fatal:
        return run.fatal
    if run.collect_errors:
        return "\n\n".join(run.collect_errors)
    if run.ended == "test-timeout":
        return (f"timed out after {limits.test:g} s (--test-timeout) while importing the graded code "
                f"and collecting the tests")
    if run.ended == "day-timeout":
        return f"not run: the day's time limit of {limits.day:g} s (--timeout) was reached first"
    return _with_output(f"the test process ended ({_status(run.returncode)}) before running this test", run)


def instructor_ids(files: list[str], limits: Limits, work: Path) -> dict[str, list[str] | str]:
    """The test ids of each file in this repository's own tree, or why they could not be listed."""
    run_dir = work / "collect"
    run_dir.mkdir()
    tree = run_dir / "tree"
    tree.mkdir()
    make_tree(tree, None)
    present = [f for f in files if (tree / f).is_file()]
    out: dict[str, list[str] | str] = {f: f"{f} does not exist in {ROOT}" for f in files if f not in present}
    if not present:
        return out
    # The instructor's own code: importing and collecting it may take the whole day's time.
    trusted = Limits(test=limits.day, day=limits.day)
    run = run_pytest(tree, ROOT / "src", present, trusted, time.monotonic() + limits.day, run_dir,
                     collect_only=True, check_src=False)
    for f in present:
        ids = [t for t in run.collected or [] if t.split("::", 1)[0] == f]
        errors = [e for e in run.collect_errors if e.startswith(f"collecting {f}")]
        out[f] = ids or "\n\n".join(errors) or _with_output(
            f"no tests were collected ({_status(run.returncode)}, {run.ended})", run)
    return out


def grade_day(root: Path, day: str, ids: list[str] | str, limits: Limits, work: Path) -> list[dict]:
    """One entry per test of `day`: name, passed, output. `ids` are the instructor's test ids
    of the day's file, or the reason they could not be listed."""
    file = test_file(day)
    if isinstance(ids, str):
        return [{"name": f"{day}: {file}", "passed": False,
                 "output": _trim(f"grader error: cannot list the instructor's tests of {file}:\n{ids}")}]
    package = root / PACKAGE
    if not (package / "__init__.py").is_file():
        found = {t: (False, f"the submission has no {PACKAGE / '__init__.py'} (looked in {root})") for t in ids}
    else:
        found = grade_tests(package, file, ids, limits, work)
    return [{"name": f"{day}: {t.split('::', 1)[1]}", "passed": found[t][0], "output": found[t][1]} for t in ids]


def results_json(graded: dict[str, list[dict]], points_per_day: float, seconds: float) -> dict:
    """Gradescope's results.json: per-test score and max_score, and the total."""
    tests = []
    for day, results in graded.items():
        each = points_per_day / len(results)
        for r in results:
            tests.append({
                "name": r["name"],
                "score": round(each if r["passed"] else 0.0, 6),
                "max_score": round(each, 6),
                "status": "passed" if r["passed"] else "failed",
                "output": r["output"] or "passed",
                "visibility": "visible",
            })
    return {
        "score": round(sum(t["score"] for t in tests), 4),
        "execution_time": round(seconds, 1),
        "output": f"graded {len(graded)} day(s): {', '.join(graded)}",
        "visibility": "visible",
        "stdout_visibility": "visible",
        "tests": tests,
    }


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not usage plus error
        self.exit(2, f"grade: error: {message}\n")


def _positive(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number of {'points' if 'points' in name else 'seconds'}, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(description="Grade course days against a submission's src/tiny_llm and print a score table.")
    parser.add_argument("--days", default=None, metavar="DAYS", help=f"comma-separated days (default: all of {', '.join(DAYS)})")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write Gradescope results.json here")
    parser.add_argument("--root", type=Path, default=ROOT, metavar="FOLDER",
                        help="the submission: a folder holding src/tiny_llm (default: this repository)")
    parser.add_argument("--points-per-day", default="10", metavar="POINTS", help="points each day is worth (default 10)")
    parser.add_argument("--test-timeout", default=str(DEFAULT_TEST_TIMEOUT), metavar="SECONDS",
                        help=f"seconds one test may run, and importing plus collecting may take, before it "
                             f"is stopped and failed (default {DEFAULT_TEST_TIMEOUT:g})")
    parser.add_argument("--timeout", default=str(DEFAULT_DAY_TIMEOUT), metavar="SECONDS",
                        help=f"seconds one day may take in all; tests not run by then fail "
                             f"(default {DEFAULT_DAY_TIMEOUT:g})")
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:
        return int(stop.code or 0)
    days = list(DAYS) if not args.days else list(dict.fromkeys(d.strip() for d in args.days.split(",") if d.strip()))
    unknown = [d for d in days if d not in DAYS]
    try:
        if unknown or not days:
            raise ValueError(f"unknown day(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(DAYS)}")
        points = _positive("--points-per-day", args.points_per_day)
        limits = Limits(test=_positive("--test-timeout", args.test_timeout), day=_positive("--timeout", args.timeout))
        if not args.root.is_dir():
            raise ValueError(f"--root {args.root} is not a folder")
        if args.json is not None and not args.json.resolve().parent.is_dir():
            raise ValueError(f"--json {args.json}: folder {args.json.resolve().parent} does not exist")
    except ValueError as e:
        print(f"grade: error: {e}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    graded = {}
    print(f"{'day':12s} {'passed':>7s} {'total':>6s} {'score':>8s}", flush=True)
    with tempfile.TemporaryDirectory(prefix="tiny-llm-grade-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        try:
            all_ids = instructor_ids([test_file(d) for d in days], limits, work)
        except Exception as e:  # noqa: BLE001 - the grader must still write its report
            all_ids = {test_file(d): f"{type(e).__name__}: {e}" for d in days}
        for n, day in enumerate(days):
            day_work = work / f"day{n}"
            day_work.mkdir()
            try:
                results = grade_day(args.root.resolve(), day, all_ids[test_file(day)], limits, day_work)
            except Exception as e:  # noqa: BLE001
                results = [{"name": f"{day}: grading", "passed": False, "output": f"grader error: {type(e).__name__}: {e}"}]
            graded[day] = results
            passed = sum(r["passed"] for r in results)
            print(f"{day:12s} {passed:7d} {len(results):6d} {points * passed / len(results):8.2f}", flush=True)
    report = results_json(graded, points, time.perf_counter() - start)
    print(f"{'total':12s} {'':7s} {'':6s} {report['score']:8.2f} / {points * len(days):.2f}")
    if args.json:
        partial = args.json.with_name(args.json.name + ".partial")
        partial.write_text(json.dumps(report, indent=2))
        partial.replace(args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
