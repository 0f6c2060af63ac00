#!/usr/bin/env python3
"""Write the student starter: the repository with the chosen days' solutions removed.

    python scripts/make_starter.py DEST [--days week1-day1,week1-day2]

Every `# BEGIN SOLUTION weekW-dayD` ... `# END SOLUTION` region of the chosen days (all by
default) becomes `raise NotImplementedError("weekW-dayD: implement <function>")` at the
region's indentation. Signatures, docstrings, tests and the book are kept.
"""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import DAYS, ROOT, MarkerError, find_regions, strip_source  # noqa: E402

# Instructor-only tools that make no sense in a student's copy.
INSTRUCTOR_ONLY = {"scripts/make_starter.py", "scripts/check_course.py", ".ci/run"}


def tracked_files(root: Path) -> list[str]:
    """Files git tracks, plus untracked ones it does not ignore."""
    result = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, text=True, check=True,
    )
    return sorted({f for f in result.stdout.splitlines() if (root / f).is_file()})


def parse_days(value: str | None) -> set[str]:
    if not value:
        return set(DAYS)
    days = {d.strip() for d in value.split(",") if d.strip()}
    unknown = sorted(days - set(DAYS))
    if unknown:
        raise ValueError(f"--days: unknown day(s) {', '.join(unknown)} (known: {', '.join(DAYS)})")
    return days


def make_starter(dest: Path, days: set[str], root: Path = ROOT) -> int:
    """Write the starter to `dest`; return the number of regions replaced."""
    files = tracked_files(root)
    # Check every file's markers before writing anything.
    sources = {}
    for f in files:
        if f.endswith(".py") and f.startswith("src/"):
            text = (root / f).read_text()
            sources[f] = (text, find_regions(root / f, text.splitlines(keepends=True)))
    if dest.exists() and any(dest.iterdir()):
        raise ValueError(f"destination {dest} exists and is not empty")
    replaced = 0
    for f in files:
        if f in INSTRUCTOR_ONLY:
            continue
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        if f in sources:
            text, regions = sources[f]
            target.write_text(strip_source(root / f, text, days))
            replaced += sum(r.day in days for r in regions)
        elif f == "README.md":
            target.write_text((root / "scripts" / "starter_README.md").read_text())
        else:
            shutil.copy2(root / f, target)
    return replaced


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("dest", type=Path, help="where to write the starter (new or empty folder)")
    parser.add_argument("--days", default=None, help=f"comma-separated days to strip (default: all of {', '.join(DAYS)})")
    args = parser.parse_args(argv)
    try:
        days = parse_days(args.days)
        n = make_starter(args.dest, days)
    except (ValueError, MarkerError) as e:
        print(f"make_starter: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.dest}: {n} exercise regions removed ({', '.join(sorted(days))})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
