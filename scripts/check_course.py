#!/usr/bin/env python3
"""Prove that every day's tests bite: without a day's solution its tests fail, while the
tests of the days that do not build on it still pass.

    python scripts/check_course.py [--days week1-day3,...]

For each day it writes a starter with only that day removed, runs pytest there, and prints
a table. Exit status 1 if any test passes without its day's solution, or if an unrelated
day's test fails.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import DAYS, depends_on, test_file  # noqa: E402
from make_starter import make_starter, parse_days  # noqa: E402


def run_pytest(tree: Path, files: list[str], report: Path) -> dict[str, Counter]:
    """Run `files` inside `tree` (its own `src` first on the path); outcomes per file."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *files],
        cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
    )
    return outcomes(report)


def outcomes(report: Path) -> dict[str, Counter]:
    """Per test file: how many tests passed, failed (or errored) and were skipped; the names
    of passing tests are kept under the key "passed:" + name."""
    results: dict[str, Counter] = {}
    if not report.exists():
        return results
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        path = "/".join(module[: module.index(next(m for m in module if m.startswith("test_"))) + 1]) + ".py"
        kinds = {child.tag for child in case}
        outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        results.setdefault(path, Counter())[outcome] += 1
        if outcome == "passed":
            results[path]["passed:" + case.get("name", "?")] += 1
    return results


def check_day(day: str, workdir: Path) -> tuple[bool, list[str]]:
    """Strip `day`, run its tests and the independent days' tests; report rows and success."""
    tree = workdir / day
    make_starter(tree, {day})
    independent = [d for d in DAYS if d != day and not depends_on(d, day)]
    files = [test_file(day)] + [test_file(d) for d in independent]
    results = run_pytest(tree, files, workdir / f"{day}.xml")
    ok, rows = True, []
    own = results.get(test_file(day), Counter())
    total = own["passed"] + own["failed"] + own["skipped"]
    bite = own["failed"] / total if total else 0.0
    if total == 0 or own["failed"] != total:
        ok = False
    rows.append(f"{day:12s} {test_file(day):28s} {total:5d} tests  bite {bite:6.1%}"
                + ("" if own["failed"] == total and total else f"   <-- {own['passed']} pass without the solution"))
    rows += [f"{'':12s}   passes without it: {k[len('passed:'):]}" for k in own if k.startswith("passed:")]
    for d in independent:
        res = results.get(test_file(d), Counter())
        n = res["passed"] + res["failed"] + res["skipped"]
        good = n > 0 and res["passed"] == n
        ok &= good
        rows.append(f"{'':12s} {test_file(d):28s} {n:5d} tests  still pass: "
                    + ("yes" if good else f"NO ({res['failed']} failed, {res['skipped']} skipped)"))
    return ok, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check that every day's tests fail without its solution.")
    parser.add_argument("--days", default=None, help="comma-separated days (default: all)")
    args = parser.parse_args(argv)
    try:
        days = parse_days(args.days)
    except ValueError as e:
        print(f"check_course: error: {e}", file=sys.stderr)
        return 2
    all_ok = True
    print(f"{'day stripped':12s} {'test file':28s} {'':5s}")
    with tempfile.TemporaryDirectory(prefix="tiny-llm-check-") as tmp:
        for day in [d for d in DAYS if d in days]:
            ok, rows = check_day(day, Path(tmp))
            all_ok &= ok
            print("\n".join(rows), flush=True)
    print("every day's tests bite" if all_ok else "FAILED: see the rows marked above")
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
