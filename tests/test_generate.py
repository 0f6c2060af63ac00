"""stream_generate's argument checks (the loop itself is week 1, day 6)."""

import pytest
from conftest import CountingModel, word_tokenizer

from tiny_llm.generate import stream_generate


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
