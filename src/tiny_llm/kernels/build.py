"""Engine — building the kernels: once per set of sources, into the cache, against the MLX installed.

The build goes to `<cache>/kernels/<key>/`, where the key is a digest of the C++ sources, the
MLX and nanobind versions, the Python and the machine. So the extension always matches the
MLX it runs with (a new MLX builds anew), a student's edit of a `.cpp` file builds anew on the
next import, and trees with the same sources (starters of different days) share one build.
A failed build leaves its reason in `failed.txt`, so later processes do not try again until
the sources change or `python -m tiny_llm.kernels build` is run.

CMake works in one folder per toolchain (`<cache>/kernels/work-<toolchain>/`): the sources
are copied there, a file rewritten only when its text changed, so a build after an edit of
one `.cpp` file (a student's, or another day's starter) compiles that file alone.

Tests: tests/test_kernels.py, tests/test_progress.py, tests/test_week2_day6.py
"""

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from types import ModuleType

import mlx.core as mx

from ..files import cache_root, locked

HERE = Path(__file__).resolve().parent
SOURCES = ("CMakeLists.txt", "kernels.h", "ops.cpp", "threads.cpp", "qmm.cpp", "step.cpp", "attention.cpp")
BUILD_TIMEOUT = 600  # seconds for configure + build


class BuildError(RuntimeError):
    """The kernels could not be built; the message is one line that says why."""


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "missing"


def _toolchain() -> str:
    """What, besides the sources, an extension is built against."""
    return (f"{mx.__version__}|{_version('nanobind')}|{sys.version}|{sys.executable}|{platform.machine()}"
            f"|{platform.system()}|{os.environ.get('TINY_LLM_PORTABLE', '')}|{os.environ.get('CXX', '')}")


def key() -> str:
    """The digest that names this build."""
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + (HERE / name).read_bytes() + b"\0")
    h.update(_toolchain().encode())
    return h.hexdigest()[:16]


def build_dir() -> Path:
    return cache_root() / "kernels" / key()


def work_dir() -> Path:
    """CMake's folder for this toolchain, kept between builds."""
    return cache_root() / "kernels" / f"work-{hashlib.sha256(_toolchain().encode()).hexdigest()[:16]}"


def _extension(folder: Path) -> Path | None:
    found = sorted(folder.glob("_ext*.so")) + sorted(folder.glob("_ext*.pyd"))
    return found[0] if found else None


def _cmake() -> str:
    """CMake 3.27 or newer: the PyPI package's (a dependency) before the system's."""
    try:
        import cmake  # the PyPI package

        path = Path(cmake.CMAKE_BIN_DIR) / "cmake"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    found = shutil.which("cmake")
    if found is None:
        raise BuildError("cmake is not installed (pip install 'cmake>=3.27')")
    return found


def build(force: bool = False, quiet: bool = False) -> Path:
    """Build the extension for the current sources (unless built already) and return its path.
    BuildError says why it could not be built."""
    out = build_dir()
    with locked(out.parent / (out.name + ".lock")):
        if (found := _extension(out)) is not None and not force:
            return found
        failed = out / "failed.txt"
        if failed.exists() and not force:
            raise BuildError(failed.read_text().strip())
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        if not quiet:
            print(f"tiny-llm: building the kernels into {out} (once for these sources)...",
                  file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            with locked(work_dir().with_suffix(".lock")):
                _run_cmake(out, work_dir())
        except BuildError as e:
            failed.write_text(str(e) + "\n")
            raise
        found = _extension(out)
        if found is None:
            message = "the build finished without an extension module"
            failed.write_text(message + "\n")
            raise BuildError(message)
        if not quiet:
            print(f"tiny-llm: kernels built in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        return found


def _stage(sources: Path) -> None:
    """Copy the sources into `sources`, leaving a file untouched when its text is the same, so
    its timestamp tells CMake it needs no new compile."""
    sources.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        text = (HERE / name).read_bytes()
        target = sources / name
        if not target.exists() or target.read_bytes() != text:
            target.write_bytes(text)


def _run_cmake(out: Path, work: Path) -> None:
    """Build in `work` (compiling only what changed since its last build) and copy the module
    into `out`. A build that fails where objects were kept is tried once more from nothing."""
    cmake = _cmake()
    sources, objects, log = work / "src", work / "build", out / "build.log"
    _stage(sources)
    steps = [
        [cmake, "-S", str(sources), "-B", str(objects), "-DCMAKE_BUILD_TYPE=Release",
         f"-DPython_EXECUTABLE={sys.executable}",
         f"-DTINY_LLM_PORTABLE={'ON' if os.environ.get('TINY_LLM_PORTABLE') else 'OFF'}"],
        [cmake, "--build", str(objects), "--parallel", str(os.cpu_count() or 1)],
    ]
    kept = objects.exists()
    failure = _run_steps(steps, log)
    if failure is not None and kept:  # objects left by a build cut short, or by another compiler
        shutil.rmtree(objects, ignore_errors=True)
        failure = _run_steps(steps, log)
    if failure is not None:
        raise BuildError(failure)
    for module in list(objects.glob("_ext*.so")) + list(objects.glob("_ext*.pyd")):
        shutil.copy2(module, out / module.name)


def _run_steps(steps: list[list[str]], log: Path) -> str | None:
    """Run the CMake steps, writing `log`; why they failed, or None."""
    with open(log, "w") as f:
        for step in steps:
            try:
                run = subprocess.run(step, stdout=f, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT)
            except (OSError, subprocess.TimeoutExpired) as e:
                return f"{Path(step[0]).name} failed: {e}"
            if run.returncode != 0:
                f.flush()
                return f"{_reason(log.read_text())} (full log: {log})"
    return None


def _reason(text: str) -> str:
    """The first line of a build log that says what went wrong."""
    for marker in ("No CMAKE_CXX_COMPILER", "CMAKE_CXX_COMPILER", "Could not find", "error:", "Error"):
        for line in text.splitlines():
            if marker in line:
                line = line.strip()
                if "No CMAKE_CXX_COMPILER" in line or "CMAKE_CXX_COMPILER" in line:
                    return "no C++ compiler found (install g++ or clang; on macOS the Xcode command-line tools)"
                return line[:300]
    return "the build failed"


def load(path: Path) -> ModuleType:
    """Import the built module (mlx.core first: the extension uses its library and types)."""
    spec = importlib.util.spec_from_file_location("tiny_llm.kernels._ext", path,
                                                  loader=importlib.machinery.ExtensionFileLoader(
                                                      "tiny_llm.kernels._ext", str(path)))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
