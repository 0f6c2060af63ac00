"""The one factory of a model's key/value caches (`tiny_llm.caches.make_prompt_cache`): a
dense cache, a left-padded batch or views of pages, one per layer, and its refusals."""

import pytest
from conftest import tiny_model

from tiny_llm.caches import make_prompt_cache
from tiny_llm.kv_cache import BatchKVCache, KVCache


def test_one_empty_cache_per_layer_dense_or_left_padded():
    model, _ = tiny_model("llama-tied", seed=3)
    dense = make_prompt_cache(model)
    assert [type(c) for c in dense] == [KVCache] * len(model.layers) == [KVCache] * 3
    assert all(c.offset == 0 for c in dense)
    assert len({id(c) for c in dense}) == 3  # one each, not one shared
    batch = make_prompt_cache(model, padding=[2, 0])
    assert [type(c) for c in batch] == [BatchKVCache] * 3
    assert all(c.left_padding == [2, 0] and c.batch_size == 2 for c in batch)


@pytest.mark.parametrize("kwargs, match", [
    ({"padding": [0], "pool": object(), "tables": []}, "padding .* or pool and tables .*, not both"),
    ({"pool": object()}, "needs pool and tables together"),
    ({"tables": []}, "needs pool and tables together"),
])
def test_mixed_or_half_given_kinds_are_refused(kwargs, match):
    model, _ = tiny_model("llama-tied", seed=3)
    with pytest.raises(ValueError, match=match):
        make_prompt_cache(model, **kwargs)
