#!/usr/bin/env python3
"""A change against an earlier commit, interleaved in one process: sampling and decoding.

    python scripts/bench_before_after.py --before 088dbe7 [--repeats 31] [--batch 1,8,32]
                                         [--decode-tokens 24] [--decode-runs 5] [--quick] [--json out.json]

For a change that should not alter speed (a refactor), two benchmark runs made minutes apart
are not enough on a shared machine: its speed drifts by more than the change could. This
script imports the package of `--before` (extracted with `git archive` into a temporary
directory, as `tiny_llm_before`) beside the working tree's `tiny_llm`, gives both the same
inputs and alternates the calls (before/after, then after/before, ...), so drift hits both
alike. It prints the medians, after ÷ before (below 1: the change is faster), and whether
both drew the same tokens.

Sampling: `Sampler([SamplingParams(seed=row, ...)])` on `scripts/bench_sampler.py`'s Zipf
rows with a history of 64 tokens per row. Decoding: `stream_generate` on the default model
(4-bit) with a chat prompt and the end-of-sequence token excluded, once with a greedy
sampler and once through the sampling engine.
"""

import argparse
import importlib
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import mlx.core as mx
from bench_common import add_run_arguments, machine_info, write_json
from bench_sampler import CONFIGS, model_like_logprobs

ROOT = Path(__file__).resolve().parent.parent


def extract(rev: str, into: Path) -> None:
    """`src/tiny_llm` of commit `rev` as the package `tiny_llm_before` in `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src/tiny_llm"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    (into / "src" / "tiny_llm").rename(into / "tiny_llm_before")
    sys.path.insert(0, str(into))


def interleaved(calls: dict, repeats: int, warmup: int = 2) -> tuple[dict, dict]:
    """Median seconds of each of `calls` (name -> function returning something to evaluate),
    the calls alternating in order; and every call's results, by name."""
    for fn in calls.values():
        for _ in range(warmup):
            mx.eval(fn())
    times, results = {k: [] for k in calls}, {k: [] for k in calls}
    names = list(calls)
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            out = calls[name]()
            mx.eval(out)
            times[name].append(time.perf_counter() - start)
            results[name].append(out.tolist() if isinstance(out, mx.array) else out)
    return {k: statistics.median(v) for k, v in times.items()}, results


def bench_sampling(before, after, batches: list[int], V: int, repeats: int) -> list[dict]:
    rows = []
    print(f"sampling: V = {V}, median of {repeats} interleaved calls each")
    print(f"{'configuration':24s} {'B':>3s} {'before':>10s} {'after':>10s} {'after/before':>13s}  same tokens")
    for B in batches:
        x = model_like_logprobs(B, V)
        mx.eval(x)
        history = [list(range(r, r + 64)) for r in range(B)]
        for name, (_, kwargs, _) in CONFIGS.items():
            try:
                samplers = {side: mod.Sampler([mod.SamplingParams(seed=r, **kwargs) for r in range(B)])
                            for side, mod in (("before", before), ("after", after))}
            except TypeError as e:  # a parameter the earlier commit does not have yet
                print(f"{name:24s} {B:3d} {'':>31s}  (not comparable: {e})", flush=True)
                continue
            med, results = interleaved({side: (lambda s=s: s.sample(x, history)) for side, s in samplers.items()},
                                       repeats)
            same = results["before"] == results["after"]
            ratio = med["after"] / med["before"]
            print(f"{name:24s} {B:3d} {med['before'] * 1e3:8.2f}ms {med['after'] * 1e3:8.2f}ms {ratio:12.2f}x  "
                  f"{same}", flush=True)
            rows.append(dict(config=name, B=B, before_ms=med["before"] * 1e3, after_ms=med["after"] * 1e3,
                             ratio=ratio, same_tokens=same))
    return rows


def bench_decoding(before_generate, after_generate, after, tokens: int, runs: int) -> list[dict]:
    model, tokenizer = after.load("default")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Write a short story about a lighthouse keeper."}])
    eos = tokenizer.eos_token_ids
    mask = mx.array([-float("inf") if t in eos else 0.0 for t in range(model.args.vocab_size)])
    sampling = dict(temperature=0.7, top_k=40, top_p=0.95, seed=1, logit_bias={t: -float("inf") for t in eos})

    def rate(module, **kwargs) -> tuple[float, list[int]]:
        stamps, out = [], []
        for r in module.stream_generate(model, tokenizer, prompt, tokens, **kwargs):
            stamps.append(time.perf_counter())
            out.append(r.token)
        return (len(stamps) - 1) / (stamps[-1] - stamps[0]), out

    paths = {
        "stream_generate(sampler=greedy)": lambda module, params: rate(
            module, logits_processors=[lambda _tokens, logits: logits + mask]),
        "stream_generate(params=SamplingParams(temperature=0.7, top_k=40, top_p=0.95, seed=1))": lambda module, params: rate(
            module, params=params.SamplingParams(**sampling)),
        "stream_generate(params=SamplingParams(temperature=0)) (tiny-llm generate's default)": lambda module, params: rate(
            module, params=params.SamplingParams(temperature=0.0, logit_bias=sampling["logit_bias"])),
    }
    sides = {"before": (before_generate, importlib.import_module("tiny_llm_before.sampler")),
             "after": (after_generate, importlib.import_module("tiny_llm.sampler"))}
    print(f"decoding: the default model, {tokens} new tokens, median of {runs} interleaved runs")
    rows = []
    for label, run in paths.items():
        for module, params in sides.values():
            run(module, params)  # warm-up
        rates, outs = {k: [] for k in sides}, {k: [] for k in sides}
        for r in range(runs):
            for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                value, out = run(*sides[side])
                rates[side].append(value)
                outs[side].append(out)
        b, a = statistics.median(rates["before"]), statistics.median(rates["after"])
        same = outs["before"] == outs["after"]
        print(f"{label}: decode tok/s before {b:.2f}, after {a:.2f}, after/before {a / b:.3f}, same tokens {same}",
              flush=True)
        rows.append(dict(path=label, before_tps=b, after_tps=a, ratio=a / b, same_tokens=same,
                         before_runs=rates["before"], after_runs=rates["after"]))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Sampling and decoding speed: the working tree against an earlier commit.")
    parser.add_argument("--before", required=True, help="the commit to compare against (any git revision)")
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--batch", default="1,8,32")
    parser.add_argument("--decode-tokens", type=int, default=24)
    parser.add_argument("--decode-runs", type=int, default=5)
    parser.add_argument("--no-sampling", action="store_true", help="measure decoding only")
    add_run_arguments(parser, repeats=31, quick="small vocabulary, B 1, 3 repeats, 6 tokens, 1 run")
    args = parser.parse_args(argv)
    if args.quick:
        args.vocab, args.batch, args.repeats, args.decode_tokens, args.decode_runs = 4096, "1", 3, 6, 1
    if args.repeats < 1 or args.decode_runs < 1 or args.decode_tokens < 2:
        parser.error("need --repeats >= 1, --decode-runs >= 1 and --decode-tokens >= 2")
    with tempfile.TemporaryDirectory(prefix="tiny-llm-before-") as tmp:
        try:
            extract(args.before, Path(tmp))
        except subprocess.CalledProcessError as e:
            parser.error(f"cannot extract src/tiny_llm at {args.before!r}: {e.stderr.decode().strip()}")
        before = importlib.import_module("tiny_llm_before")
        after = importlib.import_module("tiny_llm")
        info = machine_info(before=args.before, vocab=args.vocab, repeats=args.repeats)
        print(f"MLX {info['mlx']} on {info['device']} ({info['processor']}); before = {args.before}, "
              f"after = the working tree")
        sampling = [] if args.no_sampling else bench_sampling(
            importlib.import_module("tiny_llm_before.sampler"), importlib.import_module("tiny_llm.sampler"),
            [int(b) for b in args.batch.split(",")], args.vocab, args.repeats)
        decoding = bench_decoding(importlib.import_module("tiny_llm_before.generate"),
                                  importlib.import_module("tiny_llm.generate"), after,
                                  args.decode_tokens, args.decode_runs)
        del before
    write_json(args.json, info=info, sampling=sampling, decoding=decoding)
    return 0


if __name__ == "__main__":
    sys.exit(main())
