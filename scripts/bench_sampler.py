#!/usr/bin/env python3
"""Sampling speed: tiny-llm (make_sampler and Sampler) against mlx-lm, side by side.

    python scripts/bench_sampler.py [--quick] [--json out.json] [--vocab 151936] [--batch 1,8,32]
                                    [--rows typical,wide,flat]

Logits are float32 log-probabilities, randomly permuted per row, in one of three shapes:

- typical: Zipf(1.5) scores plus N(0, 1) noise. That matches what SmolLM2-135M-Instruct
  gives while it writes a story at temperature 1 (median over 120 positions: entropy 2.7
  nats, top token 0.41, 36 tokens in the 0.9 nucleus; this synthetic row: 2.8 nats, 0.42,
  27 tokens).
- wide: Zipf(1.25) scores plus N(0, 0.5) noise: a 0.9 nucleus of about 650-2,000 tokens.
- flat: N(0, 3) logits: a 0.9 nucleus of about 7,400 tokens (high temperature, the start
  of free text).

The "floor" rows time one MLX call alone (argmax; categorical), and the "draw" rows the
three ways to draw at temperature 0.8 alone: the engine's inverse CDF, the engine's
exponential race (`SamplingParams(draw="race")`) and week 1 day 7's race on `mx.random`
noise. The 0.9 nucleus of each shape is measured and printed. Each time is the median of
repeated, warmed-up runs, each synchronised with mx.eval. The ratio column is mlx-lm's time
divided by tiny-llm's (above 1: tiny-llm is faster).
"""

import argparse
import statistics
import sys
import time

import mlx.core as mx
from bench_common import add_run_arguments, machine_info, write_json
from mlx_lm import sample_utils as mlx_lm_sampling

from tiny_llm.sampler import (Sampler, SamplingParams, draw, make_logits_processors, make_sampler, rng,
                              sample_exponential_race)

CONFIGS = {
    # name: (make_sampler kwargs, Sampler params kwargs, repetition penalty or None)
    "greedy": (dict(temp=0.0), dict(temperature=0.0), None),
    "temperature 0.8": (dict(temp=0.8), dict(temperature=0.8), None),
    "top-k 40": (dict(temp=1.0, top_k=40), dict(top_k=40), None),
    "top-p 0.9": (dict(temp=1.0, top_p=0.9), dict(top_p=0.9), None),
    "min-p 0.05": (dict(temp=1.0, min_p=0.05), dict(min_p=0.05), None),
    # The same distribution as "temperature 0.8", drawn by the exponential race.
    "temperature 0.8 (race)": (dict(temp=0.8), dict(temperature=0.8, draw="race"), None),
    "llama.cpp chain": (dict(temp=0.8, top_k=40, top_p=0.95, min_p=0.05),
                        dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05), None),
    "chain + repetition 1.1": (dict(temp=0.8, top_k=40, top_p=0.95, min_p=0.05),
                               dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,
                                    repetition_penalty=1.1, penalty_last_n=64), 1.1),
}


ROWS = {  # shape: (Zipf exponent, noise standard deviation, description)
    "typical": (1.5, 1.0, "Zipf(1.5) + N(0, 1) scores"),
    "wide": (1.25, 0.5, "Zipf(1.25) + N(0, 0.5) scores"),
    "flat": (0.0, 3.0, "N(0, 3) logits"),
}


def model_like_logprobs(B: int, V: int, seed: int = 0, rows: str = "typical") -> mx.array:
    """Rows of the shape `rows` (see ROWS): a few tokens carry most of the mass and a long
    tail the rest (typical), a power law with a wide nucleus, or normal noise (flat)."""
    exponent, noise, _ = ROWS[rows]
    key = mx.random.key(seed)
    k1, k2 = mx.random.split(key)
    ranks = mx.arange(1, V + 1, dtype=mx.float32)
    scores = -exponent * mx.log(ranks) + noise * mx.random.normal((B, V), key=k1)
    perm = mx.argsort(mx.random.uniform(shape=(B, V), key=k2), axis=-1)
    logits = mx.take_along_axis(scores, perm, axis=-1)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def nucleus_sizes(x: mx.array, p: float = 0.9) -> list[int]:
    """The number of tokens in each row's top-p nucleus (by a full sort)."""
    probs = -mx.sort(-mx.exp(x), axis=-1)
    before = mx.cumsum(probs, axis=-1) - probs
    return mx.sum(before < p, axis=-1).tolist()


def timed(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        mx.eval(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def bench(B: int, V: int, repeats: int, shape: str = "typical", configs=tuple(CONFIGS)) -> list[dict]:
    x = model_like_logprobs(B, V, rows=shape)
    history = [list(range(r, r + 64)) for r in range(B)]
    history_array = mx.array(history)
    mx.eval(x, history_array)
    rows = []
    floor_argmax = timed(lambda: mx.argmax(x, axis=-1), repeats)
    floor_cat = timed(lambda: mx.random.categorical(x), repeats)
    rows.append(dict(config="floor: argmax", rows=shape, B=B, tiny_make_sampler=floor_argmax))
    rows.append(dict(config="floor: categorical", rows=shape, B=B, tiny_make_sampler=floor_cat))
    # The three ways to draw one token per row at temperature 0.8, alone: the engine's
    # inverse CDF and its exponential race (both from the rows' counter-based uniforms), and
    # week 1 day 7's race on mx.random's noise.
    seeds, counters = mx.arange(B, dtype=mx.uint32), mx.zeros((B,), dtype=mx.uint32)
    u, h = rng.uniform(seeds, counters, rng.DRAW), rng.bits(seeds, counters, rng.DRAW)
    t = mx.full((B,), 0.8)
    for name, fn in (("draw: inverse CDF", lambda: draw.draw(x / 0.8, u)), ("draw: race", lambda: draw.race(x / 0.8, h)),
                     ("draw: race, week 1 day 7", lambda: sample_exponential_race(x, t))):
        rows.append(dict(config=name, rows=shape, B=B, tiny_make_sampler=timed(fn, repeats)))
    for name, (ms_kwargs, params_kwargs, rep) in ((n, CONFIGS[n]) for n in configs):
        ours_fn = make_sampler(**ms_kwargs)
        ref_fn = mlx_lm_sampling.make_sampler(**ms_kwargs)
        ours_proc = make_logits_processors(repetition_penalty=rep, repetition_context_size=64) if rep else []
        ref_proc = mlx_lm_sampling.make_logits_processors(repetition_penalty=rep, repetition_context_size=64) if rep else []
        engine = Sampler(SamplingParams(seed=1, **params_kwargs))

        def run(fn, procs, tokens):
            logits = x
            for p in procs:
                logits = p(tokens, logits)
            return fn(logits)

        # mlx-lm's processors apply one shared history to all rows; give them row 0's.
        t_ours = timed(lambda: run(ours_fn, ours_proc, history_array[0]), repeats)
        t_ref = timed(lambda: run(ref_fn, ref_proc, history_array[0]), repeats)
        t_engine = timed(lambda: engine.sample(x, history), repeats)
        rows.append(dict(config=name, rows=shape, B=B, tiny_make_sampler=t_ours, tiny_sampler=t_engine, mlx_lm=t_ref,
                         ratio_make_sampler=t_ref / t_ours, ratio_sampler=t_ref / t_engine,
                         vs_categorical=t_engine / floor_cat))
    return rows


def print_row(row: dict) -> None:
    if "mlx_lm" in row:
        print(f"{row['config']:24s} {row['B']:3d} {row['tiny_make_sampler']:10.2f} ms {row['tiny_sampler']:6.2f} ms "
              f"{row['mlx_lm']:6.2f} ms {row['ratio_make_sampler']:10.2f}x {row['ratio_sampler']:13.2f}x "
              f"{row['vs_categorical']:18.2f}x", flush=True)
    else:
        print(f"{row['config']:24s} {row['B']:3d} {row['tiny_make_sampler']:10.2f} ms", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark sampling: tiny-llm vs mlx-lm.")
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--batch", default="1,8,32")
    parser.add_argument("--rows", default="typical", help="row shapes, comma-separated: " + ", ".join(ROWS))
    parser.add_argument("--configs", default=",".join(CONFIGS), help="configurations, comma-separated (default all)")
    add_run_arguments(parser, repeats=7, quick="small vocabulary and batch, 2 repeats (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.vocab, args.batch, args.repeats = 4096, "1,4", 2
    batches = [int(b) for b in args.batch.split(",")]
    shapes = [r.strip() for r in args.rows.split(",")]
    bad = [r for r in shapes if r not in ROWS]
    if bad:
        parser.error(f"--rows: unknown shape {bad[0]!r}; choose from {', '.join(ROWS)}")
    configs = [c.strip() for c in args.configs.split(",")]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        parser.error(f"--configs: unknown configuration {bad[0]!r}; choose from {', '.join(CONFIGS)}")
    info = machine_info(vocab=args.vocab, repeats=args.repeats,
                        logits={r: ROWS[r][2] + ", permuted, normalised to log-probabilities" for r in shapes})
    print(f"MLX {info['mlx']} on {info['device']} ({info['machine']}), V = {args.vocab}, "
          f"median of {args.repeats} runs")
    print(f"{'configuration':24s} {'B':>3s} {'make_sampler':>13s} {'Sampler':>9s} {'mlx-lm':>9s} "
          f"{'mlx-lm/make':>11s} {'mlx-lm/Sampler':>14s} {'Sampler/categorical':>19s}")
    results = []
    for shape in shapes:
        sizes = nucleus_sizes(model_like_logprobs(8, args.vocab, rows=shape))
        print(f"rows: {shape} ({ROWS[shape][2]}); 0.9 nucleus of 8 rows: {min(sizes)}-{max(sizes)} tokens, "
              f"median {sorted(sizes)[len(sizes) // 2]}")
        for B in batches:
            for row in bench(B, args.vocab, args.repeats, shape, configs):
                results.append(row)
                print_row(row)
    write_json(args.json, info=info, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
