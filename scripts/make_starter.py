#!/usr/bin/env python3
"""Write the student starter: the repository with the chosen days' solutions removed.

    python scripts/make_starter.py DEST [--days week1-day1,week1-day2]

Every `# BEGIN SOLUTION weekW-dayD` ... `# END SOLUTION` region of the chosen days (all by
default) becomes `raise NotImplementedError("weekW-dayD: implement <function>")` at the
region's indentation. Signatures, docstrings, tests and the book are kept.

What ships is `SHIPPED` less `INSTRUCTOR_ONLY`. In a git checkout only tracked files ship
(untracked ones are named on standard error); in a tree without `.git` (a ZIP download)
every file under the shipped paths does. Instructor-only blocks of the Makefile, between
`# BEGIN INSTRUCTOR ONLY` and `# END INSTRUCTOR ONLY`, are left out.
"""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import DAYS, ROOT, MarkerError, find_regions, has_regions, strip_source  # noqa: E402

# Files and folders a starter is made of.
SHIPPED = ("pyproject.toml", "Makefile", ".gitignore", "README.md", "src/tiny_llm", "tests", "book",
           "examples", "scripts")
# Tools and tests of tools that only an instructor has (the starter README replaces README.md).
INSTRUCTOR_ONLY = {
    "scripts/make_starter.py", "scripts/check_course.py", "scripts/starter_README.md",
    "tests/test_course_tools.py", "tests/test_grader.py",
}
# Never shipped, whatever the tree holds: build and cache left-overs.
JUNK = ("__pycache__", ".pytest_cache", ".hypothesis", ".egg-info", ".pyc", ".DS_Store")
INSTRUCTOR_BLOCK = ("# BEGIN INSTRUCTOR ONLY", "# END INSTRUCTOR ONLY")


def shipped_files(root: Path) -> tuple[list[str], list[str]]:
    """(files that ship, untracked files left out), as paths relative to `root`."""
    candidates = set()
    for top in SHIPPED:
        path = root / top
        if path.is_file():
            candidates.add(top)
        elif path.is_dir():
            candidates.update(p.relative_to(root).as_posix() for p in path.rglob("*") if p.is_file())
    candidates = {f for f in candidates if f not in INSTRUCTOR_ONLY and not any(j in f for j in JUNK)}
    tracked = _git_files(root)
    if tracked is None:
        return sorted(candidates), []
    return sorted(candidates & tracked), sorted(candidates - tracked - _git_ignored(root, candidates - tracked))


def _git_files(root: Path) -> set[str] | None:
    """The files git tracks under `root`, or None when `root` is not a git checkout."""
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    run = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True)
    if run.returncode != 0:
        return None
    return {f for f in run.stdout.split("\0") if f}


def _git_ignored(root: Path, files: set[str]) -> set[str]:
    if not files:
        return set()
    run = subprocess.run(["git", "check-ignore", "-z", "--stdin"], cwd=root, input="\0".join(sorted(files)),
                         capture_output=True, text=True)
    return {f for f in run.stdout.split("\0") if f}


def strip_instructor_blocks(path: str, text: str) -> str:
    """`text` without its `# BEGIN INSTRUCTOR ONLY` ... `# END INSTRUCTOR ONLY` blocks."""
    out, inside = [], None
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        if line.strip() == INSTRUCTOR_BLOCK[0]:
            if inside is not None:
                raise MarkerError(f"{path}:{number}: {INSTRUCTOR_BLOCK[0]} inside the block opened at line {inside}")
            inside = number
        elif line.strip() == INSTRUCTOR_BLOCK[1]:
            if inside is None:
                raise MarkerError(f"{path}:{number}: {INSTRUCTOR_BLOCK[1]} without a {INSTRUCTOR_BLOCK[0]}")
            inside = None
        elif inside is None:
            out.append(line)
    if inside is not None:
        raise MarkerError(f"{path}:{inside}: {INSTRUCTOR_BLOCK[0]} is never closed")
    return "".join(out)


def parse_days(value: str | None) -> set[str]:
    if not value:
        return set(DAYS)
    days = {d.strip() for d in value.split(",") if d.strip()}
    unknown = sorted(days - set(DAYS))
    if unknown:
        raise ValueError(f"--days: unknown day(s) {', '.join(unknown)} (known: {', '.join(DAYS)})")
    return days


def make_starter(dest: Path, days: set[str], root: Path = ROOT, quiet: bool = False) -> int:
    """Write the starter to `dest`; return the number of regions replaced. Untracked files
    that are left out are named on standard error unless `quiet`."""
    files, untracked = shipped_files(root)
    # Check every file's markers before writing anything.
    texts: dict[str, str] = {}
    replaced = 0
    for f in files:
        if has_regions(f):
            text = (root / f).read_text()
            replaced += sum(r.day in days for r in find_regions(Path(f), text.splitlines(keepends=True)))
            texts[f] = strip_source(Path(f), text, days)
        elif f == "Makefile":
            texts[f] = strip_instructor_blocks(f, (root / f).read_text())
        elif f == "README.md":
            texts[f] = (root / "scripts" / "starter_README.md").read_text()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ValueError(f"destination {dest} exists and is not an empty folder")
    for f in files:
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        if f in texts:
            target.write_text(texts[f])
        else:
            shutil.copy2(root / f, target)
    if untracked and not quiet:
        print(f"make_starter: not shipped, because git does not track them: {', '.join(untracked)}",
              file=sys.stderr)
    return replaced


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("dest", type=Path, help="where to write the starter (new or empty folder)")
    parser.add_argument("--days", default=None, help=f"comma-separated days to strip (default: all of {', '.join(DAYS)})")
    args = parser.parse_args(argv)
    try:
        days = parse_days(args.days)
        n = make_starter(args.dest, days)
    except (ValueError, MarkerError, OSError) as e:
        print(f"make_starter: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.dest}: {n} exercise regions removed ({', '.join(sorted(days))})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
