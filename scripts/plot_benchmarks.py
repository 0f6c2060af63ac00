#!/usr/bin/env python3
"""The book's figures: the benchmarks' JSON (book/docs/img/data/) drawn as SVG (book/docs/img/).

    python scripts/plot_benchmarks.py [--data book/docs/img/data] [--out book/docs/img] [--captions]

(`make plots` runs it.) Each figure is drawn from one JSON file that a `scripts/bench_*.py
--json` run wrote, and only from it; its footer names the machine, the versions, the date and
the command of that run (`bench_common.machine_info`). `--captions` prints the same facts as
one line per figure, for the pages that embed it.

The output is deterministic: the same JSON and the same matplotlib (pyproject.toml's dev extra
pins it) give the same bytes, so tests/test_book.py redraws every figure into a temporary
directory and compares it with the committed one. What makes it so: `svg.hashsalt` (the ids
of clip paths), no date in the metadata, text drawn as paths from the DejaVu Sans that ships
with matplotlib (no system fonts), and nothing random.
"""

import argparse
import json
import re
import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "book" / "docs" / "img" / "data"
OUT = ROOT / "book" / "docs" / "img"
MATPLOTLIB = "3.11.2"  # the version that drew the committed figures (pyproject.toml pins it)

STYLE = {
    "svg.hashsalt": "tiny-llm",
    "svg.fonttype": "path",
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
    "legend.fontsize": 8,
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
}
METADATA = {"Date": None, "Creator": "tiny-llm scripts/plot_benchmarks.py"}
TINY, MLX, FLOOR, ROOF = "#1f6fb4", "#e8772e", "#7f7f7f", "#222222"


def caption(info: dict) -> str:
    """One line: the machine, the versions, the date and the command of a benchmark run."""
    device = "CPU" if "cpu" in info.get("device", "").lower() else "GPU"
    command = re.sub(r"\s*--json\s+\S+", "", info.get("command", "")).strip()
    system = info["platform"].split("-")[0]  # Linux, macOS
    load = f" (load average {info['load_average'][0]:.1f})" if "load_average" in info else ""
    return (f"{info['processor']}, {info['cpu_count']} cores ({info['machine']} {system}){load}; MLX {info['mlx']} "
            f"{device}, mlx-lm {info['mlx_lm']}, Python {info['python']}; {info['date']}; `{command}`")


def heading(fig: Figure, title: str, ax: Axes, ncol: int = 3) -> None:
    """The figure's title with the legend of `ax` under it, above the panels."""
    fig.legend(*ax.get_legend_handles_labels(), loc="outside upper center", ncol=ncol, title=title,
               title_fontproperties={"size": 10})


def footer(fig: Figure, info: dict, note: str = "") -> None:
    """Below the panels, in small type: the run's machine, versions, date and command, and `note`."""
    width = int(fig.get_figwidth() * 17)  # characters of 7-point DejaVu Sans per line
    lines = [textwrap.fill(part, width, break_on_hyphens=False) for part in (caption(info).replace("`", ""), note) if part]
    fig.text(0.0, -0.02, "\n".join(lines), ha="left", va="top", fontsize=7, color="#444444", transform=fig.transFigure)


def quick_note(info: dict, what: str) -> str:
    """`what`, and that the run was the script's short --quick one when it was."""
    return what + (" A --quick run: the script's smoke-test sizes, not its full measurement." if "--quick" in
                   info.get("command", "") else "")


# --- sampling (scripts/bench_sampler.py) -------------------------------------------------------

def draw_sampler(data: dict) -> Figure:
    """Per configuration and batch size: the engine (`Sampler`) and mlx-lm's `make_sampler`,
    beside one `mx.random.categorical` draw (the floor), log scale."""
    rows = [r for r in data["results"] if r["rows"] == data["results"][0]["rows"]]
    batches = sorted({r["B"] for r in rows})
    configs = list(dict.fromkeys(r["config"] for r in rows if "mlx_lm" in r))
    fig, axes = plt.subplots(1, len(batches), figsize=(3.1 * len(batches) + 1.2, 0.36 * len(configs) + 1.4),
                             sharey=True, layout="constrained")
    axes = [axes] if len(batches) == 1 else list(axes)
    y = range(len(configs))
    for ax, B in zip(axes, batches):
        cells = {r["config"]: r for r in rows if r["B"] == B}
        ours = [cells[c]["tiny_sampler"] for c in configs]
        ref = [cells[c]["mlx_lm"] for c in configs]
        ax.barh([i - 0.2 for i in y], ours, height=0.4, color=TINY, label="tiny-llm Sampler")
        ax.barh([i + 0.2 for i in y], ref, height=0.4, color=MLX, label="mlx-lm make_sampler")
        floor = cells["floor: categorical"]["tiny_make_sampler"]
        ax.axvline(floor, color=FLOOR, linestyle="--", linewidth=1, label="one mx.random.categorical")
        ax.set_xscale("log")
        ax.set_title(f"B = {B}")
        ax.set_xlabel("ms per call (median)")
        right = max(ref + ours) * 6
        ax.set_xlim(min(ours + ref + [floor]) / 2, right)
        for i, c in enumerate(configs):
            ax.text(max(ours[i], ref[i]) * 1.15, i, f"{ref[i] / ours[i]:.1f}×", va="center", fontsize=7)
        ax.grid(axis="y", visible=False)
    axes[0].set_yticks(list(y), configs)
    axes[0].invert_yaxis()
    info = data["info"]
    heading(fig, f"Sampling cost, vocabulary {info['vocab']:,}: the engine against mlx-lm "
                 f"(× = mlx-lm's time ÷ the engine's)", axes[0])
    footer(fig, info, f"Rows: {rows[0]['rows']} ({info['logits'][rows[0]['rows']]}); "
                      f"median of {info['repeats']} runs per cell.")
    return fig


# --- kernels (scripts/bench_kernels.py) --------------------------------------------------------

def draw_kernels(data: dict) -> Figure:
    """GFLOP/s by M for each product shape: tiny-llm's kernels and MLX's ops, under numpy's
    float32 matmul on the same shape (the roof a tuned kernel reaches on this machine)."""
    rows = [r for r in data["rows"] if r["op"] in ("4-bit", "8-bit", "float32")]
    shapes = list(dict.fromkeys((r["K"], r["N"]) for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(3.3 * len(shapes), 3.4), sharey=True, layout="constrained")
    axes = [axes] if len(shapes) == 1 else list(axes)
    styles = {"4-bit": "-", "8-bit": "--", "float32": ":"}
    for ax, (K, N) in zip(axes, shapes):
        cells = [r for r in rows if (r["K"], r["N"]) == (K, N)]
        for op, ls in styles.items():
            line = sorted((r for r in cells if r["op"] == op), key=lambda r: r["M"])
            if not line:
                continue
            M = [r["M"] for r in line]
            ax.plot(M, [r["ours_gflops"] for r in line], ls, marker="o", ms=3, color=TINY, label=f"tiny-llm {op}")
            ax.plot(M, [r["mlx_gflops"] for r in line], ls, marker="o", ms=3, color=MLX, label=f"MLX {op}")
        # numpy's product was timed once beside each op: the roof is the best of those times.
        Ms = sorted({r["M"] for r in cells})
        roof = [max(r["numpy_gflops"] for r in cells if r["M"] == M) for M in Ms]
        ax.plot(Ms, roof, "-", color=ROOF, linewidth=2.2, alpha=0.45, label="roof: numpy float32 (OpenBLAS)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(Ms, [str(M) for M in Ms])
        ax.set_title(f"[M, {K:,}] @ [{K:,}, {N:,}]")
        ax.set_xlabel("M (rows of activations)")
    axes[0].set_ylabel("GFLOP/s (2·M·K·N / time)")
    info = data["machine"]
    heading(fig, "Quantized and float products: tiny-llm's CPU kernels and MLX's ops under this machine's roof",
            axes[0], ncol=4)
    footer(fig, info, f"Group size 32, float32 activations; medians, one mx.eval per op (MLX's per-op cost is in "
                      f"every number). The roof: numpy's float32 matmul on the same shape, timed beside each of the "
                      f"three ops, the best of the three; numpy's copy of 512 MB: {info['copy_gbs']:.1f} GB/s.")
    return fig


# --- generation (scripts/bench_generate.py) ----------------------------------------------------

def draw_generate(data: dict) -> Figure:
    """Prefill and decode tokens/s of tiny-llm and mlx-lm by batch size, one group of bars per
    configuration and batch size."""
    rows = [r for r in data["results"] if "median" in r.get("tiny", {}) and "median" in r.get("mlx", {})]
    labels = [f"{r['config']}\nB = {r['batch']}" for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(3.6 + 2.4 * len(rows), 3.3), layout="constrained")
    x = range(len(rows))
    for ax, key, title in ((axes[0], "prefill_tps", "prefill"), (axes[1], "decode_tps", "decode")):
        ours = [r["tiny"]["median"][key] for r in rows]
        ref = [r["mlx"]["median"][key] for r in rows]
        ax.bar([i - 0.2 for i in x], ours, width=0.4, color=TINY, label="tiny-llm (its kernels)")
        ax.bar([i + 0.2 for i in x], ref, width=0.4, color=MLX, label="mlx-lm")
        for i in x:
            ax.text(i, max(ours[i], ref[i]) * 1.03, f"{ours[i] / ref[i]:.1f}×", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(x), labels)
        ax.set_ylabel("tokens/s, all rows (median)")
        ax.set_title(title)
        ax.set_ylim(0, max(ours + ref) * 1.18)
        ax.grid(axis="x", visible=False)
    info = data["info"]
    heading(fig, "Generation: tiny-llm against mlx-lm by batch size (× = tiny-llm ÷ mlx-lm)", axes[0])
    footer(fig, info, quick_note(info, f"{info['prompt_tokens']} prompt tokens, {info['max_tokens']} new, median of "
                                       f"{info['repeats']}; B = 1 greedy, B > 1 sampled; each library and B in its own "
                                       f"process. Prefill: prompt tokens / time to the first token; decode: tokens "
                                       f"after the first / time after it. Memory bandwidth (a + 1): "
                                       f"{info['bandwidth_gbs']:.1f} GB/s."))
    return fig


# --- llama.cpp as the peer (scripts/bench_generate.py --peer llama.cpp) -------------------------

def draw_peers(data: dict) -> Figure:
    """Prefill and decode tokens/s of tiny-llm and llama.cpp on the same weights (the default
    model's GGUF), at B = 1 (llama-bench and llama-batched-bench) and B = 8, with the
    read-bandwidth roof of a B = 1 decode step."""
    ours = {r["batch"]: r["tiny"]["median"] for r in data["results"]
            if r["config"] == "smollm2-4bit" and "median" in r.get("tiny", {})}
    rows = [p for p in data["peer"]["rows"] if p["batch"] in ours and p["llama_cpp"]]
    labels = [f"B = {p['batch']}\n{p['tool']}" for p in rows]
    fig, axes = plt.subplots(1, 2, figsize=(3.6 + 2.4 * len(rows), 3.3), layout="constrained")
    x = range(len(rows))
    for ax, key, title in ((axes[0], "prefill_tps", "prefill (128-token prompts)"), (axes[1], "decode_tps", "decode")):
        mine = [ours[p["batch"]][key] for p in rows]
        theirs = [p["llama_cpp"][key] for p in rows]
        ax.bar([i - 0.2 for i in x], mine, width=0.4, color=TINY, label="tiny-llm (its kernels)")
        ax.bar([i + 0.2 for i in x], theirs, width=0.4, color=MLX, label="llama.cpp (the same GGUF)")
        for i in x:
            ax.text(i, max(mine[i], theirs[i]) * 1.03, f"{mine[i] / theirs[i]:.2f}×", ha="center", va="bottom",
                    fontsize=7)
        top = max(mine + theirs)
        if key == "decode_tps" and rows and "bound_tps" in data["results"][0]:
            roof = data["results"][0]["bound_tps"]
            ax.axhline(roof, color=ROOF, ls="--", lw=1, label="B = 1 roof (read bandwidth / weight bytes)")
            top = max(top, roof)
        ax.set_xticks(list(x), labels)
        ax.set_ylabel("tokens/s, all rows (median)")
        ax.set_title(title)
        ax.set_ylim(0, top * 1.18)
        ax.grid(axis="x", visible=False)
    info = data["info"]
    heading(fig, "tiny-llm against llama.cpp on the same Q4_1 weights (× = tiny-llm ÷ llama.cpp)", axes[1], ncol=3)
    footer(fig, info, quick_note(info, f"{info['prompt_tokens']} prompt tokens, {info['max_tokens']} new; tiny-llm: "
                                       f"median of {info['repeats']}, each B in its own process, B = 1 greedy, B = 8 "
                                       f"sampled; llama.cpp {data['peer']['version']} (llama-cpp-python's source), "
                                       f"{data['peer']['threads']} threads, its own averages. Read bandwidth (a numpy "
                                       f"copy): {info['bandwidth_gbs']:.1f} GB/s."))
    return fig


# --- serving (scripts/bench_serve.py) ---------------------------------------------------------

def draw_serve(data: dict) -> Figure:
    """Output tokens/s and time to first token (p50) by client concurrency: tiny-llm serve and
    mlx_lm.server, without and with per-request seeds."""
    cells = data["cells"]
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.3), layout="constrained")
    servers = (("tiny", "tiny-llm serve", TINY), ("mlx", "mlx_lm.server", MLX))
    for ax, key, label in ((axes[0], "out_tok_per_s", "output tokens/s (all requests)"),
                           (axes[1], "ttft_p50", "time to first token, p50 (s)")):
        for seeded, ls in ((False, "-"), (True, "--")):
            line = sorted((c for c in cells if c["seeded"] == seeded), key=lambda c: c["concurrency"])
            if not line:
                continue
            C = [c["concurrency"] for c in line]
            for server, name, color in servers:
                values = [c["median"].get(server, {}).get(key) for c in line]
                if all(v is not None for v in values):
                    ax.plot(C, values, ls, marker="o", ms=4, color=color,
                            label=f"{name}, {'seeded' if seeded else 'no seeds'}")
        ax.set_xscale("log", base=2)
        concurrencies = sorted({c["concurrency"] for c in cells})
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        ax.set_xlabel("concurrent clients")
        ax.set_title(label)
        ax.set_ylim(bottom=0)
    info = data["info"]
    heading(fig, "Serving over HTTP: tiny-llm serve against mlx_lm.server, the same streamed chat requests",
            axes[0], ncol=2)
    prompts = "short prompts" if info.get("short_prompts") else "one user message each"
    footer(fig, info, quick_note(info, f"{info['requests']} chat requests per run ({prompts}), {info['max_tokens']} "
                                       f"output tokens each, temperature {info['temperature']}, streaming; median of "
                                       f"{info['repeats']} interleaved repeat(s); tiny-llm --max-batch-size "
                                       f"{info['max_batch_size']}, mlx_lm.server with its prompt cache."))
    return fig


# --- prefix caching (scripts/bench_prefix.py) --------------------------------------------------

def draw_prefix(data: dict) -> Figure:
    """Time to first token with and without the prefix cache (and mlx-lm's prompt caches), with
    the tokens each prefilled; the KV memory of a batch, paged and not."""
    info, shared, chat = data["info"], data["shared"], data["chat"]
    n, turns = len(info["shared_prompt_lengths"]), info["turns"]
    fig, (ax, mem) = plt.subplots(1, 2, figsize=(9.6, 3.5), layout="constrained", width_ratios=(1.6, 1))
    later = "request 2" if n == 2 else f"requests 2–{n} (median)"
    groups = [("shared system prompt,\nrequest 1", lambda k: (shared[k]["first"], None)),
              (f"shared system prompt,\n{later}", lambda k: (shared[k]["later"], shared[k]["prefilled"])),
              (f"chat, turn {turns}", lambda k: (chat[k]["ttft"], (chat[k]["prompt"] - chat[k]["cached"])
                                                if chat[k]["prompt"] is not None else None))]
    bars = (("tiny_cached", "tiny-llm, prefix cache", TINY), ("tiny_plain", "tiny-llm, no cache", "#9ec3e6"),
            ("mlx", "mlx-lm prompt cache", MLX))
    top = 0.0
    for j, (key, label, color) in enumerate(bars):
        for i, (_, value) in enumerate(groups):
            ttft, prefilled = value(key)
            if ttft is None:
                continue
            x = i + (j - 1) * 0.27
            ax.bar(x, ttft, width=0.27, color=color, label=label if i == 0 else None)
            text = f"{ttft:.2f} s" + (f"\n{prefilled:.0f} tok" if prefilled is not None else "")
            ax.text(x, ttft * 1.08, text, ha="center", va="bottom", fontsize=6.5)
            top = max(top, ttft)
    ax.set_xticks(range(len(groups)), [g[0] for g in groups])
    ax.set_ylabel("time to first token (s, median; log scale)")
    ax.set_yscale("log")
    ax.set_ylim(top=top * 4)
    ax.set_title("time to first token, and the prompt tokens prefilled")
    ax.grid(axis="x", visible=False)
    m = data["memory"]["arithmetic"]
    kinds = (("paged_bytes", "paged: pages\nin use"), ("pool_bytes", "page pool\nstorage"),
             ("padded_bytes", "batch cache,\npadded"), ("dense_bytes", "batch cache,\nallocated"))
    values = [m[k] / 1e6 for k, _ in kinds]
    mem.bar(range(len(kinds)), values, color=[TINY, "#9ec3e6", FLOOR, FLOOR], width=0.6)
    for i, v in enumerate(values):
        mem.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=7)
    mem.set_xticks(range(len(kinds)), [k[1] for k in kinds], fontsize=7)
    mem.set_ylabel("MB of keys and values")
    lengths = data["memory"]["lengths"]
    mem.set_title(f"KV memory, a batch of {len(lengths)} ({min(lengths)}–{max(lengths)} tokens)")
    mem.grid(axis="x", visible=False)
    heading(fig, "The prefix cache: time to first token with and without it, and the memory of pages", ax)
    footer(fig, info, quick_note(info, f"The default model, greedy; {n} requests with a {info['system_tokens']}-token "
                                       f"system prompt ({min(info['shared_prompt_lengths'])}–"
                                       f"{max(info['shared_prompt_lengths'])} prompt tokens, the first "
                                       f"{info['shared_common_start']} shared), one at a time; a {turns}-turn chat; "
                                       f"median of {len(data['repetitions'])} repetition(s)"
                                       + (f" (without the cache and mlx-lm's shared prompt: {info['reference_repeats']} of "
                                          f"them)" if info["reference_repeats"] < len(data["repetitions"]) else "")
                                       + ". Memory: the page "
                                       f"arithmetic of the default model, checked against the engine."))
    return fig


# --- tensor parallelism (scripts/bench_distributed.py) ------------------------------------------

MODEL_NAMES = {"default": "SmolLM2-135M 4-bit", "qwen2-0.5b-random-fp16": "Qwen2-0.5B shape, float16"}


def draw_distributed(data: dict) -> Figure:
    """Memory per rank (weights and peak) for one rank and two, and the speeds beside it."""
    rows = data["results"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, (mem, speed) = plt.subplots(1, 2, figsize=(9.6, 3.5), layout="constrained", width_ratios=(1.5, 1))
    labels, x = [], 0.0
    for r in rows:
        for rank, (weights, peak) in enumerate(zip(r["weights"], r["peak"])):
            color = TINY if r["impl"] == "tiny-llm" else MLX
            mem.bar(x - 0.18, weights / 1e6, width=0.36, color=color, label="weights" if x == 0 else None)
            mem.bar(x + 0.18, peak / 1e6, width=0.36, color=color, alpha=0.45, hatch="//", edgecolor=color,
                    label="peak memory" if x == 0 else None)
            mem.text(x + 0.18, peak / 1e6, f"{peak / 1e6:.0f}", ha="center", va="bottom", fontsize=7)
            mem.text(x - 0.18, weights / 1e6, f"{weights / 1e6:.0f}", ha="center", va="bottom", fontsize=7)
            who = f"rank {rank} of {r['ranks']}" if r["ranks"] > 1 else "1 rank"
            model = f"\n{MODEL_NAMES.get(r['model'], r['model'])}" if len(models) > 1 else ""
            labels.append((x, f"{r['impl']}\n{who}{model}"))
            x += 1
        x += 0.4
    mem.set_xticks([t for t, _ in labels], [label for _, label in labels], fontsize=7)
    mem.set_ylabel("MB per rank")
    mem.set_title("memory per rank (solid: weights; hatched: peak)"
                  + (f", {MODEL_NAMES.get(models[0], models[0])}" if len(models) == 1 else ""))
    mem.grid(axis="x", visible=False)
    names = [f"{r['impl']}, {r['ranks']} rank{'s' if r['ranks'] > 1 else ''}"
             + (f"\n{MODEL_NAMES.get(r['model'], r['model'])}" if len(models) > 1 else "") for r in rows]
    y = range(len(rows))
    for offset, key, color in ((-0.2, "prefill", "#4a9a5b"), (0.2, "decode", "#a0d2a8")):
        values = [r[key] for r in rows]
        speed.barh([i + offset for i in y], values, height=0.4, color=color, label=key)
        for i, v in enumerate(values):
            speed.text(v, i + offset, f" {v:.1f}", va="center", fontsize=7)
    speed.set_yticks(list(y), names, fontsize=7)
    speed.invert_yaxis()
    speed.set_xlabel("tokens/s on rank 0 (median)")
    speed.set_title("speed")
    speed.legend(loc="lower right")
    speed.grid(axis="y", visible=False)
    info = data["info"]
    heading(fig, "Tensor parallelism on one 2-core machine: what two ranks buy is memory per rank", mem, ncol=2)
    footer(fig, info, quick_note(info, f"Ranks started by mlx.launch --backend ring on 127.0.0.1; {info['prompt_tokens']} "
                                       f"prompt tokens prefilled in chunks of 16, {info['decode_tokens']} decoded "
                                       f"greedily; median of {info['repeats']}. mlx-lm's shard cuts heads evenly and "
                                       f"does not apply to SmolLM2's 9 query heads on 2 ranks."))
    return fig


FIGURES = {  # NAME.svg is drawn from NAME.json by this function
    "sampler": draw_sampler,
    "kernels": draw_kernels,
    "generate": draw_generate,
    "peers": draw_peers,
    "serve": draw_serve,
    "prefix": draw_prefix,
    "distributed": draw_distributed,
}


def draw(name: str, data_dir: Path, out_dir: Path) -> Path | None:
    """Draw one figure into `out_dir`/NAME.svg from its JSON; None when the JSON is missing."""
    path = data_dir / f"{name}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    with plt.rc_context(STYLE):
        fig = FIGURES[name](data)
        out = out_dir / f"{name}.svg"
        fig.savefig(out, format="svg", metadata=METADATA, bbox_inches="tight")
        plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Draw the book's benchmark figures from their JSON.")
    parser.add_argument("--data", type=Path, default=DATA, help=f"the JSON files (default {DATA.relative_to(ROOT)})")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the SVGs go (default {OUT.relative_to(ROOT)})")
    parser.add_argument("--only", default=None, help="comma-separated figure names, of " + ", ".join(FIGURES))
    parser.add_argument("--captions", action="store_true", help="print each figure's machine, versions and date")
    args = parser.parse_args(argv)
    names = list(FIGURES) if args.only is None else [n.strip() for n in args.only.split(",")]
    if unknown := [n for n in names if n not in FIGURES]:
        parser.error(f"--only: unknown figure {unknown[0]!r}; choose from {', '.join(FIGURES)}")
    if matplotlib.__version__ != MATPLOTLIB:
        print(f"plot_benchmarks: matplotlib {matplotlib.__version__}, not {MATPLOTLIB}: the figures will not be "
              "byte for byte the committed ones", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        out = draw(name, args.data, args.out)
        if out is None:
            print(f"{name}: no {name}.json in {args.data}, skipped")
            continue
        print(f"wrote {out}")
        if args.captions:
            data = json.loads((args.data / f"{name}.json").read_text())
            print("  " + caption(data.get("info") or data["machine"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
