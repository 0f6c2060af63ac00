#!/usr/bin/env python3
"""Constrained decoding: decode tokens/s with and without a JSON-schema grammar, default model.

    python scripts/bench_constrained.py [--quick] [--max-tokens 96] [--repeats 5] [--json out.json]

(`make bench-constrained` runs it with the defaults.) The schema is `examples/person.json`;
one prompt ("Describe a person as JSON."), sampled with temperature 0.7, top-k 40, top-p 0.95, min-p 0.05 and a fixed seed,
in four configurations, interleaved run by run so that drift hits all alike:

    none          tiny-llm without a grammar
    check         the person schema, grammar_first=False: draw, check, redraw if rejected
    mask          the person schema, grammar_first=True: mask every step
    mlx-lm        mlx_lm.stream_generate without a grammar (it has none), for reference

Every constrained run compiles the schema afresh, so its masks are computed as it goes
(a cold cache, as in one `tiny-llm generate` call); the vocabulary's token table is built
once per tokenizer, in the warm-up. Decode tokens/s counts the tokens after the first over
the time after the first. Target: each constrained configuration keeps >= 80 % of the
unconstrained tiny-llm throughput (the constraint costs < 20 %). Median of --repeats runs.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
from bench_common import add_run_arguments, machine_info, write_json

# The example schema: a name, an age (0-120), a city and up to three hobbies.
SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "examples" / "person.json").read_text())
SAMPLING = dict(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, seed=1)
TARGET = 0.8


def run_tiny(model, tokenizer, prompt: str, max_tokens: int, mode: str) -> dict:
    from tiny_llm import stream_generate
    from tiny_llm.constrain import Grammar
    from tiny_llm.sampler import Sampler, SamplingParams

    grammar = Grammar.from_json_schema(SCHEMA) if mode != "none" else None  # fresh: cold masks
    sampler = Sampler(SamplingParams(**SAMPLING, grammar=grammar, grammar_first=mode == "mask"), tokenizer)
    times, text = [], []
    for response in stream_generate(model, tokenizer, prompt, max_tokens, params=sampler):
        times.append(time.perf_counter())
        text.append(response.text)
    return dict(decode_tps=_rate(times), tokens=len(times), text="".join(text),
                sampling_ms=1e3 * sampler.stats.seconds / max(sampler.stats.draws, 1))


def run_mlx_lm(model, tokenizer, prompt: str, max_tokens: int) -> dict:
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    s = SAMPLING
    mx.random.seed(s["seed"])
    sampler = make_sampler(temp=s["temperature"], top_p=s["top_p"], min_p=s["min_p"], top_k=s["top_k"])
    times = []
    for _ in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=max_tokens, sampler=sampler):
        times.append(time.perf_counter())
    return dict(decode_tps=_rate(times), tokens=len(times), text="", sampling_ms=float("nan"))


def _rate(times: list[float]) -> float:
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark JSON-schema constrained decoding.")
    parser.add_argument("--max-tokens", type=int, default=96)
    add_run_arguments(parser, repeats=5, quick="16 tokens, 1 repeat (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.max_tokens, args.repeats = 16, 1
    if args.max_tokens < 2 or args.repeats < 1:
        parser.error("need --max-tokens >= 2 and --repeats >= 1")

    import mlx_lm

    import tiny_llm
    from tiny_llm.loader import resolve

    model, tokenizer = tiny_llm.load("default")
    ref_model, ref_tokenizer = mlx_lm.load(str(resolve("default")))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Describe a person as JSON."}])
    modes = ["none", "check", "mask", "mlx-lm"]

    def once(mode: str, max_tokens: int) -> dict:
        if mode == "mlx-lm":
            return run_mlx_lm(ref_model, ref_tokenizer, prompt, max_tokens)
        return run_tiny(model, tokenizer, prompt, max_tokens, mode)

    for mode in modes:  # warm-up (and the token table)
        once(mode, 4)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for mode in modes:
            runs[mode].append(once(mode, args.max_tokens))
    info = machine_info(max_tokens=args.max_tokens, repeats=args.repeats, sampling=SAMPLING)
    print(f"MLX {info['mlx']}, mlx-lm {info['mlx_lm']} on {info['device']} ({info['processor']}); default "
          f"model (SmolLM2-135M, 4-bit), up to {args.max_tokens} tokens, median of {args.repeats}")
    base = statistics.median(r["decode_tps"] for r in runs["none"])
    print(f"{'mode':<8} {'decode tok/s':>13} {'vs none':>8} {'target':>7} {'tokens':>7} {'sampling ms/token':>18}")
    results = {}
    for mode in modes:
        tps = statistics.median(r["decode_tps"] for r in runs[mode])
        ms = statistics.median(r["sampling_ms"] for r in runs[mode])
        tokens = statistics.median(r["tokens"] for r in runs[mode])
        ratio = tps / base if base else float("nan")
        constrained = mode in ("check", "mask")
        target = f"{TARGET:6.2f}x" if constrained else " " * 7
        miss = "!" if constrained and ratio < TARGET else " "
        print(f"{mode:<8} {tps:13.2f} {ratio:7.2f}x{miss}{target} {tokens:7.0f} {ms:18.2f}")
        results[mode] = dict(decode_tps=tps, ratio=ratio, tokens=tokens, sampling_ms=ms,
                             runs=[{k: v for k, v in r.items() if k != "text"} for r in runs[mode]])
    valid = sum(_valid(r["text"]) for m in ("check", "mask") for r in runs[m] if r["tokens"] < args.max_tokens)
    finished = sum(r["tokens"] < args.max_tokens for m in ("check", "mask") for r in runs[m])
    print(f"constrained runs that ended by themselves: {finished} of {2 * args.repeats}; "
          f"of those, valid against the schema: {valid}")
    write_json(args.json, info=info, results=results)
    return 0


def _valid(text: str) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), SCHEMA)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


if __name__ == "__main__":
    sys.exit(main())
