"""Course: week 3 day 3 — a prefix cache: pages found again by the tokens they hold, shared across requests.

Every page of a sequence is keyed by its tokens and by a digest of all the tokens before it
(a hash chain, as in vLLM): equal keys mean equal keys and values in every layer, because a
position's keys depend only on the tokens up to it. A new request walks the chain of its
prompt, takes every cached page it finds, and prefills only the rest; at the first page
that differs it may still take the start of a cached page (the longest common start), which
it copies before writing its own tokens there (copy-on-write).

Cached pages that no request holds are evicted least recently used first, deepest first,
while they take more than `max_bytes`; a page some request holds is never evicted.

    cache = PrefixCache(pool, max_bytes=1 << 30)
    table = cache.lookup(prompt)       # table.length positions are already there
    ...                                # prefill prompt[table.length:], decode
    cache.release(table, tokens)       # keep its pages for the next request, free the rest

Tests: tests/test_week3_day3.py, tests/test_cache_errors.py, tests/test_week4_day5.py
"""

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from .defaults import PREFIX_CACHE_BYTES
from .paged_cache import BlockTable, PagePool
from .progress import implemented

ROOT = bytes(32)  # the digest before the first page


def chain_digest(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The digest of a page holding `tokens` after the pages whose digest is `parent`."""
    return hashlib.sha256(parent + array("q", tokens).tobytes()).digest()


def check_budget(max_bytes: int) -> int:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ValueError(f"prefix cache bytes must be an integer >= 0 (0 turns the cache off), got {max_bytes!r}")
    return max_bytes


@dataclass
class _Node:
    """One cached page: its tokens (a full page, or the start of one), where it hangs in
    the chain, and when it was last used."""

    page: int
    parent: bytes
    tokens: tuple[int, ...]
    digest: bytes
    last_used: int = 0


@dataclass
class PrefixStats:
    """Prompt tokens looked up, and how many of them were found in the cache."""

    lookups: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    evicted_pages: int = 0


class PrefixCache:
    """Pages of earlier sequences in a `PagePool`, found by content; at most `max_bytes` of
    them held by nothing but the cache."""

    def __init__(self, pool: PagePool, max_bytes: int = PREFIX_CACHE_BYTES):
        self.pool = pool
        self.max_bytes = check_budget(max_bytes)
        self._nodes: dict[tuple[bytes, tuple[int, ...]], _Node] = {}
        self._children: dict[bytes, set[tuple[bytes, tuple[int, ...]]]] = {}
        self._clock = 0
        self.stats = PrefixStats()

    @property
    def pages(self) -> int:
        """Pages the cache holds (some may also be held by running requests)."""
        return len(self._nodes)

    @property
    def idle_bytes(self) -> int:
        """Bytes of the cached pages that only the cache holds: what `max_bytes` bounds."""
        return sum(self.pool.refs[n.page] == 1 for n in self._nodes.values()) * self.pool.page_nbytes

    def lookup(self, tokens: Sequence[int]) -> BlockTable:
        """A table over the cached pages that hold the longest start of `tokens`, at most
        `len(tokens) - 1` positions (the last token must run through the model for its
        logits). The table holds each page once more; the caller prefills
        `tokens[table.length:]` into it."""
        tokens = list(tokens)
        # Find `pages` (the cached pages, in order) and `length` (the positions of `tokens`
        # they hold); retain each page and mark the nodes used (`_touch`).
        # BEGIN SOLUTION week3-day3
        P, limit = self.pool.page_size, len(tokens) - 1
        parent, pages, length, used = ROOT, [], 0, []
        while length + P <= limit and (node := self._nodes.get((parent, tuple(tokens[length:length + P])))):
            pages.append(node.page)
            used.append(node)
            length += P
            parent = node.digest
        # The first page that differs: the cached page under `parent` whose tokens share the
        # longest start with the prompt's next ones.
        best, best_n, want = None, 0, tokens[length:limit][:P]
        for key in self._children.get(parent, ()):
            n = common_start(key[1], want)
            if n > best_n:
                best, best_n = self._nodes[key], n
        if best is not None:
            pages.append(best.page)
            used.append(best)
            length += best_n
        for page in pages:
            self.pool.retain(page)
        self._touch(used)
        # END SOLUTION
        self.stats.lookups += 1
        self.stats.prompt_tokens += len(tokens)
        self.stats.cached_tokens += length
        return BlockTable(self.pool, pages, length)

    def insert(self, table: BlockTable, tokens: Sequence[int], *, full_pages_only: bool = False) -> None:
        """Cache the pages of `table`, which holds `tokens[:table.length]`. A page whose key
        is cached already is not added twice. `full_pages_only`: leave out a last page that
        is not full (its owner is still writing there)."""
        if self.max_bytes == 0:
            return
        # BEGIN SOLUTION week3-day3
        P, parent, used = self.pool.page_size, ROOT, []
        for i, page in enumerate(table.pages):
            chunk = tuple(tokens[i * P:min((i + 1) * P, table.length)])
            if not chunk or (full_pages_only and len(chunk) < P):
                break
            key = (parent, chunk)
            node = self._nodes.get(key)
            if node is None:
                node = _Node(page, parent, chunk, chain_digest(parent, chunk))
                self._nodes[key] = node
                self._children.setdefault(parent, set()).add(key)
                self.pool.retain(page)
            used.append(node)
            if len(chunk) < P:
                break
            parent = node.digest
        self._touch(used)
        # END SOLUTION

    def release(self, table: BlockTable, tokens: Sequence[int]) -> None:
        """A sequence has finished: cache its pages, give the table's hold back, and evict
        down to the budget."""
        self.insert(table, tokens)
        table.release()
        self.evict()

    def cancel(self, table: BlockTable) -> None:
        """A sequence given up: its pages are not cached, its hold is given back, and the
        cache evicts down to the budget (cached pages it held may now be idle)."""
        table.release()
        self.evict()

    def evict(self) -> None:
        """Drop the least recently used pages that only the cache holds until those take at
        most `max_bytes`. A dropped page takes the pages after it in its chain along (they
        could no longer be found)."""
        # BEGIN SOLUTION week3-day3
        idle = sorted((n for n in self._nodes.values() if self.pool.refs[n.page] == 1), key=lambda n: n.last_used)
        excess = len(idle) * self.pool.page_nbytes - self.max_bytes
        for victim in idle:
            if excess <= 0:
                break
            if (victim.parent, victim.tokens) in self._nodes:  # not dropped with an earlier one
                excess -= self._drop(victim) * self.pool.page_nbytes
        # END SOLUTION

    def clear(self) -> None:
        """Drop every cached page."""
        for node in [n for n in self._nodes.values() if n.parent == ROOT]:
            self._drop(node)

    def _drop(self, node: _Node) -> int:
        """Drop `node` and the nodes after it in its chain; return how many of their pages
        only the cache held (those go back to the pool)."""
        freed = sum(self._drop(self._nodes[key]) for key in list(self._children.get(node.digest, ())))
        key = (node.parent, node.tokens)
        del self._nodes[key]
        siblings = self._children[node.parent]
        siblings.discard(key)
        if not siblings:
            del self._children[node.parent]
        freed += self.pool.refs[node.page] == 1
        self.pool.release(node.page)
        self.stats.evicted_pages += 1
        return freed

    def _touch(self, nodes: list[_Node]) -> None:
        """Mark `nodes` (a chain, root first) used now; the deeper a page, the older its
        mark, so that a chain is evicted from its end."""
        for node in reversed(nodes):
            self._clock += 1
            node.last_used = self._clock


def common_start(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens `a` and `b` share from their start."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def prefix_cache_implemented() -> bool:
    """Whether week 3 day 3 is implemented (requests then reuse cached prefixes); always
    True in the finished engine."""
    return implemented("week3-day3", lambda: PrefixCache(PagePool(page_size=1, num_pages=1)).lookup([1, 2]))
