"""Which course days' solution code each test file runs, recorded while the tests run.

With `TINY_LLM_DAY_HITS=DIR` in the environment, `tiny_llm`'s modules are imported with a
call in front of every `# BEGIN SOLUTION weekW-dayD` region (on the marker's own line, so
line numbers do not move), and each call notes the day under the test file running at the
time (during a fixture's set-up: under the fixture, and so under every test that uses it).
A Python process a test starts (a server, the command line, `mlx.launch`'s ranks) records
under the same test or fixture (`day_hits_site/sitecustomize.py` on its PYTHONPATH), writing
each day down as soon as it runs, since tests may kill it. The kernels' C++ days count at each
call of an op that may run their code. Each process writes `DIR/hits-<pid>.json` (or
`child-<pid>.json`); `load` reads them all back as test file -> days. A test that forks, or
starts a process on this tree's sources outside the record, is "unknown": it may run anything. `scripts/check_course.py --hits DIR`
skips the runs that these records prove cannot fail: a file that never runs a day's code
behaves the same whether or not that day is stubbed. The fingerprint (of the package's and
the tests' sources) ties the records to the tree they came from.

Without the variable nothing here does anything.
"""

import hashlib
import importlib.abc
import importlib.machinery
import json
import marshal
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = "TINY_LLM_DAY_HITS"
OWNER = "TINY_LLM_DAY_HITS_OWNER"  # in a process a test started: the test file or fixture
SITE = str(Path(__file__).resolve().parent / "day_hits_site")
BEGIN = re.compile(r"^(?P<indent>[ \t]*)# BEGIN SOLUTION (?P<day>week\d+-day\d+)[ \t]*$", re.M)
HIT = "__day_hit__"
CHECKS = ("ensure", "day_done", "probe")  # the kernels' functions that check a day given as argument


def fingerprint(root: Path = ROOT) -> str:
    """A digest of the package's Python sources and the tests: records of another tree do not count."""
    digest = hashlib.sha256()
    for path in sorted([*(root / "src" / "tiny_llm").rglob("*.py"), *(root / "tests").rglob("*.py")]):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def instrument(source: str) -> str:
    """`source` with `__day_hit__("weekW-dayD")` before each region's marker, on its line."""
    return BEGIN.sub(lambda m: f'{m["indent"]}{HIT}("{m["day"]}")  # BEGIN SOLUTION {m["day"]}', source)


class _Loader(importlib.machinery.SourceFileLoader):
    """Compiles the instrumented source (never from or to a cached .pyc)."""

    def get_code(self, fullname):
        data = self.get_data(self.path)
        # Compiled once per source for all the processes of a run (children import the package anew).
        cached = Path(os.environ[ENV]) / ".code" / f"{hashlib.sha256(self.path.encode() + data).hexdigest()}.bin"
        try:
            return marshal.loads(cached.read_bytes())
        except (OSError, ValueError, EOFError):
            code = compile(instrument(data.decode("utf-8")), self.path, "exec", dont_inherit=True)
        cached.parent.mkdir(parents=True, exist_ok=True)
        part = cached.with_suffix(f".{os.getpid()}")
        part.write_bytes(marshal.dumps(code))
        part.replace(cached)
        return code

    def exec_module(self, module):
        module.__dict__[HIT] = _record
        super().exec_module(module)
        if module.__name__ == "tiny_llm.kernels":  # the C++ days' code runs behind the extension
            module.extension = _reaching(module.extension)


def op_days(root: Path = ROOT) -> dict[str, set[str]]:
    """The kernels' ops (`m.def("name", &function, ...)`) -> the C++ days whose code each may
    run: the days a function checks (`ensure`, `day_done`), also through the functions and
    classes it names."""
    chunks: dict[str, str] = {}
    defs: dict[str, str] = {}
    for path in sorted((root / "src" / "tiny_llm" / "kernels").glob("*.cpp")):
        text = path.read_text()
        defs.update(re.findall(r'm\.def\("(\w+)",\s*&(\w+)', text))
        name = None
        for line in text.splitlines():
            top = re.match(r"(?:class|struct)\s+(\w+)|[A-Za-z_][\w:<>,\s*&]*?\b(\w+)\(", line)
            if top and not line[:1].isspace() and not line.startswith(("//", "#", "}")):
                name = top[1] or top[2]
            if name:
                chunks[name] = chunks.get(name, "") + line + "\n"
    days = {n: set(re.findall(r'(?:ensure|day_done)\("(week\d+-day\d+)"\)', t)) for n, t in chunks.items()}
    changed = True
    while changed:  # through the functions and classes a chunk names
        changed = False
        for n, t in chunks.items():
            for other, d in days.items():
                if other not in CHECKS and other != n and d and not d <= days[n] and re.search(rf"\b{other}\b", t):
                    days[n] |= d
                    changed = True
    return {op: days.get(function, set()) for op, function in defs.items()}


def _reaching(extension):
    """`extension` whose built module notes, at each call of an op, the C++ days it may run."""
    ops = op_days()

    def reached(*args, **kwargs):
        ext = extension(*args, **kwargs)
        if ext is not None and not getattr(ext, "_day_hits", False):
            for op, days in ops.items():
                if hasattr(ext, op):
                    setattr(ext, op, _noting(getattr(ext, op), days, op == "probe"))
            ext._day_hits = True
        return ext

    return reached


def _noting(op, days: set[str], by_argument: bool):
    def noted(*args, **kwargs):
        for day in ([args[0] if args else kwargs.get("day")] if by_argument else days):
            _record(day)
        return op(*args, **kwargs)

    return noted


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "tiny_llm" and not fullname.startswith("tiny_llm."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not str(spec.origin).endswith(".py"):
            return spec
        spec.loader = _Loader(fullname, spec.origin)
        return spec


_lock = threading.Lock()
_owners: list[str] = []  # the test file or fixture running now (innermost last)
_hits: dict[str, set[str]] = {}
_unknown: set[str] = set()
_late = False  # tiny_llm was imported before the hook: nothing recorded can be trusted


_child = False  # a process a test started: each day is written down at once (it may be killed)


def _record(day: str) -> None:
    owner = _owners[-1] if _owners else None
    if owner is None:
        return
    with _lock:
        new = day not in _hits.setdefault(owner, set())
        _hits[owner].add(day)
        if new and _child:
            try:
                _write({"owners": {o: sorted(d) for o, d in _hits.items()}}, f"child-{os.getpid()}")
            except OSError:  # the record is lost, never the work: the owner becomes unknown
                _unknown.add(owner)


def _write(record: dict, name: str) -> None:
    folder = Path(os.environ[ENV])
    folder.mkdir(parents=True, exist_ok=True)
    record = {"fingerprint": _fingerprint(), "late": _late, **record}
    part = folder / f".{name}.json.part"
    part.write_text(json.dumps(record, indent=1))
    part.replace(folder / f"{name}.json")


_print = None


def _fingerprint() -> str:
    global _print
    _print = _print or fingerprint()
    return _print


def _popen_init(original):
    """`subprocess.Popen.__init__` that starts a Python child recording under the current
    owner (tests/day_hits_site/sitecustomize.py). A child given an environment without this
    run's record folder (a command's clean environment) is left as it is: unless that
    environment puts this tree's sources on its path, the child imports the installed
    package, which a course check's stubs never change, so it cannot tell them apart. One
    that does, or an environment given by position, makes the owner unknown."""
    def init(self, args, *rest, **kwargs):
        if _owners:
            given = kwargs.get("env")
            if len(rest) >= 10 or (given is not None and given.get(ENV) != os.environ[ENV] and _sees_tree(given)):
                _unknown.add(_owners[-1])
            elif given is None or given.get(ENV) == os.environ[ENV]:
                env = dict(os.environ if given is None else given)
                env[OWNER] = _owners[-1]
                env["PYTHONPATH"] = os.pathsep.join(p for p in (SITE, env.get("PYTHONPATH")) if p)
                kwargs["env"] = env
        return original(self, args, *rest, **kwargs)

    return init


def _sees_tree(env) -> bool:
    """Whether `env`'s PYTHONPATH reaches into this tree (its own sources, not the installed package)."""
    return any(p and Path(p).resolve().is_relative_to(ROOT) for p in env.get("PYTHONPATH", "").split(os.pathsep))


def _unknowing(original):
    """A way of starting a process whose records are lost (a fork): the owner is unknown."""
    def started(*args, **kwargs):
        if _owners:
            _unknown.add(_owners[-1])
        return original(*args, **kwargs)

    return started


def install() -> bool:
    """Start recording (once, before `tiny_llm` is imported) when the variable asks for it."""
    global _late
    if not os.environ.get(ENV) or any(isinstance(f, _Finder) for f in sys.meta_path):
        return False
    _late = any(m == "tiny_llm" or m.startswith("tiny_llm.") for m in sys.modules)
    sys.meta_path.insert(0, _Finder())
    subprocess.Popen.__init__ = _popen_init(subprocess.Popen.__init__)
    os.fork = _unknowing(os.fork)
    os.posix_spawn = _unknowing(os.posix_spawn)
    return True


def install_child() -> None:
    """In a process a test started: record everything under the owner that started it."""
    global _child
    if install():
        _child = True
        _owners.append(os.environ[OWNER])
        _fingerprint()  # now, not in the middle of the work it records


def _file_of(item) -> str:
    path = Path(str(item.path)).resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


# ---- pytest hooks (tests/conftest.py imports them) ------------------------------------------

_uses: dict[str, set[str]] = {}  # test file -> the fixtures its tests use


def pytest_configure(config):  # also as a plugin of its own: `pytest -p day_hits`
    install()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not os.environ.get(ENV):
        yield
        return
    file = _file_of(item)
    _uses.setdefault(file, set()).update(item.fixturenames)
    _owners.append(file)
    try:
        yield
    finally:
        _owners.pop()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if not os.environ.get(ENV):
        yield
        return
    _owners.append(f"fixture:{fixturedef.argname}")
    try:
        yield
    finally:
        _owners.pop()


def pytest_sessionfinish(session, exitstatus):
    folder = os.environ.get(ENV)
    if not folder:
        return
    _write({"owners": {o: sorted(d) for o, d in _hits.items()}, "unknown": sorted(_unknown),
            "uses": {file: sorted({file, *(f"fixture:{name}" for name in fixtures)}) for file, fixtures in _uses.items()}},
           f"hits-{os.getpid()}")


def load(folder: Path, root: Path = ROOT) -> dict[str, set[str] | None] | None:
    """Test file -> the days whose code its tests ran (None: not known), from every record in
    `folder`; None when there is none, or one is of another tree."""
    records = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))]
    if not any("uses" in r for r in records):
        return None
    if any(r["fingerprint"] != fingerprint(root) or r["late"] for r in records):
        return None
    ran: dict[str, set[str]] = {}
    for r in records:
        for owner, days in r["owners"].items():
            ran.setdefault(owner, set()).update(days)
    unknown = {o for r in records for o in r.get("unknown", ())}
    files: dict[str, set[str] | None] = {}
    for r in records:
        for file, owners in r.get("uses", {}).items():
            if files.get(file, set()) is None or unknown & set(owners):
                files[file] = None
            else:
                files[file] = files.get(file, set()).union(*(ran.get(o, set()) for o in owners))
    return files
