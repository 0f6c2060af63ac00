#!/usr/bin/env python3
"""Prefix caching: time to first token with and without tiny-llm's prefix cache, beside
mlx-lm's prompt caches, and the KV memory of a paged batch against week 2's padded one.

    python scripts/bench_prefix.py [--quick] [--requests 8] [--system-tokens 256]
        [--new-tokens 2] [--turns 5] [--reply-tokens 16] [--prefill-step-size 2048]
        [--reference-repeats 1] [--repeats 3] [--json out.json]

(`make bench-prefix` runs it with the defaults.) The default model (SmolLM2-135M-Instruct,
4-bit) for both libraries: `tiny_llm.load("default")` and `mlx_lm.load` on the same converted
directory (`tiny_llm.loader.resolve("default")`). Prompts are token ids made once with
tiny-llm's tokenizer and the model's chat template, and given as ids to both libraries.
Every generation is greedy. Times are measured, never asserted.

(a) Shared system prompt. --requests chat requests, each a system message of
    --system-tokens tokens (the same for all) and a different short question, run one
    after another: request i starts when request i-1 has finished. tiny-llm runs them
    through one `BatchGenerator` with `max_batch_size=1` (so each request runs alone; the
    prefix cache is what carries over), paged, with the prefix cache (its default budget).
    For reference, in the first --reference-repeats repetitions only (default 1; every
    request without a cache is a whole prefill, 40 s on a slow CPU, and its median is over
    requests 2..n of those sweeps): the same with `prefix_cache_bytes=0`, and mlx-lm with
    the `LRUPromptCache` of `mlx_lm.server`, used the way the server uses it (fetch the
    nearest cache, which deep-copies and trims it, prefill the rest, insert the cache with
    the prompt and generated tokens). TTFT: from `insert` (mlx-lm: from the cache lookup)
    to the request's first token. Reported: request 1 (nothing cached yet) and the median
    of requests 2..n.
(b) A chat of --turns turns: each turn's prompt is the chat template over the whole
    conversation so far (the model's default system prompt, the user questions and the
    replies), --reply-tokens tokens per reply. tiny-llm: `stream_generate` with one
    `PrefixCache` passed to every turn (as `tiny-llm chat` does), and the last turn once
    more with no cache at all (the whole conversation prefilled). mlx-lm: one
    `make_prompt_cache(model)` kept across turns, as `mlx_lm chat` does, and each turn
    `mlx_lm.stream_generate` gets only the tokens its cache does not hold yet (the
    conversation's tokens after the longest start the cache holds; positions past that
    start, e.g. a reply that tokenizes differently, are trimmed first, as mlx_lm.server
    trims). The conversation is the one tiny-llm's cached run produced, so all three see
    the same last prompt. Reported: the last turn's TTFT, timed around the stream.
(c) KV memory of a batch of 8 prompts with lengths spread evenly from 50 to 1,000 tokens,
    without a long prefill: exact arithmetic for the default model (pages of the engine's
    page size; `page_nbytes` read from a real pool after a one-token forward pass; week 2's
    cache grows in blocks of `KVCache.step` slots per row), and, as a check, the engine
    itself on a one-layer random-weight model with the default model's keys and values per
    layer (KV heads, head size, dtype), bytes multiplied by the default model's layer count
    (pages and lengths do not depend on it): `BatchGenerator(paged=True)` after its first
    step (pool.pages_in_use x pool.page_nbytes: what the rows hold, each prompt plus the
    token just fed) against `BatchGenerator(paged=False)` (the sum of its `BatchKVCache.nbytes`
    over layers, and the padded size B x longest row). Also shown: the storage the pool
    has allocated (`capacity x page_nbytes`), which grows by an eighth (at least 16 pages)
    whenever the pool runs out.

Targets (from the issue; "!" marks a miss): (a) requests 2..n >= 5x lower TTFT than
without the cache; (b) the last turn >= 5x lower than re-prefilling and <= 1.1x mlx-lm's
cached turn; (c) paged <= 0.6x the padded batch cache.

Each --repeats repetition starts from empty caches (request 1 and turn 1 are cold again;
with --reference-repeats above 1 the two tiny-llm runs of (a) alternate in order). One
warm-up generation per library first; medians over the repetitions.
"""

import argparse
import os
import statistics
import sys
import time

import mlx.core as mx
from bench_common import add_run_arguments, machine_info, write_json

from tiny_llm.defaults import PAGE_SIZE, PREFILL_STEP_SIZE, PREFIX_CACHE_BYTES
from tiny_llm.prefix_cache import common_start

MLX_KEY = "default"  # the model key of mlx-lm's LRUPromptCache
SYSTEM_TEXT = (
    "You are the help desk of a small public library in a river town. Answer questions from "
    "visitors about the library, its rooms, its opening hours, its rules and its events. "
    "The library opens at nine in the morning and closes at six in the evening from Monday "
    "to Friday; on Saturday it opens at ten and closes at two; it is closed on Sunday and on "
    "public holidays. Visitors may borrow up to eight books, four magazines and two films at "
    "a time, for three weeks; a loan can be renewed twice, in person, by telephone or on the "
    "website, unless another reader has reserved the item. Late returns cost ten cents a day "
    "per item, up to five euros; children's books have no late fees. The reading room on the "
    "first floor is quiet: no telephone calls, no food, and drinks only in closed bottles. "
    "The children's corner on the ground floor has picture books, games and a story hour "
    "every Wednesday at four. The local history room keeps old maps of the river, the mill "
    "and the bridge, photographs of the town since the eighteen nineties and the archive of "
    "the weekly newspaper; these cannot be borrowed, but copies can be made at the front "
    "desk for twenty cents a page. Six computers with internet access can be booked for one "
    "hour a day; printing costs ten cents a page in black and white and fifty in colour. "
    "Wireless internet is free; the network name and password are on the notice board by "
    "the entrance. The library card is free for residents of the town and costs twelve "
    "euros a year for others; a lost card is replaced for two euros. Groups and school "
    "classes can book a guided visit at least a week ahead. The book club meets on the last "
    "Thursday of each month at seven in the evening, and the knitting circle on Tuesday "
    "mornings. Be brief, friendly and precise; when you do not know an answer, say so and "
    "suggest asking at the front desk, by telephone or by e-mail."
)
QUESTIONS = [
    "When do you open on Saturday?", "How many books can I borrow?", "Can I eat in the reading room?",
    "Is there a story hour for kids?", "How much does printing cost?", "Can I borrow the old maps?",
    "What does a library card cost?", "When does the book club meet?", "Is the wifi free?",
    "How do I renew a loan?", "Are you open on holidays?", "What are the late fees?",
]
CHAT = [
    "Name three rivers in Europe.", "Which of them is the longest?", "What countries does it flow through?",
    "What is its largest city?", "Tell me one fact about that city.", "Why do cities grow on rivers?",
    "Name a famous bridge there.", "Thank you!",
]
MEMORY_BATCH, MEMORY_SHORTEST, MEMORY_LONGEST = 8, 50, 1000
PREFIX_TARGET, CHAT_TARGET, MLX_TARGET, MEMORY_TARGET = 5.0, 5.0, 1.1, 0.6


def greedy():
    from tiny_llm.sampler import SamplingParams

    return SamplingParams(temperature=0.0)


# ---------------------------------------------------------------- prompts

def system_prompt(tokenizer, tokens: int) -> str:
    """The shortest start of SYSTEM_TEXT (repeated if need be), whole words, of at least
    `tokens` tokens."""
    words = SYSTEM_TEXT.split()
    while len(words) < tokens:
        words += SYSTEM_TEXT.split()
    lo, hi = 1, len(words)
    while lo < hi:  # the token count grows with the number of words
        mid = (lo + hi) // 2
        if len(tokenizer.encode(" ".join(words[:mid]), add_special_tokens=False)) >= tokens:
            hi = mid
        else:
            lo = mid + 1
    return " ".join(words[:lo])


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The token ids of `messages` under the chat template, ready for the reply (as
    `tiny-llm chat` makes them)."""
    return tokenizer.encode(tokenizer.apply_chat_template(messages))


# ---------------------------------------------------------------- (a) shared system prompt

def shared_tiny(model, tokenizer, prompts: list[list[int]], args, cache_bytes: int) -> list[dict]:
    """The prompts one after another through one paged BatchGenerator (one row)."""
    from tiny_llm.batch import BatchGenerator

    gen = BatchGenerator(model, tokenizer, max_batch_size=1, prefill_step_size=args.prefill_step_size,
                         paged=True, prefix_cache_bytes=cache_bytes)
    out = []
    for ids in prompts:
        start = time.perf_counter()
        uid = gen.insert(ids, args.new_tokens, params=greedy())
        ttft, cached, tokens = None, 0, []
        while gen.has_work():
            for r in gen.step():
                if r.error:
                    raise RuntimeError(r.error)
                if r.uid != uid:
                    continue
                if ttft is None:
                    ttft, cached = time.perf_counter() - start, r.cached_tokens
                if r.token is not None:
                    tokens.append(r.token)
        out.append(dict(ttft=ttft, prompt_tokens=len(ids), cached_tokens=cached, tokens=tokens))
    return out



def mlx_generate(model, tokenizer, ids: list[int], max_tokens: int, cache, args,
                 start: float) -> tuple[float, list[int]]:
    """`mlx_lm.stream_generate` of `ids` into `cache`: the time from `start` to the first
    response, and the token of every response."""
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    ttft, tokens = None, []
    for r in stream_generate(model, tokenizer, ids, max_tokens, sampler=make_sampler(temp=0.0),
                             prompt_cache=cache, prefill_step_size=args.prefill_step_size):
        if ttft is None:
            ttft = time.perf_counter() - start
        tokens.append(r.token)
    return ttft, tokens


def shared_mlx(model, tokenizer, prompts: list[list[int]], args) -> list[dict]:
    """The prompts one after another with mlx_lm.server's `LRUPromptCache`, used as the
    server uses it: the nearest cache (deep-copied, trimmed to the common start), the rest
    of the prompt prefilled, the cache inserted again under the prompt and its tokens."""
    from mlx_lm.models.cache import LRUPromptCache, make_prompt_cache

    lru = LRUPromptCache()
    out = []
    for ids in prompts:
        start = time.perf_counter()
        cache, rest = lru.fetch_nearest_cache(MLX_KEY, list(ids))
        if cache is None:
            cache = make_prompt_cache(model)
        ttft, tokens = mlx_generate(model, tokenizer, rest, args.new_tokens, cache, args, start)
        out.append(dict(ttft=ttft, prompt_tokens=len(ids), cached_tokens=len(ids) - len(rest), tokens=tokens))
        lru.insert_cache(MLX_KEY, list(ids) + tokens, cache)
    return out


def shared_summary(runs: list[dict]) -> dict:
    """Request 1's TTFT and the median TTFT of the later requests; their cached and
    prefilled tokens."""
    later = runs[1:]
    return dict(first_ttft=runs[0]["ttft"], later_ttft=statistics.median(r["ttft"] for r in later),
                later_cached=statistics.mean(r["cached_tokens"] for r in later),
                later_prefilled=statistics.mean(r["prompt_tokens"] - r["cached_tokens"] for r in later),
                first_prefilled=runs[0]["prompt_tokens"] - runs[0]["cached_tokens"])


# ---------------------------------------------------------------- (b) chat

def chat_tiny_cached(model, tokenizer, args) -> tuple[list[dict], list[list[dict]]]:
    """The chat with one PrefixCache across turns: each turn's numbers, and each turn's
    messages (the prompt of that turn)."""
    from tiny_llm import stream_generate
    from tiny_llm.paged_cache import PagePool
    from tiny_llm.prefix_cache import PrefixCache

    cache = PrefixCache(PagePool(PAGE_SIZE), PREFIX_CACHE_BYTES)
    messages, turns, prompts = [], [], []
    for question in CHAT[:args.turns]:
        messages.append(dict(role="user", content=question))
        prompts.append(list(messages))
        ids = chat_ids(tokenizer, messages)
        start = time.perf_counter()
        ttft, tokens, text, cached = None, [], [], 0
        for r in stream_generate(model, tokenizer, ids, args.reply_tokens, params=greedy(), prefix_cache=cache,
                                 prefill_step_size=args.prefill_step_size):
            if ttft is None:
                ttft, cached = time.perf_counter() - start, r.cached_tokens
            tokens.append(r.token)
            text.append(r.text)
        turns.append(dict(ttft=ttft, prompt_tokens=len(ids), cached_tokens=cached, tokens=tokens))
        messages.append(dict(role="assistant", content="".join(text)))
    return turns, prompts


def chat_tiny_plain(model, tokenizer, messages: list[dict], args) -> dict:
    """One turn with no cache from earlier turns: the whole conversation prefilled."""
    from tiny_llm import stream_generate

    ids = chat_ids(tokenizer, messages)
    start = time.perf_counter()
    ttft, tokens = None, []
    for r in stream_generate(model, tokenizer, ids, args.reply_tokens, params=greedy(),
                             prefill_step_size=args.prefill_step_size):
        if ttft is None:
            ttft = time.perf_counter() - start
        tokens.append(r.token)
    return dict(ttft=ttft, prompt_tokens=len(ids), cached_tokens=0, tokens=tokens)


def chat_mlx(model, tokenizer, tiny_tokenizer, prompts: list[list[dict]], args) -> list[dict]:
    """The same turns with one mlx-lm prompt cache kept across them: each turn feeds only
    what the cache does not hold yet."""
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    cache, held, turns = make_prompt_cache(model), [], []  # held: the tokens in the cache
    for messages in prompts:
        ids = chat_ids(tiny_tokenizer, messages)
        start = time.perf_counter()
        keep = min(common_start(held, ids), len(ids) - 1)  # at least one token is fed
        trimmed = len(held) - keep
        if trimmed:
            trim_prompt_cache(cache, trimmed)
        new = ids[keep:]
        ttft, tokens = mlx_generate(model, tokenizer, new, args.reply_tokens, cache, args, start)
        held = (held[:keep] + new + tokens)[:cache[0].offset]
        if cache[0].offset > len(held):  # positions of tokens not known here: drop them
            trim_prompt_cache(cache, cache[0].offset - len(held))
        turns.append(dict(ttft=ttft, prompt_tokens=len(ids), cached_tokens=keep, trimmed=trimmed, tokens=tokens))
    return turns


# ---------------------------------------------------------------- (c) memory

def memory_lengths() -> list[int]:
    step = (MEMORY_LONGEST - MEMORY_SHORTEST) / (MEMORY_BATCH - 1)
    return [round(MEMORY_SHORTEST + i * step) for i in range(MEMORY_BATCH)]


def page_nbytes_of(model) -> tuple[int, str]:
    """The bytes of one page of `model`'s keys and values (every layer), from a real pool
    after a one-token forward pass; and the cache's dtype."""
    from tiny_llm.model import prefill
    from tiny_llm.paged_cache import BlockTable, PagePool, paged_views

    pool = PagePool(PAGE_SIZE, num_pages=1)
    table = BlockTable(pool)
    mx.eval(prefill(model, mx.array([[1]]), paged_views(pool, len(model.layers), [table])))
    return pool.page_nbytes, str(pool.keys[0].dtype)


def memory_arithmetic(page_nbytes: int, positions: list[int]) -> dict:
    """Paged and dense bytes for rows holding `positions` keys and values each."""
    from tiny_llm.kv_cache import KVCache

    per_position = page_nbytes // PAGE_SIZE
    pages = sum(-(-n // PAGE_SIZE) for n in positions)
    capacity = 64  # PagePool's first capacity, grown by an eighth (at least 16 pages) when it runs out
    while capacity < pages:
        capacity += max(16, capacity // 8)
    longest = max(positions)
    dense_slots = -(-longest // KVCache.step) * KVCache.step  # BatchKVCache grows in blocks of `step`
    return dict(pages=pages, paged_bytes=pages * page_nbytes, pool_bytes=capacity * page_nbytes,
                dense_bytes=len(positions) * dense_slots * per_position,
                padded_bytes=len(positions) * longest * per_position)


def random_model(like):
    """A one-layer random-weight model with `like`'s keys and values per layer and position
    (KV heads, head size; float32 like the default model's cache) and its vocabulary, tiny
    elsewhere. Page counts and cache lengths do not depend on the number of layers, and
    bytes grow in proportion to it, so one layer is enough and 30 times cheaper."""
    from tiny_llm.qwen2 import ModelArgs, Qwen2Model, expected_weight_shapes

    a = like.args
    args = ModelArgs(model_type=a.model_type, hidden_size=32, num_hidden_layers=1, intermediate_size=32,
                     num_attention_heads=a.num_key_value_heads, num_key_value_heads=a.num_key_value_heads,
                     head_dim=a.head_dim, vocab_size=a.vocab_size, rope_theta=a.rope_theta, tie_word_embeddings=True)
    shapes = expected_weight_shapes(args)
    keys = mx.random.split(mx.random.key(0), len(shapes))
    weights = {name: (mx.ones(shape) if name.endswith("norm.weight") else mx.random.normal(shape, scale=0.02, key=k))
               for (name, shape), k in zip(shapes.items(), keys)}
    return Qwen2Model(args, weights, fused=True)


def memory_engine(model, tokenizer, lengths: list[int], layers: int, args) -> dict:
    """What the engine holds after admitting the prompts (one step: each row has drawn its
    first token and fed it), paged and dense, on `model`; bytes scaled from `model`'s layers
    to `layers`."""
    import numpy as np
    from tiny_llm.batch import BatchGenerator

    scale = layers // len(model.layers)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, model.args.vocab_size, n).tolist() for n in lengths]
    out = {}
    for paged in (True, False):
        gen = BatchGenerator(model, tokenizer, max_batch_size=len(prompts), prefill_step_size=args.prefill_step_size,
                             paged=paged, prefix_cache_bytes=0)
        for p in prompts:
            gen.insert(p, 2, params=greedy())
        start = time.perf_counter()
        gen.step()
        mx.eval(gen.batch.logits)  # the decode step it started
        seconds = time.perf_counter() - start
        if paged:
            pool = gen.pool
            out |= dict(pages=pool.pages_in_use, page_nbytes=scale * pool.page_nbytes,
                        paged_bytes=scale * pool.pages_in_use * pool.page_nbytes,
                        pool_bytes=scale * pool.capacity * pool.page_nbytes, paged_seconds=seconds)
        else:
            caches = gen.batch.cache  # one BatchKVCache per layer
            out |= dict(dense_bytes=scale * sum(c.nbytes for c in caches),
                        padded_bytes=scale * sum(c.offset * c.nbytes // c.keys.shape[2] for c in caches),
                        dense_slots=caches[0].keys.shape[2], dense_offset=caches[0].offset, dense_seconds=seconds)
        while gen.has_work():
            gen.step()
    return out


# ---------------------------------------------------------------- report

def fmt(value, spec: str, miss: bool = False) -> str:
    return "-" if value is None else format(value, spec) + ("!" if miss else "")


def ratio(a, b):
    return a / b if a is not None and b else None


def median_of(reps: list[dict], *path):
    values = []
    for r in reps:
        for key in path:
            r = r.get(key) if isinstance(r, dict) else None
        if r is not None:
            values.append(r)
    return statistics.median(values) if values else None


def met(value, target: float, at_least: bool) -> str:
    if value is None:
        return "not measured"
    return "met" if (value >= target if at_least else value <= target) else "NOT met"


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def compared(shared: dict, key: str, name: str) -> str:
    """Whether the tokens of run `key` of (a) equal those of tiny-llm with the prefix cache."""
    if key not in shared:
        return f"{name} not run"
    same = all(x["tokens"] == y["tokens"][:len(x["tokens"])] for x, y in zip(shared["tiny_cached"], shared[key]))
    return f"{name} {'identical' if same else 'DIFFERENT'}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark prefix caching: tiny-llm vs mlx-lm.")
    parser.add_argument("--requests", type=int, default=8, help="(a) requests sharing the system prompt (default 8)")
    parser.add_argument("--system-tokens", type=int, default=256, help="(a) tokens of the system prompt (default 256)")
    parser.add_argument("--new-tokens", type=int, default=2, help="(a) tokens generated per request (default 2)")
    parser.add_argument("--turns", type=int, default=5, help=f"(b) chat turns (default 5, at most {len(CHAT)})")
    parser.add_argument("--reply-tokens", type=int, default=16, help="(b) tokens per reply (default 16)")
    parser.add_argument("--prefill-step-size", type=int, default=PREFILL_STEP_SIZE,
                        help=f"prompt positions per prefill chunk, both libraries (default {PREFILL_STEP_SIZE}, "
                             "both libraries' default)")
    parser.add_argument("--reference-repeats", type=int, default=1,
                        help="(a) repetitions that also run the requests without the prefix cache (each a whole "
                             "prefill) and with mlx-lm's LRUPromptCache (default 1: the first)")
    add_run_arguments(parser, repeats=3, quick="2 requests with a 32-token system prompt, 2 turns of 4 tokens, 1 repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.system_tokens, args.new_tokens, args.turns, args.reply_tokens, args.repeats = 2, 32, 2, 2, 4, 1
    if (args.requests < 2 or args.requests > len(QUESTIONS) or args.system_tokens < 1 or args.new_tokens < 1
            or not 2 <= args.turns <= len(CHAT) or args.reply_tokens < 1 or args.repeats < 1
            or args.prefill_step_size < 1 or not 1 <= args.reference_repeats <= args.repeats):
        parser.error(f"need 2 <= --requests <= {len(QUESTIONS)}, 2 <= --turns <= {len(CHAT)}, and positive "
                     "--system-tokens, --new-tokens, --reply-tokens, --repeats and --prefill-step-size, "
                     "1 <= --reference-repeats <= --repeats")

    import mlx_lm
    import tiny_llm
    from tiny_llm.loader import resolve

    began = time.perf_counter()
    model_dir = resolve("default")
    model, tokenizer = tiny_llm.load("default")
    mlx_model, mlx_tokenizer = mlx_lm.load(str(model_dir))
    info = machine_info(model=str(model_dir), requests=args.requests, system_tokens=args.system_tokens,
                        new_tokens=args.new_tokens, turns=args.turns, reply_tokens=args.reply_tokens,
                        prefill_step_size=args.prefill_step_size, repeats=args.repeats, page_size=PAGE_SIZE,
                        prefix_cache_bytes=PREFIX_CACHE_BYTES, reference_repeats=args.reference_repeats,
                        load_average_start=os.getloadavg())
    print(f"{info['processor']}, {info['cpu_count']} CPUs, {info['platform']}; MLX {info['mlx']} ({info['device']}), "
          f"mlx-lm {info['mlx_lm']}; load average {' '.join(f'{x:.2f}' for x in info['load_average_start'])}")
    print(f"model {model_dir.name}; greedy; prefill chunk {args.prefill_step_size} positions in both libraries; "
          f"pages of {PAGE_SIZE} positions, prefix cache budget {PREFIX_CACHE_BYTES >> 20} MB; "
          f"median of {args.repeats} repetitions after one warm-up per library", flush=True)
    if args.quick:
        print("--quick: a smoke run with short prompts; the targets are for the full run's sizes", flush=True)

    system = system_prompt(tokenizer, args.system_tokens)
    system_ids = len(tokenizer.encode(system, add_special_tokens=False))
    shared = [chat_ids(tokenizer, [dict(role="system", content=system), dict(role="user", content=q)])
              for q in QUESTIONS[:args.requests]]
    prefix_len = min(common_start(shared[0], p) for p in shared[1:])
    info |= dict(system_prompt_tokens=system_ids, shared_prompt_lengths=[len(p) for p in shared],
                 shared_common_start=prefix_len)

    # Warm-up: one short generation per library (and one through the batch engine).
    warm = chat_ids(tokenizer, [dict(role="user", content="Hi!")])
    from tiny_llm import stream_generate

    for _ in stream_generate(model, tokenizer, warm, 4, params=greedy(), prefill_step_size=args.prefill_step_size):
        pass
    shared_tiny(model, tokenizer, [warm, warm], argparse.Namespace(**{**vars(args), "new_tokens": 2}),
                PREFIX_CACHE_BYTES)
    from mlx_lm.models.cache import make_prompt_cache

    mlx_generate(mlx_model, mlx_tokenizer, warm, 4, make_prompt_cache(mlx_model), args, time.perf_counter())

    reps = []
    for rep in range(args.repeats):
        r = dict(shared={}, chat={})
        order = [PREFIX_CACHE_BYTES, 0] if rep % 2 == 0 else [0, PREFIX_CACHE_BYTES]
        for cache_bytes in order:
            key = "tiny_cached" if cache_bytes else "tiny_plain"
            if cache_bytes or rep < args.reference_repeats:
                r["shared"][key] = shared_tiny(model, tokenizer, shared, args, cache_bytes)
        if rep < args.reference_repeats:
            r["shared"]["mlx"] = shared_mlx(mlx_model, mlx_tokenizer, shared, args)
        for key in r["shared"]:
            s = shared_summary(r["shared"][key])
            r[f"shared_{key}"] = s
            print(f"[{rep + 1}/{args.repeats}] (a) {key:11s}: request 1 TTFT {s['first_ttft']:.2f} s, requests 2-"
                  f"{args.requests} median {s['later_ttft']:.2f} s ({s['later_prefilled']:.1f} tokens prefilled, "
                  f"{s['later_cached']:.1f} cached)", flush=True)

        turns, prompts = chat_tiny_cached(model, tokenizer, args)
        r["chat"]["tiny_cached"] = turns
        r["chat"]["tiny_plain"] = chat_tiny_plain(model, tokenizer, prompts[-1], args)
        r["chat"]["mlx"] = chat_mlx(mlx_model, mlx_tokenizer, tokenizer, prompts, args)
        last = dict(tiny_cached=turns[-1], tiny_plain=r["chat"]["tiny_plain"], mlx=r["chat"]["mlx"][-1])
        r["chat_last"] = {k: dict(ttft=v["ttft"], prompt_tokens=v["prompt_tokens"], cached_tokens=v["cached_tokens"])
                          for k, v in last.items()}
        print(f"[{rep + 1}/{args.repeats}] (b) turn {args.turns} ({turns[-1]['prompt_tokens']} prompt tokens) TTFT: "
              + ", ".join(f"{k} {v['ttft']:.2f} s ({v['prompt_tokens'] - v['cached_tokens']} prefilled)"
                          for k, v in last.items()), flush=True)
        reps.append(r)

    # (c): exact arithmetic for the default model, and the engine on a same-KV-shape random model.
    page_nbytes, kv_dtype = page_nbytes_of(model)
    lengths = memory_lengths()
    arithmetic = memory_arithmetic(page_nbytes, [n + 1 for n in lengths])
    engine = memory_engine(random_model(model), tokenizer, lengths, len(model.layers), args)
    if engine["page_nbytes"] != page_nbytes:
        print(f"WARNING: the random model's page holds {engine['page_nbytes']} bytes (x layers), the default model's "
              f"{page_nbytes}: the engine check does not have the same KV shape")

    # ---- report
    a = {k: dict(first=median_of(reps, f"shared_{k}", "first_ttft"), later=median_of(reps, f"shared_{k}", "later_ttft"),
                 prefilled=median_of(reps, f"shared_{k}", "later_prefilled"),
                 cached=median_of(reps, f"shared_{k}", "later_cached"))
         for k in ("tiny_cached", "tiny_plain", "mlx")}
    a_ratio = ratio(a["tiny_plain"]["later"], a["tiny_cached"]["later"])
    b = {k: dict(ttft=median_of(reps, "chat_last", k, "ttft"), prompt=median_of(reps, "chat_last", k, "prompt_tokens"),
                 cached=median_of(reps, "chat_last", k, "cached_tokens")) for k in ("tiny_cached", "tiny_plain", "mlx")}
    b_plain = ratio(b["tiny_plain"]["ttft"], b["tiny_cached"]["ttft"])
    b_mlx = ratio(b["tiny_cached"]["ttft"], b["mlx"]["ttft"])
    c_dense = ratio(arithmetic["paged_bytes"], arithmetic["dense_bytes"])
    c_padded = ratio(arithmetic["paged_bytes"], arithmetic["padded_bytes"])
    n = args.requests
    some = f" ({args.reference_repeats} of {args.repeats} repetitions)" if args.reference_repeats < args.repeats else ""
    names = {"tiny_cached": "tiny-llm, prefix cache", "tiny_plain": "tiny-llm, prefix_cache_bytes=0" + some,
             "mlx": "mlx-lm, LRUPromptCache (as mlx_lm.server)" + some}

    print(f"\n(a) {n} requests, one after another through one BatchGenerator(max_batch_size=1, paged=True): a "
          f"{system_ids}-token system prompt and a short question each ({min(info['shared_prompt_lengths'])}-"
          f"{max(info['shared_prompt_lengths'])} prompt tokens, the first {prefix_len} shared); {args.new_tokens} "
          f"new tokens each\n")
    print(f"| | request 1 TTFT (s) | requests 2-{n} TTFT, median (s) | tokens prefilled, requests 2-{n} | "
          f"tokens from the cache |\n|---|--:|--:|--:|--:|")
    for k, v in a.items():
        print(f"| {names[k]} | {fmt(v['first'], '.2f')} | {fmt(v['later'], '.2f')} | {fmt(v['prefilled'], '.1f')} | "
              f"{fmt(v['cached'], '.1f')} |")
    print(f"\nrequests 2-{n}, without / with the prefix cache: {fmt(a_ratio, '.1f', a_ratio is not None and a_ratio < PREFIX_TARGET)}x "
          f"(target >= {PREFIX_TARGET:g}x: {met(a_ratio, PREFIX_TARGET, True)}); tiny-llm cached / mlx-lm cached: "
          f"{fmt(ratio(a['tiny_cached']['later'], a['mlx']['later']), '.2f')}x")

    names_b = {"tiny_cached": "tiny-llm, one PrefixCache across turns", "tiny_plain": "tiny-llm, whole conversation prefilled",
               "mlx": "mlx-lm, make_prompt_cache kept across turns (as mlx_lm chat)"}
    print(f"\n(b) a {args.turns}-turn chat, {args.reply_tokens} tokens per reply; turn {args.turns}:\n")
    print("| | TTFT (s) | prompt tokens | prefilled |\n|---|--:|--:|--:|")
    for k, v in b.items():
        prefilled = v["prompt"] - v["cached"] if v["prompt"] is not None and v["cached"] is not None else None
        print(f"| {names_b[k]} | {fmt(v['ttft'], '.2f')} | {fmt(v['prompt'], '.0f')} | {fmt(prefilled, '.0f')} |")
    print(f"\nturn {args.turns}: re-prefilled / cached {fmt(b_plain, '.1f', b_plain is not None and b_plain < CHAT_TARGET)}x "
          f"(target >= {CHAT_TARGET:g}x: {met(b_plain, CHAT_TARGET, True)}); tiny-llm cached / mlx-lm cached "
          f"{fmt(b_mlx, '.2f', b_mlx is not None and b_mlx > MLX_TARGET)}x (target <= {MLX_TARGET:g}x: "
          f"{met(b_mlx, MLX_TARGET, False)})")

    print(f"\n(c) KV memory, batch of {len(lengths)}, prompt lengths {', '.join(map(str, lengths))} ({sum(lengths)} tokens), "
          f"after the first step (each row holds its prompt and the token just fed); keys and values {kv_dtype}, "
          f"{page_nbytes // PAGE_SIZE} bytes per position, {page_nbytes} per page of {PAGE_SIZE}\n")
    print(f"| | default model, arithmetic | engine, one random layer of the same KV shape, x {len(model.layers)} |"
          "\n|---|--:|--:|")
    rows = [("paged: pages in use x page bytes", "paged_bytes"), ("dense BatchKVCache, allocated (sum of nbytes)", "dense_bytes"),
            ("dense, padded (B x longest row)", "padded_bytes"), ("page pool storage allocated (capacity x page bytes)", "pool_bytes")]
    for label, key in rows:
        print(f"| {label} | {mb(arithmetic[key])} | {mb(engine[key])} |")
    print(f"\npages in use: {arithmetic['pages']} (arithmetic), {engine['pages']} (engine); paged / dense allocated "
          f"{fmt(c_dense, '.2f')}x, paged / padded {fmt(c_padded, '.2f', c_padded is not None and c_padded > MEMORY_TARGET)}x "
          f"(target <= {MEMORY_TARGET:g}x: {met(c_padded, MEMORY_TARGET, False)}); the pool's storage / dense allocated "
          f"{fmt(ratio(arithmetic['pool_bytes'], arithmetic['dense_bytes']), '.2f')}x")

    notes = []
    for rep, r in enumerate(reps, 1):
        sh = r["shared"]
        ch = r["chat"]
        same_turn = ch["tiny_cached"][-1]["tokens"] == ch["tiny_plain"]["tokens"]
        same_chat = sum(x["tokens"] == y["tokens"] for x, y in zip(ch["tiny_cached"], ch["mlx"]))
        trimmed = sum(t["trimmed"] for t in ch["mlx"])
        notes.append(f"repetition {rep}: (a) tokens: {compared(sh, 'tiny_plain', 'without the prefix cache')}, "
                     f"{compared(sh, 'mlx', 'mlx-lm')}; "
                     f"(b) turn {args.turns} with and without the cache {'identical' if same_turn else 'DIFFERENT'}, "
                     f"tiny-llm and mlx-lm replies identical in {same_chat} of {args.turns} turns, mlx-lm cache "
                     f"positions trimmed {trimmed}")
    notes.append(f"(c) engine check: prefill + first step of the 8 prompts took {engine['paged_seconds']:.1f} s paged and "
                 f"{engine['dense_seconds']:.1f} s dense on the one-layer random model; dense rows {engine['dense_slots']} slots, "
                 f"{engine['dense_offset']} used by the longest")
    total = time.perf_counter() - began
    info["load_average_end"] = os.getloadavg()
    notes.append(f"whole run {total:.0f} s; load average at the end "
                 f"{' '.join(f'{x:.2f}' for x in info['load_average_end'])} (1, 5, 15 minutes; {info['cpu_count']} CPUs)")
    print()
    for line in notes:
        print(line)
    write_json(args.json, info=info, repetitions=reps, shared=a, chat=b, memory=dict(
        lengths=lengths, page_nbytes=page_nbytes, kv_dtype=kv_dtype, arithmetic=arithmetic, engine=engine),
        ratios=dict(shared_plain_over_cached=a_ratio, chat_plain_over_cached=b_plain, chat_tiny_over_mlx=b_mlx,
                    memory_paged_over_dense=c_dense, memory_paged_over_padded=c_padded),
        targets=dict(shared=PREFIX_TARGET, chat_plain=CHAT_TARGET, chat_mlx=MLX_TARGET, memory=MEMORY_TARGET),
        notes=notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
