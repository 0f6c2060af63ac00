#!/usr/bin/env python3
"""Grade the course: run each day's tests against the code in a tree and score them.

    python scripts/grade.py [--days week1-day1,...] [--json results.json] [--root DIR]

Prints a table (day, passed, total, score). With --json, writes Gradescope's
`results.json` (see scripts/gradescope_results.schema.json). Each day is worth
--points-per-day points, split evenly over its tests. A crash, a hang or a syntax error in
the graded code fails the affected tests; the grader itself always finishes.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import DAYS, ROOT, test_file  # noqa: E402

MAX_OUTPUT = 4000  # characters of failure text kept per test


def _pytest(root: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess | None:
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    try:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
            cwd=root, env=env, capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None


def collect(root: Path, file: str, timeout: float) -> tuple[list[str], str]:
    """Test ids in `file`, or ([], why) when collection fails."""
    run = _pytest(root, ["--collect-only", "-q", file], timeout)
    if run is None:
        return [], f"collecting {file} took longer than {timeout:.0f} s"
    ids = [line.split("::", 1)[1] for line in run.stdout.splitlines() if line.startswith(file + "::")]
    if run.returncode != 0 or not ids:
        return [], (run.stdout + run.stderr)[-MAX_OUTPUT:]
    return ids, ""


def grade_day(root: Path, day: str, timeout: float) -> list[dict]:
    """One entry per test: name, passed, output."""
    file = test_file(day)
    if not (root / file).is_file():
        return [{"name": f"{day}: {file}", "passed": False, "output": f"{file} does not exist"}]
    ids, why = collect(root, file, timeout)
    if not ids:
        return [{"name": f"{day}: collecting {file}", "passed": False, "output": why}]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        run = _pytest(root, ["-q", f"--junitxml={report}", file], timeout)
        found = _junit(report) if report.exists() else {}
    if run is None:
        crash = f"the tests took longer than {timeout:.0f} s and were stopped"
    else:
        crash = f"the test process ended abnormally (exit status {run.returncode}) during this test"
        # The process died part-way: run each test without a result on its own, so one
        # crashing test does not take the others down with it.
        for test_id in [t for t in ids if t not in found]:
            with tempfile.TemporaryDirectory() as tmp:
                report = Path(tmp) / "report.xml"
                _pytest(root, ["-q", f"--junitxml={report}", f"{file}::{test_id}"], timeout)
                found.update(_junit(report) if report.exists() else {})
    results = []
    for test_id in ids:
        passed, output = found.get(test_id, (False, crash))
        results.append({"name": f"{day}: {test_id}", "passed": passed, "output": output})
    return results


def _junit(report: Path) -> dict[str, tuple[bool, str]]:
    out = {}
    try:
        root = ET.parse(report).getroot()
    except ET.ParseError:
        return out
    for case in root.iter("testcase"):
        problems = [c for c in case if c.tag in ("failure", "error", "skipped")]
        text = "\n".join((c.get("message") or "") + "\n" + (c.text or "") for c in problems)
        out[case.get("name", "")] = (not problems, text.strip()[-MAX_OUTPUT:])
    return out


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Grade course days and print a score table.")
    parser.add_argument("--days", default=None, help=f"comma-separated days (default: all of {', '.join(DAYS)})")
    parser.add_argument("--json", type=Path, default=None, help="write Gradescope results.json here")
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree to grade (default: this repository)")
    parser.add_argument("--points-per-day", type=float, default=10.0, help="points each day is worth (default 10)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per day (default 1800)")
    args = parser.parse_args(argv)
    days = list(DAYS) if not args.days else [d.strip() for d in args.days.split(",") if d.strip()]
    unknown = [d for d in days if d not in DAYS]
    if unknown or not days:
        print(f"grade: error: unknown day(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(DAYS)}", file=sys.stderr)
        return 2
    if args.points_per_day <= 0:
        print(f"grade: error: --points-per-day must be positive, got {args.points_per_day}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    graded = {}
    print(f"{'day':12s} {'passed':>7s} {'total':>6s} {'score':>8s}")
    for day in days:
        results = grade_day(args.root.resolve(), day, args.timeout)
        graded[day] = results
        passed = sum(r["passed"] for r in results)
        score = args.points_per_day * passed / len(results)
        print(f"{day:12s} {passed:7d} {len(results):6d} {score:8.2f}", flush=True)
    report = results_json(graded, args.points_per_day, time.perf_counter() - start)
    print(f"{'total':12s} {'':7s} {'':6s} {report['score']:8.2f} / {args.points_per_day * len(days):.2f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
