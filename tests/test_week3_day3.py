"""Week 3, day 3: the prefix cache — pages found by content, shared across requests, copied
before they are written, evicted least recently used under a byte budget."""

import mlx.core as mx
import pytest
from conftest import tiny_model, vocab_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

import tiny_llm
from tiny_llm.batch import BatchGenerator
from tiny_llm.paged_cache import BlockTable, PagedKVCache, PagePool
from tiny_llm.prefix_cache import PrefixCache
from tiny_llm.sampler import SamplingParams

P = 4  # positions per page in the hand-made cases
PAGE_BYTES = P * 2 * 4  # one layer, one head, one feature: keys and values in float32


def key_of(tokens: list[int], s: int) -> float:
    """The key a test writes for position `s` of `tokens` (it depends on the token and its place)."""
    return float(tokens[s] * 1000 + s)


def write(pool: PagePool, table: BlockTable, tokens: list[int]) -> None:
    """Write the keys of `tokens[table.length:]` after what `table` holds (one layer)."""
    start = table.length
    k = mx.array([key_of(tokens, s) for s in range(start, len(tokens))])[None, None, :, None]
    PagedKVCache(pool, 0, [table]).update_and_fetch(k, -k)


def keys(pool: PagePool, table: BlockTable) -> list[float]:
    return pool.keys[0][mx.array(table.slots(0, table.length))][:, 0, 0].tolist() if table.length else []


def finished(cache: PrefixCache, tokens: list[int]) -> None:
    """A sequence of `tokens` runs from scratch and ends: its pages go to the cache."""
    table = BlockTable(cache.pool)
    write(cache.pool, table, tokens)
    cache.release(table, tokens)


SEQ = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]  # pages [1 2 3 4] [5 6 7 8] and the start [9 10]


@pytest.mark.parametrize("prompt, length", [
    ([1, 2, 3, 4, 5, 6, 9, 9, 9], 6),  # a whole page, then the common start [5 6] of the next
    (SEQ, 9),  # all of it but the last token, whose logits are needed
    (SEQ + [11, 12], 10),  # everything cached; [11 12] is prefilled
    ([1, 2, 3, 4], 3),
    ([2, 1, 3, 4, 5], 0),  # differs at the first token
])
def test_lookup_takes_whole_pages_then_the_longest_common_start(prompt, length):
    cache = PrefixCache(PagePool(P))
    finished(cache, SEQ)
    table = cache.lookup(prompt)
    assert table.length == length
    assert keys(cache.pool, table) == [key_of(prompt, s) for s in range(length)]
    assert len(table.pages) == -(-length // P)
    assert cache.stats.cached_tokens == length and cache.stats.prompt_tokens == len(prompt)


def test_the_first_page_that_differs_is_copied_and_the_cached_one_stays():
    """A prompt that shares [5 6] of the second page takes that page and, at its first write,
    copies it: the cached page keeps [5 6 7 8] for the next request."""
    cache = PrefixCache(PagePool(P))
    finished(cache, SEQ)
    prompt = [1, 2, 3, 4, 5, 6, 9, 9, 9]
    table = cache.lookup(prompt)
    shared = table.pages[1]
    write(cache.pool, table, prompt)
    assert table.pages[1] != shared and keys(cache.pool, table) == [key_of(prompt, s) for s in range(9)]
    again = cache.lookup(SEQ)
    assert again.pages[1] == shared and keys(cache.pool, again) == [key_of(SEQ, s) for s in range(9)]


def test_pages_of_a_prompt_are_cached_once():
    """Two sequences with the same first page: one cached copy of it (held by the cache once)."""
    cache = PrefixCache(PagePool(P))
    finished(cache, [1, 2, 3, 4, 5])
    finished(cache, [1, 2, 3, 4, 6, 7])
    assert cache.pages == 3  # [1 2 3 4], [5] and [6 7]
    assert cache.pool.pages_in_use == 3 and all(cache.pool.refs[p] in (0, 1) for p in range(cache.pool.capacity))


def held(cache: PrefixCache, tokens: list[int]) -> int:
    """How many positions of `tokens` the cache holds (looked up, then let go again)."""
    table = cache.lookup(tokens)
    length = table.length
    table.release()
    return length


def test_idle_pages_are_evicted_least_recently_used_and_deepest_first():
    """A budget of three pages. A = [1..8] (2 pages), then B = [20..27] (2 pages): A's second
    page (older and deeper) goes. Then A's first page and all of B are used, A before B; a
    third sequence of two pages evicts the two oldest marks: A's first page, then B's
    second page (deeper than B's first, so older)."""
    cache = PrefixCache(PagePool(P), max_bytes=3 * PAGE_BYTES)
    a, b, c = [1, 2, 3, 4, 5, 6, 7, 8], [20, 21, 22, 23, 24, 25, 26, 27], [30, 31, 32, 33, 34]
    finished(cache, a)
    finished(cache, b)
    assert cache.pages == 3 and cache.idle_bytes == 3 * PAGE_BYTES
    assert held(cache, a + [0]) == 4 and held(cache, b + [0]) == 8
    finished(cache, c)
    assert cache.pages == 3 and cache.idle_bytes == 3 * PAGE_BYTES
    assert (held(cache, a + [0]), held(cache, b + [0]), held(cache, c + [0])) == (0, 4, 5)


def test_a_page_in_use_is_never_evicted():
    """A running request holds the cached pages it found: even with a budget of one page they
    stay, and they are still found; once it ends they may go."""
    cache = PrefixCache(PagePool(P), max_bytes=PAGE_BYTES)
    finished(cache, SEQ[:8])  # two pages, one over the budget: the deeper one is evicted
    assert cache.pages == 1
    running = cache.lookup(SEQ)  # holds [1 2 3 4]
    finished(cache, [40, 41, 42, 43, 44, 45, 46, 47, 48])  # more idle pages than the budget allows
    assert cache.idle_bytes <= PAGE_BYTES and held(cache, SEQ) == 4
    assert keys(cache.pool, running) == [key_of(SEQ, s) for s in range(4)]
    running.release()
    cache.evict()
    assert cache.idle_bytes <= PAGE_BYTES


# ---- the pool under random traffic -----------------------------------------------------------

OPS = st.lists(st.tuples(st.sampled_from(["insert", "step", "finish", "cancel", "fork", "evict"]),
                         st.integers(0, 7), st.lists(st.integers(1, 3), min_size=1, max_size=9)),
               max_size=25)


@settings(derandomize=True, database=None, deadline=None, max_examples=200)
@given(ops=OPS, page_size=st.sampled_from([1, 2, 3]), budget_pages=st.integers(0, 6))
def test_random_traffic_never_frees_or_overwrites_a_page_in_use_nor_leaks_one(ops, page_size, budget_pages):
    """Random interleavings of requests that start (from the cache), decode, fork (n > 1),
    finish (into the cache), are cancelled, and evictions: after every operation each page's
    count equals its holders, every running sequence still reads its own keys, and the pages
    only the cache holds fit the budget. At the end the pool is empty."""
    pool = PagePool(page_size, num_pages=2)
    budget = budget_pages * page_size * 2 * 4
    cache = PrefixCache(pool, max_bytes=budget)
    running: list[tuple[BlockTable, list[int]]] = []
    for op, i, tokens in ops:
        if op == "insert":
            table = cache.lookup(tokens) if budget else BlockTable(pool)
            write(pool, table, tokens)
            if budget:
                cache.insert(table, tokens, full_pages_only=True)
            running.append((table, list(tokens)))
        elif running and op in ("step", "finish", "cancel", "fork"):
            table, seq = running[i % len(running)]
            if op == "step":
                seq.append(tokens[0])
                write(pool, table, seq)
            elif op == "fork":
                running.append((table.fork(), list(seq)))
            else:
                running.remove((table, seq))
                if op == "finish":
                    cache.release(table, seq)
                else:
                    cache.cancel(table)
        elif op == "evict":
            cache.evict()
        holders = [0] * pool.capacity
        for table, _ in running:
            for p in table.pages:
                holders[p] += 1
        for node in cache._nodes.values():
            holders[node.page] += 1
        assert pool.refs == holders
        assert pool.pages_in_use == sum(h > 0 for h in holders)
        for table, seq in running:
            assert keys(pool, table) == [key_of(seq, s) for s in range(table.length)]
        assert cache.idle_bytes <= budget
    for table, _ in running:
        table.release()
    cache.clear()
    assert pool.pages_in_use == 0 and set(pool.refs) == {0}


# ---- the engine with the prefix cache ---------------------------------------------------------

SYSTEM = [9, 14, 3, 27, 8, 8, 31, 5, 17, 2, 40, 6, 11, 23, 4, 19, 30, 7, 12]
QUESTIONS = [[45, 3, 8], [50, 51], [45, 3, 9, 9, 13], [60]]


def run(gen: BatchGenerator, prompts, params, limit: int) -> dict[int, list[int]]:
    uids = [gen.insert(p, limit, q) for p, q in zip(prompts, params)]
    out = {u: [] for u in uids}
    while gen.has_work():
        for r in gen.step():
            out[r.uid].append(r.token)
    return [out[u] for u in uids]


@pytest.mark.parametrize("name", ["qwen2-untied", "llama-tied"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_requests_sharing_a_system_prompt_get_the_same_tokens_from_the_cache(name, page_size):
    """Four requests with one system prompt, two rows at a time, chunked prefill, greedy and
    seeded: the same tokens with and without the prefix cache, and the later requests take
    the system prompt from it (pages of 64 hold the whole prompt: the common start of the one
    cached page is taken and copied)."""
    model, _ = tiny_model(name, seed=21)
    tok = vocab_tokenizer(model.args.vocab_size)
    prompts = [SYSTEM + q for q in QUESTIONS]
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, seed=3),
              SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_p=0.9, seed=8)]
    outs, gens = [], []
    for budget in (0, 1 << 20):
        gen = BatchGenerator(model, tok, max_batch_size=2, prefill_step_size=3, page_size=page_size,
                             prefix_cache_bytes=budget)
        outs.append(run(gen, prompts, params, 6))
        gens.append(gen)
    assert outs[0] == outs[1]
    without, with_cache = gens[0].stats, gens[1].stats
    assert without.cached_tokens == 0 and without.prompt_tokens == sum(map(len, prompts))
    assert with_cache.cached_tokens + with_cache.prompt_tokens == sum(map(len, prompts))
    if page_size < len(SYSTEM):  # the second request, prefilled next to the first, takes its full pages
        assert with_cache.cached_tokens >= 3 * (len(SYSTEM) // page_size * page_size)
    else:  # no full page: the third and fourth take the first two's whole sequences
        assert with_cache.cached_tokens >= 2 * len(SYSTEM)
    assert gens[1].pool.pages_in_use == gens[1].prefix_cache.pages  # only the cache holds pages now


def test_a_budget_smaller_than_one_request_keeps_what_fits():
    """A budget below one page: the request runs as usual and nothing is kept. Room for one
    page: a request of seven pages keeps its first page only, and the same prompt later takes
    that page (4 positions) from the cache."""
    model, _ = tiny_model("qwen2-tied", seed=5)
    tok = vocab_tokenizer(model.args.vocab_size)
    args = model.args
    page = len(model.layers) * 4 * args.num_key_value_heads * args.head_dim * 4 * 2  # float32 keys and values
    prompt = SYSTEM + QUESTIONS[0]
    alone = run(BatchGenerator(model, tok, page_size=4, prefix_cache_bytes=0), [prompt], [None], 5)
    gen = BatchGenerator(model, tok, page_size=4, prefix_cache_bytes=page - 1)
    assert run(gen, [prompt], [None], 5) == alone
    assert gen.pool.page_nbytes == page and gen.prefix_cache.pages == 0 and gen.pool.pages_in_use == 0
    gen = BatchGenerator(model, tok, page_size=4, prefix_cache_bytes=page)
    assert run(gen, [prompt], [None], 5) == alone and gen.prefix_cache.pages == 1
    assert run(gen, [prompt], [None], 5) == alone and gen.stats.cached_tokens == 4


class Counting:
    """A model that counts the positions it is run on."""

    def __init__(self, model):
        self.model, self.args, self.layers, self.make_cache = model, model.args, model.layers, model.make_cache
        self.positions = 0

    def __call__(self, tokens, cache=None):
        self.positions += tokens.shape[1]
        return self.model(tokens, cache=cache)


def test_a_chat_of_five_turns_prefills_only_each_new_turn():
    """Each turn's prompt is the conversation so far plus new tokens. With one prefix cache
    across turns, a turn runs the model on its new tokens and on the last reply's last token
    (the reply stopped at max_tokens, so that token was never fed), then one position per
    further token; the replies equal those without the cache."""
    model, _ = tiny_model("llama-tied", seed=5)
    tok = vocab_tokenizer(model.args.vocab_size)
    counting, cache = Counting(model), PrefixCache(PagePool(16))
    conversation, limit = [], 5
    for turn in range(5):
        new = [11 + turn, 20 + turn, 3, 7 + turn]
        conversation += new
        params = SamplingParams(temperature=0.8, seed=turn, repetition_penalty=1.3)
        before = counting.positions
        reply = [r.token for r in tiny_llm.stream_generate(counting, tok, conversation, limit, params=params,
                                                           prefix_cache=cache)]
        fresh = [r.token for r in tiny_llm.stream_generate(model, tok, conversation, limit, params=params)]
        assert reply == fresh and len(reply) == limit
        prefilled = counting.positions - before - (limit - 1)
        assert prefilled == len(new) + (1 if turn else 0)
        conversation += reply


def test_prompt_progress_counts_only_the_tokens_not_found_in_the_cache():
    """A prompt of 16 tokens whose first 10 are cached: prompt_progress sees a prefill of
    the other 6 (chunks of 4: all but the last token in chunks, then the last)."""
    model, _ = tiny_model("llama-tied", seed=5)
    tok = vocab_tokenizer(model.args.vocab_size)
    cache, first, seen = PrefixCache(PagePool(4)), list(range(1, 11)), []
    list(tiny_llm.stream_generate(model, tok, first, 1, prefix_cache=cache, prefill_step_size=4,
                                  prompt_progress=lambda done, total: seen.append((done, total))))
    assert seen == [(4, 10), (8, 10), (9, 10), (10, 10)]
    seen.clear()
    out = list(tiny_llm.stream_generate(model, tok, first + [11, 12, 13, 14, 15, 16], 1, prefix_cache=cache,
                                        prefill_step_size=4,
                                        prompt_progress=lambda done, total: seen.append((done, total))))
    assert out[0].cached_tokens == 10
    assert seen == [(4, 6), (5, 6), (6, 6)]


def test_default_model_reuses_the_system_prompt_and_answers_the_same(default_model):
    """The real model: two questions under one system message, greedy. The second takes
    every token the two prompts share from the cache, and its answer is the one it gets
    without the cache."""
    model, tok = default_model
    prompts = [tok.encode(tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                                   {"role": "user", "content": q}]))
               for q in ("Name a colour.", "Hi!")]
    alone = run(BatchGenerator(model, tok, prefill_step_size=16, prefix_cache_bytes=0), prompts[1:], [None], 3)
    gen = BatchGenerator(model, tok, max_batch_size=1, prefill_step_size=16, prefix_cache_bytes=1 << 30)
    assert run(gen, prompts, [None, None], 3)[1] == alone[0]
    shared = next(i for i, (a, b) in enumerate(zip(*prompts)) if a != b)  # the template's start
    assert shared > 5 and gen.stats.cached_tokens == shared
