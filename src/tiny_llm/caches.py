"""Engine — the one factory of a model's key/value caches: dense, batch or paged, one per layer.

Every cache the engine makes comes from `make_prompt_cache` (as in mlx-lm): the model's own
`make_cache()`, a batch's left-padded prefill, and the views of a page pool that the prefix
cache, the paged batch and beam search run on. The paged module loads only when pages are
asked for (week 3).

Tests: tests/test_caches.py, tests/test_models.py, tests/test_week3_day4.py
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .kv_cache import BatchKVCache, KVCache

if TYPE_CHECKING:
    from .paged_cache import BlockTable, PagedKVCache, PagePool


class Layered(Protocol):
    """What the factory reads of a model: its `layers`, one cache each. (Not `model.Model`:
    the model itself makes its caches here, and this module sits below the contract.)"""

    layers: Sequence[Any]


def make_prompt_cache(
    model: Layered,
    *,
    padding: Sequence[int] | None = None,
    pool: "PagePool | None" = None,
    tables: "Sequence[BlockTable] | None" = None,
) -> list[KVCache] | list[BatchKVCache] | list["PagedKVCache"]:
    """One cache per layer of `model`: an empty `KVCache` (one sequence, or rows of equal
    length); with `padding` (a count per row) an empty `BatchKVCache` over rows left-padded
    by that much; with `pool` and `tables` (one `BlockTable` per row) the views of those
    tables' pages, holding what the tables hold already."""
    if padding is not None and (pool is not None or tables is not None):
        raise ValueError("make_prompt_cache takes padding (a dense batch) or pool and tables (pages), not both")
    if (pool is None) != (tables is None):
        raise ValueError("make_prompt_cache needs pool and tables together: the pages and each row's table")
    if pool is not None:
        from .paged_cache import paged_views

        return paged_views(pool, len(model.layers), list(tables))
    if padding is not None:
        return [BatchKVCache(list(padding)) for _ in model.layers]
    return [KVCache() for _ in model.layers]
