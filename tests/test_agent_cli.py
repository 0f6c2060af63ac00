"""`tiny-llm agent run` and `tiny-llm agent eval` on the command line: bad input is one line
and exit status 2, before any model loads; a scripted run writes its log, a resumed run
appends to it, and a log is never rewritten.

Needs week 4 days 1–3 (the loop, the workspace, sessions) and day 4 (evaluation)."""

import json
import re
import shutil
from pathlib import Path

import pytest

from tiny_llm.agent.loop import RunLog
from tiny_llm.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "agent-tasks"
FIX = EXAMPLES / "fix-off-by-one"
TASK = "Fix inclusive_range in ranges.py."


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


def assert_one_line_error(status: int, out: str, err: str, fragment: str) -> None:
    assert status == 2 and out == "", (status, out, err)
    assert len(err.splitlines()) == 1 and err.startswith("tiny-llm: error: "), err
    assert re.search(fragment, err), err


@pytest.fixture(autouse=True)
def no_model(monkeypatch):
    """Loading a model is a test failure here: these runs are scripted, and bad input must be
    refused before a model would load."""
    import tiny_llm.cli.agent as agent_cli

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(agent_cli, "load", load)


@pytest.fixture
def ws(tmp_path) -> Path:
    return Path(shutil.copytree(FIX / "workspace", tmp_path / "ws"))


def scripted(tmp_path: Path, actions: list[dict], name: str = "script.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(actions))
    return str(path)


def corrupt_log(tmp_path: Path) -> str:
    path = tmp_path / "corrupt.jsonl"
    path.write_text('{"kind": "start", "step": 0, "task": "x", "messages": []}\n{"kind": "proposal", "step": \n')
    return str(path)


@pytest.mark.parametrize("argv, fragment", [
    (["agent"], r"the following arguments are required: ACTION"),
    (["agent", "walk"], r"invalid choice: 'walk'"),
    (["agent", "run", TASK], r"the following arguments are required: --workspace"),
    (["agent", "run", "--workspace", "{tmp}/missing", TASK], r"--workspace .*/missing: no such folder"),
    (["agent", "run", "--workspace", "{ws}/ranges.py", TASK], r"--workspace .*/ranges\.py: not a folder"),
    (["agent", "run", "--workspace", "{ws}", "--allow-command", "no-such-command-tiny", TASK],
     r"--allow-command 'no-such-command-tiny': no such command on PATH"),
    (["agent", "run", "--workspace", "{ws}", "--allow-command", "/bin/sh", TASK],
     r"--allow-command '/bin/sh': give a command name, not a path"),
    (["agent", "run", "--workspace", "{ws}", "--max-steps", "0", TASK], r"--max-steps must be positive, got 0"),
    (["agent", "run", "--workspace", "{ws}", "--seconds", "-1", TASK], r"--seconds must be positive, got -1"),
    (["agent", "run", "--workspace", "{ws}", "--max-repeats", "0", TASK], r"--max-repeats must be positive, got 0"),
    (["agent", "run", "--workspace", "{ws}"], r"the task is missing: pass what to do as text"),
    (["agent", "run", "--workspace", "{ws}", "  "], r"the task is empty"),
    (["agent", "run", "--workspace", "{ws}", "--steer", "go", TASK], r"--steer needs --resume LOG"),
    (["agent", "run", "--workspace", "{ws}", "--resume", "{tmp}/none.jsonl"], r"--resume .*none\.jsonl: no such run log"),
    (["agent", "run", "--workspace", "{ws}", "--resume", "{corrupt}"], r"run log .*corrupt\.jsonl:2: not JSON"),
    (["agent", "run", "--workspace", "{ws}", "--resume", "{corrupt}", TASK], r"a resumed run takes its task from its log"),
    (["agent", "run", "--workspace", "{ws}", "--log", "{corrupt}", TASK],
     r"--log .*corrupt\.jsonl exists; a run log is never rewritten: resume it with --resume"),
    (["agent", "run", "--workspace", "{ws}", "--scripted", "{tmp}/none.json", TASK], r"--scripted .*none\.json: no such file"),
    (["agent", "run", "--workspace", "{ws}", "--scripted", "{ws}/ranges.py", TASK], r"--scripted .*: not a JSON file"),
    (["agent", "run", "--workspace", "{ws}", "--base-url", "localhost:8080", TASK],
     r"--base-url must be an http:// or https:// URL, got 'localhost:8080'"),
    (["agent", "run", "--workspace", "{ws}", "--api-key", "k", TASK], r"--api-key goes with --base-url"),
    (["agent", "run", "--workspace", "{ws}", "--temp", "-1", TASK], r"--temp must be >= 0, got -1"),
    (["agent", "run", "--workspace", "{ws}", "--scripted", "{script}", "--model", "x", TASK],
     r"--scripted replaces the model: drop --model, --base-url and --api-key"),
    (["agent", "eval", str(EXAMPLES), "--scripted", "--base-url", "http://127.0.0.1:1/v1"],
     r"--scripted replaces the model"),
    (["agent", "eval", "{tmp}/missing"], r"tasks .*/missing: no such folder"),
    (["agent", "eval", "{ws}"], r"tasks .*/ws: no task\.json in it or in any folder directly inside it"),
    (["agent", "eval", str(EXAMPLES), "--runs", "0"], r"--runs must be a positive integer, got 0"),
    (["agent", "eval", str(EXAMPLES), "--scripted", "--out", "{ws}"],
     r"--out .*/ws exists and is not an empty folder; earlier results are never overwritten"),
])
def test_bad_input_is_one_line_and_exit_status_2(tmp_path, ws, capsys, argv, fragment):
    names = {"tmp": tmp_path, "ws": ws, "corrupt": corrupt_log(tmp_path) if "{corrupt}" in argv else "",
             "script": str(FIX / "solution.json")}
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    status, out, err = run_cli([a.format(**names) for a in argv], capsys)
    assert_one_line_error(status, out, err, fragment)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # nothing written


def test_a_scripted_run_fixes_the_workspace_and_logs_every_event(tmp_path, ws, capsys):
    log = tmp_path / "runs" / "fix.jsonl"
    solution = str(FIX / "solution.json")
    argv = ["agent", "run", "--workspace", str(ws), "--allow-command", "python3", "--editable", "ranges.py",
            "--scripted", solution, "--log", str(log), "--seed", "5", TASK]
    status, out, err = run_cli(argv, capsys)
    assert status == 0, err
    assert out == "finished: inclusive_range now includes stop: range(start, stop + 1).\n"
    assert err.splitlines()[0] == f"log: {log}"
    assert "step 1: " in err and "[exit status 0]" not in err.splitlines()[0]
    assert "return list(range(start, stop + 1))" in (ws / "ranges.py").read_text()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["kind"] for e in events] == ["start", "proposal", "intent", "observation", "proposal", "intent",
                                           "observation", "proposal", "intent", "observation", "proposal", "finish"]
    assert events[0]["task"] == TASK and events[0]["seed"] == 5
    # The same --log again: refused, and the log is unchanged.
    text = log.read_text()
    status, out, err = run_cli(argv, capsys)
    assert_one_line_error(status, out, err, r"exists; a run log is never rewritten")
    assert log.read_text() == text
    # A finished run cannot be steered.
    status, out, err = run_cli(["agent", "run", "--workspace", str(ws), "--resume", str(log), "--steer", "more"], capsys)
    assert_one_line_error(status, out, err, r"the run has finished; only a paused run can be steered")


def test_a_run_stopped_by_a_limit_resumes_with_a_steer_and_appends(tmp_path, ws, capsys):
    log, script = tmp_path / "run.jsonl", str(FIX / "solution.json")
    common = ["agent", "run", "--workspace", str(ws), "--allow-command", "python3"]
    status, out, err = run_cli([*common, "--scripted", script, "--log", str(log), "--max-steps", "1", TASK], capsys)
    assert status == 1 and out == "limit: steps limit reached (1 of 1)\n"
    text = log.read_text()
    # The same script: the resumed run goes on with its second action, the first being in the log.
    status, out, err = run_cli([*common, "--scripted", script, "--resume", str(log), "--steer", "Now edit it."], capsys)
    assert status == 0 and out.startswith("finished: "), err
    assert log.read_text().startswith(text)  # appended, never rewritten
    events = [json.loads(line) for line in log.read_text().splitlines()]
    steer = next(e for e in events if e["kind"] == "steer")
    assert steer["text"] == "Now edit it." and events[-1]["kind"] == "finish"
    assert "stop + 1" in (ws / "ranges.py").read_text()


def test_a_command_outside_the_allow_list_is_refused_to_the_model_not_run(tmp_path, ws, capsys):
    script = scripted(tmp_path, [{"tool": "run", "args": {"command": ["python3", "demo.py"]}},
                                 {"tool": "finish", "args": {"summary": "tried"}}])
    status, out, err = run_cli(["agent", "run", "--workspace", str(ws), "--scripted", script,
                                "--log", str(tmp_path / "r.jsonl"), TASK], capsys)
    assert status == 0 and out == "finished: tried\n"
    observation = next(json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()
                       if json.loads(line)["kind"] == "observation")
    assert observation["ok"] is False and "is not an allowed command (allowed: none)" in observation["text"]


def proposals(log: Path) -> list[dict]:
    return [json.loads(e.data["text"]) for e in RunLog.read(log) if e.kind == "proposal"]


def test_a_resumed_scripted_run_goes_on_after_the_last_proposal_in_its_log(tmp_path, ws, capsys):
    """The script is not started over: each of its actions is proposed once across the two
    parts of the run, and the edit is made once."""
    log, solution = tmp_path / "run.jsonl", FIX / "solution.json"
    common = ["agent", "run", "--workspace", str(ws), "--allow-command", "python3", "--scripted", str(solution)]
    status, out, err = run_cli([*common, "--log", str(log), "--max-steps", "2", TASK], capsys)
    assert status == 1 and out == "limit: steps limit reached (2 of 2)\n", err
    status, out, err = run_cli([*common, "--resume", str(log)], capsys)
    assert status == 0 and out == "finished: inclusive_range now includes stop: range(start, stop + 1).\n", err
    assert proposals(log) == json.loads(solution.read_text())
    assert all(e.data["ok"] for e in RunLog.read(log) if e.kind == "observation")
    assert "range(start, stop + 1))" in (ws / "ranges.py").read_text()


def test_a_log_with_a_torn_last_line_resumes_with_a_one_line_notice(tmp_path, ws, capsys):
    """A crash in the middle of writing the last line leaves part of it: the resumed run says
    so on standard error, keeps every byte, and leaves a log that reads back."""
    log, solution = tmp_path / "run.jsonl", FIX / "solution.json"
    common = ["agent", "run", "--workspace", str(ws), "--allow-command", "python3", "--scripted", str(solution)]
    status, out, err = run_cli([*common, "--log", str(log), "--max-steps", "2", TASK], capsys)
    assert status == 1, err
    lines = log.read_bytes().splitlines(keepends=True)
    assert json.loads(lines[-1])["kind"] == "limit" and json.loads(lines[-2])["kind"] == "observation"
    torn = b"".join(lines[:-2]) + lines[-2][:30]  # the edit's observation, cut mid-write
    log.write_bytes(torn)
    status, out, err = run_cli([*common, "--resume", str(log)], capsys)
    assert status == 0 and out.startswith("finished: "), err
    notice = f"run log {log}:{len(lines) - 1}: a torn last line (a crash mid-write) was set aside"
    assert err.splitlines()[:2] == [f"log: {log}", notice]
    assert log.read_bytes().startswith(torn)
    contents = RunLog.load(log)
    assert contents.torn is None and contents.notice is None
    assert [(e.kind, e.data["line"]) for e in contents.events if e.kind == "torn"] == [("torn", len(lines) - 1)]
    # The edit was settled from the workspace, not made twice; the script went on after it.
    assert proposals(log) == json.loads(solution.read_text())
    assert "range(start, stop + 1))" in (ws / "ranges.py").read_text()
    settled = [e for e in contents.events if e.kind == "observation" and e.step == 1]
    assert len(settled) == 1 and settled[0].data["text"].startswith("done before the run stopped")


def test_max_repeats_ends_a_run_that_repeats_a_refused_action(tmp_path, ws, capsys):
    stuck = {"tool": "read", "args": {"path": "nope.py"}}
    script = scripted(tmp_path, [stuck] * 5 + [{"tool": "finish", "args": {"summary": "never"}}])
    status, out, err = run_cli(["agent", "run", "--workspace", str(ws), "--scripted", script, "--max-repeats", "2",
                                "--log", str(tmp_path / "r.jsonl"), TASK], capsys)
    assert status == 1, err
    assert out == 'limit: the same refused action was proposed 2 times in a row: ["read", {"path": "nope.py"}]\n'
