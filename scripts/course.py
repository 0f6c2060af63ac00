"""The course's days, their test files, and which earlier days each one builds on."""

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Day -> the days whose solutions its tests need (directly; dependencies are transitive).
DEPENDS: dict[str, tuple[str, ...]] = {
    "week1-day1": (),
    "week1-day2": (),
    "week1-day3": ("week1-day1", "week1-day2"),  # attention uses softmax, linear and RoPE
    "week1-day4": ("week1-day1",),  # the MLP uses linear
    "week1-day5": ("week1-day3", "week1-day4"),  # the whole model
    "week1-day6": ("week1-day5",),  # generation with the real model
    "week1-day7": (),
    "week2-day1": (),
    "week2-day2": ("week1-day5", "week1-day6"),  # the cache under the model and generate_step
    "week2-day3": ("week1-day5",),  # fused kernels, compared inside the whole model too
    "week2-day4": ("week2-day2", "week1-day7"),  # batches: cached prefill, per-row sampling
    "week2-day5": ("week2-day4",),  # continuous batching
    # Our own quantized matrix product (C++): greedy tokens of the default model vs mlx-lm.
    "week2-day6": ("week2-day2",),
    # The step's overhead (C++): each decoder layer of a decode step as one primitive, on day 6's products.
    "week2-day7": ("week2-day6",),
    "week3-day1": ("week2-day2",),  # speculative decoding: the cache and its trim
    "week3-day2": ("week2-day5",),  # the batch engine on pages, compared with the dense batch
    "week3-day3": ("week3-day2",),  # the prefix cache shares pages
    "week3-day4": ("week2-day2",),  # mixture of experts: whole sparse models, with their cache
    # Tensor parallelism: sparse models sharded too; real ranks run the command line and serve.
    "week3-day5": ("week3-day4", "week2-day3", "week2-day5", "week3-day3"),
    # Attention straight over pages (C++): inside the paged cache, the batch engine on pages.
    "week3-day6": ("week3-day2",),
    # Week 4: a coding agent. The loop and the workspace stand alone (scripted models).
    "week4-day1": ("week2-day2",),  # the engine behind the loop: cached generation
    "week4-day2": (),
    # Sessions resume the loop over a workspace; each step's prompt comes from the prefix cache.
    "week4-day3": ("week4-day1", "week4-day2", "week3-day3"),
    "week4-day4": ("week4-day1", "week4-day2"),  # evaluation runs the loop on task workspaces
    "week4-day5": ("week4-day3", "week4-day4", "week3-day3"),  # forks share the prefix cache
}
DAYS = tuple(DEPENDS)

# Test files that are not a day's own file -> the days they need (directly). Every shipped
# test file is a day's file or listed here; the walkthrough runs each one at the first stage
# of the course where all its days are done.
TEST_DAYS: dict[str, tuple[str, ...]] = {
    "tests/test_generate.py": ("week1-day6",),
    "tests/test_tokenizer.py": (),
    "tests/test_loader.py": ("week1-day5",),
    # Qwen3 and RoPE scaling against mlx-lm, on the hand-written and the fused kernels.
    "tests/test_models.py": ("week2-day2", "week2-day3"),
    # Every architecture through the command line, batches, drafts, beams and grammars.
    "tests/test_architectures.py": ("week2-day3", "week2-day5", "week3-day1", "week3-day3", "week3-day4"),
    "tests/test_sampler_params.py": (),
    "tests/test_sampler_stages.py": (),
    "tests/test_sampler_engine.py": (),
    "tests/test_sampler_fast.py": (),
    "tests/test_sampler_search.py": (),
    "tests/test_sampler_draw_order.py": (),
    "tests/test_sampler_facade.py": ("week1-day7",),
    "tests/test_constrain_grammar.py": (),
    "tests/test_constrain_regex.py": (),
    "tests/test_constrain_json_schema.py": (),
    "tests/test_constrain_numbers.py": (),
    "tests/test_json_schema_sampled.py": (),
    "tests/test_json_schema_keywords.py": (),
    "tests/test_json_schema_hypothesis.py": (),
    "tests/test_json_schema_pydantic.py": (),
    "tests/test_constrain_sampling.py": (),
    "tests/test_fuzz.py": (),
    "tests/test_layout.py": (),
    "tests/test_book.py": (),  # the built book (offline formulas) and its figures
    "tests/test_cache_errors.py": (),
    # The kernels' argument checks, their MLX-op fallback and an install without a compiler.
    "tests/test_kernels.py": ("week1-day6",),
    "tests/test_constrain_generate.py": ("week2-day5",),
    "tests/test_batch.py": ("week2-day5",),
    "tests/test_beam_search.py": ("week2-day2",),
    "tests/test_speculative.py": ("week3-day1",),
    # The fused decode step on pages: batches, shared pages, seeded rows alone and together.
    "tests/test_fused_step.py": ("week2-day7", "week3-day2"),
    "tests/test_cli.py": ("week2-day3", "week2-day5", "week3-day1", "week3-day3"),
    "tests/test_progress.py": ("week2-day3", "week2-day4"),
    # The server runs on the batch engine (week 2, days 4 and 5); its replies count the prompt
    # tokens found in the prefix cache (week 3, day 3).
    "tests/test_serve_text.py": (),
    # One request builder: the command line's generate, chat and batch with --min-tokens.
    "tests/test_request.py": ("week2-day5",),
    "tests/test_serve.py": ("week2-day5", "week3-day3"),
    "tests/test_serve_responses.py": ("week2-day5", "week3-day3"),
    "tests/test_serve_anthropic.py": ("week2-day5", "week3-day3"),
    "tests/test_serve_agents.py": ("week2-day5", "week3-day3"),
    "tests/test_agent_cli.py": ("week4-day3", "week4-day4"),  # `tiny-llm agent run` and `eval`
    "tests/test_agent_sandbox.py": ("week4-day3",),
    "tests/test_agent_actions.py": (),  # the validator students are given in week 4
    "tests/test_agent_runner.py": (),  # a command's typed result and the receipt's log  # attacks through `tiny-llm agent run`; resume, undo
    "tests/test_serve_engine.py": ("week2-day5",),
    "tests/test_serve_lockstep.py": ("week2-day5",),  # the leader over the batch engine
    "tests/test_distributed.py": (),  # a rank and its launcher: no day's code
    "tests/test_caches.py": ("week2-day4",),  # dense and left-padded batch caches
    "tests/test_serve_default.py": ("week2-day5", "week3-day3"),
    "tests/test_serve_browser.py": ("week2-day5",),
    # The server under faults, load and fuzzing: failures on purpose, the drain, the soak.
    "tests/test_serve_faults.py": ("week2-day5", "week3-day3"),
    "tests/test_serve_soak.py": ("week2-day5", "week3-day3"),
    "tests/test_serve_fuzz.py": ("week2-day5", "week3-day3"),
}

MARKER_WORD = "SOLUTION"  # a line that holds it must be one of the two markers
# Source files with exercise regions, by suffix -> their comment mark. A C++ region becomes a
# `throw NotImplemented(...)`, which Python sees as the same NotImplementedError.
COMMENT = {".py": "#", ".cpp": "//", ".h": "//"}


def _markers(path: Path) -> tuple[re.Pattern, re.Pattern, str]:
    mark = re.escape(COMMENT.get(Path(path).suffix, "#"))
    return (re.compile(rf"^(?P<indent>\s*){mark} BEGIN SOLUTION (?P<day>\S+)\s*$"),
            re.compile(rf"^\s*{mark} END SOLUTION\s*$"), COMMENT.get(Path(path).suffix, "#"))


def has_regions(path: str) -> bool:
    """True for the package's source files that may hold exercise regions."""
    return path.startswith("src/") and Path(path).suffix in COMMENT


def test_file(day: str) -> str:
    week, d = day.split("-")
    return f"tests/test_{week}_{d}.py"


def needed_days(test: str) -> set[str]:
    """Every day whose solution the tests in `test` need, directly or through other days."""
    direct = TEST_DAYS.get(test) or tuple(d for d in DAYS if test_file(d) == test)
    if test not in TEST_DAYS and not direct:
        raise KeyError(f"{test} is neither a day's test file nor listed in course.TEST_DAYS")
    needed, pending = set(), list(direct)
    while pending:
        d = pending.pop()
        if d not in needed:
            needed.add(d)
            pending.extend(DEPENDS[d])
    return needed


def depends_on(day: str, other: str) -> bool:
    """True when `day`'s tests need `other`'s solution, directly or through other days."""
    pending, seen = list(DEPENDS[day]), set()
    while pending:
        d = pending.pop()
        if d == other:
            return True
        if d not in seen:
            seen.add(d)
            pending.extend(DEPENDS[d])
    return False


class MarkerError(ValueError):
    pass


@dataclass(frozen=True)
class Region:
    day: str
    begin: int  # 0-based line index of the BEGIN marker
    end: int  # 0-based line index of the END marker
    indent: str
    name: str  # the enclosing function, e.g. "RoPE.__call__"


def find_regions(path: Path, lines: list[str]) -> list[Region]:
    """The solution regions of one file; MarkerError names the file and line of any fault."""
    BEGIN, END, mark = _markers(path)
    regions, open_at = [], None
    for i, line in enumerate(lines):
        if m := BEGIN.match(line):
            if open_at is not None:
                raise MarkerError(f"{path}:{i + 1}: BEGIN SOLUTION inside the region opened at line {open_at[0] + 1}")
            if m["day"] not in DEPENDS:
                raise MarkerError(f"{path}:{i + 1}: unknown day {m['day']!r} (known: {', '.join(DAYS)})")
            open_at = (i, m["day"], m["indent"])
        elif END.match(line):
            if open_at is None:
                raise MarkerError(f"{path}:{i + 1}: END SOLUTION without a BEGIN SOLUTION")
            begin, day, indent = open_at
            name = _enclosing_cpp(lines, begin, indent) if mark == "//" else _enclosing(lines, begin, indent)
            regions.append(Region(day, begin, i, indent, name))
            open_at = None
        elif MARKER_WORD in line:
            # A mistyped marker would ship its solution to students: refuse it.
            raise MarkerError(f"{path}:{i + 1}: {line.strip()!r} is not a solution marker "
                              f"(write '{mark} BEGIN SOLUTION weekW-dayD' or '{mark} END SOLUTION')")
    if open_at is not None:
        raise MarkerError(f"{path}:{open_at[0] + 1}: BEGIN SOLUTION is never closed")
    return regions


def _enclosing(lines: list[str], at: int, indent: str) -> str:
    """Qualified name of the function (and class) around line `at`."""
    names, level = [], len(indent)
    for line in reversed(lines[:at]):
        stripped = line.lstrip()
        width = len(line) - len(stripped)
        if stripped.startswith(("def ", "class ")) and width < level:
            names.append(re.split(r"[(:\s]", stripped.split(None, 1)[1])[0])
            level = width
            if width == 0:
                break
    return ".".join(reversed(names)) or "this code"


def _enclosing_cpp(lines: list[str], at: int, indent: str) -> str:
    """The C++ function whose body holds line `at`: the name before the first `(` of the
    nearest line above that starts less indented than the region and opens a parameter list."""
    for line in reversed(lines[:at]):
        stripped = line.lstrip()
        if len(line) - len(stripped) < len(indent) and (m := re.match(r"[\w:<>,*&\s]*?\b(\w+)\s*\(", stripped)):
            if m[1] not in ("if", "for", "while", "switch", "return"):
                return m[1]
    return "this code"


def strip_source(path: Path, text: str, days: set[str]) -> str:
    """`text` with each region of `days` replaced by `raise NotImplementedError(...)` (in C++,
    `throw NotImplemented(...)`)."""
    lines = text.splitlines(keepends=True)
    out, last = [], 0
    for r in find_regions(path, lines):
        if r.day not in days:
            continue
        out.extend(lines[last : r.begin])
        stub = "throw NotImplemented" if COMMENT.get(Path(path).suffix) == "//" else "raise NotImplementedError"
        out.append(f'{r.indent}{stub}("{r.day}: implement {r.name}"){";" if stub.startswith("throw") else ""}\n')
        last = r.end + 1
    out.extend(lines[last:])
    return "".join(out)
