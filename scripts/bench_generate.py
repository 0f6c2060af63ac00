#!/usr/bin/env python3
"""Generation speed and memory: tiny-llm against mlx-lm, same model, prompt and settings.

    python scripts/bench_generate.py [--quick] [--configs smollm2-4bit,...] [--batch 1,8]
        [--prompt-tokens 128] [--max-tokens 64] [--repeats 3] [--json out.json]

(`make bench-generate` runs it with the defaults.) Configurations:

    smollm2-4bit            the default model as shipped (SmolLM2-135M-Instruct, 4-bit, 8-bit embedding)
    smollm2-fp16 / -fp32    the same weights unpacked in float32, then cast (both implementations)
    qwen2-0.5b-random-fp16  Qwen2-0.5B's shape with random N(0, 0.02) weights, float16

For each configuration, batch size B and implementation the table shows prefill tok/s
(prompt tokens of all rows / time to first token), the time to first token, decode tok/s
(tokens per second after the first token, all rows together), peak memory in GB, and the ratios
tiny-llm / mlx-lm (targets: speeds >= 0.95, memory <= 1.05; misses are marked "!").

How it is measured:
- Every (configuration, implementation, B) runs in a fresh subprocess (this script with
  --worker), so its peak memory holds one model. Peak memory is reset just before each
  measured generation and read from what the generate function reports; the weights are
  already allocated then, so they count.
- Prompts are the same token ids for both implementations: a fixed English paragraph
  (SmolLM2) or fixed random ids (random model), repeated to --prompt-tokens; at B > 1
  row r is the same prompt rotated by 7r tokens. EOS gets a logit bias of -inf on both
  sides, so every row generates exactly --max-tokens tokens.
- B = 1: `stream_generate` of each library as its command-line tool calls it, greedy with
  the EOS bias: tiny-llm with the sampling engine (`params=Sampler(SamplingParams(...))`,
  what `tiny-llm generate` passes), mlx-lm with `sampler=` and `logits_processors=` (what
  `mlx_lm.generate` passes); this script times the stream itself (first response: TTFT; the
  rest: decode), since the two report decode rates differently.
- B > 1: `tiny_llm.batch.batch_generate` with one SamplingParams per row (temperature 0.7,
  top-k 40, top-p 0.95, min-p 0.05, seed = row, mlx-lm's filter order) and
  `mlx_lm.batch_generate` with the same settings as one shared `make_sampler` (it takes no
  per-row samplers). Prefill rate, TTFT (the batch's prompt time) and peak memory are
  what the functions report; decode tok/s = all generated tokens / (wall time of the call
  - prompt time), timed here, as the two count decode time differently. (The prompt's last
  position is prefill in tiny-llm but the first decode step in mlx-lm: 1/--max-tokens of
  the decode time goes to mlx-lm's disadvantage, 1/--prompt-tokens of prefill to tiny-llm's.)
- One warm-up generation (short prompt, 4 tokens), then --repeats measured ones; medians.
- The roof: the parent measures the rate a copy reads at (numpy copying 512 MB, one thread
  per core; bytes read per second). A decode step reads every weight once (a tied head reads the
  whole embedding table; quantized weights count packed values, scales and biases), so
  B = 1 cannot beat bandwidth / weight bytes tok/s; "of roof" is decode tok/s / that roof
  (at B > 1 the same weights serve B rows: B x the roof).
- `--peer llama.cpp` (`make bench-peers`): llama.cpp on the default model's own GGUF (the
  same Q4_1 weights), built once by `scripts/peers.py build`: `llama-bench -p P -n N -t T`
  (B = 1) and `llama-batched-bench -npp P -ntg N -npl 1,8` (B = 1 and 8), printed beside
  tiny-llm's smollm2-4bit rows with the ratios tiny-llm / llama.cpp (targets >= 0.9 at
  B = 1, >= 1.0 at B = 8). Its threads spin: measure on a quiet machine.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
from bench_common import add_run_arguments, machine_info, write_json

CONFIGS = {  # name: (model source, dtype name or None for the weights as shipped)
    "smollm2-4bit": ("default", None),
    "smollm2-fp16": ("default", "float16"),
    "smollm2-fp32": ("default", "float32"),
    "qwen2-0.5b-random-fp16": ("random", "float16"),
}
IMPLS = ("tiny", "mlx")
RANDOM_CONFIG = {
    "model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "intermediate_size": 4864,
    "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
    "tie_word_embeddings": True, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768,
}
RANDOM_EOS = 151643  # Qwen2's <|endoftext|>
PARAGRAPH = (
    "The river runs past the old mill, under the stone bridge and out into the wide valley, "
    "where farmers grow wheat and barley in long, straight fields. In spring the water rises "
    "and the children watch the boats carry timber down to the town by the sea."
)
SAMPLING = dict(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05)  # B > 1
WARMUP_PROMPT, WARMUP_TOKENS = 16, 4
SPEED_TARGET, MEMORY_TARGET, SCALING_TARGET = 0.95, 1.05, 4.0


# ---------------------------------------------------------------- worker (one model)

class IdTokenizer:
    """The random model's tokenizer: text is the ids written out, and one EOS id. Enough for
    both libraries' detokenizers (mlx-lm wraps it in its NaiveStreamingDetokenizer)."""

    eos_token_id = RANDOM_EOS
    eos_token_ids = frozenset({RANDOM_EOS})
    bos_token = None
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())

    def decode(self, ids, **_) -> str:
        return "".join(f" {i}" for i in ids)

    def get_vocab(self) -> dict:
        return {}

    def apply_chat_template(self, *args, **kwargs):
        raise ValueError("the random model has no chat template")


def prompt_rows(config: str, length: int, rows: int) -> list[list[int]]:
    """`rows` prompts of `length` ids: the fixed prompt, row r rotated by 7r tokens."""
    if CONFIGS[config][0] == "random":
        import numpy as np

        base = np.random.default_rng(0).integers(0, RANDOM_CONFIG["vocab_size"], length).tolist()
    else:
        from tiny_llm.loader import resolve
        from tiny_llm.tokenizer import Tokenizer

        ids = Tokenizer.from_directory(resolve("default")).encode(PARAGRAPH)
        base = (ids * (length // len(ids) + 1))[:length]
    return [base[(7 * r) % length:] + base[: (7 * r) % length] for r in range(rows)]


def load(config: str, impl: str, model_dir: str | None):
    """`(model, tokenizer)` of one implementation for `config`."""
    source, dtype_name = CONFIGS[config]
    dtype = getattr(mx, dtype_name) if dtype_name else None
    if impl == "tiny":
        import tiny_llm
        from tiny_llm.loader import load_model

        if source == "random":
            return load_model(model_dir, dtype=dtype), IdTokenizer()
        return tiny_llm.load("default", dequantize=dtype is not None, dtype=dtype)

    import mlx_lm
    from mlx_lm.tokenizer_utils import NaiveStreamingDetokenizer, TokenizerWrapper
    from mlx_lm.utils import dequantize_model, load_model

    if source == "random":
        model, _ = load_model(Path(model_dir))
        return model, TokenizerWrapper(IdTokenizer(), NaiveStreamingDetokenizer)
    from tiny_llm.loader import resolve

    model, tokenizer = mlx_lm.load(str(resolve("default")))
    if dtype is not None:
        model.set_dtype(mx.float32)  # scales and biases too: unpack in float32, like tiny-llm
        dequantize_model(model)
        model.set_dtype(dtype)
        mx.eval(model.parameters())
    return model, tokenizer


ABLATION = ("none", "rms_norm", "rope", "attention")  # switched on one after another


def load_partly_fused(config: str, pieces: list[str]):
    """tiny-llm's hand-written model (`fused=False`) with the named pieces swapped for
    their `mx.fast` kernels."""
    import tiny_llm
    from tiny_llm.fused import FusedRMSNorm, FusedRoPE, fused_attention

    source, dtype_name = CONFIGS[config]
    dtype = getattr(mx, dtype_name) if dtype_name else None
    model, tokenizer = tiny_llm.load(source, dequantize=dtype is not None, dtype=dtype, fused=False)
    if "rms_norm" in pieces:
        model.norm = FusedRMSNorm(model.norm.weight, model.norm.eps)
        for layer in model.layers:
            for name in ("input_layernorm", "post_attention_layernorm"):
                old = getattr(layer, name)
                setattr(layer, name, FusedRMSNorm(old.weight, old.eps))
    for layer in model.layers:
        attn = layer.self_attn
        if "rope" in pieces:
            attn.rope = FusedRoPE(attn.rope.dims, attn.rope.base, attn.rope.traditional)
        if "attention" in pieces:
            attn.attention = fused_attention
    return model, tokenizer


def run_ablation(args) -> list[dict]:
    """Prefill and decode tok/s of the default model at B = 1, with each fused piece
    switched on in turn (tiny-llm only)."""
    rows, pieces = [], []
    print(f"{'model':<40} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for piece in ABLATION:
        if piece != "none":
            pieces.append(piece)
        name = "tiny+" + "+".join(pieces) if pieces else "tiny+"
        result = run_worker("smollm2-4bit", name, 1, args, None)
        label = "hand-written" if not pieces else "+ fused " + pieces[-1].replace("_", " ")
        med = result.get("median", {})
        rows.append(dict(step=label, pieces=list(pieces), **{k: med.get(k) for k in ("prefill_tps", "decode_tps")},
                         error=result.get("error")))
        print(f"{label:<40} {fmt(med.get('prefill_tps'), '.2f', 14)} {fmt(med.get('decode_tps'), '.2f', 13)}"
              + (f"  {result['error']}" if "error" in result else ""), flush=True)
    return rows


def weight_bytes(model) -> int:
    """Bytes of weights one decode step reads (an mlx-lm model): every parameter, except
    that an untied model's embedding table is only looked up, one row at a time."""
    from mlx.utils import tree_flatten

    tied = getattr(model.args, "tie_word_embeddings", True)
    return sum(v.nbytes for k, v in tree_flatten(model.parameters()) if tied or "embed_tokens" not in k)


def eos_bias(tokenizer) -> dict[int, float]:
    return {int(t): -math.inf for t in tokenizer.eos_token_ids}


def generate_single(impl: str, model, tokenizer, prompt: list[int], max_tokens: int) -> dict:
    """Greedy B = 1 generation through `stream_generate`, timed around the stream: the path
    each command-line tool runs. `tiny-llm generate` passes the sampling engine
    (`params=Sampler(SamplingParams(...))`); `mlx_lm.generate` passes `make_sampler` and
    `make_logits_processors`."""
    if impl == "tiny":
        from tiny_llm import stream_generate
        from tiny_llm.sampler import Sampler, SamplingParams

        kwargs = dict(params=Sampler(SamplingParams(temperature=0.0, logit_bias=eos_bias(tokenizer)), tokenizer))
    else:
        from mlx_lm import stream_generate
        from mlx_lm.sample_utils import make_logits_processors, make_sampler

        kwargs = dict(sampler=make_sampler(temp=0.0), logits_processors=make_logits_processors(logit_bias=eos_bias(tokenizer)))
    mx.reset_peak_memory()
    start = time.perf_counter()
    times, tokens, last = [], [], None
    for last in stream_generate(model, tokenizer, prompt, max_tokens, **kwargs):
        times.append(time.perf_counter())
        tokens.append(last.token)
    if len(tokens) != max_tokens:
        raise RuntimeError(f"{impl} generated {len(tokens)} tokens, not {max_tokens}")
    ttft = times[0] - start
    return dict(prefill_tps=len(prompt) / ttft, ttft=ttft,
                decode_tps=(len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0,
                peak_gb=last.peak_memory, reported_decode_tps=last.generation_tps, tokens=tokens)


def generate_batch(impl: str, model, tokenizer, prompts: list[list[int]], max_tokens: int) -> dict:
    """Sampled B > 1 generation through each library's `batch_generate`: its prompt time
    and peak memory; decode rate = all generated tokens / (wall time - prompt time)."""
    bias = eos_bias(tokenizer)
    mx.reset_peak_memory()
    start = time.perf_counter()
    if impl == "tiny":
        from tiny_llm.batch import batch_generate
        from tiny_llm.sampler import SamplingParams

        params = [SamplingParams(**SAMPLING, seed=r, logit_bias=bias, order="mlx-lm") for r in range(len(prompts))]
        result = batch_generate(model, tokenizer, prompts, max_tokens, params=params)
        tokens = result.tokens
    else:
        from mlx_lm import batch_generate
        from mlx_lm.sample_utils import make_logits_processors, make_sampler

        mx.random.seed(0)
        sampler = make_sampler(temp=SAMPLING["temperature"], top_p=SAMPLING["top_p"],
                               min_p=SAMPLING["min_p"], top_k=SAMPLING["top_k"])
        result = batch_generate(model, tokenizer, prompts, max_tokens=max_tokens, sampler=sampler,
                                logits_processors=make_logits_processors(logit_bias=bias),
                                return_token_ids=True)
        tokens = result.token_ids
    wall = time.perf_counter() - start
    if any(len(t) != max_tokens for t in tokens):
        raise RuntimeError(f"{impl} generated {[len(t) for t in tokens]} tokens per row, not {max_tokens}")
    s = result.stats
    return dict(prefill_tps=s.prompt_tps, ttft=s.prompt_time, decode_tps=len(prompts) * max_tokens / (wall - s.prompt_time),
                peak_gb=s.peak_memory, reported_decode_tps=s.generation_tps)


def worker(config: str, impl: str, batch: int, args) -> dict:
    """Load one model, warm up, measure `args.repeats` generations; medians and details."""
    out = dict(config=config, impl=impl, batch=batch)
    start = time.perf_counter()
    if impl.startswith("tiny+"):  # an ablation step: the hand-written model plus some fused pieces
        model, tokenizer = load_partly_fused(config, impl.removeprefix("tiny+").split("+"))
        impl = "tiny"
    else:
        model, tokenizer = load(config, impl, args.model_dir)
    out["load_s"] = time.perf_counter() - start
    out["weight_bytes"] = weight_bytes(model) if impl == "mlx" else model.weight_bytes
    prompts = prompt_rows(config, args.prompt_tokens, batch)

    def run(rows, max_tokens):
        if batch == 1:
            return generate_single(impl, model, tokenizer, rows[0], max_tokens)
        return generate_batch(impl, model, tokenizer, rows, max_tokens)

    run([p[:WARMUP_PROMPT] for p in prompts], WARMUP_TOKENS)
    runs = [run(prompts, args.max_tokens) for _ in range(args.repeats)]
    if batch == 1:
        out["tokens"] = runs[0]["tokens"]
    out["runs"] = [{k: v for k, v in r.items() if k != "tokens"} for r in runs]
    out["median"] = {k: statistics.median(r[k] for r in out["runs"]) for k in out["runs"][0]}
    return out


# ---------------------------------------------------------------- parent

def build_random_model(directory: Path) -> None:
    """Write Qwen2-0.5B's config and random float16 weights (Hugging Face names) to `directory`."""
    c = RANDOM_CONFIG
    D, F, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * D // c["num_attention_heads"]
    shapes = {"model.embed_tokens.weight": (V, D)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (D, D), p + "self_attn.q_proj.bias": (D,),
            p + "self_attn.k_proj.weight": (kv, D), p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, D), p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (D, D),
            p + "mlp.gate_proj.weight": (F, D), p + "mlp.up_proj.weight": (F, D),
            p + "mlp.down_proj.weight": (D, F),
        }
    keys = mx.random.split(mx.random.key(0), len(shapes))
    weights = {name: mx.random.normal(shape, dtype=mx.float16, scale=0.02, key=k)
               for (name, shape), k in zip(shapes.items(), keys)}
    for i in range(c["num_hidden_layers"]):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            weights[f"model.layers.{i}.{norm}.weight"] = mx.ones((D,), dtype=mx.float16)
    weights["model.norm.weight"] = mx.ones((D,), dtype=mx.float16)
    mx.save_safetensors(str(directory / "model.safetensors"), weights, metadata={"format": "mlx"})
    (directory / "config.json").write_text(json.dumps(c, indent=2))


def run_worker(config: str, impl: str, batch: int, args, model_dir: Path | None) -> dict:
    """Run `worker` in a fresh interpreter; its last stdout line is the JSON result."""
    cmd = [sys.executable, __file__, "--worker", config, impl, str(batch),
           "--prompt-tokens", str(args.prompt_tokens), "--max-tokens", str(args.max_tokens),
           "--repeats", str(args.repeats)]
    if model_dir is not None:
        cmd += ["--model-dir", str(model_dir)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)  # stderr passes through
    lines = proc.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return dict(config=config, impl=impl, batch=batch, error=f"worker failed (exit {proc.returncode})")


def measure_bandwidth(repeats: int = 7, threads: int | None = None) -> float:
    """The bytes per second a multi-threaded copy reads, in GB/s, median of runs: 512 MB
    copied by numpy on one thread per core, each copying its own slice (numpy lets go of
    the GIL while it copies). A decode step reads every weight once and writes next to
    nothing, so the rate a copy reads at is its roof. (MLX's `a + 1` on the CPU measures far
    less: not a roof.)"""
    import numpy as np
    from concurrent.futures import ThreadPoolExecutor

    threads = threads or os.cpu_count() or 1
    src = np.ones(128 * 2**20, dtype=np.float32)
    dst = np.empty_like(src)
    cuts = np.linspace(0, src.size, threads + 1).astype(int)

    def part(i):
        np.copyto(dst[cuts[i]:cuts[i + 1]], src[cuts[i]:cuts[i + 1]])

    times = []
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats + 1):
            start = time.perf_counter()
            list(pool.map(part, range(threads)))
            times.append(time.perf_counter() - start)
    return src.nbytes / statistics.median(times[1:]) / 1e9


def ratio(tiny: dict, mlx: dict, key: str) -> float | None:
    a, b = tiny.get("median", {}).get(key), mlx.get("median", {}).get(key)
    return a / b if a is not None and b else None


def fmt(value: float | None, spec: str, width: int = 0, miss: bool = False, unit: str = "") -> str:
    """`value` right-aligned in `width`, "-" when missing, "!" when it misses its target."""
    text = "-" if value is None else format(value, spec) + unit + ("!" if miss else "")
    return text.rjust(width)


HEADER = (f"{'':24s} {'':>2s} | {'prefill tok/s':^22s} | {'TTFT s':^13s} | {'decode tok/s':^22s} | "
          f"{'peak GB':^20s} | {'of roof':^11s}\n"
          f"{'configuration':24s} {'B':>2s} | {'tiny':>7s} {'mlx-lm':>7s} {'ratio':>6s} | {'tiny':>6s} {'mlx-lm':>6s} | "
          f"{'tiny':>7s} {'mlx-lm':>7s} {'ratio':>6s} | {'tiny':>6s} {'mlx-lm':>6s} {'ratio':>6s} | "
          f"{'tiny':>5s} {'mlx':>5s}")


def bound_fraction(median: dict, row: dict) -> float | None:
    """Decode tok/s as a fraction of B x the read-bandwidth roof."""
    bound = row.get("bound_tps")
    return median["decode_tps"] / (row["batch"] * bound) if bound and "decode_tps" in median else None


def table_row(row: dict) -> str:
    t, m = row["tiny"], row["mlx"]
    tm, mm = t.get("median", {}), m.get("median", {})
    r_pre, r_dec, r_mem = row["ratio_prefill"], row["ratio_decode"], row["ratio_peak"]
    line = (f"{row['config']:24s} {row['batch']:2d} | {fmt(tm.get('prefill_tps'), '.1f', 7)} "
            f"{fmt(mm.get('prefill_tps'), '.1f', 7)} {fmt(r_pre, '.2f', 6, r_pre is not None and r_pre < SPEED_TARGET)} | "
            f"{fmt(tm.get('ttft'), '.3f', 6)} {fmt(mm.get('ttft'), '.3f', 6)} | "
            f"{fmt(tm.get('decode_tps'), '.1f', 7)} {fmt(mm.get('decode_tps'), '.1f', 7)} "
            f"{fmt(r_dec, '.2f', 6, r_dec is not None and r_dec < SPEED_TARGET)} | "
            f"{fmt(tm.get('peak_gb'), '.3f', 6)} {fmt(mm.get('peak_gb'), '.3f', 6)} "
            f"{fmt(r_mem, '.2f', 6, r_mem is not None and r_mem > MEMORY_TARGET)} | "
            f"{fmt(bound_fraction(tm, row), '.2f', 5)} {fmt(bound_fraction(mm, row), '.2f', 5)}")
    errors = [f"{name}: {d['error']}" for name, d in (("tiny-llm", t), ("mlx-lm", m)) if "error" in d]
    return line + ("   (" + "; ".join(errors) + ")" if errors else "")


def greedy_check(tiny: dict, mlx: dict) -> str:
    """Where the two B = 1 greedy token streams first differ (a warning within 8 steps)."""
    a, b = tiny.get("tokens"), mlx.get("tokens")
    if mlx.get("error", "").startswith("not run"):
        return "greedy tokens: not compared (mlx-lm not run: --impls)"
    if not a or not b:
        return "greedy tokens: not compared (a B = 1 run failed)"
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    if same == len(a):
        return f"greedy tokens: identical for all {len(a)} steps"
    text = f"greedy tokens: identical for {same} of {len(a)} steps (then tiny {a[same]}, mlx-lm {b[same]})"
    return ("WARNING: " + text) if same < min(8, len(a)) else text


def bench_config(config: str, args, batches: list[int], bandwidth: float, model_dir) -> tuple[list[dict], list[str]]:
    """Both implementations at every B for one configuration: table rows and notes."""
    rows, notes = [], []
    for batch in batches:
        tiny = run_worker(config, "tiny", batch, args, model_dir)
        mlx = (run_worker(config, "mlx", batch, args, model_dir) if "mlx" in args.impls
               else dict(config=config, impl="mlx", batch=batch, error="not run (--impls)"))
        row = dict(config=config, batch=batch, tiny=tiny, mlx=mlx,
                   ratio_prefill=ratio(tiny, mlx, "prefill_tps"), ratio_decode=ratio(tiny, mlx, "decode_tps"),
                   ratio_peak=ratio(tiny, mlx, "peak_gb"))
        known = mlx if "weight_bytes" in mlx else tiny
        if "weight_bytes" in known:
            row["weight_bytes"] = known["weight_bytes"]
            row["bound_tps"] = bandwidth * 1e9 / known["weight_bytes"]
        rows.append(row)
        print(table_row(row), flush=True)
    by_batch = {r["batch"]: r for r in rows}
    known = next((r for r in rows if "bound_tps" in r), None)
    if known:
        notes.append(f"{known['weight_bytes'] / 1e6:.1f} MB of weights read per decode step, "
                     f"roof {known['bound_tps']:.1f} tok/s at B = 1")
    if 1 in by_batch:
        notes.append(greedy_check(by_batch[1]["tiny"], by_batch[1]["mlx"]))
    for batch in (b for b in batches if b > 1 and 1 in by_batch):
        scaling = {impl: ratio(by_batch[batch][impl], by_batch[1][impl], "decode_tps") for impl in IMPLS}
        miss = scaling["tiny"] is not None and scaling["tiny"] < SCALING_TARGET
        notes.append(f"decode throughput B = {batch} / B = 1: tiny-llm {fmt(scaling['tiny'], '.2f', miss=miss, unit='x')} "
                     f"(target >= {SCALING_TARGET:g}x), mlx-lm {fmt(scaling['mlx'], '.2f', unit='x')}")
    return rows, notes


def run_peer(args, batches: list[int], results: list[dict]) -> dict | None:
    """llama.cpp on the default model's GGUF, printed beside tiny-llm's smollm2-4bit rows."""
    import peers

    if peers.built() is None:
        print("llama.cpp: not built (run `python scripts/peers.py build`, ~8 minutes); no peer numbers")
        return None
    try:
        single = peers.llama_bench(args.prompt_tokens, args.max_tokens, args.threads, args.repeats)
        batched = peers.llama_batched_bench(args.prompt_tokens, args.max_tokens, batches, args.threads)
    except (peers.BuildError, OSError, subprocess.TimeoutExpired, ValueError) as e:
        print(f"llama.cpp: {e}")
        return None
    print(f"\nllama.cpp {peers.LLAMA_CPP_PYTHON} (llama-cpp-python's vendored source), {args.threads} threads, "
          f"the same GGUF; ratio = tiny-llm / llama.cpp (targets: decode >= 0.9 at B = 1, >= 1.0 at B = 8; "
          f"prefill >= 1.0)")
    print(f"{'':22s} {'B':>2s} | {'prefill tok/s':^22s} | {'decode tok/s':^22s}")
    print(f"{'':22s} {'':>2s} | {'tiny':>7s} {'llama':>7s} {'ratio':>6s} | {'tiny':>7s} {'llama':>7s} {'ratio':>6s}")
    ours = {r["batch"]: r["tiny"].get("median", {}) for r in results if r["config"] == "smollm2-4bit"}
    rows = [("llama-bench", 1, single)] + [("llama-batched-bench", b, batched.get(b, {})) for b in batches]
    peer = dict(version=peers.LLAMA_CPP_PYTHON, threads=args.threads, rows=[])
    for tool, b, theirs in rows:
        mine = ours.get(b, {})
        r_pre = mine.get("prefill_tps") / theirs["prefill_tps"] if mine.get("prefill_tps") and theirs.get("prefill_tps") else None
        r_dec = mine.get("decode_tps") / theirs["decode_tps"] if mine.get("decode_tps") and theirs.get("decode_tps") else None
        target = 0.9 if b == 1 else 1.0
        print(f"{tool:22s} {b:2d} | {fmt(mine.get('prefill_tps'), '.1f', 7)} {fmt(theirs.get('prefill_tps'), '.1f', 7)} "
              f"{fmt(r_pre, '.2f', 6, r_pre is not None and r_pre < 1.0)} | {fmt(mine.get('decode_tps'), '.1f', 7)} "
              f"{fmt(theirs.get('decode_tps'), '.1f', 7)} {fmt(r_dec, '.2f', 6, r_dec is not None and r_dec < target)}")
        peer["rows"].append(dict(tool=tool, batch=b, llama_cpp=theirs, ratio_prefill=r_pre, ratio_decode=r_dec))
    return peer


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark generation: tiny-llm vs mlx-lm.")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma list of " + ", ".join(CONFIGS))
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    add_run_arguments(parser, repeats=3, quick="smollm2-4bit, B 1 and 2, 16 + 8 tokens, 1 repeat")
    parser.add_argument("--ablation", action="store_true",
                        help="instead: tiny-llm's default model at B = 1, each mx.fast kernel switched on in turn")
    parser.add_argument("--peer", choices=["llama.cpp"], default=None,
                        help="also run llama.cpp on the default model's GGUF (built by scripts/peers.py build)")
    parser.add_argument("--impls", default="tiny,mlx",
                        help="comma list of tiny, mlx: which libraries to run (default both; mlx-lm's B = 8 takes minutes)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp's threads (--peer)")
    parser.add_argument("--worker", nargs=3, metavar=("CONFIG", "IMPL", "B"), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.configs, args.batch, args.prompt_tokens, args.max_tokens, args.repeats = "smollm2-4bit", "1,2", 16, 8, 1
    if args.worker:
        config, impl, batch = args.worker
        try:
            result = worker(config, impl, int(batch), args)
        except Exception as e:  # reported in the table; the traceback goes to stderr
            import traceback

            traceback.print_exc()
            result = dict(config=config, impl=impl, batch=int(batch), error=f"{type(e).__name__}: {e}")
        print(json.dumps(result))
        return 0

    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configurations {unknown}: choose from {', '.join(CONFIGS)}")
    batches = [int(b) for b in args.batch.split(",")]
    args.impls = [i.strip() for i in args.impls.split(",")]
    if not set(args.impls) <= {"tiny", "mlx"} or "tiny" not in args.impls:
        parser.error(f"--impls must list tiny, and may list mlx, got {','.join(args.impls)}")
    if args.max_tokens < 2 or args.prompt_tokens < 1 or args.repeats < 1 or min(batches) < 1:
        parser.error("need --max-tokens >= 2, --prompt-tokens >= 1, --repeats >= 1 and batch sizes >= 1")

    info = machine_info(bandwidth_gbs=measure_bandwidth())
    info |= dict(prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, repeats=args.repeats,
                 sampling_b1="greedy, stream_generate as each CLI calls it: tiny-llm params=Sampler(...), "
                             "mlx-lm sampler= and logits_processors=",
                 sampling_batch=", ".join(f"{k} {v}" for k, v in SAMPLING.items())
                 + "; tiny-llm: one SamplingParams per row (seed = row, order mlx-lm), "
                   "mlx-lm: one shared make_sampler")
    print(f"{info['processor']}, {info['cpu_count']} CPUs, {info['platform']}; MLX {info['mlx']} ({info['device']}), "
          f"mlx-lm {info['mlx_lm']}; read bandwidth {info['bandwidth_gbs']:.1f} GB/s (a numpy copy of 512 MB on "
          f"{os.cpu_count()} threads, bytes read)")
    print(f"prompt {args.prompt_tokens} tokens, {args.max_tokens} new tokens (EOS bias -inf), median of "
          f"{args.repeats} after one warm-up, each (configuration, implementation, B) in its own process")
    print(f"sampling: B = 1 {info['sampling_b1']}; B > 1 {info['sampling_batch']}")
    print(f"ratio = tiny-llm / mlx-lm, '!' misses the target (speed >= {SPEED_TARGET}, memory <= {MEMORY_TARGET}); "
          f"of roof = decode tok/s / (B x read bandwidth / weight bytes per step)")
    if args.ablation:
        print(f"ablation: smollm2-4bit, B = 1, greedy, tiny-llm only; median of {args.repeats}")
        rows = run_ablation(args)
        write_json(args.json, info=info, ablation=rows)
        return 0
    print(HEADER, flush=True)
    results, notes = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp:
        model_dir = None
        if any(CONFIGS[c][0] == "random" for c in configs):
            model_dir = Path(tmp)
            build_random_model(model_dir)
        for config in configs:
            rows, notes[config] = bench_config(config, args, batches, info["bandwidth_gbs"],
                                               model_dir if CONFIGS[config][0] == "random" else None)
            results += rows
    peer = run_peer(args, batches, results) if args.peer else None
    for config, lines in notes.items():
        for line in lines:
            print(f"{config}: {line}")
    write_json(args.json, info=info, results=results, notes=notes, peer=peer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
