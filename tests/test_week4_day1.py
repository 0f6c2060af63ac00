"""Week 4, day 1: the agent loop — actions under a schema, meaning errors as observations,
limits, and the run log.

The models are scripts (exact events), a random-weight model over the default tokenizer
(every proposal it writes under the grammar parses and validates) and a fake endpoint on the
loopback interface (what `EndpointModel` asks for). The toolbox is a dict of files: day 1
needs no workspace."""

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import jsonschema
import pytest

from tiny_llm.agent.actions import FINISH, action_schema, describe_tools, parse_action
from tiny_llm.agent.core import Action, Event, Limits, Observation, Proposal, Receipt, Tool
from tiny_llm.agent.loop import Outcome, RunLog, run_agent, system_prompt
from tiny_llm.agent.models import EndpointModel, EngineModel, ScriptedModel, count_tokens, text_tokens

from conftest import tiny_model

PATH = {"type": "string", "minLength": 1, "maxLength": 24}
TOOLS = (
    Tool("read", "Read a file.", {"type": "object", "properties": {"path": PATH}, "required": ["path"],
                                  "additionalProperties": False}),
    Tool("edit", "Replace the text old by new in a file; old must occur once.",
         {"type": "object", "properties": {"path": PATH, "old": {"type": "string", "minLength": 1, "maxLength": 40},
                                           "new": {"type": "string", "maxLength": 40}},
          "required": ["path", "old", "new"], "additionalProperties": False}),
)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Notebook:
    """A toolbox over a dict of files, with digests: `read`, and `edit` with a receipt. An
    absolute path raises ValueError, as a policy would."""

    tools = TOOLS

    def __init__(self, files: dict[str, str]):
        self.files = dict(files)

    def touched(self, action: Action) -> list[str]:
        return [action.args["path"]] if action.tool == "edit" else []

    def digest(self, path: str) -> str | None:
        return sha(self.files[path]) if path in self.files else None

    def perform(self, action: Action) -> Observation:
        path = action.args["path"]
        if path.startswith("/"):
            raise ValueError(f"{path}: absolute paths are refused")
        if path not in self.files:
            return Observation(f"no such file: {path}", ok=False)
        if action.tool == "read":
            return Observation(self.files[path])
        text, old, new = self.files[path], action.args["old"], action.args["new"]
        if text.count(old) != 1:
            return Observation(f"the old text occurs {text.count(old)} times in {path}", ok=False)
        self.files[path] = text.replace(old, new)
        receipt = Receipt("edit", action.args, {path: sha(text)}, {path: sha(self.files[path])})
        return Observation(f"edited {path}", receipt=receipt)


def read(path):
    return {"tool": "read", "args": {"path": path}}


def finish(summary="done"):
    return {"tool": "finish", "args": {"summary": summary}}


def branch(name, args):
    return {"type": "object", "properties": {"tool": {"const": name}, "args": args},
            "required": ["tool", "args"], "additionalProperties": False}


def test_the_action_schema_is_a_tagged_union_of_the_tools():
    assert action_schema(TOOLS) == {"oneOf": [
        branch("read", TOOLS[0].parameters),
        branch("edit", TOOLS[1].parameters),
        branch("finish", {"type": "object", "properties": {"summary": {"type": "string", "maxLength": 500}},
                          "required": ["summary"], "additionalProperties": False}),
    ]}
    assert action_schema(()) == {"oneOf": [branch("finish", FINISH.parameters)]}
    with pytest.raises(ValueError, match="two tools are named 'read'"):
        action_schema((TOOLS[0], TOOLS[0]))
    with pytest.raises(ValueError, match="'finish' is reserved"):
        action_schema((FINISH,))
    with pytest.raises(ValueError, match="keyword 'uniqueItems' is not supported"):
        action_schema((Tool("x", "", {"type": "object", "properties": {"a": {"uniqueItems": True}}}),))


@pytest.mark.parametrize("text, why", [
    ('{"tool": "read"', "not JSON"),
    ('[1, 2]', 'exactly "tool" and "args", got list'),
    ('{"tool": "read", "args": {"path": "a"}, "why": "x"}', r"exactly \"tool\" and \"args\", got \['args', 'tool', 'why'\]"),
    ('{"tool": "delete", "args": {}}', "unknown tool 'delete' \\(tools: read, edit, finish\\)"),
    ('{"tool": "read", "args": {}}', "read args is missing 'path'"),
    ('{"tool": "read", "args": {"path": 7}}', "read args.path must be string, got 7"),
    ('{"tool": "read", "args": {"path": ""}}', "read args.path must have 1 to 24 characters, got 0"),
    ('{"tool": "read", "args": {"path": "a", "line": 1}}', "unknown key 'line' \\(allowed: path\\)"),
    ('{"tool": "edit", "args": {"path": "a", "old": "x", "new": NaN}}', "NaN is not a JSON number"),
    ('{"tool": "finish", "args": {"summary": ' + json.dumps("x" * 501) + "}}", "must have 0 to 500 characters"),
])
def test_parse_action_says_what_is_wrong(text, why):
    assert parse_action('{"tool": "read", "args": {"path": "a.py"}}', TOOLS) == Action("read", {"path": "a.py"})
    assert parse_action(json.dumps(finish("ok")), TOOLS) == Action("finish", {"summary": "ok"})
    with pytest.raises(ValueError, match=why):
        parse_action(text, TOOLS)


def test_meaning_errors_are_observations_not_exceptions(tmp_path):
    """A missing file, a path the toolbox refuses (it raises), an edit that does not apply,
    text that is not an action and an unknown tool: each is an observation the model reads."""
    model = ScriptedModel([read("b.py"), read("/etc/passwd"), {"tool": "edit", "args": {"path": "a.py", "old": "y",
                                                                                          "new": "z"}},
                           "I will read a.py", {"tool": "delete", "args": {"path": "a.py"}}, finish()])
    log = RunLog(tmp_path / "run.jsonl")
    outcome = run_agent("Fix a.py.", model, Notebook({"a.py": "x = 1\n"}), Limits(), log)
    assert (outcome.status, outcome.summary, outcome.steps) == ("finished", "done", 6)
    seen = [m["content"] for m in model.calls[-1] if m["role"] == "user"][1:]
    assert seen == [
        "Observation (refused): no such file: b.py",
        "Observation (refused): /etc/passwd: absolute paths are refused",
        "Observation (refused): the old text occurs 0 times in a.py",
        "Observation (refused): invalid action: not JSON: Expecting value: line 1 column 1 (char 0)",
        "Observation (refused): invalid action: unknown tool 'delete' (tools: read, edit, finish)",
    ]
    kinds = [e.kind for e in RunLog.read(log.path)]
    # Performed actions have an intent; text that is not an action never reaches the toolbox.
    assert kinds == ["start"] + ["proposal", "intent", "observation"] * 3 + ["proposal", "observation"] * 2 \
        + ["proposal", "finish"]


def endless(messages):
    return read("a.py")


@pytest.mark.parametrize("limits, kind, used, allowed, steps", [
    (Limits(steps=2), "steps", 2, 2, 2),
    (Limits(steps=0), "steps", 0, 0, 0),
    (Limits(seconds=0), "seconds", None, 0, 0),
    (Limits(tokens=1), "tokens", None, 1, 1),
])
def test_limits_end_the_run_with_a_limit_event(tmp_path, limits, kind, used, allowed, steps):
    log = RunLog(tmp_path / "run.jsonl")
    model = ScriptedModel(endless)
    outcome = run_agent("Read a.py.", model, Notebook({"a.py": "x"}), limits, log)
    last = RunLog.read(log.path)[-1]
    assert (outcome.status, outcome.steps, last.kind, last.step) == ("limit", steps, "limit", steps)
    assert (last.data["limit"], last.data["allowed"]) == (kind, allowed)
    if kind == "tokens":  # the first proposal spent the estimate of its prompt and reply
        prompt = count_tokens(model.calls[0])
        assert last.data["used"] == outcome.tokens == prompt + text_tokens(json.dumps(read("a.py")))
    elif used is not None:
        assert last.data["used"] == used
    assert outcome.reason == f"{kind} limit reached ({last.data['used']} of {allowed})"
    with pytest.raises(ValueError, match="limits.steps must be an integer >= 0, got -1"):
        run_agent("Read a.py.", model, Notebook({}), Limits(steps=-1), log)


def test_a_failing_model_is_an_error_event(tmp_path):
    log = RunLog(tmp_path / "run.jsonl")
    outcome = run_agent("Read a.py.", ScriptedModel([read("a.py")]), Notebook({"a.py": "x"}), Limits(), log)
    assert (outcome.status, outcome.steps) == ("error", 1)
    assert outcome.reason == "the model failed: IndexError: the script has 1 actions and call 2 asks for another"
    assert [(e.kind, e.step) for e in RunLog.read(log.path)][-2:] == [("observation", 0), ("error", 1)]


class Recorded(ScriptedModel):
    """A script that also records the seed of each call."""

    def __init__(self, actions):
        super().__init__(actions)
        self.seeds = []

    def propose(self, messages, schema, *, seed=None):
        self.seeds.append(seed)
        assert schema == action_schema(TOOLS)
        return super().propose(messages, schema, seed=seed)


def test_the_log_of_a_scripted_run_is_exact(tmp_path):
    edit = {"tool": "edit", "args": {"path": "a.py", "old": "1", "new": "2"}}
    model = Recorded([read("a.py"), edit, finish("a.py says x = 2")])
    log = RunLog(tmp_path / "runs" / "one.jsonl")
    steps = []
    outcome = run_agent("Make x 2.", model, Notebook({"a.py": "x = 1\n"}), Limits(steps=5), log, seed=7,
                        on_step=lambda step, messages: steps.append((step, len(messages))))
    system = {"role": "system", "content": system_prompt("Make x 2.", TOOLS)}
    assert describe_tools(TOOLS) in system["content"]
    start = [system, {"role": "user", "content": "Make x 2."}]
    texts = [json.dumps(read("a.py")), json.dumps(edit), json.dumps(finish("a.py says x = 2"))]
    tokens = [count_tokens(c) for c in model.calls]
    replies = [text_tokens(t) for t in texts]
    assert replies == [11, 17, 15]  # four bytes a token, rounded up
    receipt = {"tool": "edit", "args": edit["args"], "before": {"a.py": sha("x = 1\n")},
               "after": {"a.py": sha("x = 2\n")}, "exit_status": None}
    expected = [
        ("start", 0, {"task": "Make x 2.", "messages": start, "tools": ["read", "edit"],
                      "limits": {"steps": 5, "tokens": 100_000, "seconds": 600.0, "repeats": 3}, "seed": 7}),
        ("proposal", 0, {"text": texts[0], "prompt_tokens": tokens[0], "completion_tokens": replies[0], "cached_tokens": 0}),
        ("intent", 0, {"tool": "read", "args": {"path": "a.py"}, "before": {}}),
        ("observation", 0, {"text": "x = 1\n", "ok": True, "receipt": None}),
        ("proposal", 1, {"text": texts[1], "prompt_tokens": tokens[1], "completion_tokens": replies[1], "cached_tokens": 0}),
        ("intent", 1, {"tool": "edit", "args": edit["args"], "before": {"a.py": sha("x = 1\n")}}),
        ("observation", 1, {"text": "edited a.py", "ok": True, "receipt": receipt}),
        ("proposal", 2, {"text": texts[2], "prompt_tokens": tokens[2], "completion_tokens": replies[2], "cached_tokens": 0}),
        ("finish", 2, {"summary": "a.py says x = 2"}),
    ]
    events = RunLog.read(log.path)
    assert [(e.kind, e.step, {k: v for k, v in e.data.items() if k != "seconds"}) for e in events] == expected
    assert outcome == Outcome("finished", "a.py says x = 2", 3, sum(tokens) + sum(replies), outcome.seconds)
    assert model.seeds == [7, 8, 9] and steps == [(0, 4), (1, 6)]
    assert model.calls[2] == start + [
        {"role": "assistant", "content": texts[0]}, {"role": "user", "content": "Observation: x = 1\n"},
        {"role": "assistant", "content": texts[1]}, {"role": "user", "content": "Observation: edited a.py"}]
    # One JSON object a line; a second run on the same log appends and rewrites nothing.
    first = log.path.read_bytes()
    assert [json.loads(line) for line in first.decode().splitlines()] == [e.to_json() for e in events]
    run_agent("Again.", ScriptedModel([finish()]), Notebook({}), Limits(), log)
    assert log.path.read_bytes().startswith(first) and len(RunLog.read(log.path)) == len(events) + 3


def test_a_corrupt_log_line_is_a_value_error_naming_file_and_line(tmp_path):
    log = RunLog(tmp_path / "run.jsonl")
    run_agent("Read a.py.", ScriptedModel([read("a.py"), finish()]), Notebook({"a.py": "x"}), Limits(), log)
    good = log.path.read_text().splitlines()
    assert len(RunLog.read(log.path)) == len(good) == 6
    where = re.escape(str(log.path))
    for line, bad, why in [(3, '{"kind": "intent", "step": 0', "not JSON"),
                           (2, '{"kind": "guess", "step": 0}', "not an event"),
                           (5, '{"kind": "proposal", "step": -1}', "step must be an integer >= 0, got -1"),
                           (4, '{"kind": "proposal", "step": 1}', "a proposal event without 'text'"),
                           (6, "[]", "not an event")]:
        lines = list(good)
        lines[line - 1] = bad
        log.path.write_text("\n".join(lines) + "\n")
        with pytest.raises(ValueError, match=f"^run log {where}:{line}: {why}"):
            RunLog.read(log.path)
    with pytest.raises(ValueError, match="no such file"):
        RunLog.read(tmp_path / "missing.jsonl")


def test_a_torn_last_line_is_set_aside_and_the_log_reads_after_appending(tmp_path):
    """A crash in the middle of writing an event leaves the last line torn: part of the
    line, no line break. Reading sets it aside and says so; the next append ends it and
    marks it with a "torn" event, rewriting nothing, and the log reads back every time."""
    log = RunLog(tmp_path / "run.jsonl")
    notebook = Notebook({"a.py": "x = 1\u2028y = 2\n"})  # U+2028 breaks lines for str.splitlines, not for JSONL
    run_agent("Read a.py.", ScriptedModel([read("a.py"), finish()]), notebook, Limits(), log)
    lines = log.path.read_bytes().splitlines(keepends=True)
    events = RunLog.read(log.path)
    assert len(lines) == len(events) == 6 and events[3].data["text"] == "x = 1\u2028y = 2\n"
    where = re.escape(str(log.path))
    for cut in (lines[-1][:25], lines[-1][:-1], "é".encode()[:1]):  # torn JSON, a lost line break, torn UTF-8
        log.path.write_bytes(b"".join(lines[:-1]) + cut)
        contents = RunLog.load(log.path)
        whole = cut == lines[-1][:-1]
        assert contents.events == RunLog.read(log.path) == (events if whole else events[:-1])
        assert contents.torn == (None if whole else 6)
        assert contents.notice == (None if whole else
                                   f"run log {log.path}:6: a torn last line (a crash mid-write) was set aside")
    # Appending ends the torn line and marks it, before its own event; nothing is rewritten.
    torn = b"".join(lines[:-1]) + lines[-1][:25]
    log.path.write_bytes(torn)
    run_agent("Again.", ScriptedModel([finish()]), Notebook({}), Limits(), log)
    assert log.path.read_bytes().startswith(torn + b"\n")
    again = RunLog.load(log.path)
    assert again.torn is None
    assert [(e.kind, e.step, e.data.get("line")) for e in again.events[5:]] == [
        ("torn", 0, 6), ("start", 0, None), ("proposal", 0, None), ("finish", 0, None)]
    # A whole event that lost only its line break gets the break, and no "torn" event.
    log.path.write_bytes(b"".join(lines[:-1]) + lines[-1][:-1])
    run_agent("Again.", ScriptedModel([finish()]), Notebook({}), Limits(), log)
    assert [e.kind for e in RunLog.read(log.path)] == [e.kind for e in events] + ["start", "proposal", "finish"]
    # Anything else that is not an event is still an error: a torn line that is not the
    # last and not marked, a last line that ends with a line break, a last line that is
    # JSON but no event, and a "torn" event that names another line.
    for text, line, why in [(b"".join(lines[:2]) + lines[2][:20] + b"\n" + b"".join(lines[3:]), 3, "not JSON"),
                            (b"".join(lines[:-1]) + lines[-1][:25] + b"\n", 6, "not JSON"),
                            (b"".join(lines[:-1]) + b"[1, 2]", 6, "not an event"),
                            (torn + b'\n{"kind": "torn", "step": 0, "line": 5}\n', 6, "not JSON")]:
        log.path.write_bytes(text)
        with pytest.raises(ValueError, match=f"^run log {where}:{line}: {why}"):
            RunLog.read(log.path)


def test_a_model_that_repeats_a_refused_action_is_told_and_stopped(tmp_path):
    """The same tool with the same arguments (in any key order), refused again: the
    observation says when it was refused before; `Limits.repeats` in a row end the run
    with a "limit" instead of spending its steps."""
    edit = {"tool": "edit", "args": {"path": "a.py", "old": "y", "new": "z"}}
    reordered = {"tool": "edit", "args": {"new": "z", "old": "y", "path": "a.py"}}
    model = ScriptedModel([read("b.py"), read("b.py"), read("a.py"), read("b.py"), edit, read("b.py"), reordered,
                           edit, edit] + [finish()])
    log = RunLog(tmp_path / "run.jsonl")
    outcome = run_agent("Fix a.py.", model, Notebook({"a.py": "x = 1\n"}), Limits(), log)
    key = '["edit", {"new": "z", "old": "y", "path": "a.py"}]'
    assert (outcome.status, outcome.steps) == ("limit", 9)
    assert outcome.reason == f"the same refused action was proposed 3 times in a row: {key}"
    seen = [m["content"] for m in model.calls[-1] if m["role"] == "user"][1:]
    assert seen == [
        "Observation (refused): no such file: b.py",
        "Observation (refused): refused again: this same action was refused at step 0: no such file: b.py",
        "Observation: x = 1\n",
        "Observation (refused): refused again: this same action was refused at step 1: no such file: b.py",
        "Observation (refused): the old text occurs 0 times in a.py",
        "Observation (refused): refused again: this same action was refused at step 3: no such file: b.py",
        "Observation (refused): refused again: this same action was refused at step 4: the old text occurs 0 "
        "times in a.py",
        "Observation (refused): refused again: this same action was refused at step 6: the old text occurs 0 "
        "times in a.py",
    ]
    assert len(model.calls) == 9  # no tenth proposal: the run ended before it
    last = RunLog.read(log.path)[-1]
    assert (last.kind, last.step) == ("limit", 9)
    assert {k: v for k, v in last.data.items() if k != "seconds"} == {"limit": "repeats", "used": 3, "allowed": 3,
                                                                       "proposal": key}
    # Text that is not an action counts by its text; with repeats=1 the first refusal ends the run.
    outcome = run_agent("Fix a.py.", ScriptedModel(["oops", "oops"]), Notebook({}), Limits(repeats=2), log)
    assert (outcome.status, outcome.steps, outcome.reason) == (
        "limit", 2, 'the same refused action was proposed 2 times in a row: "oops"')
    outcome = run_agent("Fix a.py.", ScriptedModel([read("b.py")]), Notebook({}), Limits(repeats=1), log)
    assert (outcome.status, outcome.steps) == ("limit", 1)
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match=f"limits.repeats must be an integer >= 1, got {bad!r}"):
            run_agent("Fix a.py.", model, Notebook({}), Limits(repeats=bad), log)


@pytest.fixture(scope="module")
def random_model(default_tokenizer):
    """Random weights over the default tokenizer: they spread their mass over every token
    the grammar allows (odd whitespace, escapes, every tool), walking the schema widely."""
    model, _ = tiny_model("llama-tied", vocab_size=default_tokenizer.vocab_size, max_position_embeddings=4096)
    return model, default_tokenizer


def test_every_engine_proposal_parses_and_validates(random_model, tmp_path):
    model, tokenizer = random_model
    engine = EngineModel(model, tokenizer, max_tokens=600, temperature=1.0, prefix_cache=False)
    schema = action_schema(TOOLS)
    messages = [{"role": "system", "content": system_prompt("Fix a.py.", TOOLS)},
                {"role": "user", "content": "Fix a.py."}]
    proposals = [engine.propose(messages, schema, seed=seed) for seed in range(6)]
    log = RunLog(tmp_path / "run.jsonl")
    run_agent("Fix a.py.", engine, Notebook({"a.py": "x = 1\n"}), Limits(steps=3), log, seed=11)
    proposals += [Proposal(e.data["text"]) for e in RunLog.read(log.path) if e.kind == "proposal"]
    tools = set()
    for p in proposals:
        action = parse_action(p.text, TOOLS)
        jsonschema.validate(json.loads(p.text), schema)
        tools.add(action.tool)
    assert len(tools) >= 2  # sampled, not one action every time
    assert not any(e.data["text"].startswith("invalid action") for e in RunLog.read(log.path)
                   if e.kind == "observation")
    prompt = len(tokenizer.encode(tokenizer.apply_chat_template(messages)))
    assert all(p.prompt_tokens == prompt and p.completion_tokens >= 1 and p.cached_tokens == 0
               for p in proposals[:6])


class FakeEndpoint(BaseHTTPRequestHandler):
    """POST /v1/chat/completions: records the request and answers with `reply`."""

    requests: list[dict] = []
    reply = json.dumps(finish("all done"))

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, **body})
        answer = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                  "choices": [{"index": 0, "finish_reason": "stop",
                               "message": {"role": "assistant", "content": self.reply}}],
                  "usage": {"prompt_tokens": 120, "completion_tokens": 14, "total_tokens": 134,
                            "prompt_tokens_details": {"cached_tokens": 96}}}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_the_endpoint_model_asks_for_the_action_schema(tmp_path):
    server = HTTPServer(("127.0.0.1", 0), FakeEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        model = EndpointModel(f"http://127.0.0.1:{server.server_port}/v1", model="tiny", max_tokens=64)
        log = RunLog(tmp_path / "run.jsonl")
        outcome = run_agent("Say done.", model, Notebook({}), Limits(), log, seed=3)
    finally:
        server.shutdown()
        server.server_close()
    assert (outcome.status, outcome.summary, outcome.tokens) == ("finished", "all done", 134)
    sent = FakeEndpoint.requests[-1]
    assert sent["path"] == "/v1/chat/completions"
    assert (sent["model"], sent["max_tokens"], sent["seed"], sent["temperature"]) == ("tiny", 64, 3, 0.0)
    assert sent["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "action", "schema": action_schema(TOOLS), "strict": True}}
    assert sent["messages"] == RunLog.read(log.path)[0].data["messages"]
    proposal = RunLog.read(log.path)[1]
    assert (proposal.kind, proposal.data["prompt_tokens"], proposal.data["cached_tokens"]) == ("proposal", 120, 96)
    with pytest.raises(ValueError, match="base_url must be an http"):
        EndpointModel("127.0.0.1:8000")
