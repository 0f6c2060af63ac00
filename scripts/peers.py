#!/usr/bin/env python3
"""llama.cpp as a peer in the benchmarks: built once from source into the cache folder.

    python scripts/peers.py build      # llama-bench, llama-batched-bench, llama-server
    python scripts/peers.py where      # the folder of the built programs, or why there is none

The source is llama.cpp as vendored by the `llama-cpp-python` source distribution on PyPI
(the one registry this project reaches); the version is pinned below, so every machine
measures the same llama.cpp. The build takes ~8 minutes on 2 cores and lands in
`<cache>/peers/llama.cpp-<version>/bin` (`<cache>`: `$TINY_LLM_CACHE` or
`~/.cache/tiny-llm`). Optional: nothing in `make test` or `.ci/run` needs it; a failed
build is one line and a non-zero exit.
"""

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"  # the llama-cpp-python sdist whose vendored llama.cpp we build
TARGETS = ("llama-bench", "llama-batched-bench", "llama-server")


def cache_root() -> Path:
    if "TINY_LLM_CACHE" in os.environ:
        return Path(os.environ["TINY_LLM_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tiny-llm"


def bin_dir() -> Path:
    return cache_root() / "peers" / f"llama.cpp-{LLAMA_CPP_PYTHON}" / "bin"


def built() -> Path | None:
    """The folder holding every target, or None when they are not all built."""
    d = bin_dir()
    return d if all((d / t).is_file() for t in TARGETS) else None


class BuildError(RuntimeError):
    pass


def _run(cmd: list[str], log, cwd: Path | None = None) -> None:
    print("+", " ".join(cmd), file=log, flush=True)
    if subprocess.run(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT).returncode:
        raise BuildError(f"{cmd[0]} {cmd[1] if len(cmd) > 1 else ''} failed")


def build() -> Path:
    """Build the targets unless they are there; returns their folder."""
    if (d := built()) is not None:
        return d
    if not shutil.which("cmake") and not (Path(sys.executable).parent / "cmake").exists():
        raise BuildError("no cmake")
    cmake = shutil.which("cmake", path=str(Path(sys.executable).parent)) or shutil.which("cmake")
    root = bin_dir().parent
    root.mkdir(parents=True, exist_ok=True)
    log_path = root / "build.log"
    with open(log_path, "w") as log, tempfile.TemporaryDirectory() as tmp:
        try:
            _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", tmp,
                  f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], log)
            archive = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
            src = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
            build_dir = Path(tmp) / "build"
            _run([cmake, "-S", str(src), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
                  "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF"], log)
            _run([cmake, "--build", str(build_dir), "-j", str(os.cpu_count() or 2), "--target", *TARGETS], log)
        except (BuildError, StopIteration, OSError, tarfile.TarError) as e:
            raise BuildError(f"{e or type(e).__name__} (log: {log_path})") from None
        bin_dir().mkdir(parents=True, exist_ok=True)
        for t in TARGETS:
            shutil.copy2(build_dir / "bin" / t, bin_dir() / t)
    return bin_dir()


def main(argv: list[str]) -> int:
    if argv not in (["build"], ["where"]):
        print("usage: python scripts/peers.py build|where", file=sys.stderr)
        return 2
    if argv == ["where"]:
        d = built()
        print(d if d else f"llama.cpp is not built: run `python scripts/peers.py build` ({bin_dir()})")
        return 0 if d else 1
    try:
        print(build())
    except BuildError as e:
        print(f"llama.cpp not built: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
