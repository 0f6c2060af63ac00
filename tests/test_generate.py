"""Argument checks of stream_generate and generate_step (the loops are week 1, day 6 and week 2, day 2)."""

import math
import re

import mlx.core as mx
import pytest
from conftest import CountingModel, tiny_model, word_tokenizer

import tiny_llm
from tiny_llm.generate import generate_step, stream_generate
from tiny_llm.sampler import SamplingParams


@pytest.mark.parametrize("prompt, max_tokens, match", [
    ([1], 0, "max_tokens must be positive or -1"),
    ([1], -2, r"max_tokens must be in \[-1, inf\), got -2"),
    ([], 4, "prompt must be a non-empty sequence"),
    ("", 4, "prompt must be a non-empty sequence"),
    ([1, 2.5], 4, r"prompt must hold token ids \(integers from 0 to 2\*\*31 - 1\), got 2.5"),
    ([3, -1], 4, r"prompt must hold token ids .*, got -1"),
    ([2**31], 4, r"prompt must hold token ids .*, got 2147483648"),
    ([True], 4, r"prompt must hold token ids .*, got True"),
    (mx.array([1.0, 2.0]), 4, "prompt must hold token ids \\(integers\\), got an array of mlx.core.float32"),
])
def test_bad_arguments_are_reported(prompt, max_tokens, match):
    """max_tokens of 0 or below -1, empty prompts and prompts of anything but token ids are
    refused before the model runs."""
    with pytest.raises(ValueError, match=match):
        next(stream_generate(CountingModel(), word_tokenizer(), prompt, max_tokens=max_tokens))


@pytest.mark.parametrize("size", [0, -3, 1.5])
def test_bad_prefill_step_size_is_refused(size):
    model, _ = tiny_model("llama-tied")
    with pytest.raises(ValueError, match="prefill_step_size"):
        generate_step(mx.array([1, 2]), model, prefill_step_size=size)


def test_the_context_is_checked_the_same_way_everywhere():
    """A prompt plus max_tokens beyond max_position_embeddings is refused by generation,
    speculative decoding, beam search and batching with one message; max_tokens=-1 runs
    until the context is full."""
    from conftest import vocab_tokenizer

    from tiny_llm.batch import BatchGenerator
    from tiny_llm.beam_search import beam_search
    from tiny_llm.sampler import SamplingParams

    model, _ = tiny_model("llama-tied", seed=3, max_position_embeddings=16)
    tok = vocab_tokenizer(model.args.vocab_size)
    prompt = list(range(1, 15))  # 14 tokens: room for 2 more
    message = "prompt of 14 tokens plus max_tokens=3 exceeds the model's context of 16 positions"
    calls = [lambda: list(tiny_llm.stream_generate(model, tok, prompt, 3)),
             lambda: list(tiny_llm.stream_generate(model, tok, prompt, 3, prompt_lookup=True)),
             lambda: beam_search(model, tok, prompt, 2, 3),
             lambda: BatchGenerator(model, tok).insert(prompt, 3)]
    for call in calls:
        with pytest.raises(ValueError, match=re.escape(message)):
            call()
    with pytest.raises(ValueError, match="prompt of 16 tokens leaves no room in the model's context of 16"):
        list(tiny_llm.stream_generate(model, tok, list(range(1, 17)), -1))
    params = SamplingParams(temperature=0.0, logit_bias={0: -math.inf})  # no end-of-sequence
    out = list(tiny_llm.stream_generate(model, tok, prompt, -1, params=params))
    assert [r.generation_tokens for r in out] == [1, 2] and out[-1].finish_reason == "length"
    assert len(list(tiny_llm.stream_generate(model, tok, prompt, 2, params=params))) == 2  # exactly full


def test_kv_cache_true_needs_a_model_with_a_cache():
    """kv_cache=True with a plain function of tokens (no make_cache) and no prompt_cache is
    refused instead of silently running week 1's loop."""
    with pytest.raises(ValueError, match=r"kv_cache=True needs a model with make_cache\(\)"):
        generate_step(mx.array([1, 2]), lambda tokens, cache=None: tokens, kv_cache=True)


def test_prompt_progress_of_the_loop_without_a_cache_is_one_report():
    """Week 1's loop runs the whole prompt in its first step: prompt_progress is called once,
    as (L, L), before the first token; generate passes it on too."""
    events = []
    for response in stream_generate(CountingModel(), word_tokenizer(), [1, 2, 3, 4, 5], 2,
                                    prompt_progress=lambda done, total: events.append((done, total))):
        events.append(("token", response.token))
    assert events == [(5, 5), ("token", 6), ("token", 7)]
    seen = []
    tiny_llm.generate(CountingModel(), word_tokenizer(), [1, 2, 3], max_tokens=2,
                      prompt_progress=lambda *a: seen.append(a))
    assert seen == [(3, 3)]


def test_a_prompt_progress_that_is_not_a_function_is_refused():
    with pytest.raises(ValueError, match=r"prompt_progress must be None or a function of \(done, total\), got 3"):
        next(stream_generate(CountingModel(), word_tokenizer(), [1, 2], 2, prompt_progress=3))


class TurnsBad(CountingModel):
    """The counting rule for `good` calls, then logits of `value` everywhere."""

    def __init__(self, good: int, value: float):
        super().__init__()
        self.good, self.value = good, value

    def __call__(self, tokens: mx.array, cache=None) -> mx.array:
        out = super().__call__(tokens, cache)
        return out if len(self.calls) <= self.good else mx.full(out.shape, self.value)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=1),
                                    SamplingParams(temperature=0.8, min_p=0.1, seed=2),
                                    SamplingParams(top_p=0.9, seed=3)], ids=["greedy", "temperature", "min_p", "top_p"])
@pytest.mark.parametrize("value, reason", [(math.nan, "no finite value"), (math.inf, r"\+inf")], ids=["nan", "inf"])
def test_a_bad_step_stops_generation_before_its_token(params, value, reason):
    """The engine (`params=`) samples ahead of the caller; when the model's third call gives
    logits of NaN or +inf, the two good tokens come out, then a ValueError naming the row,
    and the bad step's token is never handed out."""
    got = []
    with pytest.raises(ValueError, match=f"row 0: .*{reason}"):
        for response in stream_generate(TurnsBad(2, value), word_tokenizer(), [1], max_tokens=8, params=params):
            got.append(response.token)
    assert got == [2, 3]



# ---- generate(model, tokenizer, prompt, verbose=False, **kwargs), as mlx_lm.generate ---------------


def test_generate_passes_every_keyword_to_stream_generate():
    """Every keyword of `stream_generate` reaches it through `generate`, `step_times` too
    (a list of `generate`'s own once left it out): the same text, and the times filled in."""
    from tiny_llm.streaming import StepTimes

    times, model = StepTimes(), CountingModel()
    params = SamplingParams(temperature=0.0)
    text = tiny_llm.generate(model, word_tokenizer(), [1, 2], max_tokens=3, params=params, step_times=times)
    assert text == "c d e" == "".join(r.text for r in stream_generate(CountingModel(), word_tokenizer(), [1, 2], 3,
                                                                       params=params))
    assert times.steps == 3 and model.calls == [[1, 2], [1, 2, 3], [1, 2, 3, 4]]


def test_generate_refuses_an_unknown_keyword_before_the_model_runs():
    model = CountingModel()
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_token'"):
        tiny_llm.generate(model, word_tokenizer(), [1, 2], max_token=3)
    assert model.calls == []


def test_generate_takes_verbose_fourth_and_refuses_a_max_tokens_there():
    """The fourth argument is `verbose`, as in mlx-lm: a count there is a mistake, named."""
    model = CountingModel()
    with pytest.raises(ValueError, match=r"verbose must be True or False, got 8 \(max_tokens and the other options "
                                         r"are keywords"):
        tiny_llm.generate(model, word_tokenizer(), [1, 2], 8)
    assert model.calls == []


def test_verbose_generate_prints_the_text_then_the_statistics(capsys):
    text = tiny_llm.generate(CountingModel(), word_tokenizer(), [1, 2], True, max_tokens=3)
    lines = capsys.readouterr().out.splitlines()
    assert text == "c d e"
    assert lines[:3] == ["=" * 10, "c d e", "=" * 10]
    assert re.fullmatch(r"Prompt: 2 tokens, [\d.]+ tokens-per-sec", lines[3])
    assert re.fullmatch(r"Generation: 3 tokens, [\d.]+ tokens-per-sec", lines[4])
    assert re.fullmatch(r"Peak memory: [\d.]+ GB", lines[5]) and len(lines) == 6
    assert tiny_llm.generate(CountingModel(), word_tokenizer(), [7], verbose=True, max_tokens=3) == ""
    assert capsys.readouterr().out.splitlines() == ["=" * 10, "", "=" * 10, "No text generated for this prompt"]
