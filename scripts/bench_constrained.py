#!/usr/bin/env python3
"""Constrained decoding: decode tokens/s with and without a JSON-schema grammar, default model.

    python scripts/bench_constrained.py [--quick] [--workloads person,profile] [--max-tokens 96]
                                        [--repeats 5] [--json out.json]

(`make bench-constrained` runs it with the defaults.) Two workloads, each one prompt sampled
with temperature 0.7, top-k 40, top-p 0.95, min-p 0.05 and a fixed seed:

    person    `examples/person.json` (a name, an age, a city, up to three hobbies; strings of
              at most 24 and 16 characters), "Describe a person as JSON."
    profile   a name of at most 40 characters, a city from a list of names in German,
              French and Japanese (text the tokenizer cuts inside characters), and a motto
              of at most 120 characters

in four configurations, interleaved run by run so that drift hits all alike:

    none          tiny-llm without a grammar
    check         the schema, grammar_first=False: draw, check, redraw if rejected
    mask          the schema, grammar_first=True: mask every step
    mlx-lm        mlx_lm.stream_generate without a grammar (it has none), for reference

Every constrained run compiles the schema afresh, so its masks are computed as it goes
(a cold cache, as in one `tiny-llm generate` call); the vocabulary's token table is built
once per tokenizer, in the warm-up. Decode tokens/s counts the tokens after the first over
the time after the first; "mask ms/token" is the time spent building masks (states not in
the cache) per generated token, and "walks/mask" how many of the length buckets a new
mask had to walk (the rest came from the cache). Targets: mask-first keeps >= 95 % of the
unconstrained tiny-llm throughput, the check strategy >= 80 %. Median of --repeats runs.
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
PERSON = json.loads((Path(__file__).resolve().parent.parent / "examples" / "person.json").read_text())
PROFILE = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "city": {"enum": ["Köln", "München", "Zürich", "Besançon", "東京", "大阪", "京都"]},
        "motto": {"type": "string", "maxLength": 120},
    },
    "required": ["name", "city", "motto"],
}
WORKLOADS = {
    "person": (PERSON, "Describe a person as JSON."),
    "profile": (PROFILE, "Write a profile of a person from Germany or Japan as JSON, with a motto."),
}
SAMPLING = dict(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, seed=1)
TARGETS = {"check": 0.8, "mask": 0.95}


def run_tiny(model, tokenizer, prompt: str, max_tokens: int, mode: str, schema: dict) -> dict:
    from tiny_llm import stream_generate
    from tiny_llm.constrain import Grammar, TokenMatcher, TokenTable
    from tiny_llm.sampler import Sampler, SamplingParams

    grammar = Grammar.from_json_schema(schema) if mode != "none" else None  # fresh: cold masks
    sampler = Sampler(SamplingParams(**SAMPLING, grammar=grammar, grammar_first=mode == "mask"), tokenizer)
    times, text = [], []
    for response in stream_generate(model, tokenizer, prompt, max_tokens, params=sampler):
        times.append(time.perf_counter())
        text.append(response.text)
    masks = TokenMatcher.get(grammar, TokenTable.from_tokenizer(tokenizer)).stats if grammar else None
    return dict(decode_tps=_rate(times), tokens=len(times), text="".join(text),
                sampling_ms=1e3 * sampler.stats.seconds / max(sampler.stats.draws, 1),
                mask_ms=1e3 * masks.seconds / len(times) if masks else float("nan"),
                walks=masks.walks / masks.masks if masks and masks.masks else float("nan"))


def run_mlx_lm(model, tokenizer, prompt: str, max_tokens: int) -> dict:
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    s = SAMPLING
    mx.random.seed(s["seed"])
    sampler = make_sampler(temp=s["temperature"], top_p=s["top_p"], min_p=s["min_p"], top_k=s["top_k"])
    times = []
    for _ in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=max_tokens, sampler=sampler):
        times.append(time.perf_counter())
    return dict(decode_tps=_rate(times), tokens=len(times), text="", sampling_ms=float("nan"),
                mask_ms=float("nan"), walks=float("nan"))


def _rate(times: list[float]) -> float:
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark JSON-schema constrained decoding.")
    parser.add_argument("--workloads", default="person,profile",
                        help=f"comma-separated, of {', '.join(WORKLOADS)} (default: both)")
    parser.add_argument("--max-tokens", type=int, default=96)
    add_run_arguments(parser, repeats=5, quick="16 tokens, 1 repeat (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.max_tokens, args.repeats = 16, 1
    if args.max_tokens < 2 or args.repeats < 1:
        parser.error("need --max-tokens >= 2 and --repeats >= 1")
    workloads = args.workloads.split(",")
    if unknown := [w for w in workloads if w not in WORKLOADS]:
        parser.error(f"unknown workload {unknown[0]!r}; choose from {', '.join(WORKLOADS)}")

    import mlx_lm

    import tiny_llm
    from tiny_llm.loader import resolve

    model, tokenizer = tiny_llm.load("default")
    ref_model, ref_tokenizer = mlx_lm.load(str(resolve("default")))
    modes = ["none", "check", "mask", "mlx-lm"]
    info = machine_info(max_tokens=args.max_tokens, repeats=args.repeats, sampling=SAMPLING)
    print(f"MLX {info['mlx']}, mlx-lm {info['mlx_lm']} on {info['device']} ({info['processor']}); default "
          f"model (SmolLM2-135M, 4-bit), up to {args.max_tokens} tokens, median of {args.repeats}")
    results = {}
    for workload in workloads:
        schema, question = WORKLOADS[workload]
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}])

        def once(mode: str, max_tokens: int) -> dict:
            if mode == "mlx-lm":
                return run_mlx_lm(ref_model, ref_tokenizer, prompt, max_tokens)
            return run_tiny(model, tokenizer, prompt, max_tokens, mode, schema)

        for mode in modes:  # warm-up (and the token table)
            once(mode, 4)
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for _ in range(args.repeats):
            for mode in modes:
                runs[mode].append(once(mode, args.max_tokens))
        print(f"\n{workload}:")
        print(f"{'mode':<8} {'decode tok/s':>13} {'vs none':>8} {'target':>7} {'tokens':>7} "
              f"{'sampling ms/token':>18} {'mask ms/token':>14} {'walks/mask':>11}")
        base = statistics.median(r["decode_tps"] for r in runs["none"])
        results[workload] = {}
        for mode in modes:
            med = {k: statistics.median(r[k] for r in runs[mode])
                   for k in ("decode_tps", "tokens", "sampling_ms", "mask_ms", "walks")}
            ratio = med["decode_tps"] / base if base else float("nan")
            target = TARGETS.get(mode)
            miss = "!" if target and ratio < target else " "
            shown = f"{target:6.2f}x" if target else " " * 7
            print(f"{mode:<8} {med['decode_tps']:13.2f} {ratio:7.2f}x{miss}{shown} {med['tokens']:7.0f} "
                  f"{med['sampling_ms']:18.2f} {med['mask_ms']:14.2f} {med['walks']:11.1f}")
            results[workload][mode] = dict(med, ratio=ratio,
                                           runs=[{k: v for k, v in r.items() if k != "text"} for r in runs[mode]])
        ended = [r for m in ("check", "mask") for r in runs[m] if r["tokens"] < args.max_tokens]
        valid = sum(_valid(r["text"], schema) for r in ended)
        print(f"constrained runs that ended by themselves: {len(ended)} of {2 * args.repeats}; "
              f"of those, valid against the schema: {valid}")
    write_json(args.json, info=info, results=results)
    return 0


def _valid(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


if __name__ == "__main__":
    sys.exit(main())
