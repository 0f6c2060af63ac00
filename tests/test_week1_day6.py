"""Week 1, day 6: the generation loop — prefill, decode, stopping, sampler and processors."""

import mlx.core as mx
import numpy as np
import pytest
from conftest import EOS, TINY_CONFIGS, V, CountingModel, tiny_model, word_tokenizer

import tiny_llm
from tiny_llm.generate import generate_step, stream_generate


def expected_logprobs(last: int) -> np.ndarray:
    logits = np.where(np.arange(V) == (last + 1) % V, 5.0, 0.0)
    return logits - np.log(np.exp(logits).sum())


def test_greedy_follows_the_model_and_recomputes_without_cache():
    """No cache: step n sees prompt + n generated tokens; tokens follow the argmax rule."""
    model = CountingModel()
    out = list(generate_step(mx.array([1, 2]), model, max_tokens=3))
    assert [t for t, _ in out] == [3, 4, 5]
    assert model.calls == [[1, 2], [1, 2, 3], [1, 2, 3, 4]]


def test_yielded_logprobs_are_the_normalised_last_position():
    """Each step yields log-softmax of the last position's logits, shape [V]."""
    for token, logprobs in generate_step(mx.array([6]), CountingModel(), max_tokens=2):
        assert logprobs.shape == (V,)
        np.testing.assert_allclose(np.array(logprobs), expected_logprobs((token - 1) % V), atol=1e-6)


def test_the_given_sampler_is_used():
    """A sampler that always answers 6 decides every token, and gets logprobs [1, V]."""
    seen = []

    def sampler(logprobs):
        seen.append(logprobs.shape)
        return mx.array([6])

    out = [t for t, _ in generate_step(mx.array([1]), CountingModel(), max_tokens=4, sampler=sampler)]
    assert out == [6, 6, 6, 6]
    assert seen == [(1, V)] * 4


def test_logits_processors_see_the_whole_history_and_change_the_choice():
    """Processors get prompt + generated tokens and their output is what the sampler sees."""
    histories = []

    def boost_seven(tokens, logits):
        histories.append(tokens.tolist())
        return logits + 10.0 * (mx.arange(V) == 7)

    model = CountingModel()
    out = [t for t, _ in generate_step(mx.array([1, 2]), model, max_tokens=3,
                                       logits_processors=[boost_seven])]
    assert out == [7, 7, 7]
    assert histories == [[1, 2], [1, 2, 7], [1, 2, 7, 7]]


def test_stream_stops_at_max_tokens():
    """max_tokens bounds the responses; the last one says 'length' and counts them."""
    responses = list(stream_generate(CountingModel(), word_tokenizer(), [1], max_tokens=3))
    assert [r.token for r in responses] == [2, 3, 4]
    assert [r.finish_reason for r in responses] == [None, None, "length"]
    assert responses[-1].generation_tokens == 3 and responses[-1].prompt_tokens == 1
    assert "".join(r.text for r in responses) == "b c d"


def test_stream_stops_at_end_of_sequence_without_showing_it():
    """Reaching the EOS token ends generation with 'stop'; EOS text is not emitted."""
    responses = list(stream_generate(CountingModel(), word_tokenizer(), "f", max_tokens=10))
    assert [r.token for r in responses] == [7, EOS]
    assert responses[-1].finish_reason == "stop"
    assert "".join(r.text for r in responses) == "g"


def test_generate_returns_the_streamed_text_and_accepts_every_prompt_form():
    """generate() joins the stream; a string, a list and an mx.array prompt agree."""
    tok = word_tokenizer()
    texts = {tiny_llm.generate(CountingModel(), tok, p, max_tokens=4) for p in ("c", [3], mx.array([3]))}
    assert texts == {"d e f g"}


def test_statistics_are_filled_in():
    """Each response carries the prompt size, rates, time to first token and peak memory."""
    responses = list(stream_generate(CountingModel(), word_tokenizer(), [1, 2, 3], max_tokens=4))
    last = responses[-1]
    assert last.prompt_tokens == 3 and last.generation_tokens == 4
    # Rates are defined by the counts and times they report (no speed is asserted).
    assert last.prompt_tps == pytest.approx(last.prompt_tokens / last.time_to_first_token)
    assert all(r.time_to_first_token == last.time_to_first_token for r in responses)
    assert responses[0].generation_tps == 0.0  # the first token belongs to the prefill
    assert last.peak_memory >= 0 and last.from_draft is False


# ---- a real (random-weight) model ----------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_greedy_recompute_matches_mlx_lm(name):
    """Without a cache (week 1's loop), 10 greedy tokens of a random model equal mlx-lm's."""
    from mlx_lm.generate import generate_step as reference_step

    model, ref = tiny_model(name, seed=21)
    prompt = mx.array([5, 17, 3, 9, 30])
    ours = [t for t, _ in generate_step(prompt, model, max_tokens=10, kv_cache=False)]
    theirs = [int(t) for t, _ in reference_step(prompt, ref, max_tokens=10)]
    assert ours == theirs


def test_kv_cache_false_recomputes_even_when_the_model_has_a_cache():
    """kv_cache=False runs week 1's loop: the model is called with the whole sequence and
    without a cache."""
    model, _ = tiny_model("llama-untied", seed=3)
    calls = []

    def spy(tokens, cache=None):
        calls.append((tokens.shape[1], cache))
        return model(tokens, cache=cache)

    spy.make_cache = model.make_cache
    list(generate_step(mx.array([1, 2, 3]), spy, max_tokens=3, kv_cache=False))
    assert calls == [(3, None), (4, None), (5, None)]
