#!/usr/bin/env python3
"""Speculative decoding: tokens per second with and without speculation, on the default model.

    python scripts/bench_speculative.py [--quick] [--max-tokens 64] [--num-draft-tokens 4]
        [--repeats 3] [--json out.json]

(`make bench-speculative` runs it with the defaults.) Two tasks, greedy (temperature 0):

    copy        "Repeat the following paragraph exactly" plus a paragraph: the answer is in
                the prompt, so prompt lookup drafts long runs that the model accepts
    open-ended  a short story: drafts come only from repeats inside the text so far

For each task it runs `tiny_llm.stream_generate` without speculation and with prompt lookup
(`prompt_lookup=True`, `--num-draft-tokens` per round), checks that both give the same
tokens, and prints decode tokens/s (tokens after the first / time after the first), the
acceptance rate (accepted / drafted), tokens per target forward pass, and the speed-up.
Targets: >= 1.5x on the copying task, >= 0.9x on the open-ended one. Median of --repeats
runs after one warm-up.
"""

import argparse
import statistics
import sys
import time

from bench_common import add_run_arguments, machine_info, write_json

from tiny_llm.defaults import NUM_DRAFT_TOKENS

PARAGRAPH = (
    "The lighthouse stood on a narrow spit of rock at the mouth of the harbour. Every evening "
    "the keeper climbed the one hundred and twelve steps, trimmed the wick, polished the great "
    "lens and wrote the weather in a leather book. Ships passed in the dark and never knew his name."
)
TASKS = {
    "copy": f"Repeat the following paragraph exactly, word for word:\n\n{PARAGRAPH}",
    "open-ended": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}
TARGETS = {"copy": 1.5, "open-ended": 0.9}


def run(model, tokenizer, prompt: str, max_tokens: int, gamma: int | None) -> dict:
    """One greedy generation; `gamma` None: no speculation."""
    from tiny_llm import stream_generate
    from tiny_llm.speculative import SpeculativeStats

    stats = SpeculativeStats()
    kwargs = dict(prompt_lookup=True, num_draft_tokens=gamma, speculative_stats=stats) if gamma else {}
    times, tokens = [], []
    start = time.perf_counter()
    for response in stream_generate(model, tokenizer, prompt, max_tokens, **kwargs):
        times.append(time.perf_counter())
        tokens.append(response.token)
    decode = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    return dict(tokens=tokens, decode_tps=decode, ttft=times[0] - start,
                acceptance=stats.acceptance_rate if gamma else None,
                per_pass=stats.emitted / stats.rounds if gamma and stats.rounds else 1.0)


def measure(model, tokenizer, prompt: str, args, gamma: int | None) -> dict:
    run(model, tokenizer, prompt, 4, gamma)  # warm-up
    runs = [run(model, tokenizer, prompt, args.max_tokens, gamma) for _ in range(args.repeats)]
    median = {k: statistics.median(r[k] for r in runs) for k in ("decode_tps", "ttft")}
    return dict(median, tokens=runs[0]["tokens"], acceptance=runs[0]["acceptance"], per_pass=runs[0]["per_pass"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark speculative decoding (prompt lookup).")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--num-draft-tokens", type=int, default=NUM_DRAFT_TOKENS)
    add_run_arguments(parser, repeats=3, quick="12 tokens, 1 repeat (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.max_tokens, args.repeats = 12, 1
    if args.max_tokens < 2 or args.num_draft_tokens < 1 or args.repeats < 1:
        parser.error("need --max-tokens >= 2, --num-draft-tokens >= 1 and --repeats >= 1")

    import tiny_llm

    model, tokenizer = tiny_llm.load("default")
    info = machine_info(max_tokens=args.max_tokens, num_draft_tokens=args.num_draft_tokens, repeats=args.repeats)
    print(f"MLX {info['mlx']} on {info['device']} ({info['processor']}); default model (SmolLM2-135M, 4-bit), "
          f"greedy, {args.max_tokens} tokens, prompt lookup with {args.num_draft_tokens} draft tokens, "
          f"median of {args.repeats}")
    print(f"{'task':<12} {'plain tok/s':>12} {'spec tok/s':>11} {'speed-up':>9} {'target':>7} "
          f"{'accepted':>9} {'tok/pass':>9} {'same tokens':>12}")
    results = []
    for task, text in TASKS.items():
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}])
        plain = measure(model, tokenizer, prompt, args, None)
        spec = measure(model, tokenizer, prompt, args, args.num_draft_tokens)
        speedup = spec["decode_tps"] / plain["decode_tps"] if plain["decode_tps"] else float("nan")
        same = plain["tokens"] == spec["tokens"]
        miss = "!" if speedup < TARGETS[task] else " "
        print(f"{task:<12} {plain['decode_tps']:12.2f} {spec['decode_tps']:11.2f} {speedup:8.2f}x{miss}"
              f" {TARGETS[task]:6.1f}x {spec['acceptance']:9.0%} {spec['per_pass']:9.2f} {str(same):>12}")
        results.append(dict(task=task, plain=plain, speculative=spec, speedup=speedup, same_tokens=same))
    write_json(args.json, info=info, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
