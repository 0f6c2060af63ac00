"""Engine — our own CPU kernels as MLX primitives, each with MLX's op as its fallback.

The arithmetic is the course's (week 2 day 6: `qmm.cpp`; week 3 day 6: `attention.cpp`); this
module checks arguments, builds the extension when its sources are new (`build.py`), and
chooses: the kernel on a CPU stream, MLX's own op on a GPU stream, when the extension could
not be built, when it is turned off (`TINY_LLM_KERNELS=0`, `--no-kernels`, `enable(False)`),
and, for the engine, while the day that writes it is not done.

    y = kernels.quantized_matmul(x, w, scales, biases, group_size=32, bits=4)  # x @ W.T
    y = kernels.matmul(x, w)                                                  # x @ w.T
    o = kernels.paged_attention(q, keys, values, pages, starts, page_size=16, scale=0.125)
    o = kernels.dense_attention(q, cache.keys, cache.values, start=cache.offset - L, scale=0.125)

Tests: tests/test_kernels.py, tests/test_progress.py, tests/test_week2_day6.py
"""

import contextlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType

import mlx.core as mx

from ..progress import implemented

GROUP_SIZES = (32, 64, 128)
BITS = (4, 8)
FLOATS = (mx.float32, mx.float16, mx.bfloat16)

_enabled = os.environ.get("TINY_LLM_KERNELS", "1") != "0"
_ext: ModuleType | None = None
_failure: str | None = None  # why the extension is not there, once tried


def enable(on: bool) -> bool:
    """Turn the kernels on or off for this process (`--no-kernels` turns them off); returns
    whether they were on."""
    global _enabled
    before, _enabled = _enabled, bool(on)
    return before


def enabled() -> bool:
    """Whether the kernels are turned on (they may still be unbuilt: see `status`)."""
    return _enabled


def extension() -> ModuleType | None:
    """The built extension, building it first when its sources are new; None when it cannot
    be built (`status()` says why)."""
    global _ext, _failure
    if _ext is None and _failure is None:
        from . import build

        try:
            _ext = build.load(build.build())
        except (build.BuildError, ImportError, OSError) as e:
            _failure = str(e).splitlines()[0] if str(e) else type(e).__name__
    return _ext


def status() -> str:
    """One line: whether the kernels run, and if not, why."""
    if not _enabled:
        return "kernels: off (TINY_LLM_KERNELS=0 or --no-kernels): matrix products and attention run on MLX ops"
    ext = extension()
    if ext is None:
        return f"kernels: not built ({_failure}): matrix products and attention run on MLX ops"
    return f"kernels: built for {ext.simd}, {ext.num_threads()} threads, MLX {ext.mlx_version}"


def require() -> ModuleType:
    """The extension, or a RuntimeError that says why there is none."""
    if not _enabled:
        raise RuntimeError("the kernels are turned off (TINY_LLM_KERNELS=0 or --no-kernels)")
    ext = extension()
    if ext is None:
        raise RuntimeError(f"the kernels are not built: {_failure}")
    return ext


def active(day: str) -> bool:
    """True when the engine should use `day`'s kernel now: turned on, built, the default device
    a CPU, and the day's functions written."""
    if not _enabled or mx.default_device() != mx.cpu:
        return False
    ext = extension()
    return ext is not None and implemented(day, lambda: ext.probe(day))


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """Run the kernels on `n` threads inside the block (the default: the cores, or
    `$TINY_LLM_THREADS`)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"threads must be a positive integer, got {n!r}")
    ext = require()
    mx.synchronize()  # no kernel may be running on the pool being replaced
    before = ext.num_threads()
    ext.set_num_threads(n)
    try:
        yield
    finally:
        mx.synchronize()
        ext.set_num_threads(before)


# ---- the ops ---------------------------------------------------------------------------------

def _check_float(name: str, a: mx.array) -> None:
    if not isinstance(a, mx.array) or a.dtype not in FLOATS:
        got = a.dtype if isinstance(a, mx.array) else type(a).__name__
        raise ValueError(f"{name} must be a float32, float16 or bfloat16 array, got {got}")


def _check_bias(bias: mx.array | None, N: int) -> None:
    if bias is not None:
        _check_float("bias", bias)
        if bias.shape != (N,):
            raise ValueError(f"bias must have shape ({N},), got {bias.shape}")


def _kernel(op: str, stream: mx.Stream | mx.Device | None) -> ModuleType | None:
    """The extension when `op`'s kernel runs on `stream`, else None (MLX's op runs). A day not
    done raises its NotImplementedError when the op is built (the extension checks each
    day's functions once, before any graph uses them)."""
    device = stream if isinstance(stream, mx.Device) else stream.device if isinstance(stream, mx.Stream) else mx.default_device()
    if not _enabled or device != mx.cpu:
        return None
    return extension()


def quantized_matmul(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, group_size: int = 64,
                     bits: int = 4, bias: mx.array | None = None, *, stream: mx.Stream | mx.Device | None = None
                     ) -> mx.array:
    """`x [..., K] @ W.T (+ bias)` -> `[..., N]` for W `[N, K]` kept in MLX's affine format
    (`w [N, K * bits / 32]` uint32, `scales/biases [N, K / group_size]`); the same result as
    `mx.quantized_matmul(x, w, scales, biases, transpose=True, ...)`, in `x`'s dtype."""
    _check_float("x", x)
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size!r}")
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    if not isinstance(w, mx.array) or w.dtype != mx.uint32 or w.ndim != 2:
        raise ValueError(f"w must be a uint32 array [N, K * bits / 32], got {getattr(w, 'dtype', type(w).__name__)} "
                         f"{getattr(w, 'shape', '')}")
    K, (N, packed) = x.shape[-1], w.shape
    if K % group_size or packed != K * bits // 32:
        raise ValueError(f"w {w.shape} does not hold {bits}-bit rows of x's {K} features in groups of {group_size}")
    for name, a in (("scales", scales), ("biases", biases)):
        _check_float(name, a)
        if a.shape != (N, K // group_size):
            raise ValueError(f"{name} must have shape ({N}, {K // group_size}), got {a.shape}")
    if scales.dtype != biases.dtype:
        raise ValueError(f"scales and biases must have one dtype, got {scales.dtype} and {biases.dtype}")
    _check_bias(bias, N)
    if (ext := _kernel("quantized_matmul", stream)) is not None:
        return ext.quantized_matmul(x, w, scales, biases, bias, group_size, bits, stream=stream)
    y = mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=group_size, bits=bits, stream=stream)
    return y if bias is None else y + bias


def matmul(x: mx.array, w: mx.array, bias: mx.array | None = None, *,
           stream: mx.Stream | mx.Device | None = None) -> mx.array:
    """`x [..., K] @ w.T (+ bias)` -> `[..., N]` for a float `w [N, K]` (a linear layer's
    weight as stored), in `x`'s dtype."""
    _check_float("x", x)
    _check_float("w", w)
    if w.ndim != 2 or w.shape[1] != x.shape[-1]:
        raise ValueError(f"w must have shape [N, {x.shape[-1]}] (x's last axis), got {w.shape}")
    _check_bias(bias, w.shape[0])
    if (ext := _kernel("matmul", stream)) is not None:
        return ext.matmul(x, w, bias, stream=stream)
    y = mx.matmul(x, w.T.astype(x.dtype), stream=stream)
    return y if bias is None else y + bias


def paged_attention(q: mx.array, keys: mx.array, values: mx.array, pages: mx.array, starts: mx.array,
                    page_size: int, scale: float, *, stream: mx.Stream | mx.Device | None = None) -> mx.array:
    """Attention of `q [B, Hq, L, D]` over keys and values kept in a page pool
    `[slots, Hkv, D]`: row `b`'s position `s` is in slot `pages[b, s // page_size] * page_size
    + s % page_size`, and its query `i` (position `starts[b] + i`) sees positions
    `0 .. starts[b] + i`. Returns `[B, Hq, L, Dv]` in `q`'s dtype."""
    _check_float("q", q)
    for name, a in (("keys", keys), ("values", values)):
        _check_float(name, a)
        if a.ndim != 3:
            raise ValueError(f"{name} must be a pool [slots, Hkv, D], got shape {a.shape}")
    if q.ndim != 4:
        raise ValueError(f"q must have shape [B, Hq, L, D], got {q.shape}")
    B, Hq, L, D = q.shape
    if keys.shape[:2] != values.shape[:2] or keys.shape[2] != D or keys.dtype != values.dtype:
        raise ValueError(f"keys {keys.shape} {keys.dtype} and values {values.shape} {values.dtype} must be pools "
                         f"of one dtype with the same slots and heads, keys of q's {D} features")
    if Hq % keys.shape[1]:
        raise ValueError(f"the {Hq} query heads must be a multiple of the {keys.shape[1]} key/value heads")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive integer, got {page_size!r}")
    if pages.dtype != mx.int32 or pages.ndim != 2 or pages.shape[0] != B:
        raise ValueError(f"pages must be an int32 array [{B}, n], got {pages.dtype} {pages.shape}")
    if starts.dtype != mx.int32 or starts.shape != (B,):
        raise ValueError(f"starts must be an int32 array [{B}], got {starts.dtype} {starts.shape}")
    if (ext := _kernel("paged_attention", stream)) is not None:
        return ext.paged_attention(q, keys, values, pages, starts, page_size, float(scale), stream=stream)
    return _paged_attention_ops(q, keys, values, pages, starts, page_size, scale)


def dense_attention(q: mx.array, keys: mx.array, values: mx.array, start: int, scale: float, *,
                    stream: mx.Stream | mx.Device | None = None) -> mx.array:
    """Attention of `q [B, Hq, L, D]` over a KVCache's buffers `keys/values [B, Hkv, S, D]`,
    whose first `start + L` positions hold keys: query `i` sees positions `0 .. start + i`.
    Returns `[B, Hq, L, Dv]` in `q`'s dtype."""
    _check_float("q", q)
    for name, a in (("keys", keys), ("values", values)):
        _check_float(name, a)
        if a.ndim != 4 or a.shape[0] != q.shape[0] or a.shape[:3] != keys.shape[:3]:
            raise ValueError(f"{name} must be buffers [{q.shape[0]}, Hkv, S, D] like keys, got {a.shape}")
    if q.ndim != 4 or keys.shape[3] != q.shape[3] or keys.dtype != values.dtype or q.shape[1] % keys.shape[1]:
        raise ValueError(f"q {q.shape} must be [B, Hq, L, D] with Hq a multiple of the keys' heads and their D, "
                         f"keys and values of one dtype")
    if isinstance(start, bool) or not isinstance(start, int) or start < 0 or start + q.shape[2] > keys.shape[2]:
        raise ValueError(f"start must be an integer with 0 <= start and start + L <= {keys.shape[2]}, got {start!r}")
    if (ext := _kernel("dense_attention", stream)) is not None:
        return ext.dense_attention(q, keys, values, start, float(scale), stream=stream)
    n = start + q.shape[2]
    mask = mx.where(mx.arange(n)[None, :] <= start + mx.arange(q.shape[2])[:, None], 0.0, -mx.inf).astype(q.dtype)
    return mx.fast.scaled_dot_product_attention(q, keys[:, :, :n].astype(q.dtype), values[:, :, :n].astype(q.dtype),
                                                scale=scale, mask=mask)


def _paged_attention_ops(q, keys, values, pages, starts, page_size, scale):
    """The same attention on MLX ops: gather the pages, mask, `mx.fast.scaled_dot_product_attention`."""
    B, Hq, L, D = q.shape
    S = pages.shape[1] * page_size
    slots = (pages[:, :, None] * page_size + mx.arange(page_size)).reshape(B, S)  # B, S
    k = keys[slots].transpose(0, 2, 1, 3)  # B, Hkv, S, D
    v = values[slots].transpose(0, 2, 1, 3)
    query = starts[:, None, None] + mx.arange(L)[None, :, None]  # B, L, 1
    mask = mx.where(mx.arange(S)[None, None, :] <= query, 0.0, -mx.inf).astype(q.dtype)[:, None]  # B, 1, L, S
    return mx.fast.scaled_dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), scale=scale, mask=mask)


def main(argv: list[str] | None = None) -> int:
    """`python -m tiny_llm.kernels build|status`."""
    argv = sys.argv[1:] if argv is None else argv
    if argv not in (["build"], ["status"]):
        print("usage: python -m tiny_llm.kernels build|status", file=sys.stderr)
        return 2
    if argv == ["build"]:
        from . import build

        global _ext
        try:
            _ext = build.load(build.build(force=(build.build_dir() / "failed.txt").exists()))
        except (build.BuildError, ImportError, OSError) as e:
            print(f"tiny-llm: kernels not built ({str(e).splitlines()[0]}); everything runs on MLX ops",
                  file=sys.stderr)
            return 1
    print(status())
    return 0
