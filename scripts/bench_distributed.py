#!/usr/bin/env python3
"""Tensor parallelism: one rank against two, tiny-llm beside mlx-lm, on this machine.

    python scripts/bench_distributed.py [--quick] [--models default,qwen2-0.5b-random-fp16]
                                        [--prompt-tokens 64] [--decode-tokens 32] [--repeats 3] [--json out.json]

(`make bench-distributed` runs it with the defaults.) For each model, library and rank count
it starts the ranks (`mlx.launch --backend ring -n 2` on 127.0.0.1 for two), and each rank
loads its shard, prefills the same prompt ids through the KV cache in chunks of 16 and
decodes greedily (argmax of the logits, no sampler), once untimed, then --repeats times
timed. Reported per configuration, medians over the runs (rank 0's clock): prefill tok/s,
decode tok/s, and the bytes of the weights each rank holds with its peak memory.

mlx-lm shards with its models' `shard` method (`mlx_lm.utils.sharded_load` does the same),
which cuts every projection evenly: it applies where the heads divide by the ranks
(Qwen2-0.5B's 14 query and 2 key/value heads), not to SmolLM2's 9 query and 3 key/value
heads, which tiny-llm splits 6 + 3 by key/value group. Both ranks share this machine's
cores: the speed-up is bounded; memory per rank is what sharding buys here.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from bench_common import add_run_arguments, machine_info, write_json

MODELS = ("default", "qwen2-0.5b-random-fp16")
LAUNCH = str(Path(sys.executable).parent / "mlx.launch")

WORKER = textwrap.dedent('''
    import json, sys, time
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten

    impl, path, out, prompt_tokens, decode_tokens, repeats = sys.argv[1:7]
    prompt_tokens, decode_tokens, repeats = int(prompt_tokens), int(decode_tokens), int(repeats)
    group = mx.distributed.init() if "MLX_HOSTFILE" in __import__("os").environ else None
    if group is not None and group.size() == 1:
        group = None
    if impl == "tiny-llm":
        from tiny_llm import distributed
        from tiny_llm.loader import load_model
        model = load_model(path, group=distributed.group())
        weight_bytes = model.weight_bytes
        make_cache = model.make_cache
    else:
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.utils import load_model
        model, _ = load_model(__import__("pathlib").Path(path))
        if group is not None:
            model.shard(group)
        mx.eval(model.parameters())
        weight_bytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
        make_cache = lambda: make_prompt_cache(model)
    rank = group.rank() if group is not None else 0
    vocab = 49152 if "default" in path or "smollm" in path.lower() else 151936
    prompt = mx.array(np.random.default_rng(0).integers(0, min(vocab, 32000), prompt_tokens))[None]

    def once():
        cache = make_cache()
        start = time.perf_counter()
        for i in range(0, prompt_tokens - 1, 16):
            model(prompt[:, i:min(i + 16, prompt_tokens - 1)], cache=cache)
            mx.eval([c.state for c in cache] if hasattr(cache[0], "state") else [c.keys for c in cache])
        y = mx.argmax(model(prompt[:, -1:], cache=cache)[:, -1], axis=-1)
        mx.eval(y)
        first = time.perf_counter()
        tokens = []
        for _ in range(decode_tokens):
            y = mx.argmax(model(y[:, None], cache=cache)[:, -1], axis=-1)
            mx.eval(y)
            tokens.append(y.item())
        end = time.perf_counter()
        return prompt_tokens / (first - start), decode_tokens / (end - first), tokens

    once()
    runs = [once() for _ in range(repeats)]
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump({"rank": rank, "prefill": [r[0] for r in runs], "decode": [r[1] for r in runs],
                   "tokens": runs[-1][2], "weight_bytes": weight_bytes, "peak": mx.get_peak_memory()}, f)
''')


def run(impl: str, path: str, ranks: int, args) -> list[dict] | None:
    """Every rank's numbers (None when the run failed: printed)."""
    with tempfile.TemporaryDirectory() as out:
        script = Path(out) / "worker.py"
        script.write_text(WORKER)
        command = [sys.executable, str(script), impl, path, out, str(args.prompt_tokens), str(args.decode_tokens),
                   str(args.repeats)]
        if ranks > 1:
            command = [LAUNCH, "--backend", "ring", "-n", str(ranks), "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600, stdin=subprocess.DEVNULL)
        files = sorted(Path(out).glob("[0-9]*.json"))
        if len(files) != ranks:
            print(f"  {impl} on {ranks} rank(s) failed: {done.stderr.strip()[-400:]}")
            return None
        return [json.loads(f.read_text()) for f in files]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark tensor parallelism: 1 rank against 2.")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--decode-tokens", type=int, default=32)
    add_run_arguments(parser, repeats=3, quick="the default model, 16 + 4 tokens, 1 repeat (a smoke run)")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    if args.quick:
        models, args.prompt_tokens, args.decode_tokens, args.repeats = ["default"], 16, 4, 1
    if unknown := [m for m in models if m not in MODELS]:
        parser.error(f"unknown model {unknown[0]!r}; choose from {', '.join(MODELS)}")
    if args.prompt_tokens < 2 or args.decode_tokens < 1 or args.repeats < 1:
        parser.error("need --prompt-tokens >= 2, --decode-tokens >= 1 and --repeats >= 1")

    from tiny_llm.loader import resolve

    info = machine_info(prompt_tokens=args.prompt_tokens, decode_tokens=args.decode_tokens, repeats=args.repeats)
    print(f"MLX {info['mlx']}, mlx-lm {info['mlx_lm']} on {info['device']} ({info['processor']}, "
          f"{info['cpu_count']} cores); {args.prompt_tokens} prompt tokens, {args.decode_tokens} decoded, "
          f"median of {args.repeats}")
    print(f"{'model':<24} {'library':<9} {'ranks':>5} {'prefill tok/s':>14} {'decode tok/s':>13} "
          f"{'weights MB/rank':>16} {'peak MB/rank':>13}  same tokens")
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in models:
            if name == "default":
                path = str(resolve("default"))
            else:
                from bench_generate import build_random_model

                path = str(Path(scratch) / name)
                Path(path).mkdir()
                build_random_model(Path(path))
            first_tokens = None
            for impl in ("tiny-llm", "mlx-lm"):
                for ranks in (1, 2):
                    if impl == "mlx-lm" and ranks > 1 and name == "default":
                        print(f"{name:<24} {impl:<9} {ranks:>5}   (9 query heads do not divide by 2: "
                              f"mlx-lm's shard does not apply)")
                        continue
                    start = time.perf_counter()
                    rows = run(impl, path, ranks, args)
                    if rows is None:
                        continue
                    zero = rows[0]
                    row = dict(model=name, impl=impl, ranks=ranks,
                               prefill=statistics.median(zero["prefill"]), decode=statistics.median(zero["decode"]),
                               weights=[r["weight_bytes"] for r in rows], peak=[r["peak"] for r in rows],
                               tokens=zero["tokens"], seconds=time.perf_counter() - start)
                    first_tokens = first_tokens or row["tokens"]
                    same = "yes" if row["tokens"] == first_tokens else "NO"
                    results.append(row)
                    mb = " / ".join(f"{b / 1e6:.1f}" for b in row["weights"])
                    peak = " / ".join(f"{b / 1e6:.0f}" for b in row["peak"])
                    print(f"{name:<24} {impl:<9} {ranks:>5} {row['prefill']:14.1f} {row['decode']:13.2f} "
                          f"{mb:>16} {peak:>13}  {same}", flush=True)
    write_json(args.json, info=info, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
