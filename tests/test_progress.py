"""A starter part-way through the course: week 2's fast paths switch on once their day is
done, a command that needs a missing day says which in one line, and the package imports
each day's module on its own."""

import importlib
import re
import subprocess
import sys

import pytest

import tiny_llm.loader
from tiny_llm import progress
from tiny_llm.cli import main

from test_cli import NO_MODEL, PROMPT, run_captured

generate_module = importlib.import_module("tiny_llm.generate")  # `tiny_llm.generate` is the function


@pytest.mark.parametrize("error, expected", [
    (NotImplementedError("week2-day4: implement BatchGenerator._admit"), ("week2-day4", "implement BatchGenerator._admit")),
    (NotImplementedError("week10-day2:  implement x\n"), ("week10-day2", "implement x")),
    (NotImplementedError("not a day: implement x"), None),
    (NotImplementedError(), None),
    (ValueError("week1-day1: implement softmax"), None),
])
def test_missing_day_reads_only_starter_stubs(error, expected):
    assert progress.missing_day(error) == expected


def _raise(error):
    def probe():
        raise error
    return probe


@pytest.mark.parametrize("probe, expected", [
    (lambda: None, True),
    (_raise(NotImplementedError("week2-day3: implement FusedRMSNorm.__call__")), False),
    (_raise(TypeError("a bug in the student's kernel")), True),  # shown by the real call
])
def test_implemented_asks_the_probe_once(monkeypatch, probe, expected):
    monkeypatch.setattr(progress, "_known", {})
    calls = []

    def counted():
        calls.append(1)
        return probe()

    assert progress.implemented("week2-day3", counted) is expected
    assert progress.implemented("week2-day3", counted) is expected
    assert len(calls) == 1


def test_another_days_stub_is_not_swallowed(monkeypatch):
    """A probe that reaches an earlier missing day reports that day, not its own."""
    monkeypatch.setattr(progress, "_known", {})
    with pytest.raises(NotImplementedError, match="week1-day6: implement next_token"):
        progress.implemented("week2-day2", _raise(NotImplementedError("week1-day6: implement next_token")))
    assert "week2-day2" not in progress._known


def test_the_finished_engine_has_every_fast_path():
    assert generate_module.cached_loop_implemented()
    assert tiny_llm.loader.fused_kernels_implemented()


@pytest.fixture
def week_one_only(monkeypatch):
    """The CLI as in a starter where week 2 days 2 and 3 are not done yet; records which
    loop ran and which kernels were loaded."""
    seen = {"recompute": 0, "fused": []}
    recompute, load = generate_module._recompute_steps, tiny_llm.loader.load

    def counting_recompute(*args, **kwargs):
        seen["recompute"] += 1
        return recompute(*args, **kwargs)

    def recording_load(*args, fused=None, **kwargs):
        seen["fused"].append(fused)
        return load(*args, fused=fused, **kwargs)

    monkeypatch.setattr(generate_module, "cached_loop_implemented", lambda: False)
    monkeypatch.setattr(tiny_llm.loader, "fused_kernels_implemented", lambda: False)
    monkeypatch.setattr(generate_module, "_recompute_steps", counting_recompute)
    monkeypatch.setattr(tiny_llm.loader, "load", recording_load)
    return seen


def test_generate_falls_back_to_week_one_with_a_note(week_one_only):
    """Without week 2 days 2 and 3 the same command runs week 1's loop and kernels, says so
    on stderr, and writes the greedy text of the finished engine."""
    status, out, err = run_captured(["generate", "--prompt", PROMPT, "--max-tokens", "2"])
    assert status == 0, err
    assert week_one_only == {"recompute": 1, "fused": [False]}
    notes = [line for line in without_kernel_notes(err) if line.startswith("tiny-llm: note:")]
    assert len(notes) == 2 and "week2-day3 is not implemented yet" in notes[0] and "--no-fused" in notes[0]
    assert "week2-day2 is not implemented yet" in notes[1] and "--no-kv-cache" in notes[1]
    status, expected, _ = run_captured(["generate", "--prompt", PROMPT, "--max-tokens", "2", "--no-fused"])
    assert status == 0 and out == expected


def test_a_command_that_needs_a_missing_day_says_which_in_one_line(monkeypatch, tmp_path):
    """The stub's day and what to implement, how to do without it, exit status 2, no traceback."""
    import tiny_llm.batch

    def stub(self, *args, **kwargs):
        raise NotImplementedError("week2-day4: implement BatchGenerator._admit")

    monkeypatch.setattr(tiny_llm.batch.BatchGenerator, "_admit", stub)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Name a colour.\n")
    status, out, err = run_captured(["batch", "--prompts", str(prompts), "--max-tokens", "2"])
    assert (status, out) == (2, "")
    assert without_kernel_notes(err) == [
        "tiny-llm: error: week2-day4 is not implemented yet (implement BatchGenerator._admit); "
        "`tiny-llm generate` runs one prompt at a time without it"
    ]


def without_kernel_notes(err: str) -> list[str]:
    """The lines of `err` but the notes that the kernel days (week 2 days 6 and 7, week 3 day
    6) are not done yet: a starter at an earlier stage prints them too (tests/test_kernels.py
    and the walkthrough check them)."""
    return [line for line in err.splitlines()
            if not re.match(r"tiny-llm: note: week(2-day6|2-day7|3-day6) is not implemented yet", line)]


def test_other_not_implemented_errors_are_not_hidden(monkeypatch):
    """Only a starter's stub becomes a one-line message; any other NotImplementedError is a
    bug and keeps its traceback."""
    import tiny_llm.cli.smoke

    def broken(args):
        raise NotImplementedError("something else")

    monkeypatch.setattr(tiny_llm.cli.smoke, "run", broken)
    with pytest.raises(NotImplementedError, match="something else"):
        main(["smoke", "--prompt", "hi", *NO_MODEL])


def test_python_dash_m_tiny_llm_cli_runs_the_command_line():
    run = subprocess.run([sys.executable, "-m", "tiny_llm.cli", "smoke", "--prompt", "hi", *NO_MODEL],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.startswith("tiny-llm: error: no model at '/nonexistent/model'")


def test_the_package_imports_one_day_at_a_time():
    """Week 1's modules load without any week 2 module (the engine's `kernels` and `files`
    are not course days), and `tiny_llm.generate` stays the function after its submodule is
    imported."""
    code = (
        "import sys, tiny_llm.basics, tiny_llm.attention, tiny_llm.qwen2, tiny_llm.loader\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('tiny_llm.'))\n"
        "import tiny_llm.generate, tiny_llm\n"
        "print(loaded, callable(tiny_llm.generate), tiny_llm.generate.__module__)\n"
    )
    assert fresh_python(code) == [
        "['tiny_llm.attention',", "'tiny_llm.basics',", "'tiny_llm.embedding',", "'tiny_llm.files',",
        "'tiny_llm.gguf',", "'tiny_llm.hub',",
        "'tiny_llm.kernels',", "'tiny_llm.layer_norm',", "'tiny_llm.loader',", "'tiny_llm.positional_encoding',",
        "'tiny_llm.progress',", "'tiny_llm.quantize',",
        "'tiny_llm.qwen2',", "'tiny_llm.tokenizer']", "True", "tiny_llm.generate",
    ]


def test_public_names_live_on_the_package():
    """The engine's public names are on `tiny_llm` itself, as in mlx-lm; `generate` stays the
    function after its submodule is imported, and `tiny_llm.beam_search` stays the module."""
    code = (
        "import tiny_llm.beam_search, tiny_llm.generate, tiny_llm\n"
        "from tiny_llm import batch, model, sampler, speculative\n"
        "pairs = [(tiny_llm.SamplingParams, sampler.SamplingParams), (tiny_llm.Sampler, sampler.Sampler),\n"
        "         (tiny_llm.make_sampler, sampler.make_sampler), (tiny_llm.batch_generate, batch.batch_generate),\n"
        "         (tiny_llm.BatchGenerator, batch.BatchGenerator), (tiny_llm.prefill, model.prefill),\n"
        "         (tiny_llm.Model, model.Model),\n"
        "         (tiny_llm.speculative_generate_step, speculative.speculative_generate_step)]\n"
        "print(all(a is b for a, b in pairs), tiny_llm.beam_search.__name__, tiny_llm.generate.__module__)\n"
    )
    assert fresh_python(code) == ["True", "tiny_llm.beam_search", "tiny_llm.generate"]


def fresh_python(code: str) -> list[str]:
    """The words `code` prints in a new interpreter (nothing of tiny_llm imported yet)."""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.split()
