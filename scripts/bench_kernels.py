#!/usr/bin/env python3
"""Our own CPU kernels against MLX's ops, with this machine's roof beside them.

    python scripts/bench_kernels.py [--quick] [--m 1,8,64,512] [--repeats 20] [--json out.json]

(`make bench-kernels` runs it with the defaults.) Rows:

- 4-bit and 8-bit products (group 32, float32 activations: MLX's faster case on the CPU) and
  the float32 product, at the default model's shapes (576 -> 1536, 1536 -> 576, and the tied head
  576 -> 49,152) for each M: tiny-llm's kernel, MLX's op (`mx.quantized_matmul`, `mx.matmul`),
  and numpy's float32 matmul on the same shape (its bundled OpenBLAS: the roof a tuned kernel
  reaches here). GFLOP/s = 2 M K N / time. Then the default model's own case, float16
  activations and scales ("4-bit f16"), at M <= 8.
- Memory: the bytes a product must read (packed weights, scales, biases, activations) per
  second, against numpy's copy of a 512 MB array (read + written bytes per second): at M = 1
  a product is memory-bound, so that copy is its roof (the tied head, 576 -> 49,152, is the
  one whose weights do not stay in the caches).
- Attention over pages (the default model's 9 query / 3 key-value heads of 64, pages of 16):
  decode of 1 row and 8 rows of 512 positions, and a 128-position prefill chunk after 384;
  tiny-llm's kernel reading the pages in place against MLX's gather + fused attention.

Times are medians of --repeats runs after a warm-up (fewer, at least one, where they would
take over 10 s: MLX's op on the largest shapes), each `mx.eval` of one op (so MLX's per-op
cost, ~0.05 ms here, is in every number, ours too); numpy's threads are its own.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from bench_common import add_run_arguments, machine_info, write_json  # noqa: E402

from tiny_llm import kernels  # noqa: E402

SHAPES = [(576, 1536), (1536, 576), (576, 49152)]  # (K, N): an MLP projection, its way back, the tied head


def median_ms(f, repeats: int, budget: float = 10.0) -> float:
    """The median of `repeats` timed runs after a warm-up; fewer runs (at least one) when
    they would take more than `budget` seconds (MLX's op on the largest shapes)."""
    start = time.perf_counter()
    mx.eval(f())
    first = time.perf_counter() - start
    times = []
    for _ in range(max(1, min(repeats, int(budget / max(first, 1e-9))))):
        start = time.perf_counter()
        mx.eval(f())
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def numpy_ms(a: np.ndarray, b: np.ndarray, repeats: int) -> float:
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def copy_gbs(repeats: int) -> float:
    """Read + written bytes per second of a 512 MB copy (numpy's, the fastest one here)."""
    a = np.ones(128 << 20, dtype=np.float32)
    b = np.empty_like(a)
    times = []
    for _ in range(max(3, repeats // 2)):
        start = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - start)
    return 2 * a.nbytes / statistics.median(times) / 1e9


def products(ms_list: list[int], repeats: int, rows: list[dict]) -> None:
    key = mx.random.key(0)
    for K, N in SHAPES:
        w = mx.random.normal((N, K), key=key) * 0.02
        w_np = np.array(w).T.copy()
        for bits in (4, 8):
            packed, scales, biases = mx.quantize(w, group_size=32, bits=bits)
            weight_bytes = packed.nbytes + scales.nbytes + biases.nbytes
            for M in ms_list:
                x = mx.random.normal((M, K), key=mx.random.key(M))
                ours = median_ms(lambda: kernels.quantized_matmul(x, packed, scales, biases, 32, bits), repeats)
                mlx = median_ms(lambda: mx.quantized_matmul(x, packed, scales, biases, transpose=True,
                                                            group_size=32, bits=bits), repeats)
                roof = numpy_ms(np.array(x), w_np, repeats)
                rows.append(dict(op=f"{bits}-bit", M=M, K=K, N=N, ours_ms=ours, mlx_ms=mlx, numpy_ms=roof,
                                 bytes=weight_bytes + x.nbytes))
        for M in ms_list:
            x = mx.random.normal((M, K), key=mx.random.key(M))
            ours = median_ms(lambda: kernels.matmul(x, w), repeats)
            mlx = median_ms(lambda: x @ w.T, repeats)
            roof = numpy_ms(np.array(x), w_np, repeats)
            rows.append(dict(op="float32", M=M, K=K, N=N, ours_ms=ours, mlx_ms=mlx, numpy_ms=roof,
                             bytes=w.nbytes + x.nbytes))
    # The default model's own case: float16 activations and scales. MLX's CPU op is far slower
    # in float16 than in float32, so only the small M are timed for it.
    K, N = SHAPES[0]
    packed, scales, biases = mx.quantize(mx.random.normal((N, K), key=key) * 0.02, group_size=32, bits=4)
    scales, biases = scales.astype(mx.float16), biases.astype(mx.float16)
    for M in [m for m in ms_list if m <= 8]:
        x = mx.random.normal((M, K), key=mx.random.key(M)).astype(mx.float16)
        ours = median_ms(lambda: kernels.quantized_matmul(x, packed, scales, biases, 32, 4), repeats)
        mlx = median_ms(lambda: mx.quantized_matmul(x, packed, scales, biases, transpose=True, group_size=32, bits=4),
                        repeats)
        roof = numpy_ms(np.array(x.astype(mx.float32)), np.zeros((K, N), dtype=np.float32), repeats)
        rows.append(dict(op="4-bit f16", M=M, K=K, N=N, ours_ms=ours, mlx_ms=mlx, numpy_ms=roof,
                         bytes=packed.nbytes + scales.nbytes + biases.nbytes + x.nbytes))


def attention(repeats: int, rows: list[dict]) -> None:
    Hq, Hkv, D, P = 9, 3, 64, 16
    for name, B, L, start in (("decode, 1 row of 512", 1, 1, 511), ("decode, 8 rows of 512", 8, 1, 511),
                              ("prefill 128 after 384", 1, 128, 384)):
        n = -(-(start + L) // P)
        pages = mx.array(np.random.default_rng(0).permutation(B * n).reshape(B, n).astype(np.int32))
        keys = mx.random.normal((B * n * P, Hkv, D), key=mx.random.key(1)).astype(mx.float16)
        values = mx.random.normal((B * n * P, Hkv, D), key=mx.random.key(2)).astype(mx.float16)
        q = mx.random.normal((B, Hq, L, D), key=mx.random.key(3)).astype(mx.float16)
        starts = mx.array([start] * B, dtype=mx.int32)
        ours = median_ms(lambda: kernels.paged_attention(q, keys, values, pages, starts, P, 0.125), repeats)
        mlx = median_ms(lambda: kernels._paged_attention_ops(q, keys, values, pages, starts, P, 0.125), repeats)
        rows.append(dict(op="paged attention", case=name, ours_ms=ours, mlx_ms=mlx))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--m", default="1,8,64,512", help="rows of activations (default 1,8,64,512)")
    add_run_arguments(parser, repeats=20, quick="one shape, M = 1 and 64, 3 runs: proves the script runs")
    args = parser.parse_args()
    ms_list = [int(m) for m in args.m.split(",")]
    if args.quick:
        global SHAPES
        SHAPES, ms_list, args.repeats = SHAPES[:1], [1, 64], 3
    print(kernels.status())
    kernels.require()
    bandwidth = copy_gbs(args.repeats)
    rows: list[dict] = []
    products(ms_list, args.repeats, rows)
    attention(args.repeats, rows)
    info = machine_info(kernels=kernels.status(), copy_gbs=bandwidth)
    print(f"{info['processor']}, {info['cpu_count']} cores, MLX {info['mlx']}; copy of 512 MB: {bandwidth:.1f} GB/s")
    print(f"{'op':9s} {'M':>4s} {'K':>5s} {'N':>6s} | {'ours ms':>8s} {'GFLOP/s':>8s} {'GB/s':>6s} | "
          f"{'MLX ms':>9s} {'GFLOP/s':>8s} | {'numpy f32':>9s} {'GFLOP/s':>8s} | ours/MLX  ours/numpy")
    for r in rows:
        if r["op"] == "paged attention":
            continue
        flop = 2 * r["M"] * r["K"] * r["N"]
        r.update(ours_gflops=flop / r["ours_ms"] / 1e6, mlx_gflops=flop / r["mlx_ms"] / 1e6,
                 numpy_gflops=flop / r["numpy_ms"] / 1e6, ours_gbs=r["bytes"] / r["ours_ms"] / 1e6)
        print(f"{r['op']:9s} {r['M']:4d} {r['K']:5d} {r['N']:6d} | {r['ours_ms']:8.3f} {r['ours_gflops']:8.1f} "
              f"{r['ours_gbs']:6.1f} | {r['mlx_ms']:9.3f} {r['mlx_gflops']:8.1f} | {r['numpy_ms']:9.3f} "
              f"{r['numpy_gflops']:8.1f} | {r['mlx_ms'] / r['ours_ms']:7.1f}x  {r['ours_gflops'] / r['numpy_gflops']:8.0%}")
    print(f"\n{'attention over pages':24s} | {'ours ms':>8s} | {'gather + MLX ms':>15s} | speed-up")
    for r in rows:
        if r["op"] == "paged attention":
            print(f"{r['case']:24s} | {r['ours_ms']:8.3f} | {r['mlx_ms']:15.3f} | {r['mlx_ms'] / r['ours_ms']:7.1f}x")
    write_json(args.json, machine=info, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
