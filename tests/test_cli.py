"""The `tiny-llm` command line: user errors, `generate`, `chat` and `smoke` on the default model.

Most cases call the entry point `tiny_llm.cli.main(argv)` in-process; `chat` runs once as
`python -m tiny_llm` with standard input from a pipe. The default model decodes a few tokens
per second on a slow CPU, so every run keeps `--max-tokens` small and runs are shared.
"""

import contextlib
import io
import json
import re
import subprocess
import sys

import pytest

from tiny_llm.cli import main

PROMPT = "What is the capital of France?"
# A model that does not exist: a flag error that slipped through would otherwise load the
# default model and generate; with it such a test fails at once (flags are checked first).
NO_MODEL = ["--model", "/nonexistent/model"]


def run_main(argv: list[str]) -> int:
    """The exit status of `main(argv)`: its return value, or the code argparse exits with."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def run_captured(argv: list[str]) -> tuple[int, str, str]:
    """`(status, stdout, stderr)` of one in-process run (for runs shared by several tests,
    where the function-scoped `capsys` cannot be used)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = run_main(argv)
    return status, out.getvalue(), err.getvalue()


def assert_user_error(status: int, out: str, err: str, *fragments: str) -> str:
    """Exit status 2, nothing on stdout, exactly one 'tiny-llm: error:' line on stderr naming
    every fragment (the flag and the bad value), and no traceback."""
    assert status == 2, err
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tiny-llm: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


# ---------------------------------------------------------------------------------------------
# User errors


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["generate", "--prompt", ""], ["--prompt", "empty"]),
        (["generate", "--prompt", "   "], ["--prompt", "empty"]),
        (["generate", "--prompt", PROMPT, "--temp", "-1", *NO_MODEL], ["--temp", "-1"]),
        (["generate", "--prompt", PROMPT, "--temp", "nan", *NO_MODEL], ["--temp", "nan"]),
        (["generate", "--prompt", PROMPT, "--top-p", "1.5", *NO_MODEL], ["--top-p", "1.5"]),
        (["generate", "--prompt", PROMPT, "--top-k", "-3", *NO_MODEL], ["--top-k", "-3"]),
        (["generate", "--prompt", PROMPT, "--min-p", "2", *NO_MODEL], ["--min-p", "2"]),
        (["generate", "--prompt", PROMPT, "--repetition-penalty", "0", *NO_MODEL],
         ["--repetition-penalty", "0"]),
        (["generate", "--prompt", PROMPT, "--max-tokens", "0", *NO_MODEL], ["--max-tokens", "0"]),
        (["generate", "--prompt", PROMPT, *NO_MODEL], ["/nonexistent/model"]),
        (["generate", "--prompt", PROMPT, "--bogus"], ["--bogus"]),
        (["generate", "--prompt", PROMPT, "--temp", "abc"], ["--temp", "abc"]),
        (["chat", "--top-p", "1.5", *NO_MODEL], ["--top-p", "1.5"]),
        (["chat", *NO_MODEL], ["/nonexistent/model"]),
        (["smoke", "--prompt", ""], ["--prompt", "empty"]),
        (["smoke", "--prompt", PROMPT, "--top", "0", *NO_MODEL], ["--top", "0"]),
        (["chat", "--page-size", "0", *NO_MODEL], ["--page-size", "0"]),
        (["chat", "--prefix-cache-bytes", "lots", *NO_MODEL], ["--prefix-cache-bytes", "512M or 1G", "'lots'"]),
        (["chat", "--prefix-cache-bytes", "-1", *NO_MODEL], ["--prefix-cache-bytes", "'-1'"]),
        (["batch", "--prompts", "x.txt", "--page-size", "-2", *NO_MODEL], ["--page-size", "-2"]),
    ],
    ids=[
        "empty-prompt", "blank-prompt", "temp-negative", "temp-nan", "top-p-1.5", "top-k-negative",
        "min-p-2", "repetition-penalty-0", "max-tokens-0", "unknown-model", "unknown-flag",
        "temp-not-a-number", "chat-top-p-1.5", "chat-unknown-model", "smoke-empty-prompt",
        "smoke-top-0", "chat-page-size-0", "chat-prefix-cache-bytes-text", "chat-prefix-cache-bytes-negative",
        "batch-page-size-negative",
    ],
)
def test_user_error_is_one_line_and_status_2(argv, fragments, capsys):
    """A bad command line prints one 'tiny-llm: error:' line naming the flag and value, exit 2."""
    status = run_main(argv)
    captured = capsys.readouterr()
    assert_user_error(status, captured.out, captured.err, *fragments)


def test_empty_standard_input_is_a_user_error(monkeypatch, capsys):
    """`generate` without --prompt reads standard input; an empty one is a one-line error."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    status = run_main(["generate", *NO_MODEL])
    captured = capsys.readouterr()
    assert_user_error(status, captured.out, captured.err, "--prompt", "empty")


# ---------------------------------------------------------------------------------------------
# generate


@pytest.fixture(scope="module")
def greedy_run():
    """One greedy `generate --verbose` run, shared by the tests reading its stdout and stderr."""
    return run_captured(["generate", "--prompt", PROMPT, "--max-tokens", "12", "--verbose"])


def test_generate_greedy_answers_paris(greedy_run):
    """Greedy `generate` prints a reply naming Paris on stdout, nothing else, and exits 0."""
    status, out, err = greedy_run
    assert status == 0, err
    assert "Paris" in out
    assert out.endswith("\n") and out.count("\n") == 1  # the reply, then one newline
    assert "Traceback" not in err


def test_generate_verbose_prints_stats_to_stderr(greedy_run):
    """--verbose adds prompt tokens, tokens/s and peak memory lines on stderr, not stdout."""
    status, out, err = greedy_run
    assert status == 0
    prompt = re.search(r"^prompt: (\d+) tokens, ([\d.]+) tokens/s", err, re.M)
    generation = re.search(r"^generation: (\d+) tokens, ([\d.]+) tokens/s", err, re.M)
    memory = re.search(r"^peak memory: ([\d.]+) GB$", err, re.M)
    assert prompt and generation and memory, err
    assert int(prompt.group(1)) > len(PROMPT.split())  # the chat template adds tokens
    assert float(prompt.group(2)) > 0
    assert 1 <= int(generation.group(1)) <= 12
    assert float(memory.group(1)) > 0
    assert "tokens/s" not in out and "peak memory" not in out


SAMPLED = [
    "generate", "--prompt", PROMPT, "--temp", "0.7", "--top-k", "40", "--top-p", "0.95",
    "--min-p", "0.05", "--repetition-penalty", "1.1", "--max-tokens", "16",
]


@pytest.fixture(scope="module")
def seed7_run():
    """One sampled run with --seed 7, shared by the reproducibility and different-seed tests."""
    return run_captured([*SAMPLED, "--seed", "7"])


def test_generate_with_a_seed_is_reproducible(seed7_run, capsys):
    """Sampling with --seed 7 twice prints the identical text."""
    status, out, err = seed7_run
    assert status == 0, err
    assert out.strip()
    assert run_main([*SAMPLED, "--seed", "7"]) == 0
    assert capsys.readouterr().out == out


def test_generate_with_another_seed_differs(seed7_run, capsys):
    """--seed 8 samples a different text than --seed 7 (checked beforehand: they do differ)."""
    _, out7, _ = seed7_run
    assert run_main([*SAMPLED, "--seed", "8"]) == 0
    out8 = capsys.readouterr().out
    assert out8.strip()
    assert out8 != out7


# ---------------------------------------------------------------------------------------------
# chat


@pytest.fixture(scope="module")
def chat_run():
    """`python -m tiny_llm chat` with two questions on a pipe, then end of input.

    A short system message replaces the template's default one: 13 fewer tokens to prefill
    per turn on a slow CPU."""
    return subprocess.run(
        [sys.executable, "-m", "tiny_llm", "chat", "--max-tokens", "12", "--verbose",
         "--system", "Be brief."],
        input=f"{PROMPT}\nWhat about Germany?\n",
        capture_output=True, text=True, timeout=600,
    )


def test_chat_from_a_pipe_answers(chat_run):
    """`chat` reading a pipe replies to the first line with Paris and exits 0 at end of input."""
    assert chat_run.returncode == 0, chat_run.stderr
    assert "Traceback" not in chat_run.stderr
    replies = chat_run.stdout.splitlines()
    assert "Paris" in replies[0]
    assert ">>" not in chat_run.stdout  # no prompt marker when standard input is not a terminal


def test_chat_keeps_the_conversation(chat_run):
    """Two lines give two replies; the second sees the first exchange ('What about Germany?'
    alone does not name Berlin) and its prompt is longer by the whole first exchange."""
    assert chat_run.returncode == 0, chat_run.stderr
    replies = chat_run.stdout.splitlines()
    assert len(replies) == 2, chat_run.stdout
    assert "Berlin" in replies[1]
    prompt_tokens = [int(n) for n in re.findall(r"^prompt: (\d+) tokens", chat_run.stderr, re.M)]
    assert len(prompt_tokens) == 2
    assert prompt_tokens[1] > prompt_tokens[0] + 10
    # The second turn takes the first exchange from the prefix cache and prefills the rest.
    cached = re.search(r"^prompt: (\d+) tokens \((\d+) from the prefix cache, (\d+) prefilled\)", chat_run.stderr, re.M)
    assert cached and int(cached[1]) == prompt_tokens[1], chat_run.stderr
    assert int(cached[2]) > prompt_tokens[0] and int(cached[2]) + int(cached[3]) == prompt_tokens[1]


# ---------------------------------------------------------------------------------------------
# smoke


def test_smoke_prints_the_top_candidates(capsys):
    """`smoke` on raw text prints the prompt length and the 5 most likely next tokens, most
    likely first: ' Paris' after 'The capital of France is'."""
    argv = ["smoke", "--no-chat-template", "--prompt", "The capital of France is"]
    assert run_main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    header = re.fullmatch(r"(\d+) prompt tokens; most likely next tokens:", lines[0])
    assert header and 3 <= int(header.group(1)) <= 8  # raw text: no template tokens
    rows = [re.fullmatch(r"\s*([\d.]+)%\s+(\d+)\s+(['\"])(.*)\3", line) for line in lines[1:]]
    assert len(rows) == 5 and all(rows), lines
    percents = [float(row.group(1)) for row in rows]
    assert percents == sorted(percents, reverse=True)
    assert 0 < sum(percents) <= 100.01
    assert len({row.group(2) for row in rows}) == 5  # five different token ids
    assert rows[0].group(4) == " Paris" and percents[0] > 50


# ---------------------------------------------------------------------------------------------
# batch


def prompts_file(tmp_path, text: str) -> str:
    path = tmp_path / "prompts.txt"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, extra, fragments", [
    (None, [], ["cannot read --prompts", "missing.txt"]),
    ('{"prompt": "hi"\n', [], ["prompts.txt:1", "not valid JSON"]),
    ('Hello\n{"max_tokens": 3}\n', [], ["prompts.txt:2", '"prompt" string']),
    ('{"prompt": "hi", "colour": 1}\n', [], ["prompts.txt:1", "unknown keys colour"]),
    ('{"prompt": "hi", "top_p": 2}\n', [], ["prompts.txt:1", "top_p", "2"]),
    ('{"prompt": "hi", "max_tokens": 0}\n', [], ["prompts.txt:1", "max_tokens", "0"]),
    ('{"prompt": "  "}\n', [], ["prompts.txt:1", "empty"]),
    ("\n\n", [], ["holds no prompt"]),
    ("Hello\n", ["--max-batch-size", "0"], ["--max-batch-size", "0"]),
    ("Hello\n", ["--prefill-step-size", "0"], ["--prefill-step-size", "0"]),
    ("Hello\n", ["--max-tokens", "-1"], ["--max-tokens", "-1"]),
    ('Hello\n{"prompt": "Count.", "logit_bias": {"abc": 1}}\n', [],
     ["prompts.txt:2", 'logit_bias keys are token ids such as "15043"', "'abc'"]),
    (b"Hello\nCaf\xe9\n", [], ["prompts.txt:2", "not valid UTF-8 text", "byte 10"]),
    ('{"prompt": "Count.", "order": 5}\n', [], ["prompts.txt:1: order must be a preset name", "got 5"]),
    ('{"prompt": "Count.", "eos_token_ids": 2}\n', [], ["prompts.txt:1: eos_token_ids must be a list of token ids, got 2"]),
    ('{"prompt": "Count.", "regex": "a(b"}\n', [], ["prompts.txt:1: regex: regex: missing ), unterminated subpattern (position 1 in 'a(b')"]),
    ('{"prompt": "Count.", "regex": "[^\\\\s\\\\S]"}\n', [], ["prompts.txt:1: regex:", "matches no text"]),
    ('{"prompt": "Count.", "regex": ""}\n', [], ["prompts.txt:1: regex: matches only the empty text"]),
    ('{"prompt": "Count.", "regex": "a", "grammar": "root ::= \\"a\\""}\n', [],
     ["prompts.txt:1: give one of grammar, regex and json_schema, not grammar and regex"]),
    ('{"prompt": "Count.", "json_schema": {"oneOf": [{"type": "number"}, {}]}}\n', [],
     ["prompts.txt:1: json_schema:", "'oneOf' at #/oneOf"]),
    ('{"prompt": "Count.", "grammar": 5}\n', [], ["prompts.txt:1: grammar must be text, got 5"]),
], ids=["missing-file", "bad-json", "no-prompt-key", "unknown-key", "bad-field", "bad-max-tokens",
        "empty-prompt", "no-prompts", "batch-size-0", "prefill-step-0", "max-tokens-unlimited",
        "logit-bias-key-not-a-number", "not-utf-8", "order-not-a-list", "eos-not-a-list", "bad-regex",
        "regex-matches-nothing", "regex-only-empty", "two-constraints", "bad-schema", "grammar-not-text"])
def test_batch_user_errors(tmp_path, text, extra, fragments, capsys):
    """Every problem in the prompts file or flags is one line naming the place, exit 2,
    before a model is loaded."""
    if isinstance(text, bytes):
        (tmp_path / "prompts.txt").write_bytes(text)
        path = str(tmp_path / "prompts.txt")
    else:
        path = str(tmp_path / "missing.txt") if text is None else prompts_file(tmp_path, text)
    status = run_main(["batch", "--prompts", path, *extra, *NO_MODEL])
    captured = capsys.readouterr()
    assert_user_error(status, captured.out, captured.err, *fragments)


def test_batch_lines_carry_their_own_constraints(tmp_path):
    """A batch line's "regex" and "json_schema" (an object) constrain that request alone; a
    line without one runs free."""
    lines = ['{"prompt": "Give a number.", "regex": "[0-9]{2}"}',
             '{"prompt": "Give a number.", "json_schema": {"type": "integer", "minimum": 100, "maximum": 999}}']
    status, out, err = run_captured(["batch", "--prompts", prompts_file(tmp_path, "\n".join(lines) + "\n"),
                                     "--max-tokens", "6"])
    assert status == 0, err
    blocks = dict(re.findall(r"--- request (\d) \(stop, \d+ tokens\) ---\n(.*?)\n(?=---|\Z)", out, re.S))
    assert re.fullmatch(r"[0-9]{2}", blocks["0"]), out
    assert re.fullmatch(r"[1-9][0-9]{2}", blocks["1"].strip()), out


def test_token_ids_outside_the_vocabulary_are_user_errors(tmp_path, capsys):
    """Known only once the model is loaded, and still one line before anything runs: a
    --logit-bias token, and a batch request's logit_bias (which no longer ends the batch)."""
    status = run_main(["generate", "--prompt", "hi", "--logit-bias", "999999999+1"])
    captured = capsys.readouterr()
    assert_user_error(status, captured.out, captured.err,
                      "--logit-bias names token 999999999, outside the vocabulary [0, 49152)")
    path = prompts_file(tmp_path, 'Name a colour.\n{"prompt": "Count.", "logit_bias": {"999999": 1}}\n')
    status = run_main(["batch", "--prompts", path, "--max-tokens", "2"])
    captured = capsys.readouterr()
    assert_user_error(status, captured.out, captured.err,
                      "request 1: logit_bias names token 999999, outside the vocabulary [0, 49152)")


def the_servers_words(field: str, value) -> str:
    """The message of the server's 400 for a completion request with `field: value`."""
    from conftest import vocab_tokenizer

    from tiny_llm.serve.protocol import Context, RequestError, parse

    with pytest.raises(RequestError) as e:
        parse({"prompt": "w1", field: value}, "completion", Context(vocab_tokenizer(64), ("m",), None, 64))
    assert e.value.param == field
    return e.value.message


def test_a_number_float32_cannot_hold_is_refused_as_the_server_refuses_it(tmp_path, capsys):
    """The float32 range is SamplingParams' own: a temperature of 1e-50, which the command
    line and batch files took (to fail at the first token), is refused with the server's
    words, the field named the caller's way."""
    words = the_servers_words("temperature", 1e-50)
    assert words.startswith("temperature must be a float32 (the sampler's numbers): 0, or between ")
    status = run_main(["generate", "--prompt", "hi", "--temp", "1e-50", *NO_MODEL])
    captured = capsys.readouterr()
    line = assert_user_error(status, captured.out, captured.err)
    assert line == "tiny-llm: error: --temp" + words.removeprefix("temperature")
    path = prompts_file(tmp_path, 'Hello\n{"prompt": "Count.", "temperature": 1e-50}\n')
    status = run_main(["batch", "--prompts", path, *NO_MODEL])
    captured = capsys.readouterr()
    line = assert_user_error(status, captured.out, captured.err)
    assert line == f"tiny-llm: error: {path}:2: {words}"


def test_each_sampling_flags_help_shows_its_range():
    """--help states each sampling flag's range, read from SamplingParams' BOUNDS."""
    from tiny_llm.cli import build_parser
    from tiny_llm.cli.options import SAMPLING_FLAGS
    from tiny_llm.sampler.params import BOUNDS

    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    helps = {a.dest: a.help for a in generate._actions}
    ranged = [field for _, field, _, _ in SAMPLING_FLAGS if field in BOUNDS]
    assert len(ranged) == len(SAMPLING_FLAGS) - 2  # mirostat (0, 1 or 2) and draw (a name) have none
    for field in ranged:
        assert helps[field].endswith(f"; in {BOUNDS[field].interval()})"), (field, helps[field])
    assert helps["top_p"].endswith("(default 1.0; in [0.0, 1.0])")


@pytest.mark.parametrize("argv, stdin, fragments", [
    ([b"generate", b"--prompt", b"caf\xe9 au lait"], b"", ["--prompt is not valid UTF-8 text (character 4)"]),
    ([b"generate"], b"caf\xe9", ["standard input is not valid UTF-8 text"]),
], ids=["prompt", "stdin"])
def test_text_that_is_not_utf8_is_a_user_error(argv, stdin, fragments):
    """Bytes that are not UTF-8 reach Python as lone surrogates (or fail to decode): one
    line, exit 2, before a model is loaded."""
    run = subprocess.run([sys.executable.encode(), b"-m", b"tiny_llm", *argv, b"--model", b"/nonexistent/model"],
                         input=stdin, capture_output=True, timeout=120)
    assert_user_error(run.returncode, run.stdout.decode(), run.stderr.decode(), *fragments)


def test_chat_skips_a_line_that_is_not_utf8_and_goes_on():
    run = subprocess.run([sys.executable, "-m", "tiny_llm", "chat", "--max-tokens", "3"],
                         input=b"caf\xe9\nWhat is the capital of France?\n", capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "tiny-llm: error: that line is not valid UTF-8 text" in run.stderr.decode()
    assert "Traceback" not in run.stderr.decode()
    assert run.stdout.decode().strip().startswith("The capital")  # the next line was answered


def test_batch_answers_every_request_like_generate(tmp_path, greedy_run):
    """Three requests through two rows: each is printed once, with its reason and count; the
    greedy ones equal `generate`'s text (the first, a prefix of the shared 12-token run), and the seeded one equals `generate` with its seed
    and temperature (its random stream is its own, whatever rows share the batch)."""
    import tiny_llm

    lines = [PROMPT, '{"prompt": "Name a colour.", "max_tokens": 5, "temperature": 0.8, "seed": 3}',
             "", "Count to three."]
    path = prompts_file(tmp_path, "\n".join(lines) + "\n")
    status, out, err = run_captured(["batch", "--prompts", path, "--max-tokens", "8", "--max-batch-size", "2"])
    assert status == 0, err
    blocks = {u: t for u, _, t in re.findall(r"--- request (\d) \((stop|length), \d+ tokens\) ---\n(.*?)\n(?=---|\Z)", out, re.S)}
    assert sorted(blocks) == ["0", "1", "2"]
    model, tokenizer = tiny_llm.load("default")
    assert blocks["0"].strip() and greedy_run[1].startswith(blocks["0"])
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Count to three."}])
    assert blocks["2"] == tiny_llm.generate(model, tokenizer, text, max_tokens=8)
    seeded = run_captured(["generate", "--prompt", "Name a colour.", "--max-tokens", "5", "--temp", "0.8", "--seed", "3"])
    assert seeded[0] == 0, seeded[2]
    assert blocks["1"] == seeded[1].rstrip("\n") and blocks["1"].strip()


def test_generate_without_kv_cache_gives_the_same_text(greedy_run):
    """--no-kv-cache runs week 1's loop: the same greedy text (3 tokens, a prefix of the
    shared 12-token run: it is slow)."""
    slow = run_captured(["generate", "--prompt", PROMPT, "--max-tokens", "3", "--no-kv-cache", "--no-fused"])
    assert greedy_run[0] == slow[0] == 0
    assert slow[1].strip() and greedy_run[1].startswith(slow[1].rstrip("\n"))


# ---------------------------------------------------------------------------------------------
# beam search


@pytest.mark.parametrize("extra, fragments", [
    (["--num-beams", "0"], ["--num-beams", "0"]),
    (["--num-beams", "-2"], ["--num-beams", "-2"]),
    (["--num-return-sequences", "3", "--num-beams", "2"], ["--num-return-sequences", "3"]),
    (["--num-return-sequences", "0"], ["--num-return-sequences", "0"]),
    (["--num-beams", "2", "--max-tokens", "-1"], ["--max-tokens", "-1"]),
], ids=["beams-0", "beams-negative", "return-3-of-2", "return-0", "beams-unlimited"])
def test_beam_search_user_errors(extra, fragments, capsys):
    """Bad beam-search flags give one line naming the flag and value, exit 2, before a model
    is loaded."""
    status = run_main(["generate", "--prompt", PROMPT, *extra, *NO_MODEL])
    captured = capsys.readouterr()
    assert_user_error(status, captured.out, captured.err, *fragments)


def test_generate_with_beams_prints_the_best_text():
    """`--num-beams 2` prints the best sequence and a newline, like greedy, and exits 0."""
    status, out, err = run_captured(["generate", "--prompt", PROMPT, "--num-beams", "2", "--max-tokens", "6"])
    assert status == 0, err
    assert "Traceback" not in err
    assert out.endswith("\n") and "Paris" in out


def test_generate_with_beams_prints_every_returned_sequence():
    """`--num-return-sequences 2` prints two different sequences, each under a header with
    its score, best first."""
    status, out, err = run_captured(["generate", "--prompt", PROMPT, "--num-beams", "2",
                                     "--num-return-sequences", "2", "--max-tokens", "6"])
    assert status == 0, err
    parts = re.split(r"^--- sequence (\d) \(score (-[\d.]+), (stop|length), (\d+) tokens\) ---\n", out, flags=re.M)
    assert parts[0] == "" and len(parts) == 11, out
    numbers, scores, texts = parts[1::5], [float(s) for s in parts[2::5]], parts[5::5]
    assert numbers == ["0", "1"]
    assert scores[0] >= scores[1]
    assert texts[0] != texts[1] and all(t.strip() for t in texts)


# ---------------------------------------------------------------------------------------------
# speculative decoding


@pytest.mark.parametrize("extra, fragments", [
    (["--draft-model", "default", "--prompt-lookup"], ["--draft-model", "--prompt-lookup"]),
    (["--prompt-lookup", "--num-draft-tokens", "0"], ["--num-draft-tokens", "0"]),
    (["--prompt-lookup", "--num-beams", "2"], ["--num-beams"]),
    (["--prompt-lookup", "--no-kv-cache"], ["--no-kv-cache"]),
    (["--prompt-lookup", "--mirostat", "2"], ["--mirostat"]),
    (["--prompt-lookup", "--xtc-probability", "0.5"], ["--xtc-probability"]),
], ids=["both-drafters", "zero-drafts", "with-beams", "without-cache", "mirostat", "xtc"])
def test_speculative_user_errors(extra, fragments, capsys):
    status = run_main(["generate", "--prompt", PROMPT, *extra, *NO_MODEL])
    captured = capsys.readouterr()
    assert_user_error(status, captured.out, captured.err, *fragments)


def test_prompt_lookup_prints_the_greedy_text_and_its_counts(greedy_run):
    """--prompt-lookup changes how fast, never what: the same 12 greedy tokens, and
    --verbose reports the rounds."""
    status, out, err = run_captured(["generate", "--prompt", PROMPT, "--max-tokens", "12",
                                     "--prompt-lookup", "--verbose"])
    assert status == 0, err
    assert out == greedy_run[1]
    assert re.search(r"speculative: \d+ target passes, \d+ tokens drafted, \d+ accepted", err)


@pytest.fixture(scope="module")
def small_context_model(tmp_path_factory):
    """The default model with a context of 48 positions (its weights linked, not copied)."""
    from tiny_llm.loader import resolve

    source, target = resolve("default"), tmp_path_factory.mktemp("small-context")
    for f in source.iterdir():
        if f.name != "config.json":
            (target / f.name).symlink_to(f)
    config = json.loads((source / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 48}))
    return str(target)


@pytest.mark.parametrize("flags, message", [
    (["--max-tokens", "20"], "prompt of 36 tokens plus --max-tokens 20 exceeds the model's context of 48 positions"),
    (["--max-tokens", "13", "--num-beams", "2"], "prompt of 36 tokens plus --max-tokens 13 exceeds"),
    (["--max-tokens", "20", "--prompt-lookup"], "prompt of 36 tokens plus --max-tokens 20"),
], ids=["generate", "beams", "speculative"])
def test_a_prompt_beyond_the_context_is_a_user_error(small_context_model, flags, message):
    status, out, err = run_captured(["generate", "--prompt", "Describe a person as JSON.", *flags,
                                     "--model", small_context_model])
    assert_user_error(status, out, err, message)


def test_chat_refuses_a_turn_beyond_the_context_and_goes_on(small_context_model):
    run = subprocess.run([sys.executable, "-m", "tiny_llm", "chat", "--max-tokens", "2", "--model", small_context_model],
                         input="Tell me everything you know about the history of the sky and the sea.\nHi\n",
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "tiny-llm: error: prompt of 59 tokens leaves no room in the model's context of 48" in run.stderr
    assert "Traceback" not in run.stderr and run.stdout.strip()  # "Hi" was answered


def test_a_long_prefill_shows_progress_and_stops_on_ctrl_c():
    """On the CPU the prompt goes in 16-token chunks: with --verbose a progress line names
    the tokens done, and SIGINT ends the command (status 130) long before the prefill of
    about 700 tokens (over a minute here) could have finished."""
    import select
    import signal
    import time

    prompt = "Summarise: " + "The sky is blue because of Rayleigh scattering. " * 70
    # A shell that starts jobs in the background ignores SIGINT for them, and Python keeps a
    # signal it finds ignored: the command starts with SIGINT at its default, as in a terminal.
    # On MLX's ops (--no-kernels) the prefill lasts over a minute here; on our kernels it may
    # end before the first progress line is due on a fast machine.
    proc = subprocess.Popen([sys.executable, "-m", "tiny_llm", "generate", "--prompt", prompt, "--max-tokens", "2",
                             "--verbose", "--no-kernels"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline, line = time.monotonic() + 120, ""
        while not line.startswith("prefill: ") and time.monotonic() < deadline:
            if select.select([proc.stderr], [], [], 1.0)[0]:
                line = proc.stderr.readline()
        m = re.fullmatch(r"prefill: (\d+)/(7\d\d) tokens, [\d.]+ tokens/s\n", line)
        assert m and int(m[1]) % 16 == 0 and int(m[1]) < int(m[2]), line  # whole chunks, not all of them
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        assert "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("extra, fragments", [
    (["--port", "70000"], ["--port", "0 to 65535", "70000"]),
    (["--max-batch-size", "0"], ["--max-batch-size", ">= 1"]),
    (["--max-queue", "-1"], ["--max-queue", ">= 1"]),
    (["--max-prompt-tokens", "0"], ["--max-prompt-tokens", ">= 1"]),
    (["--api-key", " "], ["--api-key is empty"]),
    (["--page-size", "0"], ["--page-size must be a positive integer, got 0"]),
    (["--prefix-cache-bytes", "1T"], ["--prefix-cache-bytes", "'1T'"]),
    (["--host", "256.1.1.1"], ["cannot listen on 256.1.1.1"]),
])
def test_serve_user_errors(extra, fragments, capsys):
    """Checked before the model loads (the model named here does not exist)."""
    assert run_main(["serve", *NO_MODEL, *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(f in err for f in fragments), err


def test_serve_refuses_a_port_in_use(capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert run_main(["serve", *NO_MODEL, "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in err, err
