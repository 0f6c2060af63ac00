"""Grader: the pytest plugin `scripts/grade.py` loads into each test process (`-p grade_plugin`).

It appends one JSON line per event to the file named by `TINY_LLM_GRADE_EVENTS` as the
event happens, so the grader sees a test start, its result, a collection error, and what
was collected, even when the process later hangs or dies:

    {"event": "collected", "ids": [...]}        after collection (and selection)
    {"event": "collect_error", "id": ..., "text": ...}
    {"event": "start", "id": ...}               before a test's setup
    {"event": "result", "id": ..., "passed": bool, "text": ...}   after its teardown
    {"event": "fatal", "text": ...}             the run cannot grade anything

With `TINY_LLM_GRADE_SELECT` (a file of test ids, one a line) only those tests run. With
`TINY_LLM_GRADE_SRC` (a folder) the run stops at once unless `tiny_llm` is imported from
that folder: an installed copy must never stand in for the graded one. Without
`TINY_LLM_GRADE_EVENTS` the plugin does nothing.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

EVENTS = os.environ.get("TINY_LLM_GRADE_EVENTS")
SELECT = os.environ.get("TINY_LLM_GRADE_SELECT")
SRC = os.environ.get("TINY_LLM_GRADE_SRC")
MAX_TEXT = 6000  # characters kept per event text; the grader trims further

_reports: dict[str, list] = {}


def _emit(event: str, **fields) -> None:
    # One write of one whole line to a file opened for appending: a line is either all
    # there or (if the process dies mid-write) an unparseable tail the grader ignores.
    line = json.dumps({"event": event, **fields}) + "\n"
    fd = os.open(EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode("utf-8", "replace"))
    finally:
        os.close(fd)


def _tail(text: str) -> str:
    return text if len(text) <= MAX_TEXT else "...\n" + text[-MAX_TEXT:]


def _graded_origin() -> str | None:
    """Where `tiny_llm` comes from in this process (imported already, by the conftest, or not)."""
    module = sys.modules.get("tiny_llm")
    if module is not None:
        return getattr(module, "__file__", None)
    try:
        spec = importlib.util.find_spec("tiny_llm")  # a top-level name: nothing is imported
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.has_location else None


def pytest_sessionstart(session):
    if not (EVENTS and SRC):
        return
    origin = _graded_origin()
    expected = Path(SRC).resolve()
    if origin is None or expected not in Path(origin).resolve().parents:
        why = (f"tiny_llm would be imported from {origin or 'nowhere'}, not from the graded "
               f"{expected / 'tiny_llm'}; is src/tiny_llm/__init__.py missing?")
        _emit("fatal", text=why)
        pytest.exit(why, returncode=3)


def pytest_collectreport(report):
    if EVENTS and report.failed:
        _emit("collect_error", id=report.nodeid, text=_tail(report.longreprtext))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if not (EVENTS and SELECT):
        return
    wanted = set(Path(SELECT).read_text().splitlines())
    keep = [item for item in items if item.nodeid in wanted]
    dropped = [item for item in items if item.nodeid not in wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_collection_finish(session):
    if EVENTS:
        _emit("collected", ids=[item.nodeid for item in session.items])


def pytest_runtest_logstart(nodeid, location):
    if EVENTS:
        _reports[nodeid] = []
        _emit("start", id=nodeid)


def pytest_runtest_logreport(report):
    if EVENTS:
        _reports.setdefault(report.nodeid, []).append(report)


def pytest_runtest_logfinish(nodeid, location):
    if not EVENTS:
        return
    reports = _reports.pop(nodeid, [])
    # Passed: setup, call and teardown all passed. A skip or an expected failure is not a pass.
    passed = bool(reports) and all(r.passed for r in reports) and any(r.when == "call" for r in reports)
    texts = []
    for r in reports:
        if r.failed:
            texts.append(f"[{r.when} failed]\n{r.longreprtext}")
            texts.extend(f"[{title}]\n{content}" for title, content in r.sections)
        elif r.skipped:
            reason = r.longrepr[2] if isinstance(r.longrepr, tuple) else str(r.longrepr)
            texts.append(f"[skipped in {r.when}] {reason}")
    _emit("result", id=nodeid, passed=passed, text=_tail("\n".join(texts)))
