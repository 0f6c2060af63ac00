"""Bad input to the paged KV cache and the prefix cache (week 3 days 2 and 3): a clear
`ValueError` naming the argument, raised before anything runs."""

import pytest
from conftest import vocab_tokenizer

import tiny_llm
from tiny_llm.batch import BatchGenerator
from tiny_llm.kv_cache import KVCache
from tiny_llm.paged_cache import PagePool
from tiny_llm.prefix_cache import PrefixCache


class StandIn:
    """A model that must never run: every error here comes before the model would."""

    def __call__(self, tokens, cache=None):
        raise AssertionError("the model ran")

    def make_cache(self):
        return [KVCache()]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return StandIn(), vocab_tokenizer(16)


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "16"])
def test_a_page_size_that_is_not_a_positive_integer_is_refused(bad, model_and_tokenizer):
    with pytest.raises(ValueError, match=r"page_size must be a positive integer, got"):
        PagePool(page_size=bad)
    with pytest.raises(ValueError, match=r"page_size must be a positive integer"):
        BatchGenerator(*model_and_tokenizer, page_size=bad)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1G"])
def test_a_budget_that_is_not_a_byte_count_is_refused(bad, model_and_tokenizer):
    with pytest.raises(ValueError, match=r"prefix cache bytes must be an integer >= 0 \(0 turns the cache off\), got"):
        PrefixCache(PagePool(4), max_bytes=bad)
    with pytest.raises(ValueError, match="prefix cache bytes must be an integer >= 0"):
        BatchGenerator(*model_and_tokenizer, prefix_cache_bytes=bad)


def test_a_prefix_cache_needs_pages(model_and_tokenizer):
    with pytest.raises(ValueError, match=r"prefix_cache_bytes=1024 needs pages: pass paged=True or None"):
        BatchGenerator(*model_and_tokenizer, paged=False, prefix_cache_bytes=1024)
    with pytest.raises(ValueError, match="paged must be True, False or None, got 'yes'"):
        BatchGenerator(*model_and_tokenizer, paged="yes")


def test_a_prefix_cache_does_not_combine_with_a_prompt_cache(model_and_tokenizer):
    model, tok = model_and_tokenizer
    with pytest.raises(ValueError, match="prefix_cache makes the cache itself"):
        list(tiny_llm.stream_generate(model, tok, [1, 2], 2, prompt_cache=model.make_cache(),
                                      prefix_cache=PrefixCache(PagePool(4))))
    with pytest.raises(ValueError, match="prefix_cache makes the cache itself"):
        list(tiny_llm.stream_generate(model, tok, [1, 2], 2, kv_cache=False, prefix_cache=PrefixCache(PagePool(4))))
