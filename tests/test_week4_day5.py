"""Week 4, day 5: fork and select — K branches from one point of a run, each on its own copy
of the workspace, chosen by the visible checks (passing, then fewer steps, then fewer tokens,
then the lower index), with the choice recorded; on the in-process engine the branches'
shared conversation is prefilled once and found in the prefix cache by every later branch."""

import json
from pathlib import Path

import pytest

from tiny_llm.agent.core import Action, Limits, Proposal
from tiny_llm.agent.fork import Branch, fork, fork_point, select
from tiny_llm.agent.loop import Outcome, RunLog, run_agent, system_prompt
from tiny_llm.agent.models import EngineModel, ScriptedModel
from tiny_llm.agent.session import steer
from tiny_llm.agent.workspace import Workspace
from tiny_llm.paged_cache import PagePool
from tiny_llm.prefix_cache import PrefixCache, common_start

from conftest import tiny_model

TASK = "Make add() in calc.py return a + b."
SOURCE = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
VISIBLE = [{"kind": "file", "path": "calc.py", "equals": FIXED}]


def workspace(tmp_path: Path) -> Workspace:
    root = tmp_path / "ws"
    root.mkdir(parents=True)
    (root / "calc.py").write_text(SOURCE)
    return Workspace(root, blob_dir=tmp_path / "blobs")


def start(ws: Workspace) -> list[dict]:
    """A fresh run's conversation: the system message and the task."""
    return [{"role": "system", "content": system_prompt(TASK, ws.tools)}, {"role": "user", "content": TASK}]


def edit(new: str) -> Action:
    return Action("edit", {"path": "calc.py", "old": "a - b", "new": new})


READ = Action("read", {"path": "calc.py"})
FINISH = Action("finish", {"summary": "done"})


def hand_built(index: int, steps: int, tokens: int, passes: bool) -> Branch:
    """A branch as `fork` would return it, for the selection rule alone."""
    failures = [] if passes else ["file calc.py: differs from the expected text at line 2"]
    return Branch(index, index, None, None, Outcome("finished", "done", steps, tokens, 1.0), failures,
                  Path(f"branch-{index}.jsonl"))


def P(steps, tokens):  # a passing branch's (steps, tokens)
    return steps, tokens, True


def F(steps, tokens):  # a failing one's
    return steps, tokens, False


@pytest.mark.parametrize("rows, chosen, reason", [
    ([F(2, 100), P(5, 900), F(1, 50), F(3, 10)], 1,
     "branch 1 is the only one of 4 branches that passes the visible checks"),
    ([P(4, 100), P(3, 900), P(5, 50)], 1,
     "3 of 3 branches pass the visible checks; branch 1 took the fewest steps (3)"),
    ([P(3, 500), F(1, 10), P(3, 400), P(4, 10)], 2,
     "3 of 4 branches pass the visible checks; 2 of them took the fewest steps (3), "
     "and branch 2 used the fewest tokens (400)"),
    ([P(2, 300), P(2, 200)], 1,
     "2 of 2 branches pass the visible checks; both took 2 steps, and branch 1 used the fewest tokens (200)"),
    ([F(1, 1), P(3, 400), P(3, 400), P(3, 400)], 1,
     "3 of 4 branches pass the visible checks; branches 1, 2 and 3 tie on the fewest steps (3) and tokens "
     "(400), and branch 1 has the lowest index"),
    ([F(4, 10), F(2, 99), F(2, 98)], 2,
     "none of the 3 branches passes the visible checks; 2 of them took the fewest steps (2), "
     "and branch 2 used the fewest tokens (98)"),
    ([F(2, 9), F(2, 8), F(2, 7)], 2,
     "none of the 3 branches passes the visible checks; all 3 took 2 steps, and branch 2 used the fewest tokens (7)"),
    ([F(3, 5), F(1, 7), F(1, 6), F(2, 1)], 2,
     "none of the 4 branches passes the visible checks; 2 of them took the fewest steps (1), "
     "and branch 2 used the fewest tokens (6)"),
    ([F(1, 1)], 0, "branch 0 is the only branch (it fails the visible checks)"),
    ([P(1, 1)], 0, "branch 0 is the only branch (it passes the visible checks)"),
])
def test_select_passing_then_fewer_steps_then_fewer_tokens_then_lower_index(rows, chosen, reason):
    branches = [hand_built(i, *row) for i, row in enumerate(rows)]
    got, why = select(branches)
    assert (got.index, why) == (chosen, reason)


def test_select_goes_by_index_not_position_and_needs_a_branch():
    branches = [hand_built(i, 3, 400, True) for i in range(3)]
    got, why = select(branches[::-1])
    assert got.index == 0
    assert why.endswith("branches 0, 1 and 2 tie on the fewest steps (3) and tokens (400), and branch 0 has the "
                        "lowest index")
    with pytest.raises(ValueError, match="at least one branch"):
        select([])


def test_branches_act_on_separate_workspace_copies(tmp_path):
    """Each branch's edit lands in its own copy: another branch reads the original text, and
    the forked workspace is untouched; the visible checks see each copy alone."""
    ws = workspace(tmp_path)
    scripts = [
        [edit("a + b"), READ, FINISH],  # the fix
        [READ, edit("a * b"), READ, FINISH],  # a wrong fix
        [READ, Action("write", {"path": "notes.txt", "content": "to do\n"}), FINISH],  # no fix, a new file
    ]
    models = [ScriptedModel(s) for s in scripts]
    chosen, branches, _ = fork(start(ws), 0, ws, lambda i: models[i], 3, limits=Limits(steps=10), checks=VISIBLE,
                               run_dir=tmp_path / "fork")
    assert (ws.root / "calc.py").read_text() == SOURCE and not (ws.root / "notes.txt").exists()
    roots = [b.workspace.root for b in branches]
    assert roots == [(tmp_path / "fork" / f"workspace-{i}").resolve() for i in range(3)]
    assert (roots[0] / "calc.py").read_text() == FIXED
    assert (roots[1] / "calc.py").read_text() == SOURCE.replace("a - b", "a * b")
    assert (roots[2] / "calc.py").read_text() == SOURCE and (roots[2] / "notes.txt").read_text() == "to do\n"
    assert not (roots[0] / "notes.txt").exists() and not (roots[1] / "notes.txt").exists()
    # What each model read: its own copy, never another branch's edit.
    assert "a + b" in models[0].calls[2][-1]["content"]
    assert "a - b" in models[1].calls[1][-1]["content"] and "a * b" in models[1].calls[3][-1]["content"]
    assert "a - b" in models[2].calls[1][-1]["content"]
    assert [b.failures == [] for b in branches] == [True, False, False]
    assert all("calc.py" in f for b in branches[1:] for f in b.failures)
    assert chosen is branches[0] and [b.outcome.status for b in branches] == ["finished"] * 3


def test_steers_reach_only_their_branch(tmp_path):
    """Fork a paused run from its log: every branch starts from the run's conversation (an
    operator's steer given to the run included) at its next step; a branch's own steer is one
    more user message that no other branch sees."""
    ws = workspace(tmp_path)
    log = tmp_path / "run.jsonl"
    outcome = run_agent(TASK, ScriptedModel([READ]), ws, Limits(steps=1), RunLog(log))
    assert outcome.status == "limit"
    steer(log, "Run nothing; edit only calc.py.")
    before = log.read_bytes()
    messages, step = fork_point(log)
    assert step == 1 and messages[-1] == {"role": "user", "content": "Run nothing; edit only calc.py."}

    steers = ["Use the + operator.", None, "Rewrite the whole function."]
    models = [ScriptedModel([FINISH]) for _ in steers]
    _, branches, _ = fork(messages, step, ws, lambda i: models[i], 3, limits=Limits(steps=5), seeds=[7, 8, 9],
                          steers=steers, checks=VISIBLE, run_dir=tmp_path / "fork")
    for i, (model, text) in enumerate(zip(models, steers)):
        expected = messages + ([{"role": "user", "content": text}] if text else [])
        assert model.calls == [expected]
        others = {s for s in steers if s and s != text}
        assert not any(m["content"] in others for m in model.calls[0])
        first = RunLog.read(branches[i].log)[0]
        assert (first.kind, first.step, first.data["seed"], first.data["messages"]) == ("start", 1, 7 + i, expected)
        assert (branches[i].steer, branches[i].seed, branches[i].outcome.steps) == (text, 7 + i, 2)
    assert log.read_bytes() == before  # the forked run's own log is left as it was


def test_select_json_records_every_branch_and_the_reason(tmp_path):
    ws = workspace(tmp_path)
    scripts = [[FINISH], [edit("a + b"), FINISH], [READ, edit("a + b"), FINISH]]
    run_dir = tmp_path / "fork"
    chosen, branches, report = fork(start(ws), 0, ws, lambda i: ScriptedModel(scripts[i]), 3,
                                    limits=Limits(steps=10), checks=VISIBLE, run_dir=run_dir)
    saved = json.loads((run_dir / "select.json").read_text())
    assert saved == report
    assert chosen.index == saved["chosen"] == 1
    assert saved["reason"] == "2 of 3 branches pass the visible checks; branch 1 took the fewest steps (2)"
    assert saved["from_step"] == 0 and saved["checks"] == VISIBLE
    for i, (row, branch) in enumerate(zip(saved["branches"], branches)):
        proposals = [e.data for e in RunLog.read(run_dir / f"branch-{i}.jsonl") if e.kind == "proposal"]
        assert (row["index"], row["seed"], row["steer"], row["passed"]) == (i, i, None, i > 0)
        assert row["failures"] == branch.failures and (row["failures"] == []) == (i > 0)
        assert Path(row["log"]) == run_dir / f"branch-{i}.jsonl" and Path(row["workspace"]) == branch.workspace.root
        assert row["outcome"]["status"] == "finished" and row["outcome"]["steps"] == len(scripts[i])
        assert row["tokens"] == row["outcome"]["tokens"] == branch.outcome.tokens
        assert row["prompt_tokens"] == sum(p["prompt_tokens"] for p in proposals)
        assert row["cached_tokens"] == 0 and row["first_cached_tokens"] == 0  # a script has no cache
        assert row["first_prompt_tokens"] == proposals[0]["prompt_tokens"]
    prompt = sum(r["prompt_tokens"] for r in saved["branches"])
    assert (saved["prompt_tokens"], saved["cached_tokens"], saved["prefilled_tokens"], saved["saved_tokens"]) == \
        (prompt, 0, prompt, 0)
    # A fork never writes over an earlier one, and bad input is refused before any branch runs.
    again = dict(limits=Limits(), checks=VISIBLE)
    with pytest.raises(ValueError, match="not an empty folder"):
        fork(start(ws), 0, ws, lambda i: ScriptedModel([FINISH]), 1, run_dir=run_dir, **again)
    with pytest.raises(ValueError, match=r"k \(the number of branches\) must be an integer >= 1, got 0"):
        fork(start(ws), 0, ws, lambda i: ScriptedModel([FINISH]), 0, run_dir=tmp_path / "a", **again)
    with pytest.raises(ValueError, match=r"seeds must have one entry per branch \(2\), got 1"):
        fork(start(ws), 0, ws, lambda i: ScriptedModel([FINISH]), 2, seeds=[1], run_dir=tmp_path / "b", **again)
    with pytest.raises(ValueError, match="check 0: unknown kind 'size'"):
        fork(start(ws), 0, ws, lambda i: ScriptedModel([FINISH]), 1, limits=Limits(), checks=[{"kind": "size"}],
             run_dir=tmp_path / "c")
    with pytest.raises(ValueError, match="a steer must be a non-empty string or None, got ''"):
        fork(start(ws), 0, ws, lambda i: ScriptedModel([FINISH]), 1, steers=[""], run_dir=tmp_path / "d", **again)
    with pytest.raises(ValueError, match="is inside the workspace"):
        fork(start(ws), 0, ws, lambda i: ScriptedModel([FINISH]), 1, run_dir=ws.root / "fork", **again)
    assert not any((tmp_path / d).exists() for d in "abcd") and not (ws.root / "fork").exists()


# ---- the shared prefix on the in-process engine ------------------------------------------------


class Counting:
    """A `Model` around an `EngineModel` that keeps each prompt's tokens and each proposal."""

    def __init__(self, engine: EngineModel):
        self.engine = engine
        self.prompts: list[list[int]] = []
        self.proposals: list[Proposal] = []

    def propose(self, messages: list[dict], schema: dict, *, seed: int | None = None) -> Proposal:
        self.prompts.append(self.engine.prompt(messages))
        self.proposals.append(self.engine.propose(messages, schema, seed=seed))
        return self.proposals[-1]


@pytest.fixture(scope="module")
def random_engine(default_tokenizer):
    """Random weights over the default tokenizer and its chat template: real prompts of some
    900 tokens, at a few milliseconds a token."""
    model, _ = tiny_model("llama-tied", vocab_size=default_tokenizer.vocab_size, max_position_embeddings=2048)
    return model, default_tokenizer


def run_fork(random_engine, tmp_path: Path, cache: PrefixCache | None, name: str) -> tuple[list[Counting], dict]:
    """Four branches, one step each (two seeds alone, two steers), on models that share
    `cache` (None: each model its own cache)."""
    model, tokenizer = random_engine
    ws = workspace(tmp_path)
    models = [Counting(EngineModel(model, tokenizer, max_tokens=24, temperature=1.0,
                                   prefix_cache=True if cache is None else cache)) for _ in range(4)]
    _, _, report = fork(start(ws), 0, ws, lambda i: models[i], 4, limits=Limits(steps=1),
                        steers=[None, "Keep the change small.", "Read the file first.", None], checks=VISIBLE,
                        run_dir=tmp_path / name)
    return models, report


def test_the_shared_prefix_is_prefilled_once(random_engine, tmp_path):
    model, tokenizer = random_engine
    cache = PrefixCache(PagePool(16))
    models, report = run_fork(random_engine, tmp_path, cache, "shared")
    prompts = [m.prompts[0] for m in models]
    # The shared conversation: the system message and the task, every prompt's start.
    shared = tokenizer.encode(tokenizer.apply_chat_template(start(workspace(tmp_path / "x")),
                                                            add_generation_prompt=False))
    assert all(p[:len(shared)] == shared for p in prompts)
    aligned = len(shared) // 16 * 16
    assert aligned >= 800
    first = [m.proposals[0].cached_tokens for m in models]
    assert first[0] == 0  # the first branch prefills the conversation ...
    assert all(c >= aligned for c in first[1:])  # ... and every other branch finds it in the cache
    assert first[3] == len(prompts[3]) - 1  # the same prompt as branch 0's: all but the last token
    assert first[2] >= common_start(prompts[1], prompts[2])  # a steer after a steer: their common start too
    lengths = [len(p) for p in prompts]
    assert [m.proposals[0].prompt_tokens for m in models] == lengths
    assert report["saved_tokens"] == sum(first) and report["cached_tokens"] == sum(first)
    assert report["prompt_tokens"] == sum(lengths)
    # What the engine prefilled, by its own count, is what the report says, and far less than
    # four prompts.
    assert report["prefilled_tokens"] == sum(lengths) - sum(first)
    assert report["prefilled_tokens"] == cache.stats.prompt_tokens - cache.stats.cached_tokens
    assert report["prefilled_tokens"] < 4 * lengths[0]
    assert report["prefilled_tokens"] <= lengths[0] + sum(n - aligned for n in lengths[1:])

    # Without a shared cache every branch prefills its whole prompt.
    alone, baseline = run_fork(random_engine, tmp_path / "alone", None, "alone")
    assert [m.proposals[0].cached_tokens for m in alone] == [0, 0, 0, 0]
    assert baseline["saved_tokens"] == 0 and baseline["prefilled_tokens"] == baseline["prompt_tokens"] == sum(lengths)
