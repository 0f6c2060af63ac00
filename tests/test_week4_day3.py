"""Week 4, day 3: sessions — the log is the checkpoint: replay, resume after a kill with every
effect applied exactly once, compaction from receipts, steering, and the prefix cache
across steps.

A run is killed for real: a subprocess runs a scripted agent over a real `Workspace` and
sends itself SIGKILL at a chosen instant (after a proposal, between an intent and its effect,
between an effect and its receipt, between two steps). The parent resumes from the log."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tiny_llm.agent.core import Event, Limits, Receipt
from tiny_llm.agent.loop import RunLog, run_agent
from tiny_llm.agent.models import EngineModel, ScriptedModel, count_tokens
from tiny_llm.agent.session import compact, compactor, replay, resume, steer
from tiny_llm.agent.workspace import Workspace

from conftest import tiny_model

APPEND = "open('ran.txt', 'a').write('ran\\n')"
SCRIPT = [  # one action per step: each effect's repetition would show in the files or receipts
    {"tool": "edit", "args": {"path": "a.py", "old": "x = 1", "new": "x = 2"}},
    {"tool": "write", "args": {"path": "b.txt", "content": "hello\n"}},
    {"tool": "run", "args": {"command": ["python", "-c", APPEND]}},
    {"tool": "edit", "args": {"path": "a.py", "old": "x = 2", "new": "x = 3"}},
    {"tool": "finish", "args": {"summary": "x is 3"}},
]


def by_turn(messages):
    """The script's next action: one per assistant message so far (a function of the
    conversation, so a resumed run picks up where the killed one stopped)."""
    return SCRIPT[sum(m["role"] == "assistant" for m in messages)]


def workspace(root: Path) -> Workspace:
    return Workspace(root, allowed_commands=["python"], blob_dir=root.parent / "blobs")


def start_files(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir(parents=True)
    (root / "a.py").write_text("x = 1\n")
    return root


# The killed run: a RunLog that sends SIGKILL to its own process around one event.
KILLED = textwrap.dedent("""
    import json, os, signal, sys
    from pathlib import Path
    from tiny_llm.agent.core import Limits
    from tiny_llm.agent.loop import RunLog, run_agent
    from tiny_llm.agent.models import ScriptedModel
    from tiny_llm.agent.workspace import Workspace

    root, log, when, step, script = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), \\
        json.loads(sys.argv[5])

    class Killed(RunLog):
        def append(self, event):
            if when == "after-effect" and (event.kind, event.step) == ("observation", step):
                os.kill(os.getpid(), signal.SIGKILL)  # the effect is done, its receipt not logged
            super().append(event)
            if (when, event.kind, event.step) in {("after-proposal", "proposal", step),
                                                  ("before-effect", "intent", step),
                                                  ("between-steps", "observation", step)}:
                os.kill(os.getpid(), signal.SIGKILL)

    model = ScriptedModel(lambda messages: script[sum(m["role"] == "assistant" for m in messages)])
    ws = Workspace(root, allowed_commands=["python"], blob_dir=root.parent / "blobs")
    run_agent("Make x 3, write b.txt, run the script.", model, ws, Limits(), Killed(log))
""")


@pytest.mark.parametrize("when, step", [
    ("after-effect", 0),  # an edit done, no receipt
    ("after-effect", 2),  # a command that created a file, no receipt
    ("before-effect", 2),  # the intent logged, the command not started
    ("between-steps", 1),
    ("after-proposal", 3),  # the proposal logged, no intent
])
def test_a_killed_run_resumes_with_each_effect_applied_once(tmp_path, when, step):
    root, log = start_files(tmp_path), tmp_path / "run.jsonl"
    killed = subprocess.run([sys.executable, "-c", KILLED, str(root), str(log), when, str(step), json.dumps(SCRIPT)],
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = log.read_bytes()
    events = RunLog.read(log)
    assert events[-1].step == step

    model = ScriptedModel(by_turn)
    outcome = resume(log, model, workspace(root), Limits())
    assert (outcome.status, outcome.summary, outcome.steps) == ("finished", "x is 3", 5)
    # The files: each effect exactly once (a second run would append a second line).
    assert (root / "a.py").read_text() == "x = 3\n"
    assert (root / "b.txt").read_text() == "hello\n"
    assert (root / "ran.txt").read_text() == "ran\n"
    # The log: appended to, never rewritten; one proposal, intent and observation per step,
    # every observation ok, and one receipt per effect in order.
    assert log.read_bytes().startswith(before)
    events = RunLog.read(log)
    for kind, steps in (("proposal", [0, 1, 2, 3, 4]), ("intent", [0, 1, 2, 3]), ("observation", [0, 1, 2, 3])):
        assert [e.step for e in events if e.kind == kind] == steps, kind
    assert all(e.data["ok"] for e in events if e.kind == "observation")
    _, next_step, receipts = replay(events)
    assert next_step == 5
    assert [r.tool for r in receipts] == ["edit", "write", "run", "edit"]
    for r, (old, new) in zip([receipts[0], receipts[3]], [("x = 1", "x = 2"), ("x = 2", "x = 3")]):
        assert r.before["a.py"] != r.after["a.py"] and r.args["old"] == old and r.args["new"] == new
    assert receipts[1].before == {"b.txt": None} and receipts[1].after["b.txt"] is not None
    assert receipts[2].before.get("ran.txt") is None and receipts[2].after["ran.txt"] is not None
    assert receipts[3].before["a.py"] == receipts[0].after["a.py"]  # the second edit starts where the first ended
    # The model was asked only for the steps the killed run had not proposed.
    assert len(model.calls) == 4 - step
    settled = [e for e in events if e.kind == "observation" and e.step == step][0]
    if when == "after-effect":  # made from the workspace: the effect was not repeated
        assert settled.data["text"].startswith("done before the run stopped")
        assert settled.data["receipt"]["exit_status"] is None


def scripted_run(tmp_path, script, limits=Limits()):
    root, log = start_files(tmp_path), RunLog(tmp_path / "run.jsonl")
    model = ScriptedModel(script)
    outcome = run_agent("Make x 3.", model, workspace(root), limits, log)
    return root, log, model, outcome


def test_replay_rebuilds_what_the_model_saw(tmp_path):
    root, log, model, outcome = scripted_run(tmp_path, by_turn, Limits(steps=3))
    assert outcome.status == "limit"
    messages, step, receipts = replay(RunLog.read(log.path))
    assert step == 3
    assert messages[:-2] == model.calls[-1]  # what the last call saw, then the last step's turn
    assert messages[-2] == {"role": "assistant", "content": json.dumps(SCRIPT[2])}
    assert messages[-1]["content"] == "Observation: [exit status 0]\n"
    observed = [Receipt.from_json(e.data["receipt"]) for e in RunLog.read(log.path) if e.kind == "observation"]
    assert receipts == observed and len(receipts) == 3
    with pytest.raises(ValueError, match="starts with a 'start' event"):
        replay(RunLog.read(log.path)[1:])


def test_a_log_written_before_command_receipts_were_typed_replays_the_same(tmp_path):
    """A run log whose receipts have no `timed_out` or `dropped_bytes` (an older run) still
    replays: those fields read as unknown (None), and a compaction of it is the same summary,
    word for word, as the one the older run went on with."""
    old = {"tool": "run", "args": {"command": ["python", "t.py"]}, "before": {"t.py": "ab" * 32},
           "after": {"t.py": "ab" * 32}, "exit_status": 1}
    start = [{"role": "system", "content": "rules"}, {"role": "user", "content": "the task"}]
    lines = [{"kind": "start", "step": 0, "task": "the task", "messages": start},
             {"kind": "proposal", "step": 0, "text": "r"},
             {"kind": "observation", "step": 0, "text": "[exit status 1]\n", "ok": False, "receipt": old},
             {"kind": "proposal", "step": 1, "text": "s"},
             {"kind": "observation", "step": 1, "text": "x", "ok": True, "receipt": None},
             {"kind": "compaction", "step": 2, "keep_last": 1}]
    (tmp_path / "old.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    messages, step, [receipt_] = replay(RunLog.read(tmp_path / "old.jsonl"))
    assert (receipt_.exit_status, receipt_.timed_out, receipt_.dropped_bytes) == (1, None, None)
    assert step == 2 and f"- {json.dumps(old, sort_keys=True)}" in messages[2]["content"].splitlines()


def receipt(tool, path, before, after, status=None):
    return Receipt(tool, {"path": path}, {path: before}, {path: after}, status)


def turn(action, observation):
    return [{"role": "assistant", "content": action}, {"role": "user", "content": observation}]


def test_compaction_keeps_every_receipt_and_is_deterministic():
    head = [{"role": "system", "content": "rules"}, {"role": "user", "content": "the task"}]
    receipts = [receipt("write", "n.txt", None, "ab" * 32), receipt("edit", "a.py", "cd" * 32, "ef" * 32),
                Receipt("run", {"command": ["python", "t.py"]}, {}, {}, 1)]
    messages = head + turn("w", "Observation: wrote n.txt") + [{"role": "user", "content": "Do not touch c.py."}] \
        + turn("e", "Observation: edited a.py") + turn("r", "Observation (refused): [exit status 1]") \
        + turn("read", "Observation: x = 2")
    compacted = compact(messages, receipts, keep_last=2)
    summary = "\n".join([
        "Summary of the earlier steps of this run (compacted).",
        "Effects so far, one receipt a line (tool, args, file digests before and after, exit status):",
        *(f"- {json.dumps(r.to_json(), sort_keys=True)}" for r in receipts),
        "Operator messages:",
        '- "Do not touch c.py."',
    ])
    assert compacted == head + [{"role": "user", "content": summary}] + messages[-4:]
    assert compact(messages, receipts, keep_last=2) == compacted  # the same turns, the same summary
    # Compacting again carries the operator's words over; nothing old: nothing changes.
    again = compact(compacted + turn("f", "Observation: done"), receipts, keep_last=1)
    assert again[2]["content"] == summary and again[3:] == turn("f", "Observation: done")
    assert compact(messages, receipts, keep_last=4) == messages
    assert compact(head, [], keep_last=0) == head
    with pytest.raises(ValueError, match="keep_last must be an integer >= 0, got -1"):
        compact(messages, receipts, keep_last=-1)


READS = [  # reads bring long observations; the receipts of the effects are short
    {"tool": "read", "args": {"path": "notes.txt"}},
    SCRIPT[0],
    {"tool": "read", "args": {"path": "notes.txt", "start_line": 2}},
    SCRIPT[2],
    {"tool": "read", "args": {"path": "notes.txt", "end_line": 30}},
    SCRIPT[3],
    SCRIPT[4],
]


def test_a_run_compacts_near_its_budget_and_replays_the_same(tmp_path):
    def run(folder, on_step=None):
        root = start_files(folder)
        (root / "notes.txt").write_text("".join(f"note {i}: keep x small\n" for i in range(40)))
        model, log = ScriptedModel(READS), RunLog(folder / "run.jsonl")
        outcome = run_agent("Make x 3.", model, workspace(root), Limits(), log,
                            on_step=on_step and on_step(log))
        return root, log, model, outcome

    _, _, plain, _ = run(tmp_path / "plain")
    budget = count_tokens(plain.calls[2]) + 10  # passed after the third step
    root, log, model, outcome = run(tmp_path / "compact", lambda log: compactor(log, budget, keep_last=1))
    assert outcome.status == "finished" and (root / "a.py").read_text() == "x = 3\n"
    events = RunLog.read(log.path)
    compactions = [e for e in events if e.kind == "compaction"]
    # Past the budget after the third step, and after each step since (a long read each time
    # or before): the old turns go, the last one stays.
    assert [e.step for e in compactions] == [2, 3, 4, 5]
    assert all(e.data["tokens_after"] < e.data["tokens_before"] for e in compactions)
    last = model.calls[-1]  # what the model saw at its finish: the task, the summary, one turn
    assert [m["role"] for m in last] == ["system", "user", "user", "assistant", "user"]
    assert last[-2]["content"] == json.dumps(SCRIPT[3])
    _, _, receipts = replay(events)
    for r in receipts:  # every effect so far, as its receipt says it
        assert f"- {json.dumps(r.to_json(), sort_keys=True)}" in last[2]["content"]
    assert len(receipts) == 3
    messages, step, _ = replay(events)
    assert step == 7 and messages == last  # replay compacts exactly as the run did
    with pytest.raises(ValueError, match="budget must be a positive integer"):
        compactor(log, 0)


def test_steering_reaches_the_resumed_conversation(tmp_path):
    root, log, model, outcome = scripted_run(tmp_path, by_turn, Limits(steps=1))
    assert outcome.status == "limit"
    steer(log.path, "Stop at x = 3; do not add tests.")
    assert RunLog.read(log.path)[-1] == Event("steer", 1, {"text": "Stop at x = 3; do not add tests."})
    resumed = ScriptedModel(by_turn)
    outcome = resume(log.path, resumed, workspace(root), Limits(steps=3))
    assert (outcome.status, outcome.steps) == ("limit", 3)
    assert resumed.calls[0][-1] == {"role": "user", "content": "Stop at x = 3; do not add tests."}
    assert resumed.calls[0][-2]["content"].startswith("Observation: edited a.py")
    outcome = resume(log.path, ScriptedModel(by_turn), workspace(root), Limits(steps=10))
    assert (outcome.status, outcome.steps, (root / "ran.txt").read_text()) == ("finished", 5, "ran\n")
    assert resume(log.path, ScriptedModel([]), workspace(root), Limits()).status == "finished"  # only reported
    with pytest.raises(ValueError, match="the run has finished"):
        steer(log.path, "One more thing.")
    with pytest.raises(ValueError, match="a steering message must be a non-empty text"):
        steer(log.path, "  ")


def test_a_log_whose_last_line_is_torn_resumes_and_reads_back(tmp_path):
    """A crash in the middle of writing step 1's observation (the write done, its receipt
    torn): resume sets the torn line aside, settles the step from the workspace, and its
    appends leave a log that reads back, every byte of the old one kept."""
    root, log, _, outcome = scripted_run(tmp_path, by_turn, Limits(steps=2))
    assert outcome.status == "limit"
    lines = log.path.read_bytes().splitlines(keepends=True)
    assert [json.loads(line)["kind"] for line in lines[-2:]] == ["observation", "limit"]
    torn = b"".join(lines[:-2]) + lines[-2][:40]
    log.path.write_bytes(torn)
    assert RunLog.load(log.path).torn == len(lines) - 1
    outcome = resume(log.path, ScriptedModel(by_turn), workspace(root), Limits())
    assert (outcome.status, outcome.steps) == ("finished", 5)
    assert log.path.read_bytes().startswith(torn)
    assert (root / "b.txt").read_text() == "hello\n" and (root / "ran.txt").read_text() == "ran\n"
    events = RunLog.read(log.path)
    assert [e.data["line"] for e in events if e.kind == "torn"] == [len(lines) - 1]
    assert [e.step for e in events if e.kind == "observation"] == [0, 1, 2, 3]
    settled = next(e for e in events if e.kind == "observation" and e.step == 1)
    assert settled.data["text"].startswith("done before the run stopped: write changed b.txt")
    assert replay(events)[1] == 5


def test_a_resumed_run_counts_the_refusals_of_its_log(tmp_path):
    """Refused twice before the pause, once more after it: with `repeats` 3 the resumed run
    ends at its first step, and that step's observation names the step before the pause."""
    missing = {"tool": "read", "args": {"path": "c.py"}}
    root, log, _, outcome = scripted_run(tmp_path, lambda messages: missing, Limits(steps=2))
    assert outcome.status == "limit"
    resumed = ScriptedModel(lambda messages: missing)
    outcome = resume(log.path, resumed, workspace(root), Limits(steps=10))
    assert (outcome.status, outcome.steps) == ("limit", 3)
    assert outcome.reason == 'the same refused action was proposed 3 times in a row: ["read", {"path": "c.py"}]'
    assert len(resumed.calls) == 1
    last = [e for e in RunLog.read(log.path) if e.kind == "observation"][-1]
    assert (last.step, last.data["text"]) == (2, 'refused again: this same action was refused at step 1: read: '
                                                 '"c.py" does not exist')


class Counting:
    """A model that counts the tokens it is run on, call by call."""

    def __init__(self, model):
        self.inner, self.args, self.layers = model, model.args, model.layers
        self.fed: list[int] = []

    def __call__(self, tokens, cache=None):
        self.fed.append(tokens.shape[1])
        return self.inner(tokens, cache=cache)

    def make_cache(self):
        return self.inner.make_cache()


def test_the_engine_prefills_only_what_is_new_at_each_step(default_tokenizer, tmp_path):
    """A paused, steered and resumed run on one EngineModel: the second step takes the first
    step's prompt and reply from the prefix cache and runs the model on the rest only."""
    model, _ = tiny_model("llama-tied", vocab_size=default_tokenizer.vocab_size, max_position_embeddings=4096)
    counting = Counting(model)
    engine = EngineModel(counting, default_tokenizer)
    assert engine.prefix_cache is not None
    root, log = start_files(tmp_path), RunLog(tmp_path / "run.jsonl")
    ws = Workspace(root, editable_paths=["a.py"], blob_dir=tmp_path / "blobs")
    assert run_agent("Make x 3 in a.py.", engine, ws, Limits(steps=1), log).status == "limit"
    first = sum(counting.fed)
    steer(log.path, "Read a.py first.")
    counting.fed.clear()
    resume(log.path, engine, ws, Limits(steps=2))
    events = RunLog.read(log.path)
    p0, p1 = [e.data for e in events if e.kind == "proposal"]
    assert p0["cached_tokens"] == 0 and first == p0["prompt_tokens"] + p0["completion_tokens"]
    # The whole first step (its prompt and every token it generated) came from the cache ...
    assert p1["cached_tokens"] == p0["prompt_tokens"] + p0["completion_tokens"] > 0
    # ... and the model ran on the new part of the prompt (the observation and the steer,
    # in the template), then on each new token.
    new = p1["prompt_tokens"] - p1["cached_tokens"]
    text = default_tokenizer.apply_chat_template([e for e in events if e.kind == "start"][-1].data["messages"])
    end = text.index(p0["text"]) + len(p0["text"])
    # The first reply ended with its end token (a whole action), which the template writes as
    # the `<|im_end|>` that starts the rest: that token is in the cache already.
    assert not [e for e in events if e.kind == "observation"][0].data["text"].startswith("invalid action")
    assert new == len(default_tokenizer.encode(text[end:], add_special_tokens=False)) - 1
    assert "Read a.py first." in text[end:]
    # The cached loop feeds each token as it is drawn, except the last of a reply that
    # max_tokens cut short.
    cut = p1["completion_tokens"] == engine.max_tokens
    assert sum(counting.fed) == new + p1["completion_tokens"] - cut
