#!/usr/bin/env python3
"""Serving speed: `tiny-llm serve` against `mlx_lm.server`, same model, same requests, over HTTP.

    python scripts/bench_serve.py [--quick] [--requests 32] [--max-tokens 64] [--concurrency 1,4,8]
        [--seeds both|no|yes] [--max-batch-size 8] [--short-prompts] [--mlx-prompt-cache-size N]
        [--only tiny|mlx] [--timeout 900] [--start-timeout 120] [--repeats 3] [--json out.json]

(`make bench-serve` runs it with the defaults.) The script starts both OpenAI-compatible
servers side by side on 127.0.0.1 (free ports), on the default model converted for mlx-lm
(SmolLM2-135M-Instruct, 4-bit: `tiny_llm.loader.resolve("default")`), and stops them (the
whole process group) at the end, also on error, Ctrl-C or SIGTERM:

    tiny-llm serve --model DIR --host 127.0.0.1 --port P --max-batch-size 8
    mlx_lm.server  --model DIR --host 127.0.0.1 --port Q --decode-concurrency 8 --prompt-concurrency 8

A server is ready when `GET /health` answers 200 (at most --start-timeout seconds; otherwise
the script exits 1 with the last lines of the server's output).

For each seed mode (no seeds, then seed = request index) and each concurrency C, the table
shows requests/s, output tok/s, TTFT p50 and p95 for both servers and the ratios
tiny-llm / mlx-lm. Targets: output tok/s >= 1.0x at every concurrency (>= 1.15x with seeds
at C = 8, where mlx_lm.server serves seeded requests one at a time), TTFT p50 <= 1.0x;
misses are marked "!".

How it is measured:
- A run is --requests chat requests (POST /v1/chat/completions, `stream: true`,
  `stream_options: {include_usage: true}`, `max_tokens` --max-tokens, temperature 0.7,
  seed i in the seeded mode) sent by C client tasks that each send the next request when
  their last one finished (httpx, async, streaming; every request has a --timeout).
- Every request carries `logit_bias` {EOS: -100} (EOS of the tokenizer), so both servers
  generate exactly --max-tokens tokens; the script checks `usage.completion_tokens` and
  warns when a request got another count (throughput always uses the reported counts,
  falling back to counting content chunks).
- Prompts: one short user message each ("<audience> asks about <topic>: write a short note.",
  ~41 tokens with the chat template's default system prompt; --short-prompts, as in --quick:
  system "Be brief." and "<audience>: <topic>?", ~21 tokens), the same list for both servers
  in a run; every run has its own audience, so no run repeats an earlier run's prompt.
  mlx_lm.server keeps a prefix cache (--mlx-prompt-cache-size 0 turns it off): it still
  reuses the shared chat-template prefix. Below the table: the cached prompt tokens each
  server reports in `usage`, and the tokens tiny-llm prefilled (its /metrics counter).
- TTFT: from sending the request to the first streamed chunk carrying content. Requests/s
  and output tok/s: requests and completion tokens of the run / wall time of the run.
- Interleaved: each repeat runs every (seed mode, C) on tiny-llm and then mlx-lm, the order
  alternating between repeats; one warm-up request per server first; medians of --repeats.
- Step cost (batch-C / batch-1): the median interval between a request's content chunks at
  the largest C / the same at C = 1, per server and seed mode. One chunk is one token on
  both servers (chunks per token is checked), so this is wall time per decode step.
"""

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from bench_common import add_run_arguments, machine_info, write_json

SERVERS = ("tiny", "mlx")  # always; --peer llama.cpp adds "llama"
NAMES = {"tiny": "tiny-llm", "mlx": "mlx-lm", "llama": "llama.cpp"}
# llama.cpp's targets (--peer): output tok/s >= 0.9x llama-server's, TTFT p50 <= 1.5x.
PEER_SPEED_TARGET, PEER_TTFT_TARGET = 0.9, 1.5
TOPICS = [
    "volcanoes", "honey bees", "the moon", "bicycles", "rainforests", "glaciers", "the printing press",
    "coral reefs", "lighthouses", "tea", "owls", "the Roman roads", "thunderstorms", "chess", "bread",
    "deserts", "whales", "clocks", "the Silk Road", "mushrooms", "trains", "comets", "maple trees",
    "bridges", "penguins", "paper", "the tides", "windmills", "salt", "octopuses", "libraries", "kites",
]
AUDIENCES = [
    "A child", "A sailor", "A farmer", "A nurse", "A student", "A pilot", "A baker", "A painter",
    "A librarian", "A miner", "A poet", "A teacher", "A chemist", "A tourist", "A gardener", "A judge",
    "A carpenter", "A doctor", "A fisherman", "A musician", "A historian", "A runner", "A cook", "A tailor",
]
WARMUP = [dict(role="user", content="A visitor asks about rivers: write a short note.")]
SHORT_SYSTEM = "Be brief."
WARMUP_SHORT = [dict(role="system", content=SHORT_SYSTEM), dict(role="user", content="A visitor: rivers?")]
TEMPERATURE = 0.7
PREFILLED = "tiny_llm_prefill_tokens_total"  # in tiny-llm's /metrics: prompt tokens run through the model
SPEED_TARGET, TTFT_TARGET, SEEDED_TARGET, SEEDED_TARGET_C = 1.0, 1.0, 1.15, 8


# ---------------------------------------------------------------- servers

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server subprocess in its own process group, its output in a log file."""

    def __init__(self, key: str, cmd: list[str], port: int, log_dir: Path):
        self.key, self.name, self.cmd, self.port = key, NAMES[key], cmd, port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_dir / f"{key}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        finally:
            log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").rstrip().splitlines()
        except OSError:
            return "(no output)"
        return "\n".join(text[-lines:]) or "(no output)"

    def wait_ready(self, timeout: float) -> str | None:
        """None once `GET /health` answers 200; otherwise why not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                return f"exited with code {self.proc.returncode}"
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        return f"no 200 from GET /health within {timeout:g} s"

    def stop(self) -> None:
        """SIGTERM to the server's process group, then (after at most 10 s) SIGKILL to whatever
        is left of it."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break  # the group is gone
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                pass


def make_servers(args, model_dir: Path, log_dir: Path) -> dict[str, Server]:
    bindir = Path(sys.executable).parent
    cmds = {
        "tiny": [str(bindir / "tiny-llm"), "serve", "--model", str(model_dir), "--host", "127.0.0.1",
                 "--max-batch-size", str(args.max_batch_size)],
        "mlx": [str(bindir / "mlx_lm.server"), "--model", str(model_dir), "--host", "127.0.0.1",
                "--decode-concurrency", str(args.max_batch_size), "--prompt-concurrency", str(args.max_batch_size)]
        + (["--prompt-cache-size", str(args.mlx_prompt_cache_size)] if args.mlx_prompt_cache_size is not None else []),
    }
    if "llama" in args.servers:  # the default model's own GGUF: the same weights
        import peers

        cmds["llama"] = [str(peers.bin_dir() / "llama-server"), "-m", peers.default_gguf(), "--host", "127.0.0.1",
                         "-t", str(os.cpu_count() or 1), "-np", str(args.max_batch_size),
                         "-c", str(args.max_batch_size * 1024), "--threads-http", str(max(args.concurrency) + 2)]
    servers = {}
    for key in args.servers:
        port = free_port()
        servers[key] = Server(key, cmds[key] + ["--port", str(port)], port, log_dir)
    return servers


# ---------------------------------------------------------------- requests

def prompts_for(run: int, n: int, short: bool = False) -> list[list[dict]]:
    """`n` different chat conversations for run number `run` (its own audience, rotated topics):
    one user message, or with `short` a brief system message and a few words (for --quick)."""
    audience = AUDIENCES[run % len(AUDIENCES)] + (f" (group {run // len(AUDIENCES) + 1})" if run >= len(AUDIENCES) else "")
    out = []
    for i in range(n):
        topic = TOPICS[(i + 5 * run) % len(TOPICS)] + (f", part {i // len(TOPICS) + 1}" if i >= len(TOPICS) else "")
        if short:
            out.append([dict(role="system", content=SHORT_SYSTEM), dict(role="user", content=f"{audience}: {topic}?")])
        else:
            out.append([dict(role="user", content=f"{audience} asks about {topic}: write a short note.")])
    return out


def request_body(messages: list[dict], max_tokens: int, eos_ids, seed: int | None) -> dict:
    body = dict(messages=messages, max_tokens=max_tokens, temperature=TEMPERATURE,
                stream=True, stream_options=dict(include_usage=True),
                logit_bias={str(i): -100 for i in sorted(eos_ids)})
    if seed is not None:
        body["seed"] = seed
    return body


async def one_request(client: httpx.AsyncClient, url: str, body: dict, timeout: float) -> dict:
    """Send one streaming chat request; the times of its content chunks and its usage."""
    start = time.perf_counter()
    chunks, usage, text = [], None, []

    async def consume():
        nonlocal usage
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')[:300]}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank lines, SSE comments (mlx-lm's ": keepalive")
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    raise RuntimeError(f"error event: {json.dumps(event)[:300]}")
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        chunks.append(time.perf_counter())
                        text.append(content)

    try:
        await asyncio.wait_for(consume(), timeout)
    except asyncio.TimeoutError:
        return dict(error=f"timed out after {timeout:g} s ({len(chunks)} content chunks)")
    except Exception as e:  # noqa: BLE001 -- reported per request
        return dict(error=f"{type(e).__name__}: {e}")
    end = time.perf_counter()
    if not chunks:
        return dict(error=f"no content chunk (usage {usage})")
    tokens = usage.get("completion_tokens") if usage else None
    details = (usage or {}).get("prompt_tokens_details") or {}
    return dict(ttft=chunks[0] - start, latency=end - start, chunks=len(chunks),
                tokens=tokens if tokens is not None else len(chunks), usage_reported=tokens is not None,
                prompt_tokens=(usage or {}).get("prompt_tokens"), cached_tokens=details.get("cached_tokens"),
                intervals=[b - a for a, b in zip(chunks, chunks[1:])], text="".join(text))


async def run_load(server: Server, prompts: list[list[dict]], max_tokens: int, concurrency: int, seeded: bool,
                   eos_ids, timeout: float) -> tuple[float, list[dict]]:
    """All `prompts` with `concurrency` client tasks; wall time and per-request results."""
    results: list[dict | None] = [None] * len(prompts)
    queue = list(range(len(prompts)))[::-1]
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
        async def client_task():
            while queue:
                i = queue.pop()
                body = request_body(prompts[i], max_tokens, eos_ids, i if seeded else None)
                results[i] = await one_request(client, server.url, body, timeout)

        start = time.perf_counter()
        await asyncio.gather(*(client_task() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return wall, results


def scrape(server: Server) -> dict[str, float]:
    """The unlabelled counters and gauges of `GET /metrics` (Prometheus text; {} without one)."""
    try:
        response = httpx.get(server.url + "/metrics", timeout=10)
    except httpx.HTTPError:
        return {}
    if response.status_code != 200:
        return {}
    out = {}
    for line in response.text.splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#") and "{" not in parts[0]:
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return out


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks (numpy's default)."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def summarize(wall: float, results: list[dict], max_tokens: int) -> dict:
    ok = [r for r in results if "error" not in r]
    errors = [r["error"] for r in results if "error" in r]
    tokens = sum(r["tokens"] for r in ok)
    intervals = [x for r in ok for x in r["intervals"]]
    chunks = sum(r["chunks"] for r in ok)
    return dict(
        wall_s=wall, requests=len(results), errors=errors,
        req_per_s=len(ok) / wall, out_tok_per_s=tokens / wall,
        ttft_p50=percentile([r["ttft"] for r in ok], 50), ttft_p95=percentile([r["ttft"] for r in ok], 95),
        step_s=statistics.median(intervals) if intervals else None,
        chunks_per_token=chunks / tokens if tokens else None,
        completion_tokens=[r["tokens"] for r in ok], off_count=sum(r["tokens"] != max_tokens for r in ok),
        usage_missing=sum(not r["usage_reported"] for r in ok),
        prompt_tokens=statistics.mean(r["prompt_tokens"] for r in ok) if ok and all(r["prompt_tokens"] is not None for r in ok) else None,
        cached_tokens=statistics.mean(r["cached_tokens"] for r in ok) if ok and all(r["cached_tokens"] is not None for r in ok) else None,
        sample=ok[0]["text"][:120] if ok else None,
    )


# ---------------------------------------------------------------- report

METRICS = ("req_per_s", "out_tok_per_s", "ttft_p50", "ttft_p95", "step_s", "chunks_per_token",
           "prompt_tokens", "cached_tokens", "prefilled_tokens")


def medians(runs: list[dict]) -> dict:
    out = {}
    for key in METRICS:
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(value: float | None, spec: str, miss: bool = False) -> str:
    return "-" if value is None else format(value, spec) + ("!" if miss else "")


def speed_target(seeded: bool, concurrency: int) -> float:
    return SEEDED_TARGET if seeded and concurrency == SEEDED_TARGET_C else SPEED_TARGET


def table(cells: list[dict], other: str = "mlx") -> str:
    """tiny-llm against `other` ("mlx", or "llama" with --peer llama.cpp), a row per cell."""
    short = {"mlx": "mlx", "llama": "llama"}[other]
    lines = [f"| seed | C | req/s tiny | req/s {short} | ratio | out tok/s tiny | out tok/s {short} | ratio | "
             f"TTFT p50 tiny (s) | TTFT p50 {short} (s) | ratio | TTFT p95 tiny (s) | TTFT p95 {short} (s) |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    prefix = "ratio_" if other == "mlx" else "peer_ratio_"
    for c in cells:
        t, m = c["median"].get("tiny", {}), c["median"].get(other, {})
        r_tok, r_ttft = c[prefix + "out_tok_per_s"], c[prefix + "ttft_p50"]
        target = speed_target(c["seeded"], c["concurrency"]) if other == "mlx" else PEER_SPEED_TARGET
        ttft_target = TTFT_TARGET if other == "mlx" else PEER_TTFT_TARGET
        lines.append(
            f"| {'yes' if c['seeded'] else 'no'} | {c['concurrency']} "
            f"| {fmt(t.get('req_per_s'), '.3f')} | {fmt(m.get('req_per_s'), '.3f')} | {fmt(c[prefix + 'req_per_s'], '.2f')} "
            f"| {fmt(t.get('out_tok_per_s'), '.2f')} | {fmt(m.get('out_tok_per_s'), '.2f')} "
            f"| {fmt(r_tok, '.2f', r_tok is not None and r_tok < target)} "
            f"| {fmt(t.get('ttft_p50'), '.3f')} | {fmt(m.get('ttft_p50'), '.3f')} "
            f"| {fmt(r_ttft, '.2f', r_ttft is not None and r_ttft > ttft_target)} "
            f"| {fmt(t.get('ttft_p95'), '.3f')} | {fmt(m.get('ttft_p95'), '.3f')} |")
    return "\n".join(lines)


def notes(cells: list[dict], args) -> list[str]:
    out = []
    lo, hi = min(args.concurrency), max(args.concurrency)
    for seeded in args.seed_modes:
        by_c = {c["concurrency"]: c for c in cells if c["seeded"] == seeded}
        if lo == hi or lo not in by_c or hi not in by_c:
            continue
        parts = []
        for key in args.servers:
            a, b = by_c[hi]["median"][key].get("step_s"), by_c[lo]["median"][key].get("step_s")
            parts.append(f"{NAMES[key]} {fmt(ratio(a, b), '.2f')}x ({fmt(a, '.3f')} s / {fmt(b, '.3f')} s)")
        out.append(f"step cost batch-{hi} / batch-{lo} ({'seeded' if seeded else 'no seeds'}; median interval "
                   f"between content chunks): " + ", ".join(parts))
    for key in args.servers:
        runs = [r for c in cells for r in c["runs"][key]]
        cpt = [r["chunks_per_token"] for r in runs if r.get("chunks_per_token")]
        prompt = [r["prompt_tokens"] for r in runs if r.get("prompt_tokens") is not None]
        cached = [r["cached_tokens"] for r in runs if r.get("cached_tokens") is not None]
        prefilled = [r["prefilled_tokens"] for r in runs if r.get("prefilled_tokens") is not None]
        out.append(f"{NAMES[key]}: prompt tokens per request {fmt(statistics.mean(prompt) if prompt else None, '.1f')}, "
                   f"of them cached {fmt(statistics.mean(cached) if cached else None, '.1f')} (usage; '-': not reported)"
                   + (f", prefilled {statistics.mean(prefilled):.1f} (/metrics)" if prefilled else "")
                   + f"; content chunks per token {fmt(statistics.mean(cpt) if cpt else None, '.2f')}")
        off = sum(r["off_count"] for r in runs)
        if off:
            counts = sorted({n for r in runs for n in r["completion_tokens"] if n != args.max_tokens})
            out.append(f"WARNING: {NAMES[key]}: {off} requests did not generate {args.max_tokens} tokens "
                       f"(got {counts}); throughput uses the real counts")
        missing = sum(r["usage_missing"] for r in runs)
        if missing:
            out.append(f"WARNING: {NAMES[key]}: {missing} requests without usage.completion_tokens "
                       f"(counted content chunks instead)")
    return out


# ---------------------------------------------------------------- main

def check_alive(servers: dict[str, Server]) -> None:
    for s in servers.values():
        if not s.alive():
            raise ServerFailed(f"{s.name} server died (exit code {s.proc.returncode})", s)


class ServerFailed(RuntimeError):
    def __init__(self, message: str, server: Server):
        super().__init__(message)
        self.server = server


def bench(args, servers: dict[str, Server], eos_ids) -> tuple[list[dict], list[str]]:
    """Warm-up, then the interleaved runs; the table's cells and every request error."""
    warmup = WARMUP_SHORT if args.short_prompts else WARMUP
    for key in args.servers:
        wall, results = asyncio.run(run_load(servers[key], [warmup], min(4, args.max_tokens), 1, False,
                                             eos_ids, args.timeout))
        if "error" in results[0]:
            check_alive(servers)
            raise ServerFailed(f"{NAMES[key]} warm-up request failed: {results[0]['error']}", servers[key])
        print(f"warm-up {NAMES[key]}: {wall:.2f} s, {results[0]['tokens']} tokens: {results[0]['text'][:60]!r}",
              flush=True)

    cells = {(seeded, c): dict(seeded=seeded, concurrency=c, runs={k: [] for k in args.servers})
             for seeded in args.seed_modes for c in args.concurrency}
    errors, run_index = [], 0
    total = args.repeats * len(cells)
    for repeat in range(args.repeats):
        order = list(args.servers) if repeat % 2 == 0 else list(args.servers)[::-1]
        for (seeded, c), cell in cells.items():
            prompts = prompts_for(run_index, args.requests, args.short_prompts)
            run_index += 1
            for key in order:
                check_alive(servers)
                before = scrape(servers[key])
                wall, results = asyncio.run(run_load(servers[key], prompts, args.max_tokens, c, seeded,
                                                     eos_ids, args.timeout))
                s = summarize(wall, results, args.max_tokens)
                after = scrape(servers[key])
                if PREFILLED in before and PREFILLED in after:
                    s["prefilled_tokens"] = (after[PREFILLED] - before[PREFILLED]) / len(prompts)
                cell["runs"][key].append(s)
                errors += [f"{NAMES[key]} seed={'yes' if seeded else 'no'} C={c}: {e}" for e in s["errors"]]
                print(f"[{run_index}/{total}] repeat {repeat + 1} seed {'yes' if seeded else 'no '} C={c} "
                      f"{NAMES[key]:8s}: {wall:7.1f} s, {s['req_per_s']:.3f} req/s, {s['out_tok_per_s']:.2f} tok/s, "
                      f"TTFT p50 {fmt(s['ttft_p50'], '.2f')} s p95 {fmt(s['ttft_p95'], '.2f')} s, "
                      f"step {fmt(s['step_s'], '.3f')} s" + (f", {len(s['errors'])} ERRORS" if s["errors"] else ""),
                      flush=True)
    out = []
    for cell in cells.values():
        cell["median"] = {k: medians(cell["runs"][k]) for k in args.servers}
        t, m, p = (cell["median"].get(k, {}) for k in ("tiny", "mlx", "llama"))
        for key in ("req_per_s", "out_tok_per_s", "ttft_p50", "ttft_p95"):
            cell[f"ratio_{key}"] = ratio(t.get(key), m.get(key))
            if "llama" in args.servers:
                cell[f"peer_ratio_{key}"] = ratio(t.get(key), p.get(key))
        out.append(cell)
    return out, errors


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark serving: tiny-llm serve vs mlx_lm.server over HTTP.")
    parser.add_argument("--requests", type=int, default=32, help="chat requests per run (default 32)")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (default 64)")
    parser.add_argument("--concurrency", default="1,4,8", help="comma list of client concurrencies (default 1,4,8)")
    parser.add_argument("--seeds", choices=("both", "no", "yes"), default="both",
                        help="run without seeds, with a seed per request, or both (default)")
    parser.add_argument("--max-batch-size", type=int, default=8,
                        help="tiny-llm --max-batch-size and mlx-lm --decode/--prompt-concurrency (default 8)")
    parser.add_argument("--short-prompts", action="store_true",
                        help="a brief system message and a few words per request (~21 prompt tokens instead of ~41)")
    parser.add_argument("--mlx-prompt-cache-size", type=int, default=None,
                        help="pass --prompt-cache-size to mlx_lm.server (0: no prefix cache; default: its own, 10)")
    parser.add_argument("--only", choices=(*SERVERS, "llama"), default=None, help="benchmark one server only")
    parser.add_argument("--peer", choices=["llama.cpp"], default=None,
                        help="also llama-server on the default model's GGUF (built by scripts/peers.py build)")
    parser.add_argument("--model", default="default", help="model name or directory for tiny_llm.loader.resolve")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per request (default 900; --quick 120)")
    parser.add_argument("--start-timeout", type=float, default=120, help="seconds for a server to start (default 120)")
    add_run_arguments(parser, repeats=3, quick="4 requests, 8 tokens, concurrency 1 and 2, 1 repeat, short prompts")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.max_tokens, args.concurrency, args.repeats, args.short_prompts = 4, 8, "1,2", 1, True
    if args.timeout is None:
        args.timeout = 120 if args.quick else 900
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.seed_modes = {"both": [False, True], "no": [False], "yes": [True]}[args.seeds]
    args.servers = [args.only] if args.only else list(SERVERS) + (["llama"] if args.peer else [])
    if "llama" in args.servers:
        import peers

        if peers.built() is None:
            parser.error("llama.cpp is not built: run `python scripts/peers.py build` first (~8 minutes)")
    if args.requests < 1 or args.max_tokens < 2 or args.repeats < 1 or min(args.concurrency) < 1:
        parser.error("need --requests >= 1, --max-tokens >= 2, --repeats >= 1 and concurrencies >= 1")

    from tiny_llm.loader import resolve
    from tiny_llm.tokenizer import Tokenizer

    model_dir = resolve(args.model)
    eos_ids = Tokenizer.from_directory(model_dir).eos_token_ids

    # Ctrl-C (also when started with SIGINT ignored) and SIGTERM (a CI timeout) unwind, so the
    # servers are stopped.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as log_dir:
        servers = make_servers(args, model_dir, Path(log_dir))
        try:
            start = time.perf_counter()
            for s in servers.values():
                s.start()
            for s in servers.values():
                why = s.wait_ready(max(1.0, args.start_timeout - (time.perf_counter() - start)))
                if why:
                    raise ServerFailed(f"{s.name} server failed to start: {why}", s)
            started = time.perf_counter() - start

            info = machine_info(model=str(model_dir), requests=args.requests, max_tokens=args.max_tokens,
                                concurrency=args.concurrency, repeats=args.repeats, temperature=TEMPERATURE,
                                max_batch_size=args.max_batch_size, short_prompts=args.short_prompts,
                                commands={k: " ".join(s.cmd) for k, s in servers.items()})
            print(f"{info['processor']}, {info['cpu_count']} CPUs, {info['platform']}; MLX {info['mlx']} "
                  f"({info['device']}), mlx-lm {info['mlx_lm']}")
            print(f"model {model_dir.name}; servers up in {started:.1f} s:")
            for s in servers.values():
                print(f"  {' '.join(s.cmd)}")
            print(f"{args.requests} chat requests per run ({'short prompts' if args.short_prompts else 'one user message'}), "
                  f"{args.max_tokens} output tokens (EOS {sorted(eos_ids)} "
                  f"logit_bias -100), temperature {TEMPERATURE}, streaming; concurrency {args.concurrency}; seeds: "
                  f"{args.seeds}; median of {args.repeats} interleaved repeats after one warm-up request per server",
                  flush=True)
            cells, errors = bench(args, servers, eos_ids)
        except ServerFailed as e:
            print(f"bench_serve: {e}; last lines of its output:\n{e.server.tail()}", file=sys.stderr)
            return 1
        finally:
            for s in servers.values():
                s.stop()

    print(f"\nratio = tiny-llm / mlx-lm; '!' misses the target (out tok/s >= {SPEED_TARGET:g}x, with seeds at "
          f"C = {SEEDED_TARGET_C} >= {SEEDED_TARGET:g}x; TTFT p50 <= {TTFT_TARGET:g}x)\n")
    print(table(cells))
    if "llama" in args.servers:
        print(f"\nratio = tiny-llm / llama.cpp (llama-server on the same GGUF); '!' misses the target (out tok/s >= "
              f"{PEER_SPEED_TARGET:g}x, TTFT p50 <= {PEER_TTFT_TARGET:g}x)\n")
        print(table(cells, "llama"))
    print()
    lines = notes(cells, args)
    for line in lines:
        print(line)
    if errors:
        print(f"{len(errors)} requests failed, e.g.:", *errors[:5], sep="\n  ")
    write_json(args.json, info=info, cells=cells, notes=lines, errors=errors)
    return 1 if errors else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the servers are stopped by then
        print("bench_serve: interrupted", file=sys.stderr)
        sys.exit(130)
