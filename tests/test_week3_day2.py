"""Week 3, day 2: the paged KV cache — pages with reference counts, block tables, copy-on-write,
attention over pages, and the batch engine on it."""

import mlx.core as mx
import pytest
from conftest import generate_alone, tiny_model, vocab_tokenizer

from tiny_llm.batch import BatchGenerator, batch_generate
from tiny_llm.kv_cache import KVCache
from tiny_llm.paged_cache import BlockTable, PagedKVCache, PagePool, paged_views, reorder
from tiny_llm.sampler import SamplingParams

PROMPT = [5, 17, 3, 9, 30, 12, 7, 8, 21, 40, 19, 2, 33]


def filled(pool: PagePool, length: int, base: float) -> BlockTable:
    """A table of `length` positions whose key at position s is base + s (values: the negative),
    written through one layer's view."""
    table = BlockTable(pool)
    k = (base + mx.arange(length, dtype=mx.float32))[None, None, :, None]  # 1, 1, L, 1
    PagedKVCache(pool, 0, [table]).update_and_fetch(k, -k)
    return table


def stored(pool: PagePool, table: BlockTable) -> list[float]:
    return pool.keys[0][mx.array(table.slots(0, table.length))][:, 0, 0].tolist()


# ---- the pool and the tables ---------------------------------------------------------------


def test_pages_are_counted_and_given_back():
    """allocate hands out the lowest free page held once; retain/release count holders; the
    last release frees the page, which is handed out again; a full pool grows by an eighth,
    at least 16 pages."""
    pool = PagePool(page_size=4, num_pages=2)
    a, b = pool.allocate(), pool.allocate()
    assert (a, b) == (0, 1) and pool.refs == [1, 1] and pool.pages_in_use == 2
    c = pool.allocate()  # the pool was full: it grows, page numbers stay
    assert c == 2 and pool.capacity == 18 and pool.refs == [1, 1, 1] + [0] * 15
    pool.retain(a)
    pool.release(a)
    assert pool.refs[a] == 1 and pool.pages_in_use == 3
    pool.release(a)
    assert pool.refs[a] == 0 and pool.pages_in_use == 2
    assert pool.allocate() == a  # a freed page is reused before the unused ones


def test_releasing_a_free_page_is_refused():
    pool = PagePool(page_size=2)
    page = pool.allocate()
    pool.release(page)
    with pytest.raises(ValueError, match="page 0 is not in use: it cannot be released"):
        pool.release(page)
    with pytest.raises(ValueError, match="page 0 is not in use: only a page in use can be shared"):
        pool.retain(page)


def test_a_table_holds_its_own_length_rounded_up_to_a_page():
    """Positions 0..9 with pages of 4: three pages; slots follow the page list."""
    pool = PagePool(page_size=4)
    table = filled(pool, 10, base=100)
    assert len(table.pages) == 3 and pool.pages_in_use == 3 and table.length == 10
    assert table.slots(3, 6) == [table.pages[0] * 4 + 3, table.pages[1] * 4, table.pages[1] * 4 + 1]
    assert stored(pool, table) == [100.0 + s for s in range(10)]
    table.truncate(5)  # two pages still hold positions 0..4
    assert len(table.pages) == 2 and pool.pages_in_use == 2
    table.release()
    assert table.pages == [] and pool.pages_in_use == 0


def test_a_shared_page_is_copied_before_it_is_written():
    """Fork a table whose last page is half full: both hold every page. The first to write
    into the shared page gets a copy (its earlier positions included); the other still sees
    its own data, and then writes in place (it holds the page alone)."""
    pool = PagePool(page_size=4)
    a = filled(pool, 6, base=0)
    b = a.fork()
    assert b.pages == a.pages and [pool.refs[p] for p in a.pages] == [2, 2]
    k = mx.full((1, 1, 1, 1), 50.0)
    PagedKVCache(pool, 0, [b]).update_and_fetch(k, -k)  # b writes position 6, in the shared page
    assert b.pages[0] == a.pages[0] and b.pages[1] != a.pages[1]
    assert [pool.refs[p] for p in a.pages] == [2, 1] and pool.refs[b.pages[1]] == 1
    assert stored(pool, b) == [0, 1, 2, 3, 4, 5, 50] and stored(pool, a) == [0, 1, 2, 3, 4, 5]
    page = a.pages[1]
    PagedKVCache(pool, 0, [a]).update_and_fetch(k + 10, -k)
    assert a.pages[1] == page and stored(pool, a) == [0, 1, 2, 3, 4, 5, 60]
    a.release()
    b.release()
    assert pool.pages_in_use == 0 and set(pool.refs) == {0}


# ---- attention over pages ----------------------------------------------------------------------


def test_the_mask_hides_what_each_row_may_not_see():
    """Rows of 2 and 0 positions, 2 new queries each: row 0's queries sit at 2 and 3 (they
    see keys 0..2 and 0..3); row 1's at 0 and 1 (keys 0 and 0..1; slots 2, 3 are padding)."""
    pool = PagePool(page_size=4)
    cache = PagedKVCache(pool, 0, [filled(pool, 2, 0), BlockTable(pool)])
    mask = cache.make_mask(2)
    n = -mx.inf
    assert mask.shape == (2, 1, 2, 4)
    assert mask[:, 0].tolist() == [[[0, 0, 0, n], [0, 0, 0, 0]], [[0, n, n, n], [0, 0, n, n]]]
    assert PagedKVCache(pool, 0, [BlockTable(pool)]).make_mask(1) is None


@pytest.mark.parametrize("name", ["qwen2-untied", "llama-tied"])
@pytest.mark.parametrize("page_size", [1, 4, 16, 64])
def test_the_model_on_pages_equals_the_dense_cache(name, page_size):
    """Chunks of 5, 1 and 7 tokens: the logits on pages equal those on a `KVCache`, for pages
    of one position, of a few, and larger than the whole sequence."""
    model, _ = tiny_model(name, seed=3)
    tokens = mx.array([PROMPT])
    pool, table = PagePool(page_size, num_pages=2), None
    table = BlockTable(pool)
    paged, dense = paged_views(pool, len(model.layers), [table]), model.make_cache()
    for a, b in ((0, 5), (5, 6), (6, 13)):
        got, want = model(tokens[:, a:b], cache=paged), model(tokens[:, a:b], cache=dense)
        assert mx.allclose(got, want, atol=1e-5, rtol=1e-5).item()
    assert table.length == 13 and len(table.pages) == -(-13 // page_size)


def test_rows_of_different_lengths_decode_together():
    """Two tables of 13 and 4 positions joined into one batch (`extend`): one decode step
    gives each row the logits it has alone; `filter` keeps a row without copying anything."""
    model, _ = tiny_model("qwen2-untied", seed=4)
    pool = PagePool(page_size=4)
    t1, t2 = BlockTable(pool), BlockTable(pool)
    v1, v2 = paged_views(pool, len(model.layers), [t1]), paged_views(pool, len(model.layers), [t2])
    model(mx.array([PROMPT]), cache=v1)
    model(mx.array([PROMPT[:4]]), cache=v2)
    for a, b in zip(v1, v2):
        a.extend(b)
    out = model(mx.array([[8], [9]]), cache=v1)[:, -1]
    alone = [model(mx.array([PROMPT + [8]]))[0, -1], model(mx.array([PROMPT[:4] + [9]]))[0, -1]]
    assert mx.allclose(out[0], alone[0], atol=1e-5).item() and mx.allclose(out[1], alone[1], atol=1e-5).item()
    for c in v1:
        c.filter([1])
    out = model(mx.array([[3]]), cache=v1)[0, -1]
    assert mx.allclose(out, model(mx.array([PROMPT[:4] + [9, 3]]))[0, -1], atol=1e-5).item()
    assert t2.length == 6 and t1.length == 14


def test_trim_gives_back_the_pages_it_empties():
    """Speculative decoding's rewind on pages: forgetting positions frees the pages left empty."""
    pool = PagePool(page_size=4)
    table = filled(pool, 10, 0)
    cache = PagedKVCache(pool, 0, [table])
    assert cache.trim(3) == 3 and table.length == 7 and len(table.pages) == 2 and pool.pages_in_use == 2
    assert cache.trim(99) == 7 and pool.pages_in_use == 0
    with pytest.raises(ValueError, match="trim needs n >= 0"):
        cache.trim(-1)


# ---- the batch engine on pages ----------------------------------------------------------------

PROMPTS = [[5, 17, 3, 9, 30, 12, 7], [44], [8, 8, 21, 40], [19, 2, 33, 11, 6, 25, 14, 3, 10, 4, 4, 9, 2, 1, 6, 7, 8]]
LIMITS = [6, 9, 3, 7]


@pytest.mark.parametrize("name", ["qwen2-tied", "llama-tied"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_batches_on_pages_equal_the_dense_batch(name, page_size):
    """Greedy and seeded rows, chunked prefill, two rows at a time: the same tokens with and
    without pages (prefix cache off: this is the paged cache alone)."""
    model, _ = tiny_model(name, seed=7)
    tok = vocab_tokenizer(model.args.vocab_size)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, seed=2),
              SamplingParams(temperature=1.0, top_k=20, seed=5), SamplingParams(temperature=0.7, seed=11)]
    runs = [batch_generate(model, tok, PROMPTS, LIMITS, params=params, max_batch_size=2, prefill_step_size=3,
                           paged=paged, page_size=page_size, prefix_cache_bytes=0) for paged in (False, True)]
    assert runs[0].tokens == runs[1].tokens and runs[0].finish_reasons == runs[1].finish_reasons
    assert runs[1].tokens[0] == generate_alone(model, tok, PROMPTS[0], LIMITS[0])


def test_a_request_holds_its_own_length_not_the_longest_rows():
    """After admitting prompts of 7, 1, 4 and 17 tokens with pages of 4, the pool holds
    2 + 1 + 1 + 5 pages: each prompt rounded up to a page (the dense batch: 4 x 17)."""
    model, _ = tiny_model("llama-untied", seed=2)
    gen = BatchGenerator(model, vocab_tokenizer(model.args.vocab_size), paged=True, page_size=4, prefix_cache_bytes=0)
    for p in PROMPTS:
        gen.insert(p, 3)
    gen.step()  # admits all four and draws the first tokens; the first decode wrote one more each
    assert gen.pool.pages_in_use == sum(-(-(len(p) + 1) // 4) for p in PROMPTS) == 10
    while gen.has_work():
        gen.step()
    assert gen.pool.pages_in_use == 0  # every page went back


def test_equal_prompts_share_their_pages():
    """Three requests with one 17-token prompt: one prefill into 5 pages of 4. The first
    decode step writes position 17 into the shared last page: the first two rows copy it,
    the third (then its only holder) writes in place, so 4 + 3 pages are in use, not 15."""
    model, _ = tiny_model("qwen2-untied", seed=9)
    tok = vocab_tokenizer(model.args.vocab_size)
    gen = BatchGenerator(model, tok, paged=True, page_size=4, prefix_cache_bytes=0)
    params = [SamplingParams(temperature=1.0, seed=s) for s in (1, 2, 3)]
    uids = [gen.insert(PROMPTS[3], 5, p) for p in params]
    out = {u: [] for u in uids}
    for r in gen.step():
        out[r.uid].append(r.token)
    mx.eval(gen.batch.logits)
    assert gen.pool.pages_in_use == 7
    while gen.has_work():
        for r in gen.step():
            out[r.uid].append(r.token)
    assert gen.stats.prompt_tokens == len(PROMPTS[3])  # prefilled once
    for u, p in zip(uids, params):
        assert out[u] == generate_alone(model, tok, PROMPTS[3], 5, p)


def test_default_model_batch_on_pages_equals_the_dense_batch(default_model):
    """The real model: two chat prompts, greedy and seeded, the same text with and without
    pages."""
    model, tok = default_model
    prompts = [tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": q}])
               for q in ("Name a colour.", "Hi!")]
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=4)]
    runs = [batch_generate(model, tok, prompts, 4, params=params, prefill_step_size=16, paged=paged,
                           prefix_cache_bytes=0) for paged in (False, True)]
    assert runs[0].texts == runs[1].texts and runs[0].tokens == runs[1].tokens


def test_beams_fork_their_parents_pages():
    """`reorder` for beam search: rows 0, 0, 1 continue rows 0 and 1 of a two-row batch; the
    new rows hold their parents' pages (no copy), the old holds are given back."""
    pool = PagePool(page_size=4)
    a, b = filled(pool, 6, 0), filled(pool, 3, 100)
    views = [PagedKVCache(pool, 0, [a, b])]
    pages_a, pages_b = list(a.pages), list(b.pages)
    reorder(views, [0, 0, 1])
    rows = views[0].tables
    assert [t.pages for t in rows] == [pages_a, pages_a, pages_b] and views[0].lengths == [6, 6, 3]
    assert [pool.refs[p] for p in pages_a + pages_b] == [2, 2, 1] and a.pages == b.pages == []
    assert [stored(pool, t) for t in rows] == [[0, 1, 2, 3, 4, 5]] * 2 + [[100, 101, 102]]


@pytest.mark.parametrize("num_beams", [2, 5])
def test_beam_search_on_pages_equals_beam_search_on_the_dense_cache(num_beams):
    from tiny_llm.beam_search import beam_search

    model, _ = tiny_model("qwen2-untied", seed=12)
    tok = vocab_tokenizer(model.args.vocab_size)
    runs = [beam_search(model, tok, PROMPT, num_beams, 6, num_return_sequences=2, paged=paged)
            for paged in (False, True)]
    assert [h.tokens for h in runs[0]] == [h.tokens for h in runs[1]]
    assert [h.score for h in runs[0]] == pytest.approx([h.score for h in runs[1]], abs=1e-5)
