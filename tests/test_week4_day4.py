"""Week 4, day 4: evaluation — tasks as folders, held-out checks, pass@k, and a report in
which only checks count.

The models are scripts: the example tasks' own solutions (every run passes), their wrong
solutions (every run fails, for the reason the report states, whatever the model's summary
claims), and hand-made ones (limits, errors, seeds). The command line runs in-process, and
once end to end in a subprocess."""

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_llm.agent.core import Limits, Proposal
from tiny_llm.agent.evaluate import Task, check, evaluate, format_report, load_tasks, pass_at_k
from tiny_llm.agent.models import ScriptedModel
from tiny_llm.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "agent-tasks"
NAMES = ["add-constant", "fix-off-by-one", "rename-function", "write-greeting"]


def script(task: Task, name: str = "solution.json") -> list:
    return json.loads((task.folder / name).read_text())


def tree_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        h.update(p.relative_to(folder).as_posix().encode() + b"\0")
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return load_tasks(EXAMPLES)


# ---- Task.load ----------------------------------------------------------------------------


def test_the_example_tasks_load(tasks):
    assert [t.name for t in tasks] == NAMES
    fix = tasks[1]
    assert fix.prompt.startswith("inclusive_range in ranges.py leaves out its last number")
    assert fix.limits == Limits(steps=8, tokens=40000, seconds=300)
    assert fix.editable_paths == ["ranges.py"] and fix.allowed_commands == ["python3"]
    assert fix.workspace == EXAMPLES / "fix-off-by-one" / "workspace" and fix.folder == EXAMPLES / "fix-off-by-one"
    assert [c["kind"] for c in fix.checks] == ["command", "command", "file"]
    assert fix.visible_checks == [{"kind": "command", "label": "demo", "argv": ["python3", "demo.py"]}]
    assert tasks[3].visible_checks == []  # optional
    for task in tasks:  # the held-out checks are beside the workspace, never in it
        assert not (task.workspace / "checks.json").exists()
        assert (task.folder / "solution.json").is_file() and (task.folder / "wrong.json").is_file()
    # A folder that is one task loads as one; a folder without any is refused.
    assert [t.name for t in load_tasks(EXAMPLES / "add-constant")] == ["add-constant"]
    with pytest.raises(ValueError, match=r"no task\.json in it or in any folder directly inside it"):
        load_tasks(EXAMPLES / "add-constant" / "workspace")


def make_task(folder: Path, task: dict | str | None = None, checks: list | str | None = None) -> Path:
    """A task folder: task.json, checks.json (text as given, or JSON) and a workspace."""
    (folder / "workspace").mkdir(parents=True)
    (folder / "workspace" / "a.py").write_text("X = 1\n")
    for name, value, default in (("task.json", task, {"prompt": "Set X to 2."}),
                                 ("checks.json", checks, [{"kind": "constant", "path": "a.py", "name": "X", "value": 2}])):
        value = default if value is None else value
        (folder / name).write_text(value if isinstance(value, str) else json.dumps(value))
    return folder


@pytest.mark.parametrize("task, checks, fragment", [
    ("{", None, r"task\.json is not valid JSON \(line 1 column 2"),
    ("[1]", None, r"task\.json must hold a JSON object, got list"),
    ({"prompt": "x", "promt": "y"}, None, r"unknown field 'promt' \(known: allowed_commands, editable_paths, limits"),
    ({"prompt": "  "}, None, r"prompt must be a non-empty string, got '  '"),
    ({}, None, r"prompt must be a non-empty string, got None"),
    ({"prompt": "x", "limits": {"steps": 0}}, None, r"limits\.steps must be a positive integer, got 0"),
    ({"prompt": "x", "limits": {"steps": True}}, None, r"limits\.steps must be a positive integer, got True"),
    ({"prompt": "x", "limits": {"seconds": -1.5}}, None, r"limits\.seconds must be a positive number, got -1\.5"),
    ({"prompt": "x", "limits": {"turns": 3}}, None, r"unknown limit 'turns' \(known: steps, tokens, seconds, repeats\)"),
    ({"prompt": "x", "limits": 5}, None, r"limits must be an object with steps, tokens, seconds, repeats"),
    ({"prompt": "x", "editable_paths": "a.py"}, None, r"editable_paths must be a list of non-empty strings"),
    ({"prompt": "x", "allowed_commands": [""]}, None, r"allowed_commands must be a list of non-empty strings"),
    (None, "", r"checks\.json is not valid JSON"),
    (None, [], r"checks\.json must hold a non-empty list of checks"),
    (None, [{"kind": "files", "path": "a.py"}], r"checks\.json\[0\]: unknown kind 'files' \(known: command, constant, file\)"),
    (None, [{"kind": "file", "path": "a.py"}], r"needs exactly one of 'equals' and 'contains', got \[\]"),
    (None, [{"kind": "file", "path": "a.py", "equals": "", "contains": ""}], r"exactly one of .*got \['equals', 'contains'\]"),
    (None, [{"kind": "file", "path": "a.py", "contains": 3}], r"contains must be a string, got 3"),
    (None, [{"kind": "file", "contains": "x"}], r"a file check needs 'path'"),
    (None, [{"kind": "constant", "path": "a.py", "name": "X-1", "value": 1}], r"name must be a Python identifier"),
    (None, [{"kind": "constant", "path": "a.py", "name": "X"}], r"a constant check needs 'value'"),
    (None, [{"kind": "command", "argv": []}], r"argv must be a non-empty list of non-empty strings, got \[\]"),
    (None, [{"kind": "command", "argv": ["python3"], "exit_status": "0"}], r"exit_status must be an integer"),
    (None, [{"kind": "command", "argv": ["python3"], "timeout": 3}], r"unknown field 'timeout' of a command check"),
    ({"prompt": "x", "visible_checks": [{"kind": "nope"}]}, None, r"task\.json: visible_checks\[0\]: unknown kind 'nope'"),
    ({"prompt": "x", "visible_checks": {}}, None, r"visible_checks must be a list of checks"),
])
def test_task_load_refuses_bad_tasks_with_the_reason(tmp_path, task, checks, fragment):
    folder = make_task(tmp_path / "t", task, checks)
    with pytest.raises(ValueError, match=fragment) as e:
        Task.load(folder)
    assert str(e.value).startswith(f"task {folder}: ") and "\n" not in str(e.value)


def test_task_load_refuses_missing_parts(tmp_path):
    with pytest.raises(ValueError, match=r"task .*/nothing: not a folder"):
        Task.load(tmp_path / "nothing")
    folder = make_task(tmp_path / "t")
    (folder / "checks.json").unlink()
    with pytest.raises(ValueError, match=r"no checks\.json \(the held-out checks\)"):
        Task.load(folder)
    (folder / "task.json").unlink()
    with pytest.raises(ValueError, match=r"no task\.json"):
        Task.load(folder)
    folder = make_task(tmp_path / "u")
    shutil.rmtree(folder / "workspace")
    with pytest.raises(ValueError, match=r"no workspace/ folder"):
        Task.load(folder)
    folder = make_task(tmp_path / "v")
    (folder / "workspace" / "link").symlink_to("/etc/passwd")
    with pytest.raises(ValueError, match=r"workspace/link is a symlink; a starting workspace holds plain files"):
        Task.load(folder)


def test_a_task_gets_the_defaults_it_does_not_set(tmp_path):
    task = Task.load(make_task(tmp_path / "t"))
    assert (task.name, task.prompt, task.limits) == ("t", "Set X to 2.", Limits())
    assert (task.editable_paths, task.allowed_commands, task.visible_checks) == (["**"], [], [])


# ---- check --------------------------------------------------------------------------------


@pytest.fixture
def ws(tmp_path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    (root / "settings.py").write_text(
        '"""Settings."""\nimport os\n\nRETRIES = 3\nNAME: str = "tiny"\nSIZES = (1, 2, [3, 4])\n'
        'FLAGS = {"fast": True}\nRATIO = 0.5\nDEBUG = False\nLATE = 1\nLATE = 2\n\n'
        'def helper():\n    INNER = 7\n    return INNER\n\n'
        'COMPUTED = len("abc")\nCOUNT = 1\nCOUNT += 1\nif os.environ.get("X"):\n    BRANCHED = 1\n'
        'open("executed.txt", "w").write("the module ran")\n'
    )
    (root / "broken.py").write_text("def f(:\n")
    (tmp_path / "secret.txt").write_text("outside")
    (root / "escape.txt").symlink_to(tmp_path / "secret.txt")
    return root


FILE_CHECKS = [
    ({"kind": "file", "path": "notes.txt", "equals": "alpha\nbeta\ngamma\n"}, None),
    ({"kind": "file", "path": "notes.txt", "contains": "beta\ngam"}, None),
    ({"kind": "file", "path": "notes.txt", "contains": "delta"}, "file notes.txt: does not contain 'delta'"),
    ({"kind": "file", "path": "notes.txt", "equals": "alpha\nBETA\ngamma\n"},
     "file notes.txt: differs from the expected text at line 2: 'beta\\n' instead of 'BETA\\n'"),
    ({"kind": "file", "path": "notes.txt", "equals": "alpha\nbeta\n"},
     "file notes.txt: differs from the expected text at line 3: 'gamma\\n' instead of ''"),
    ({"kind": "file", "path": "notes.txt", "equals": "alpha\nbeta\ngamma\ndelta\n", "label": "the notes"},
     "the notes: differs from the expected text at line 4: '' instead of 'delta\\n'"),
    ({"kind": "file", "path": "missing.txt", "contains": "x"}, "file missing.txt: missing"),
    ({"kind": "file", "path": ".", "contains": "x"}, "file .: not a file"),
    ({"kind": "file", "path": "../secret.txt", "contains": "outside"},
     "file ../secret.txt: refused: \"../secret.txt\": '..' is refused; paths stay inside the workspace"),
    ({"kind": "file", "path": "escape.txt", "contains": "outside"},
     "file escape.txt: refused: \"escape.txt\": the symlink \"escape.txt\" leads out of the workspace"),
]

CONSTANT_CHECKS = [
    ({"kind": "constant", "path": "settings.py", "name": "RETRIES", "value": 3}, None),
    ({"kind": "constant", "path": "settings.py", "name": "NAME", "value": "tiny"}, None),  # annotated
    ({"kind": "constant", "path": "settings.py", "name": "SIZES", "value": [1, 2, [3, 4]]}, None),  # tuple = list
    ({"kind": "constant", "path": "settings.py", "name": "FLAGS", "value": {"fast": True}}, None),
    ({"kind": "constant", "path": "settings.py", "name": "LATE", "value": 2}, None),  # the last binding counts
    ({"kind": "constant", "path": "settings.py", "name": "RETRIES", "value": 4},
     "constant RETRIES in settings.py: is 3, expected 4"),
    ({"kind": "constant", "path": "settings.py", "name": "RETRIES", "value": "3"},
     "constant RETRIES in settings.py: is 3, expected '3'"),
    # Values compare as JSON Schema compares them (`json_equal`): 3 is 3.0, at any depth; True is not 1.
    ({"kind": "constant", "path": "settings.py", "name": "RETRIES", "value": 3.0}, None),
    ({"kind": "constant", "path": "settings.py", "name": "SIZES", "value": [1.0, 2, [3, 4.0]]}, None),
    ({"kind": "constant", "path": "settings.py", "name": "FLAGS", "value": {"fast": 1}},
     "constant FLAGS in settings.py: is {'fast': True}, expected {'fast': 1}"),
    ({"kind": "constant", "path": "settings.py", "name": "SIZES", "value": [1, 2, [3]]},
     "constant SIZES in settings.py: is (1, 2, [3, 4]), expected [1, 2, [3]]"),
    ({"kind": "constant", "path": "settings.py", "name": "DEBUG", "value": 0},
     "constant DEBUG in settings.py: is False, expected 0"),
    ({"kind": "constant", "path": "settings.py", "name": "RATIO", "value": 0.25},
     "constant RATIO in settings.py: is 0.5, expected 0.25"),
    ({"kind": "constant", "path": "settings.py", "name": "INNER", "value": 7},
     "constant INNER in settings.py: not defined"),
    ({"kind": "constant", "path": "settings.py", "name": "helper", "value": 1},
     "constant helper in settings.py: bound at line 13 by a def, not a literal assignment"),
    ({"kind": "constant", "path": "settings.py", "name": "os", "value": 1},
     "constant os in settings.py: bound at line 2 by an import, not a literal assignment"),
    ({"kind": "constant", "path": "settings.py", "name": "COUNT", "value": 2},
     "constant COUNT in settings.py: bound at line 19 by an augmented assignment, not a literal assignment"),
    ({"kind": "constant", "path": "settings.py", "name": "BRANCHED", "value": 1},
     "constant BRANCHED in settings.py: bound at line 20 by an if block, not a literal assignment"),
    ({"kind": "constant", "path": "settings.py", "name": "COMPUTED", "value": 3},
     "constant COMPUTED in settings.py: is len('abc') at line 17, not a literal"),
    ({"kind": "constant", "path": "broken.py", "name": "X", "value": 1},
     "constant X in broken.py: broken.py is not valid Python (line 1: invalid syntax)"),
    ({"kind": "constant", "path": "nope.py", "name": "X", "value": 1}, "constant X in nope.py: missing"),
    ({"kind": "constant", "path": "settings.py", "name": "RETRIES", "value": 4, "label": "retries"},
     "retries: is 3, expected 4"),
]

COMMAND_CHECKS = [
    ({"kind": "command", "argv": ["python3", "-c", "pass"]}, None),
    ({"kind": "command", "argv": ["python3", "-c", "raise SystemExit(3)"], "exit_status": 3}, None),
    ({"kind": "command", "argv": ["python3", "-c", "print('one'); print('two'); raise SystemExit(3)"]},
     "command python3 -c print('one'); print('two'); raise SystemExit(3): exit status 3, expected 0: two"),
    ({"kind": "command", "argv": ["python3", "-c", "pass"], "exit_status": 1, "label": "must fail"},
     "must fail: exit status 0, expected 1: (no output)"),
    ({"kind": "command", "argv": ["python3", "-c", "assert open('notes.txt').read().startswith('alpha')"]}, None),
    ({"kind": "command", "label": "no secrets", "argv": [
        "python3", "-c", "import os; extra = sorted(set(os.environ) - {'PATH', 'HOME', 'LANG', 'LC_CTYPE', 'PWD'}); "
                   "print(extra); raise SystemExit(1 if extra else 0)"]},
     None),
    # The reason is read from the command's result, never from its observation's text: a last
    # line that looks like the run tool's closing note is just output.
    ({"kind": "command", "label": "fake note", "argv": [
        "python3", "-c", "print('x'); print('[5 more bytes of output were dropped]'); raise SystemExit(1)"]},
     "fake note: exit status 1, expected 0: [5 more bytes of output were dropped]"),
    ({"kind": "command", "label": "unknown", "argv": ["no-such-command-tiny-llm"]},
     'unknown: did not run: run: "no-such-command-tiny-llm" is allowed but not found on PATH'),
]


@pytest.mark.parametrize("spec, failure", FILE_CHECKS + CONSTANT_CHECKS + COMMAND_CHECKS,
                         ids=lambda v: json.dumps(v)[:60] if isinstance(v, dict) else None)
def test_each_check_passes_or_fails_with_its_message(ws, monkeypatch, spec, failure):
    monkeypatch.setenv("TINY_LLM_TEST_SECRET", "hunter2")  # the command must not see it
    assert check(ws, [spec]) == ([] if failure is None else [failure])


def test_a_constant_is_read_never_run(ws):
    """settings.py would write executed.txt if it ran; reading its constants runs nothing."""
    assert check(ws, [c for c, failure in CONSTANT_CHECKS if failure is None]) == []
    assert not (ws / "executed.txt").exists()


def test_every_failing_check_is_reported_in_order(ws):
    specs = [FILE_CHECKS[2][0], FILE_CHECKS[0][0], CONSTANT_CHECKS[5][0], COMMAND_CHECKS[2][0]]
    assert check(ws, specs) == [FILE_CHECKS[2][1], CONSTANT_CHECKS[5][1], COMMAND_CHECKS[2][1]]


def test_a_command_that_runs_too_long_is_stopped(ws):
    spec = {"kind": "command", "seconds": 1,
            "argv": ["python3", "-c", "print('started', flush=True); import time; time.sleep(60)"]}
    [failure] = check(ws, [spec])
    assert re.fullmatch(r"command .*: timed out after 1 s: killed, exit status -9, expected exit status 0: started",
                        failure), failure


# ---- pass@k -------------------------------------------------------------------------------


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    assert pass_at_k(5, 2, 4) == 1.0  # every 4 of 5 runs hold a passing one
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 11/12
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0 and pass_at_k(1, 1, 1) == 1.0
    # k = 1 is the pass rate; pass@k grows with k.
    for n in range(1, 7):
        for c in range(n + 1):
            values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
            assert values[0] == pytest.approx(c / n)
            assert values == sorted(values)
            # The estimator: the share of the C(n, k) draws of k runs that hold a passing run.
            assert values[-1] == (1.0 if c else 0.0)
            assert values[1 if n > 1 else 0] == pytest.approx(1 - math.comb(n - c, min(2, n)) / math.comb(n, min(2, n)))
    for n, c, k in [(3, 4, 1), (3, 1, 0), (3, 1, 4), (0, 0, 1), (3, -1, 1)]:
        with pytest.raises(ValueError, match=r"pass_at_k needs 0 <= c <= n and 1 <= k <= n"):
            pass_at_k(n, c, k)


# ---- evaluate -----------------------------------------------------------------------------

RUN_FIELDS = ["run", "seed", "passed", "failures", "status", "reason", "summary", "steps", "tokens", "seconds",
              "workspace", "log"]
TASK_FIELDS = ["name", "runs", "passed", "pass_rate", "pass_at_k", "steps", "tokens", "seconds",
               "untouched_passes", "results"]


def test_the_scripted_solutions_pass_every_task(tasks, tmp_path):
    before = {t.name: tree_digest(t.folder) for t in tasks}
    models = []

    def make_model(task, i):
        models.append(ScriptedModel(script(task)))
        return models[-1]

    seen = []
    report = evaluate(tasks, make_model, runs=2, seed=7, out=tmp_path / "eval",
                      on_run=lambda task, result: seen.append((task.name, result["run"])))
    assert list(report) == ["runs", "seed", "pass_rate", "pass_at_k", "tasks"]
    assert (report["runs"], report["seed"], report["pass_rate"], report["pass_at_k"]) == (2, 7, 1.0, {"1": 1.0, "2": 1.0})
    assert seen == [(name, i) for name in NAMES for i in range(2)]
    assert json.loads((tmp_path / "eval" / "report.json").read_text()) == report
    steps = {"add-constant": 4, "fix-off-by-one": 4, "rename-function": 7, "write-greeting": 3}
    for task, entry in zip(tasks, report["tasks"]):
        assert list(entry) == TASK_FIELDS
        assert (entry["name"], entry["runs"], entry["passed"], entry["pass_rate"]) == (task.name, 2, 2, 1.0)
        assert entry["pass_at_k"] == {"1": 1.0, "2": 1.0} and entry["untouched_passes"] is False
        assert entry["steps"] == steps[task.name] and entry["tokens"] > 0
        for i, result in enumerate(entry["results"]):
            assert list(result) == RUN_FIELDS
            assert (result["run"], result["seed"], result["passed"], result["failures"]) == (i, 7 + i, True, [])
            assert (result["status"], result["reason"], result["steps"]) == ("finished", "", steps[task.name])
            assert result["summary"] == script(task)[-1]["args"]["summary"]
            assert result["workspace"] == f"{task.name}/run-{i}/workspace"
            assert result["log"] == f"{task.name}/run-{i}/run.jsonl"
            kinds = [json.loads(line)["kind"] for line in (tmp_path / "eval" / result["log"]).read_text().splitlines()]
            assert kinds[0] == "start" and kinds[-1] == "finish"
            assert check(tmp_path / "eval" / result["workspace"], task.checks) == []
    # The examples are untouched: every run worked on its own copy.
    assert {t.name: tree_digest(t.folder) for t in tasks} == before
    # The model never saw a held-out check, and its workspace never held one.
    for model in models:
        seen_text = json.dumps(model.calls)
        assert "checks.json" not in seen_text
    for task in tasks:
        for spec in task.checks:
            for hidden in [spec.get("label"), *spec.get("argv", [])[2:]]:  # labels, and python3 -c's code
                assert hidden is None or all(hidden not in json.dumps(m.calls) for m in models), hidden
    table = format_report(report)
    assert table.splitlines()[0].split() == ["task", "passed", "pass@1", "pass@2", "steps", "tokens", "seconds"]
    assert table.splitlines()[-1].split() == ["all", "8/8", "1.00", "1.00"]
    assert "failures" not in table


WRONG = {
    "add-constant": ["constant MAX_RETRIES in config.py: is '5', expected 5",
                     "client makes 6 attempts: exit status 1, expected 0: TypeError: unsupported operand type(s) "
                     "for +: 'int' and 'str'"],
    "fix-off-by-one": ["inclusive_range includes both ends: exit status 1, expected 0: AssertionError: [1, 2, 3, 4]"],
    "rename-function": ["main.py runs: exit status 1, expected 0: ImportError: cannot import name 'calc_total' "
                        "from 'shop' ({ws}/shop.py)",
                        "file main.py: does not contain 'from shop import total_price'",
                        "no calc_total is left: exit status 1, expected 0: AssertionError: ['main.py']"],
    "write-greeting": ["greet says hello: exit status 1, expected 0: AssertionError: Hello Ada"],
}


def test_a_wrong_solution_fails_for_the_stated_reason_whatever_it_claims(tasks, tmp_path):
    out = tmp_path / "eval"
    report = evaluate(tasks, lambda task, i: ScriptedModel(script(task, "wrong.json")), runs=1, seed=0, out=out)
    assert report["pass_rate"] == 0.0 and report["pass_at_k"] == {"1": 0.0}
    for task, entry in zip(tasks, report["tasks"]):
        result = entry["results"][0]
        ws = (out / result["workspace"]).resolve()
        assert result["failures"] == [f.format(ws=ws) for f in WRONG[task.name]]
        # The run finished, and its summary says it worked: neither counts.
        assert (result["status"], result["passed"]) == ("finished", False)
        assert result["summary"] == script(task, "wrong.json")[-1]["args"]["summary"]
    table = format_report(report)
    assert "failures:" in table
    assert "  fix-off-by-one run 0: inclusive_range includes both ends: exit status 1, expected 0: AssertionError" in table
    assert table.count("rename-function run 0:") == 1 and "no calc_total is left" in table


def test_limits_and_errors_are_reported_and_only_checks_decide(tasks, tmp_path):
    fix = next(t for t in tasks if t.name == "fix-off-by-one")
    edit, finish = script(fix)[1], script(fix)[-1]
    read = {"tool": "read", "args": {"path": "ranges.py"}}
    limited = Task(**{**fix.__dict__, "limits": Limits(steps=3)})

    def make_model(task, i):
        if i == 0:  # reads until the step limit: the checks fail, and the limit is said
            return ScriptedModel(lambda messages: read)
        if i == 1:  # fixes the file, then reads until the step limit: the checks pass
            return ScriptedModel([edit] + [read] * 5)
        if i == 2:  # the model fails
            return ScriptedModel([])
        raise RuntimeError("no model for this run")  # making the model fails

    report = evaluate([limited], make_model, runs=4, seed=0, out=tmp_path / "eval")
    results = report["tasks"][0]["results"]
    assert [(r["status"], r["passed"]) for r in results] == [("limit", False), ("limit", True), ("error", False),
                                                            ("error", False)]
    assert results[0]["reason"] == "steps limit reached (3 of 3)" and results[0]["steps"] == 3
    assert results[0]["failures"][0].startswith("inclusive_range includes both ends: exit status 1")
    assert results[1]["failures"] == []
    assert results[2]["reason"].startswith("the model failed: IndexError: the script has 0 actions")
    assert results[3]["reason"] == "RuntimeError: no model for this run" and results[3]["steps"] == 0
    entry = report["tasks"][0]
    assert (entry["passed"], entry["pass_rate"]) == (1, 0.25)
    assert entry["pass_at_k"] == pytest.approx({"1": 0.25, "2": 0.5, "3": 0.75, "4": 1.0})
    table = format_report(report)
    assert "fix-off-by-one run 0: inclusive_range includes both ends" in table
    assert "the run ended with limit: steps limit reached (3 of 3)" in table
    assert "fix-off-by-one run 3: inclusive_range includes both ends" in table
    assert "the run ended with error: RuntimeError: no model for this run" in table
    # A model that only says it finished passes nothing.
    claim = ScriptedModel([finish])
    report = evaluate([fix], lambda task, i: claim, runs=1, seed=0, out=tmp_path / "claim")
    assert report["tasks"][0]["results"][0]["status"] == "finished" and report["pass_rate"] == 0.0


class SeedModel:
    """Records the seed of each proposal, then finishes."""

    def __init__(self):
        self.seeds = []

    def propose(self, messages, schema, *, seed=None):
        self.seeds.append(seed)
        action = {"tool": "read", "args": {"path": "README.md"}} if len(self.seeds) < 3 else \
            {"tool": "finish", "args": {"summary": "done"}}
        return Proposal(json.dumps(action), 10, 5)


def test_run_i_runs_with_seed_plus_i_and_its_own_model(tasks, tmp_path):
    greet = next(t for t in tasks if t.name == "write-greeting")
    models = {}

    def make_model(task, i):
        models[i] = SeedModel()
        return models[i]

    report = evaluate([greet], make_model, runs=3, seed=100, out=tmp_path / "eval")
    assert {i: m.seeds for i, m in models.items()} == {0: [100, 101, 102], 1: [101, 102, 103], 2: [102, 103, 104]}
    results = report["tasks"][0]["results"]
    assert [r["seed"] for r in results] == [100, 101, 102]
    assert [(r["steps"], r["tokens"]) for r in results] == [(3, 45)] * 3


def test_evaluate_refuses_bad_arguments_and_never_overwrites(tasks, tmp_path):
    out = tmp_path / "eval"
    evaluate(tasks[:1], lambda task, i: ScriptedModel(script(task)), runs=1, seed=0, out=out)
    first = (out / "report.json").read_text()
    with pytest.raises(ValueError, match=r"exists and is not an empty folder; earlier results are never overwritten"):
        evaluate(tasks[:1], lambda task, i: ScriptedModel(script(task)), runs=1, seed=0, out=out)
    assert (out / "report.json").read_text() == first
    for runs in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"runs must be a positive integer"):
            evaluate(tasks, None, runs=runs, seed=0, out=tmp_path / "x")
    with pytest.raises(ValueError, match=r"distinct names"):
        evaluate(tasks[:1] * 2, None, runs=1, seed=0, out=tmp_path / "x")


def test_a_task_whose_checks_pass_untouched_is_flagged(tmp_path):
    folder = make_task(tmp_path / "t", checks=[{"kind": "constant", "path": "a.py", "name": "X", "value": 1}])
    task = Task.load(folder)
    report = evaluate([task], lambda t, i: ScriptedModel([{"tool": "finish", "args": {"summary": "nothing"}}]),
                      runs=1, seed=0, out=tmp_path / "eval")
    assert report["tasks"][0]["untouched_passes"] is True and report["pass_rate"] == 1.0
    assert "tasks whose checks pass on the untouched workspace (they measure nothing): t" in format_report(report)


# ---- the command line ---------------------------------------------------------------------


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """`tiny-llm` in-process: (exit status, stdout, stderr). A starter whose week 4 day 4 is
    not done says so in one line; that is raised here as the day's own NotImplementedError."""
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    out, err = capsys.readouterr()
    if m := re.search(r"error: (week4-day4) is not implemented yet \((.*?)\);", err):
        raise NotImplementedError(f"{m[1]}: {m[2]}")
    return status, out, err


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model is a test failure: bad input must be refused before."""
    import tiny_llm.cli.agent as agent_cli

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(agent_cli, "load", load)


def task_folder(tmp_path: Path, name: str = "fix-off-by-one") -> Path:
    return Path(shutil.copytree(EXAMPLES / name, tmp_path / "tasks" / name))


@pytest.mark.parametrize("edit, fragment", [
    (lambda f: (f / "task.json").write_text("{"), r"task\.json is not valid JSON"),
    (lambda f: (f / "checks.json").unlink(), r"no checks\.json \(the held-out checks\)"),
    (lambda f: (f / "checks.json").write_text('[{"kind": "exit"}]'), r"checks\.json\[0\]: unknown kind 'exit'"),
    (lambda f: shutil.rmtree(f / "workspace"), r"no workspace/ folder"),
    (lambda f: (f / "task.json").write_text(json.dumps({"prompt": "x", "allowed_commands": ["no-such-tool-x"]})),
     r"task fix-off-by-one: command 'no-such-tool-x': no such command on PATH"),
    (lambda f: (f / "checks.json").write_text('[{"kind": "command", "argv": ["no-such-tool-y"]}]'),
     r"task fix-off-by-one: command 'no-such-tool-y': no such command on PATH"),
    (lambda f: (f / "solution.json").unlink(), r"task fix-off-by-one: --scripted .*solution\.json: no such file"),
    (lambda f: (f / "solution.json").write_text("{}"), r"--scripted .*: expected a non-empty JSON list of actions"),
])
def test_eval_refuses_a_bad_task_in_one_line(tmp_path, capsys, no_model, edit, fragment):
    folder = task_folder(tmp_path)
    edit(folder)
    status, out, err = run_cli(["agent", "eval", str(folder.parent), "--scripted", "--out", str(tmp_path / "o")], capsys)
    assert status == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("tiny-llm: error: ") and re.search(fragment, err), err
    assert not (tmp_path / "o").exists()


def test_eval_reports_each_wrong_solutions_failure_from_the_command_line(tmp_path, capsys):
    """Another file of each task folder: the wrong solutions, each failure with its reason
    (the right ones, through the same command, are the end-to-end test's)."""
    status, stdout, err = run_cli(["agent", "eval", str(EXAMPLES), "--scripted", "wrong.json",
                                   "--out", str(tmp_path / "w")], capsys)
    assert status == 0 and "failures:" in stdout
    assert next(line for line in stdout.splitlines() if line.startswith("all")).split() == ["all", "0/4", "0.00"]
    assert "  write-greeting run 0: greet says hello: exit status 1, expected 0: AssertionError: Hello Ada" in stdout


def test_tiny_llm_agent_eval_end_to_end(tmp_path):
    """The command of the book, as a student runs it (a subprocess, from the repository): the
    scripted solutions pass every task, in the table, the progress lines and the report."""
    out = tmp_path / "o"
    argv = [sys.executable, "-m", "tiny_llm", "agent", "eval", "examples/agent-tasks", "--scripted",
            "--runs", "2", "--seed", "0", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    if m := re.search(r"error: (week4-day4) is not implemented yet \((.*?)\);", run.stderr):
        raise NotImplementedError(f"{m[1]}: {m[2]}")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split() == ["task", "passed", "pass@1", "pass@2", "steps", "tokens", "seconds"]
    assert [line.split()[:4] for line in lines[1:5]] == [[n, "2/2", "1.00", "1.00"] for n in NAMES]
    assert lines[5].split() == ["all", "8/8", "1.00", "1.00"]
    assert lines[6].startswith(f"report: {out / 'report.json'} (")
    assert "fix-off-by-one run 1: passed (4 steps," in run.stderr
    report = json.loads((out / "report.json").read_text())
    assert (report["runs"], report["seed"], report["pass_rate"]) == (2, 0, 1.0)
    assert [t["pass_at_k"] for t in report["tasks"]] == [{"1": 1.0, "2": 1.0}] * 4
