"""The package's shape: every module says whether it is course or engine (and which days), the
import graph has no cycle, and each default of generation is declared once."""

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from tiny_llm import defaults

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "tiny_llm"
MODULES = sorted(PACKAGE.rglob("*.py"))
HEADER = re.compile(r"^(?:Engine — \S|Course: (?P<days>.+?) — \S)")
# A day's exercise: its solution region, or in a starter the stub that replaced it.
DAY = re.compile(r"# BEGIN SOLUTION week(\d)-day(\d)|NotImplementedError\(\"week(\d)-day(\d):")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def named_days(days: str) -> set[tuple[str, str]]:
    """("1", "3") pairs from "week 1 days 1 and 3", "week 1 day 6 and week 2 day 2", ..."""
    found = set()
    for week, rest in re.findall(r"week (\d) (days? [\d, and]+)", days):
        found |= {(week, d) for d in re.findall(r"\d", rest)}
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_every_module_says_who_it_is_for(path):
    """The first line of each module's docstring is "Engine — ..." or "Course: week W day D
    — ...", and a course module names exactly the days whose solutions it holds."""
    source = path.read_text()
    doc = ast.get_docstring(ast.parse(source), clean=False)
    assert doc, f"{path.name} has no docstring"
    first = doc.splitlines()[0]
    match = HEADER.match(first)
    assert match, f"{module_name(path)}: {first!r}"
    held = {(m[0] or m[2], m[1] or m[3]) for m in DAY.findall(source)}
    if held:
        assert match["days"], f"{module_name(path)} holds exercises of {sorted(held)} but says {first!r}"
        assert named_days(match["days"]) == held, (module_name(path), first, sorted(held))
    else:
        assert not match["days"], f"{module_name(path)} holds no exercise but says {first!r}"


def imports_of(path: Path) -> set[str]:
    """The tiny_llm modules `path` imports, at the top or inside functions."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = node.module if node.level == 0 else ".".join(filter(None, [base, node.module]))
            if target and target.startswith("tiny_llm"):
                found.add(target)
                # `from . import fast` names a module too
                found |= {f"{target}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("tiny_llm")}
    known = {module_name(p) for p in MODULES}
    return {m for m in found if m in known and m != me}


def test_the_import_graph_has_no_cycle():
    graph = {module_name(p): imports_of(p) for p in MODULES if p.name != "__init__.py"}
    graph = {m: {d for d in deps if d in graph} for m, deps in graph.items()}
    assert graph["tiny_llm.speculative"] >= {"tiny_llm.model"}  # the walk sees real edges
    state: dict[str, str] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(d):] + [d]))
            if d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


OWNED = {  # parameter name -> the constant of `defaults` that owns its default
    "max_tokens": defaults.MAX_TOKENS,
    "prefill_step_size": defaults.PREFILL_STEP_SIZE,
    "step_size": defaults.PREFILL_STEP_SIZE,
    "num_draft_tokens": defaults.NUM_DRAFT_TOKENS,
    "max_batch_size": defaults.MAX_BATCH_SIZE,
}


def test_each_default_of_generation_is_declared_once():
    """Every function of the package that takes one of these parameters with a default uses
    the constant of `tiny_llm.defaults` (by name, not a copy of its value), and the command
    line's flags default to the same values."""
    checked = 0
    for path in MODULES:
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            args = fn.args.args + fn.args.kwonlyargs
            values = [None] * (len(fn.args.args) - len(fn.args.defaults)) + fn.args.defaults + fn.args.kw_defaults
            for arg, value in zip(args, values):
                if arg.arg in OWNED and value is not None and not (
                        isinstance(value, ast.Constant) and value.value is None):
                    assert isinstance(value, ast.Name) and getattr(defaults, value.id, None) == OWNED[arg.arg], (
                        f"{module_name(path)}.{fn.name}: {arg.arg} defaults to {ast.unparse(value)}, "
                        f"not a constant of tiny_llm.defaults")
                    checked += 1
    assert checked >= 10

    from tiny_llm import cli

    parser = cli.build_parser()
    flags = {a.dest: a.default for sub in parser._subparsers._group_actions[0].choices.values()
             for a in sub._actions}
    assert flags["max_tokens"] == defaults.MAX_TOKENS
    assert flags["num_draft_tokens"] == defaults.NUM_DRAFT_TOKENS
    assert flags["max_batch_size"] == defaults.MAX_BATCH_SIZE
    assert flags["temperature"] == defaults.TEMPERATURE


def test_library_and_cli_agree_on_the_public_defaults():
    """The defaults users see in signatures are the constants' values."""
    import tiny_llm

    for fn, name in [(tiny_llm.stream_generate, "max_tokens"), (tiny_llm.stream_generate, "num_draft_tokens"),
                     (tiny_llm.batch_generate, "prefill_step_size"), (tiny_llm.speculative_generate_step,
                                                                       "num_draft_tokens")]:
        assert inspect.signature(fn).parameters[name].default == OWNED[name], (fn.__name__, name)
    assert importlib.import_module("tiny_llm.batch").BatchGenerator.__init__.__kwdefaults__["max_batch_size"] == \
        defaults.MAX_BATCH_SIZE


def mapped_modules(chapter: str) -> set[str]:
    """The modules the layer table of `engine-core.md` names: in a row, a `pkg/` entry opens
    a package and the bare names after it are its modules (`__init__` is the package);
    names in parentheses say what a module holds."""
    table = chapter.split("## The layers", 1)[1].split("\n## ", 1)[0]
    named = set()
    for row in (line for line in table.splitlines() if line.startswith("| ") and "---" not in line):
        package = ""
        cell = re.sub(r"\([^()]*\)", "", row.split("|")[2])  # what a module holds is said in parentheses
        for entry in re.findall(r"`([^`]+)`", cell):
            if entry.endswith("/"):
                package = entry.rstrip("/")
                named.add(package)
            elif re.fullmatch(r"\w+(\.py)?", entry):
                name = entry.removesuffix(".py")
                named.add(package if name == "__init__" else ".".join(filter(None, [package, name])))
    return named


def test_the_chapter_on_the_core_maps_every_module():
    """`book/docs/engine-core.md`'s layer table names every module of the package, and
    nothing that is not one: a new module is placed in a layer when it is added."""
    modules = {module_name(p).removeprefix("tiny_llm").lstrip(".") for p in MODULES} - {"", "__main__"}
    named = mapped_modules((PACKAGE.parent.parent / "book" / "docs" / "engine-core.md").read_text())
    assert sorted(modules - named) == [], "modules missing from engine-core.md's layer table"
    assert sorted(named - modules) == [], "the layer table names modules that do not exist"


TESTS_LINE = re.compile(r"^Tests: (?P<files>tests/test_\w+\.py(?:, tests/test_\w+\.py)*)$", re.M)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_every_module_names_its_tests(path):
    """A line `Tests: tests/test_a.py, tests/test_b.py` in each module's docstring leads from a
    module to its tests: the files exist, and the first one imports the module (or, for a
    module used only through its package, the package), or is the file of a day it holds."""
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
    match = TESTS_LINE.search(doc)
    assert match, f"{module_name(path)}: no 'Tests: tests/test_....py, ...' line in its docstring"
    files = match["files"].split(", ")
    root = PACKAGE.parent.parent
    assert all((root / f).is_file() for f in files), [f for f in files if not (root / f).is_file()]
    # Students' starters have no tests of the instructors' tools: name files every tree has.
    assert not set(files) & {"tests/test_course_tools.py", "tests/test_grader.py"}, files
    first = (root / files[0]).read_text()
    day = re.match(r"tests/test_week(\d)_day(\d)\.py", files[0])
    if day and HEADER.match(doc)["days"]:
        assert (day[1], day[2]) in named_days(HEADER.match(doc)["days"]), (module_name(path), files[0])
        return
    names = module_name(path).split(".")
    if names[-1] == "__main__":  # run as `python -m ...`
        names = names[:-1]
    held = [".".join(names[:i]) for i in range(len(names), 1, -1)] or names  # the module, then its packages
    imports = [rf"\b{re.escape(n)}\b" for n in held] + [
        rf"from {re.escape('.'.join(names[:i - 1]))} import [^\n]*\b{re.escape(names[i - 1])}\b"
        for i in range(len(names), 1, -1)]
    assert any(re.search(p, first) for p in imports), f"{files[0]} does not import {module_name(path)}"
