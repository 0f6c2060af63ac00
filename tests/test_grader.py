"""Course mechanics: the grader runs the instructor's tests against a submission's code only,
stops hanging tests, survives crashing ones, and always writes a valid results.json."""

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import grade  # noqa: E402
from grade import main as grade_main  # noqa: E402
from make_starter import main as starter_main  # noqa: E402

SCHEMA = json.loads((ROOT / "scripts" / "gradescope_results.schema.json").read_text())
DAY1 = "week1-day1"
STUB = "NotImplementedError: week1-day1: implement"
# A guard against a grader that never returns, far above what a run takes; not a speed check.
NEVER = 300


def solution_copy(tmp_path: Path) -> Path:
    """A submission made of this repository's complete src/tiny_llm and nothing else."""
    sub = tmp_path / "submission"
    shutil.copytree(ROOT / "src" / "tiny_llm", sub / "src" / "tiny_llm",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return sub


def starter(tmp_path: Path, days: str = DAY1) -> Path:
    """A student starter with `days` stubbed, as make_starter writes it."""
    sub = tmp_path / "starter"
    assert starter_main([str(sub), "--days", days]) == 0
    return sub


def graded(tmp_path: Path, sub: Path | None, days: str, *options: str) -> dict:
    """Grade `sub` (None: this repository) in-process; the report, checked against the schema."""
    out = tmp_path / "results.json"
    root = [] if sub is None else ["--root", str(sub)]
    assert grade_main([*root, "--days", days, "--json", str(out), *options]) == 0
    report = json.loads(out.read_text())
    jsonschema.validate(report, SCHEMA)
    return report


def graded_cli(tmp_path: Path, sub: Path, days: str, *options: str) -> dict:
    """Grade `sub` through the command line, in a process of its own."""
    out = tmp_path / "results.json"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "grade.py"), "--root", str(sub), "--days", days,
                          "--json", str(out), *options], capture_output=True, text=True, timeout=NEVER)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    jsonschema.validate(report, SCHEMA)
    return report


def entries_of(report: dict, day: str) -> dict[str, dict]:
    return {t["name"]: t for t in report["tests"] if t["name"].startswith(f"{day}: ")}


@pytest.fixture(scope="module")
def full_marks_and_table(tmp_path_factory) -> tuple[dict, str]:
    """This repository's own day 1, graded: its report and the table printed."""
    with contextlib.redirect_stdout(io.StringIO()) as table:
        report = graded(tmp_path_factory.mktemp("full"), None, DAY1)
    return report, table.getvalue()


@pytest.fixture(scope="module")
def full_marks(full_marks_and_table) -> dict:
    """The reference for the names and number of day 1's entries."""
    return full_marks_and_table[0]


def test_grading_this_repository_gives_full_marks_and_valid_json(full_marks_and_table):
    """One entry per instructor test, each passed; the scores add up to the day's points."""
    full_marks, table = full_marks_and_table
    day = entries_of(full_marks, DAY1)
    assert table.splitlines()[1].split() == [DAY1, str(len(day)), str(len(day)), "10.00"]
    assert "10.00 / 10.00" in table
    assert len(day) == len(full_marks["tests"]) > 50  # one entry per test, not one per file
    assert all(t["status"] == "passed" and t["output"] == "passed" for t in day.values())
    assert full_marks["score"] == pytest.approx(10.0)
    assert sum(t["max_score"] for t in day.values()) == pytest.approx(10.0, abs=1e-4)
    assert f"{DAY1}: test_softmax_exact_small_distribution" in day


def test_a_submissions_own_tests_are_not_run(tmp_path, full_marks):
    """Test files replaced by `assert True` change nothing: the instructor's tests run against
    the submission's stubbed day, so every test fails with the stub's own message (which only
    the submission's code holds: the installed tiny_llm did not stand in for it)."""
    sub = starter(tmp_path)
    for test in (sub / "tests").glob("test_*.py"):
        test.write_text("def test_x():\n    assert True\n")
    report = graded(tmp_path, sub, DAY1)
    day = entries_of(report, DAY1)
    assert day.keys() == entries_of(full_marks, DAY1).keys()
    assert report["score"] == 0
    assert all(t["status"] == "failed" and t["score"] == 0 for t in day.values())
    assert sum(STUB in t["output"] for t in day.values()) > len(day) // 2


SKIP_ALL = """\
import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.skip(reason="skipped by the submission"))


def pytest_runtest_setup(item):
    pytest.skip("skipped by the submission")
"""


def test_a_submissions_conftest_settings_and_startup_files_are_ignored(tmp_path, full_marks):
    """Conftests that skip everything (at the root, in tests/, in src/ and in the package),
    pytest settings that deselect everything and a sitecustomize: none of them is used."""
    sub = starter(tmp_path)
    marker = tmp_path / "sitecustomize-ran"
    for conftest in ("conftest.py", "tests/conftest.py", "src/conftest.py", "src/tiny_llm/conftest.py"):
        (sub / conftest).write_text(SKIP_ALL)
    (sub / "pytest.ini").write_text("[pytest]\naddopts = -k nothing_is_called_this -p no:grade_plugin\n")
    with open(sub / "pyproject.toml", "a") as f:
        f.write('\n[tool.pytest]\naddopts = "--collect-only"\n')
    (sub / "src" / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    report = graded(tmp_path, sub, DAY1)
    day = entries_of(report, DAY1)
    assert day.keys() == entries_of(full_marks, DAY1).keys()
    assert report["score"] == 0
    assert not any("skipped" in t["output"] for t in day.values())
    assert sum(STUB in t["output"] for t in day.values()) > len(day) // 2
    assert not marker.exists()


def test_a_hang_while_importing_fails_every_test_with_a_timeout(tmp_path, full_marks):
    """tiny_llm.basics sleeps forever at import: the grader stops it after --test-timeout and
    still reports one failed entry per instructor test."""
    sub = solution_copy(tmp_path)
    basics = sub / "src" / "tiny_llm" / "basics.py"
    basics.write_text("import time\ntime.sleep(10**6)\n" + basics.read_text())
    report = graded_cli(tmp_path, sub, DAY1, "--test-timeout", "5", "--timeout", "60")
    day = entries_of(report, DAY1)
    assert day.keys() == entries_of(full_marks, DAY1).keys()
    assert report["score"] == 0
    for t in day.values():
        assert t["output"].startswith("timed out after 5 s (--test-timeout) while importing"), t


def test_a_crash_while_importing_fails_every_test_with_a_message(tmp_path, full_marks):
    sub = solution_copy(tmp_path)
    basics = sub / "src" / "tiny_llm" / "basics.py"
    basics.write_text("import os\nos._exit(3)\n" + basics.read_text())
    report = graded(tmp_path, sub, DAY1, "--test-timeout", "60")
    day = entries_of(report, DAY1)
    assert day.keys() == entries_of(full_marks, DAY1).keys()
    assert report["score"] == 0
    for t in day.values():
        assert t["output"].startswith("the test process ended (exit status 3) before running this test"), t


# Wraps the solution's softmax: one input hangs, one kills the process, one gives a wrong answer.
SABOTAGE = """

_softmax = softmax


def softmax(x, axis=-1):
    if x.shape == (4, 1, 9) and axis == 0 and x.dtype == mx.float32:
        while True:
            pass
    if x.shape == (7,) and x.dtype == mx.float16:
        import os
        os._exit(3)
    if x.shape == (3, 5) and axis == 0 and x.dtype == mx.float32:
        return mx.zeros_like(x)
    return _softmax(x, axis)
"""


def test_a_hanging_and_a_crashing_test_fail_alone(tmp_path, full_marks):
    """The test that hangs times out, the one that kills the process fails with its exit
    status, and every other test of the day keeps its real result: a genuine failure stays a
    failure with its assertion, the rest pass."""
    sub = solution_copy(tmp_path)
    basics = sub / "src" / "tiny_llm" / "basics.py"
    basics.write_text(basics.read_text() + SABOTAGE)
    report = graded_cli(tmp_path, sub, DAY1, "--test-timeout", "5", "--timeout", "120")
    day = entries_of(report, DAY1)
    assert day.keys() == entries_of(full_marks, DAY1).keys()
    failed = {name: t["output"] for name, t in day.items() if t["status"] == "failed"}
    hung = [n for n, out in failed.items() if out == "timed out after 5 s (--test-timeout); the grader stopped the test"]
    died = [n for n, out in failed.items()
            if out.startswith("the test process ended abnormally (exit status 3) during this test")]
    wrong = [n for n, out in failed.items() if "Not equal to tolerance" in out]
    assert len(hung) == len(died) == len(wrong) == 1, failed
    assert all(n.startswith(f"{DAY1}: test_softmax_matches_mlx[") for n in hung + died + wrong)
    assert len(failed) == 3
    each = 10 / len(day)
    assert report["score"] == pytest.approx(each * (len(day) - 3), abs=1e-3)


def test_the_day_time_limit_fails_the_tests_it_leaves(tmp_path, full_marks):
    """--timeout caps a whole day: the test running at the limit and every test after it fail."""
    sub = solution_copy(tmp_path)
    basics = sub / "src" / "tiny_llm" / "basics.py"
    basics.write_text(basics.read_text() + "\n\ndef softmax(x, axis=-1):\n    while True:\n        pass\n")
    report = graded_cli(tmp_path, sub, DAY1, "--test-timeout", "60", "--timeout", "6")
    day = entries_of(report, DAY1)
    assert day.keys() == entries_of(full_marks, DAY1).keys()
    outputs = [t["output"] for t in day.values() if t["status"] == "failed"]
    during = [o for o in outputs if o == "timed out: the day's time limit of 6 s (--timeout) was reached during this test"]
    after = [o for o in outputs if o == "not run: the day's time limit of 6 s (--timeout) was reached first"]
    assert len(during) == 1
    assert len(during) + len(after) == len(outputs) > len(day) // 2


def test_a_syntax_error_in_the_graded_code_fails_the_day_with_the_error(tmp_path, full_marks):
    sub = starter(tmp_path)
    (sub / "src" / "tiny_llm" / "basics.py").write_text("def softmax(:\n")
    report = graded(tmp_path, sub, DAY1)
    day = entries_of(report, DAY1)
    assert day.keys() == entries_of(full_marks, DAY1).keys()
    assert report["score"] == 0
    assert all("SyntaxError" in t["output"] and "basics.py" in t["output"] for t in day.values())


@pytest.mark.parametrize("module", ["kv_cache.py", "fused.py"])
def test_a_syntax_error_in_a_week2_module_leaves_week1_whole(tmp_path, module):
    """Week 1 imports no week 2 module: a broken one costs week 1 nothing."""
    sub = solution_copy(tmp_path)
    (sub / "src" / "tiny_llm" / module).write_text("def broken(:\n")
    report = graded(tmp_path, sub, "week1-day1,week1-day2")
    assert report["score"] == pytest.approx(20.0)
    assert entries_of(report, "week1-day1") and entries_of(report, "week1-day2")


def test_a_submission_without_tiny_llm_scores_zero(tmp_path, full_marks):
    """No src/tiny_llm/__init__.py: every test fails at once; the installed package is not used."""
    sub = tmp_path / "empty"
    (sub / "src" / "tiny_llm").mkdir(parents=True)
    report = graded(tmp_path, sub, DAY1)
    day = entries_of(report, DAY1)
    assert day.keys() == entries_of(full_marks, DAY1).keys()
    assert report["score"] == 0
    assert all("the submission has no src/tiny_llm/__init__.py" in t["output"] for t in day.values())


def test_the_installed_tiny_llm_cannot_stand_in_for_the_graded_one(tmp_path):
    """Graded code that Python would not import (a package folder without __init__.py loses to
    the editable install of this repository) stops the run before any test: the plugin checks
    where tiny_llm comes from."""
    package = solution_copy(tmp_path) / "src" / "tiny_llm"
    (package / "__init__.py").unlink()
    file = "tests/test_week1_day2.py"
    limits = grade.Limits(test=60, day=120)
    for folder in ("ids", "work"):
        (tmp_path / folder).mkdir()
    ids = grade.instructor_ids([file], limits, tmp_path / "ids")[file]
    assert isinstance(ids, list) and len(ids) > 10
    results = grade.grade_tests(package, file, ids, limits, tmp_path / "work")
    assert results.keys() == set(ids)
    for passed, text in results.values():
        assert not passed
        assert text.startswith(f"tiny_llm would be imported from {ROOT / 'src' / 'tiny_llm' / '__init__.py'}, "
                               f"not from the graded"), text


@pytest.mark.parametrize("options, message", [
    (["--days", "week5-day1"], "grade: error: unknown day(s) week5-day1; known: week1-day1,"),
    (["--days", ","], "grade: error: unknown day(s) (none given)"),
    (["--points-per-day", "0"], "grade: error: --points-per-day must be a positive number of points, got '0'"),
    (["--points-per-day", "ten"], "grade: error: --points-per-day must be a positive number of points, got 'ten'"),
    (["--test-timeout", "-1"], "grade: error: --test-timeout must be a positive number of seconds, got '-1'"),
    (["--timeout", "nan"], "grade: error: --timeout must be a positive number of seconds, got 'nan'"),
    (["--root", "/no/such/folder"], "grade: error: --root /no/such/folder is not a folder"),
    (["--frobnicate"], "grade: error: unrecognized arguments: --frobnicate"),
])
def test_bad_options_are_one_line_errors(tmp_path, capsys, options, message):
    out = tmp_path / "results.json"
    assert grade_main([*options, "--json", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(message) and captured.err.count("\n") == 1, captured.err
    assert captured.out == "" and not out.exists()
