"""Argument checks of stream_generate and generate_step (the loops are week 1, day 6 and week 2, day 2)."""

import mlx.core as mx
import pytest
from conftest import CountingModel, tiny_model, word_tokenizer

from tiny_llm.generate import generate_step, stream_generate


@pytest.mark.parametrize("prompt, max_tokens, match", [
    ([1], 0, "max_tokens must be positive or -1"),
    ([1], -2, r"max_tokens must be in \[-1, inf\), got -2"),
    ([], 4, "prompt must be a non-empty sequence"),
    ("", 4, "prompt must be a non-empty sequence"),
])
def test_bad_arguments_are_reported(prompt, max_tokens, match):
    """max_tokens of 0 or below -1 and empty prompts are refused before the model runs."""
    with pytest.raises(ValueError, match=match):
        next(stream_generate(CountingModel(), word_tokenizer(), prompt, max_tokens=max_tokens))


@pytest.mark.parametrize("size", [0, -3, 1.5])
def test_bad_prefill_step_size_is_refused(size):
    model, _ = tiny_model("llama-tied")
    with pytest.raises(ValueError, match="prefill_step_size"):
        generate_step(mx.array([1, 2]), model, prefill_step_size=size)
