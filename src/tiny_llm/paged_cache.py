"""Course: week 3 day 2 — a paged KV cache: keys and values in fixed-size pages, shared by reference.

A dense batch cache gives every row the length of the longest one. Here the keys and values
of every sequence live in one `PagePool` of pages of `page_size` positions; a sequence's
`BlockTable` lists its pages in order, so it holds its own length rounded up to a page.
Pages carry reference counts: sequences that start alike (`n` choices of one prompt, beams,
a prefix cache) share pages, and a shared page is copied before it is written
(copy-on-write). `PagedKVCache` is one layer's view of a batch of block tables, with the
cache contract the model uses: attention gathers each row's pages into a dense `[B, H, S, D]`, or
(week 3 day 6) `attend` reads them in place with our kernel.

    pool = PagePool(page_size=16)
    table = BlockTable(pool)
    cache = [PagedKVCache(pool, layer, [table]) for layer in range(len(model.layers))]
    logits = model(tokens, cache=cache)       # fills table's pages in every layer
    table.release()                           # the pages go back to the pool

Tests: tests/test_week3_day2.py, tests/test_cache_errors.py, tests/test_fused_step.py
"""

import mlx.core as mx

from . import kernels
from .defaults import PAGE_SIZE
from .progress import implemented


def check_page_size(page_size: int) -> int:
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive integer, got {page_size!r}")
    return page_size


class PagePool:
    """Pages of `page_size` positions of keys and values for every layer, and a reference
    count per page. Page `p` holds slots `p * page_size ... (p + 1) * page_size - 1` of each
    layer's storage `[capacity * page_size, H, D]`, made at the layer's first write. When
    every page is taken the pool grows by an eighth (at least 16 pages; page numbers stay
    valid), so its storage stays within about 1/8 of the most pages ever in use; pages
    given back are reused, the storage never shrinks."""

    def __init__(self, page_size: int = PAGE_SIZE, num_pages: int = 64, heads_share: tuple[int, int] = (1, 1)):
        self.page_size = check_page_size(page_size)
        # (key/value heads held here, key/value heads of the whole model): a rank of a
        # tensor-parallel model holds a share of every page; budgets count whole pages.
        self.heads_share = heads_share
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 1:
            raise ValueError(f"num_pages must be a positive integer, got {num_pages!r}")
        self.refs = [0] * num_pages  # holders of each page; 0 = free
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out the lowest first
        self.keys: dict[int, mx.array] = {}  # layer -> [capacity * page_size, H, D]
        self.values: dict[int, mx.array] = {}

    @property
    def capacity(self) -> int:
        return len(self.refs)

    @property
    def pages_in_use(self) -> int:
        return self.capacity - len(self._free)

    @property
    def page_nbytes(self) -> int:
        """Bytes of one page's keys and values over every layer written so far, for the whole
        model: on every rank of a tensor-parallel model the same number, so that the ranks'
        prefix caches evict the same pages and stay in step."""
        held, whole = self.heads_share
        return sum((self.keys[l].nbytes + self.values[l].nbytes) // self.capacity for l in self.keys) * whole // held

    def allocate(self) -> int:
        """A free page, now held once (reference count 1)."""
        # BEGIN SOLUTION week3-day2
        if not self._free:
            self._grow()
        page = self._free.pop()
        self.refs[page] = 1
        return page
        # END SOLUTION

    def retain(self, page: int) -> None:
        """One more holder of `page` (a page in use)."""
        if not 0 <= page < self.capacity or self.refs[page] < 1:
            raise ValueError(f"page {page} is not in use: only a page in use can be shared")
        self.refs[page] += 1

    def release(self, page: int) -> None:
        """One holder fewer; the last one gives the page back to the pool."""
        # BEGIN SOLUTION week3-day2
        if not 0 <= page < self.capacity or self.refs[page] < 1:
            raise ValueError(f"page {page} is not in use: it cannot be released")
        self.refs[page] -= 1
        if self.refs[page] == 0:
            self._free.append(page)
        # END SOLUTION

    def copy(self, page: int) -> int:
        """A new page holding what `page` holds, in every layer (copy-on-write)."""
        new = self.allocate()
        src = mx.arange(page * self.page_size, (page + 1) * self.page_size)
        dst = mx.arange(new * self.page_size, (new + 1) * self.page_size)
        for layer in self.keys:
            self.keys[layer][dst] = self.keys[layer][src]
            self.values[layer][dst] = self.values[layer][src]
        return new

    def write(self, layer: int, slots: mx.array, keys: mx.array, values: mx.array) -> None:
        """Store `keys/values [N, H, D]` of `layer` in `slots [N]`."""
        if layer not in self.keys:
            size = self.capacity * self.page_size
            self.keys[layer] = mx.zeros((size, *keys.shape[1:]), keys.dtype)
            self.values[layer] = mx.zeros((size, *values.shape[1:]), values.dtype)
        self.keys[layer][slots] = keys.astype(self.keys[layer].dtype)
        self.values[layer][slots] = values.astype(self.values[layer].dtype)

    def _grow(self) -> None:
        old, extra = self.capacity, max(16, self.capacity // 8)
        self.refs += [0] * extra
        self._free = list(range(old + extra - 1, old - 1, -1)) + self._free
        for store in (self.keys, self.values):
            for layer, a in store.items():
                store[layer] = mx.concatenate([a, mx.zeros((extra * self.page_size, *a.shape[1:]), a.dtype)])


class BlockTable:
    """One sequence's pages in order, and how many positions (`length`) they hold. Position
    `s` is in slot `s % page_size` of page `pages[s // page_size]`."""

    def __init__(self, pool: PagePool, pages: list[int] | None = None, length: int = 0):
        self.pool = pool
        self.pages = list(pages or [])
        self.length = length

    def reserve(self, start: int, end: int) -> None:
        """Make positions `start ... end - 1` writable: a shared page that holds `start` is
        replaced by a private copy, and pages are added up to `end`. Calling it again with
        the same numbers changes nothing (every layer of the model calls it)."""
        # BEGIN SOLUTION week3-day2
        P = self.pool.page_size
        first = start // P
        if start < end and first < len(self.pages) and self.pool.refs[self.pages[first]] > 1:
            old = self.pages[first]
            self.pages[first] = self.pool.copy(old)
            self.pool.release(old)
        while len(self.pages) * P < end:
            self.pages.append(self.pool.allocate())
        # END SOLUTION

    def slots(self, start: int, end: int) -> list[int]:
        """The pool slots of positions `start ... end - 1`."""
        P = self.pool.page_size
        return [self.pages[s // P] * P + s % P for s in range(start, end)]

    def fork(self) -> "BlockTable":
        """A second table over the same pages (each page gains a holder); whichever writes
        into a shared page first copies it."""
        for page in self.pages:
            self.pool.retain(page)
        return BlockTable(self.pool, self.pages, self.length)

    def truncate(self, length: int) -> None:
        """Keep the first `length` positions; pages past them are released."""
        self.length = min(self.length, length)
        keep = -(-self.length // self.pool.page_size)
        for page in self.pages[keep:]:
            self.pool.release(page)
        del self.pages[keep:]

    def release(self) -> None:
        """Give every page back (the table is then empty)."""
        self.truncate(0)


class PagedKVCache:
    """One layer's keys and values for a batch of sequences, one `BlockTable` per row.

    The tables are shared by the views of all layers; each view counts its rows' lengths
    itself, so every layer writes at the same positions in one forward pass. `filter` and
    `extend` change only which tables are rows: no key or value is copied."""

    def __init__(self, pool: PagePool, layer: int, tables: list[BlockTable]):
        self.pool, self.layer = pool, layer
        self.tables = list(tables)
        self.lengths = [t.length for t in self.tables]

    @property
    def offset(self) -> int:
        """The longest row's length."""
        return max(self.lengths, default=0)

    @property
    def keys(self) -> mx.array | None:
        return self.pool.keys.get(self.layer)

    @property
    def values(self) -> mx.array | None:
        return self.pool.values.get(self.layer)

    @property
    def rope_offset(self) -> int | mx.array:
        """Each row's next position: an int for one row, else `[B]`."""
        return self.lengths[0] if len(self.lengths) == 1 else mx.array(self.lengths, dtype=mx.int32)

    def make_mask(self, L: int, dtype: mx.Dtype = mx.float32) -> mx.array | None:
        """`[B, 1, L, S]` with `S` the longest row after this step: row `b`'s query `i`
        (position `lengths[b] + i`) sees the keys at positions up to its own. Slots past a
        row's end (other rows are longer) are hidden. None when nothing is hidden."""
        # BEGIN SOLUTION week3-day2
        if L == 1 and len(set(self.lengths)) == 1:
            return None
        S = self.offset + L
        start = mx.array(self.lengths)[:, None, None]  # B, 1, 1
        query = start + mx.arange(L)[None, :, None]  # B, L, 1: each query's position
        key = mx.arange(S)[None, None, :]  # 1, 1, S
        return mx.where(key <= query, 0.0, -mx.inf).astype(dtype)[:, None]  # B, 1, L, S
        # END SOLUTION

    def store(self, keys: mx.array, values: mx.array) -> None:
        """Write `keys/values [B, H, L, D]` after each row's positions, in its pages (reserved
        first: a shared page is copied before it is written)."""
        # BEGIN SOLUTION week3-day2
        B, H, L, D = keys.shape
        slots = []
        for b, table in enumerate(self.tables):
            start = self.lengths[b]
            table.reserve(start, start + L)
            slots += table.slots(start, start + L)
            self.lengths[b] = table.length = start + L
        new_k = keys.transpose(0, 2, 1, 3).reshape(B * L, H, D)  # B*L, H, D
        new_v = values.transpose(0, 2, 1, 3).reshape(B * L, H, values.shape[-1])
        self.pool.write(self.layer, mx.array(slots, dtype=mx.int32), new_k, new_v)
        # END SOLUTION

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """`store` the new keys and values; return every row's keys and values `[B, H, S, D]`,
        gathered from its pages (`S`: the longest row; the slots past a shorter row's end hold
        another position's data, hidden by the mask)."""
        # BEGIN SOLUTION week3-day2
        self.store(keys, values)
        B, P, S = len(self.tables), self.pool.page_size, self.offset
        n = -(-S // P)  # pages of the longest row
        pages = mx.array([t.pages[:n] + [0] * (n - len(t.pages[:n])) for t in self.tables], dtype=mx.int32)
        index = (pages[:, :, None] * P + mx.arange(P)).reshape(B, n * P)[:, :S]  # B, S: slots
        k = self.pool.keys[self.layer][index].transpose(0, 2, 1, 3)  # B, H, S, D
        v = self.pool.values[self.layer][index].transpose(0, 2, 1, 3)
        return k, v
        # END SOLUTION

    def attend(self, q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array | None:
        """`store` the new keys and values `[B, Hkv, L, D]`, then attention of `q [B, Hq, L, D]`
        over each row's positions read in place from the pages by our kernel (week 3 day 6):
        no `[B, H, S, D]` copy. None where the kernel does not run (another device, kernels
        off, the day not done): the caller then uses `update_and_fetch`."""
        if not kernels.active("week3-day6"):
            return None
        starts = mx.array(self.lengths, dtype=mx.int32)  # each row's first new position
        self.store(k, v)
        n = max(len(t.pages) for t in self.tables)
        pages = mx.array([t.pages + [0] * (n - len(t.pages)) for t in self.tables], dtype=mx.int32)  # B, n
        return kernels.extension().paged_attention(q, self.pool.keys[self.layer], self.pool.values[self.layer],
                                                   pages, starts, self.pool.page_size, scale)

    def trim(self, n: int) -> int:
        """Forget each row's last `n` positions (at most what the shortest row holds);
        pages left empty go back to the pool. Returns how many were dropped."""
        if n < 0:
            raise ValueError(f"trim needs n >= 0, got {n}")
        n = min(n, min(self.lengths, default=0))
        for b, table in enumerate(self.tables):
            self.lengths[b] -= n
            table.truncate(self.lengths[b])
        return n

    def filter(self, rows: list[int]) -> None:
        """Keep only `rows`, in that order (their tables are not released here)."""
        if not rows:
            raise ValueError("filter needs at least one row to keep")
        self.tables = [self.tables[r] for r in rows]
        self.lengths = [self.lengths[r] for r in rows]

    def extend(self, other: "PagedKVCache") -> None:
        """Append the rows of `other` after this view's rows."""
        self.tables += other.tables
        self.lengths += other.lengths


def paged_views(pool: PagePool, num_layers: int, tables: list[BlockTable]) -> list[PagedKVCache]:
    """A model's cache over `tables`: one `PagedKVCache` per layer."""
    return [PagedKVCache(pool, layer, tables) for layer in range(num_layers)]


def reorder(views: list[PagedKVCache], parents: list[int]) -> None:
    """Row `i` continues row `parents[i]` (beam search): each new row forks its parent's
    table, so beams share every page but the one each writes next; the old rows' holds are
    given back."""
    old = views[0].tables
    new = [old[p].fork() for p in parents]
    for table in old:
        table.release()
    for view in views:
        view.tables, view.lengths = list(new), [t.length for t in new]


def paged_cache_implemented() -> bool:
    """Whether week 3 day 2 is implemented (batching then runs on pages); always True in
    the finished engine."""
    return implemented("week3-day2", _probe_paged)


def _probe_paged() -> None:
    pool = PagePool(page_size=1, num_pages=1)
    BlockTable(pool).reserve(0, 2)
