"""Engine — `tiny-llm batch`: many prompts at once, from a file of lines or JSON lines, each
with its own sampling fields (continuous batching).

Tests: tests/test_cli.py, tests/test_progress.py, tests/test_request.py
"""

import argparse
import json
import sys
from pathlib import Path

from ..request import CONSTRAINTS, PARAMS, FieldError, GrammarCache, build_request, seeded
from .common import UserError, load, messages_text, prefix_cache_days_done
from .options import (add_batch_size_option, add_cache_options, add_model_options, add_sampling_options,
                      batch_settings, request, request_fields)


def add_parser(commands) -> argparse.ArgumentParser:
    batch = commands.add_parser("batch", help="generate for many prompts at once (continuous batching)")
    batch.add_argument("--prompts", required=True, metavar="FILE",
                       help='one prompt per line, or JSON lines {"prompt": ..., "max_tokens": ..., "seed": ...} '
                            "with any sampling field")
    add_batch_size_option(batch)
    add_model_options(batch)
    add_sampling_options(batch)
    add_cache_options(batch)
    return batch


# What a JSON line may hold besides "prompt": SamplingParams fields, a limit and a constraint.
LINE_FIELDS = PARAMS | {"max_tokens"} | set(CONSTRAINTS)


def read_requests(args: argparse.Namespace, tokenizer=None) -> list:
    """`(prompt, max_tokens, SamplingParams)` per request in `--prompts FILE`: one prompt per
    line, or a JSON object with "prompt" and optional "max_tokens", SamplingParams fields,
    and a constraint as text: "grammar" (GBNF), "regex" or "json_schema". A line's fields
    hold over the flags'. With --seed S, request i without its own seed gets S + i.
    Without a tokenizer the file is checked before a model is loaded; token ids are checked
    against the vocabulary as each request is inserted."""
    path = Path(args.prompts)
    try:
        data = path.read_bytes()
        lines = data.decode("utf-8").splitlines()
    except OSError as e:
        raise UserError(f"cannot read --prompts {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"{path}:{line}: not valid UTF-8 text (byte {e.start + 1} of the file)") from None
    grammars = vars(args).setdefault("_grammars", GrammarCache())  # lines with one schema share its grammar
    flags = {k: v for k, v in request_fields(args).items() if k not in CONSTRAINTS}
    flags["grammar"] = request(args).params.grammar  # the flags' constraint, compiled once
    requests = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        entry = {"prompt": line}
        if line.lstrip().startswith("{"):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(entry, dict) or not isinstance(entry.get("prompt"), str):
                raise UserError(f'{where}: a JSON line needs a "prompt" string')
        unknown = sorted(set(entry) - LINE_FIELDS - {"prompt"})
        if unknown:
            raise UserError(f"{where}: unknown keys {', '.join(unknown)} (use SamplingParams field names)")
        if not entry["prompt"].strip():
            raise UserError(f"{where}: the prompt is empty")
        given = {k: v for k, v in entry.items() if k != "prompt"}
        given.setdefault("max_tokens", args.max_tokens)
        own = any(k in entry for k in CONSTRAINTS)  # a line's constraint replaces the flags'
        try:
            built = build_request(given, tokenizer, base={**flags, "grammar": None} if own else flags,
                                  grammars=grammars)
        except FieldError as e:
            raise UserError(f"{where}: {e}") from None
        params = built.params if "seed" in entry else seeded(built.params, len(requests))
        requests.append((entry["prompt"], built.max_tokens, params))
    if not requests:
        raise UserError(f"--prompts {path} holds no prompt")
    return requests


def run(args: argparse.Namespace) -> int:
    from ..batch import BatchGenerator

    if args.max_tokens < 1:
        raise UserError(f"--max-tokens must be a positive integer for batch, got {args.max_tokens}")
    settings = batch_settings(args)
    request(args)  # the flags, then the file, are checked before anything loads
    read_requests(args)
    prefix_cache_days_done(args)
    model, tokenizer = load(args)
    request(args, tokenizer, model.args.vocab_size)
    requests = read_requests(args, tokenizer)
    gen = BatchGenerator(model, tokenizer, **settings.kwargs())
    for i, (prompt, max_tokens, params) in enumerate(requests):
        text = messages_text(tokenizer, args, [{"role": "user", "content": prompt}])
        try:
            gen.insert(text, max_tokens, params)
        except ValueError as e:
            raise UserError(f"request {i}: {e}") from None
    return report(gen, requests, args.verbose)


def report(gen, requests: list, verbose: bool) -> int:
    """Run the batch to the end, printing each reply when it is done and a status line as it
    goes; 1 if any request failed (the others are still answered)."""
    texts = {i: [] for i in range(len(requests))}
    counts = dict.fromkeys(texts, 0)
    done: list[int] = []
    failed: list[int] = []
    live = sys.stderr.isatty()
    while gen.has_work():
        for r in gen.step():
            texts[r.uid].append(r.text)
            counts[r.uid] = r.generation_tokens
            if r.finish_reason:
                done.append(r.uid)
                if live:
                    print("\r\033[K", end="", file=sys.stderr)
                print(f"--- request {r.uid} ({r.finish_reason}, {r.generation_tokens} tokens) ---", flush=True)
                print("".join(texts[r.uid]), flush=True)
                if r.error:  # this request alone failed; the others go on
                    failed.append(r.uid)
                    print(f"tiny-llm: error: {r.error}", file=sys.stderr, flush=True)
        running = " ".join(f"#{u} {counts[u]}/{requests[u][1]}" for u in gen.running)
        status = f"running: {running or '-'} | waiting: {len(gen.waiting)} | done: {len(done)}/{len(requests)}"
        if live:
            print("\r\033[K" + status, end="", file=sys.stderr, flush=True)
        elif verbose:
            print(status, file=sys.stderr)
    if live:
        print("\r\033[K", end="", file=sys.stderr)
    if verbose:
        s = gen.stats
        cached = f" ({s.cached_tokens} more from the prefix cache)" if s.cached_tokens else ""
        print(f"prompt: {s.prompt_tokens} tokens prefilled{cached}, {s.prompt_tps:.1f} tokens/s\n"
              f"generation: {s.generation_tokens} tokens, {s.generation_tps:.1f} tokens/s\n"
              f"peak memory: {s.peak_memory:.3f} GB", file=sys.stderr)
    return 1 if failed else 0  # every request was answered, but not all of them well
