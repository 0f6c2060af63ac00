#!/usr/bin/env python3
"""Prefix caching: time to first token with and without tiny-llm's prefix cache, beside
mlx-lm's prompt caches, and the KV memory of a paged batch against week 2's padded one.

    python scripts/bench_prefix.py [--quick] [--requests 8] [--system-tokens 256] [--new-tokens 4]
        [--turns 5] [--reply-tokens 16] [--prefill-step-size 2048] [--repeats 3] [--json out.json]

(`make bench-prefix` runs it with the defaults.) The default model (SmolLM2-135M-Instruct,
4-bit) for both libraries: `tiny_llm.load("default")` and `mlx_lm.load` on the same converted
directory (`tiny_llm.loader.resolve("default")`). Prompts are token ids made once with
tiny-llm's tokenizer and the model's chat template, and given as ids to both libraries.
Every generation is greedy. Times are measured, never asserted.

(a) Shared system prompt. --requests chat requests, each a system message of
    --system-tokens tokens (the same for all) and a different short question, run one
    after another: request i starts when request i-1 has finished. tiny-llm runs them
    through one `BatchGenerator` with `max_batch_size=1` (so each request runs alone; the
    prefix cache is what carries over), paged, once with the prefix cache (its default
    budget) and once with `prefix_cache_bytes=0`. mlx-lm, for reference, keeps the
    `LRUPromptCache` of `mlx_lm.server` the way the server does (fetch the nearest cache,
    which deep-copies and trims it, prefill the rest, insert the cache with the prompt and
    generated tokens). TTFT: from `insert` (mlx-lm: from the cache lookup) to the request's
    first token. Reported: request 1 (nothing cached yet) and the median of requests 2..n.
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
    without a long prefill: exact arithmetic for the default model (pages of the
    engine's page size; `page_nbytes` read from a real pool after a one-token forward
    pass), and, as a check, the engine itself on a random-weight model with the default
    model's KV shape (layers, KV heads, head size, dtype) but tiny everything else, so the
    4,200 prompt tokens prefill in seconds: `BatchGenerator(paged=True)` after its first
    step (pool.pages_in_use x pool.page_nbytes: what the rows hold, each prompt plus the
    token just fed) against `BatchGenerator(paged=False)` (the sum of its `BatchKVCache.nbytes`
    over layers, and the padded size B x longest row). Also shown: the storage the pool
    has allocated (`capacity x page_nbytes`), which doubles when the pool runs out.

Targets (from the issue; "!" marks a miss): (a) requests 2..n >= 5x lower TTFT than
without the cache; (b) the last turn >= 5x lower than re-prefilling and <= 1.1x mlx-lm's
cached turn; (c) paged <= 0.6x the padded batch cache.

Each --repeats repetition starts from empty caches (request 1 and turn 1 are cold again);
the order of the tiny-llm conditions alternates between repetitions. One warm-up
generation per library first; medians over the repetitions.
"""

import argparse
import copy
import math
import statistics
import sys
import time

import mlx.core as mx
from bench_common import add_run_arguments, machine_info, write_json

from tiny_llm.defaults import PAGE_SIZE, PREFILL_STEP_SIZE, PREFIX_CACHE_BYTES

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


def common_start(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


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
                if ttft is None:
                    ttft, cached = time.perf_counter() - start, r.cached_tokens
                if r.uid == uid and r.token is not None:
                    tokens.append(r.token)
        out.append(dict(ttft=ttft, prompt_tokens=len(ids), cached_tokens=cached, tokens=tokens))
    return out


