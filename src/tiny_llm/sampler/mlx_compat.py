"""Engine — drop-in equivalents of `mlx_lm.sample_utils`: same names, arguments and results.

This module holds every function of `mlx_lm.sample_utils` under its name. Its `make_sampler`
is mlx-lm's (`temp, top_p, min_p, min_tokens_to_keep, top_k, xtc_probability, xtc_threshold,
xtc_special_tokens`, filters in mlx-lm's order); `tiny_llm.sampler.make_sampler` is the
course's week-1 exercise.

The differences: bad arguments raise `ValueError` here, when the function is called or the
sampler or processor is built, never from inside compiled code, and values mlx-lm ignores
or misreads without a word are refused too (see `make_sampler`); the penalty processors also
accept `tokens [B, T]`, one history per row (mlx-lm applies one shared history to every
row). `apply_top_k` keeps tokens tied with the k-th largest, and so does `min_tokens_to_keep`
(mlx-lm keeps exactly k, choosing among ties arbitrarily); on logits without ties the
results are identical.

Tests: tests/test_sampler_facade.py
"""

import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial

import mlx.core as mx

from .basic import SamplerFunction, keep_top_k, keep_top_p
from .checks import check_float, check_int
from .filters import keep_min_p, xtc_mask
from .penalties import apply_frequency, apply_presence, apply_repetition, token_counts

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]

__all__ = [
    "make_sampler", "make_logits_processors", "greedy_sampler", "categorical_sampling",
    "apply_top_k", "apply_top_p", "apply_min_p", "apply_xtc",
    "make_repetition_penalty", "make_presence_penalty", "make_frequency_penalty",
]


def make_sampler(
    temp: float = 0.0,
    top_p: float = 0.0,
    min_p: float = 0.0,
    min_tokens_to_keep: int = 1,
    top_k: int = 0,
    xtc_probability: float = 0.0,
    xtc_threshold: float = 0.1,
    xtc_special_tokens: Sequence[int] | None = None,
) -> SamplerFunction:
    """mlx-lm's `make_sampler`: a function `logprobs [B, V] -> tokens [B]`.

    `temp == 0` returns `greedy_sampler`. Otherwise the filters run in mlx-lm's order, each
    on what the previous one left: top-p (if `0 < top_p < 1`, on the full row), min-p (if
    `min_p > 0`), XTC (if `xtc_probability > 0`; one coin for the whole batch), top-k (if
    `top_k > 0`); then one token per row is drawn from `softmax(logprobs / temp)`. Under the
    same `mx.random.seed`, the tokens are mlx-lm's (the random state advances the same way).

    Every argument is checked when the sampler is built, even for `temp == 0`, against the
    range mlx-lm's filter accepts, whether that filter is on or not; what depends on the
    vocabulary (`top_k < V`, and special tokens below V while XTC is on) is checked when the
    sampler is called, before anything runs. So these raise `ValueError` where mlx-lm goes
    on silently: a negative `temp` (mlx-lm draws from the reversed distribution) or an
    infinite one (mlx-lm draws uniformly, or, once a filter has masked tokens, from NaN
    weights, which picked a masked token); a `top_p` outside [0, 1], a negative `top_k` or
    a negative `xtc_probability` (mlx-lm switches the filter off); a negative special token
    (mlx-lm counts it from the end of the vocabulary); and an out-of-range `min_p`,
    `min_tokens_to_keep` or `xtc_threshold` while its filter is off (mlx-lm ignores it).
    """
    temp = check_float("temp", temp, minimum=0.0, maximum=math.inf, max_open=True)
    top_p = check_float("top_p", top_p, minimum=0.0, maximum=1.0)
    min_p = check_float("min_p", min_p, minimum=0.0, maximum=1.0)
    min_tokens_to_keep = check_int("min_tokens_to_keep", min_tokens_to_keep, minimum=1)
    top_k = check_int("top_k", top_k, minimum=0)
    xtc_probability = check_float("xtc_probability", xtc_probability, minimum=0.0, maximum=1.0)
    xtc_threshold = check_float("xtc_threshold", xtc_threshold, minimum=0.0, maximum=0.5)
    special = _special_tokens(xtc_special_tokens)
    if temp == 0:
        return greedy_sampler

    filters: list[SamplerFunction] = []
    if 0 < top_p < 1:
        filters.append(lambda x: keep_top_p(x, top_p))
    if min_p > 0:
        filters.append(lambda x: keep_min_p(x, min_p, min_tokens_to_keep))
    if xtc_probability > 0:
        filters.append(lambda x: _xtc(x, xtc_probability, xtc_threshold, special))
    if top_k > 0:
        filters.append(lambda x: keep_top_k(x, top_k))
    inv_temp = 1.0 / temp

    def sampler(logprobs: mx.array) -> mx.array:
        V = logprobs.shape[-1]
        if top_k >= V:
            raise ValueError(f"top_k must be in [0, {V - 1}] for logprobs of {V} tokens (0 is off), got {top_k}")
        if xtc_probability > 0 and special and max(special) >= V:
            _special_tokens(special, V)  # raises, naming the first token outside the vocabulary
        for keep in filters:
            logprobs = keep(logprobs)
        return _categorical(logprobs, inv_temp)

    return sampler


def greedy_sampler(logprobs: mx.array) -> mx.array:
    """The most likely token of each row (the lowest index on ties)."""
    return mx.argmax(logprobs, axis=-1)


def categorical_sampling(logits: mx.array, temp: float) -> mx.array:
    """One token per row drawn from `softmax(logits / temp)`."""
    temp = check_float("temp", temp, minimum=0.0, min_open=True)
    return _categorical(logits, 1.0 / temp)


@partial(mx.compile, inputs=mx.random.state, outputs=mx.random.state)
def _categorical(logits: mx.array, inv_temp: float) -> mx.array:
    # Scaled in the logits' own dtype, as mlx-lm does: in float16 or bfloat16, scaling in
    # float32 (as the course's `categorical_draw` does) picks another token in ~0.2% of draws.
    return mx.random.categorical(logits * inv_temp)


def apply_top_k(logprobs: mx.array, top_k: int) -> mx.array:
    """Mask all but the `top_k` largest entries of each row with `-inf`."""
    check_int("top_k", top_k, minimum=1, maximum=logprobs.shape[-1] - 1)
    return keep_top_k(logprobs, top_k)


def apply_top_p(logprobs: mx.array, top_p: float) -> mx.array:
    """Nucleus filter: keep the most likely tokens until their mass reaches `top_p`."""
    check_float("top_p", top_p, minimum=0.0, maximum=1.0)
    return keep_top_p(logprobs, top_p)


def apply_min_p(logprobs: mx.array, min_p: float, min_tokens_to_keep: int = 1) -> mx.array:
    """Mask tokens less likely than `min_p` times the most likely one."""
    check_float("min_p", min_p, minimum=0.0, maximum=1.0)
    check_int("min_tokens_to_keep", min_tokens_to_keep, minimum=1)
    return keep_min_p(logprobs, min_p, min_tokens_to_keep)


def apply_xtc(
    logits: mx.array,
    xtc_probability: float,
    xtc_threshold: float,
    xtc_special_tokens: Sequence[int],
) -> mx.array:
    """Exclude Top Choices: with probability `xtc_probability` (one draw from the global
    random state, as in mlx-lm), mask every token above `xtc_threshold` but the least likely
    of them. Tokens in `xtc_special_tokens` are never masked."""
    check_float("xtc_threshold", xtc_threshold, minimum=0.0, maximum=0.5)
    check_float("xtc_probability", xtc_probability, minimum=0.0, maximum=1.0)
    return _xtc(logits, xtc_probability, xtc_threshold, _special_tokens(xtc_special_tokens, logits.shape[-1]))


def _xtc(logits: mx.array, probability: float, threshold: float, special: list[int]) -> mx.array:
    """XTC on checked arguments: one uniform draw from the global random state decides for
    the whole batch. A token exactly at the threshold is not a top choice, as in mlx-lm."""
    mask = xtc_mask(mx.softmax(logits, axis=-1), threshold, strict=True)  # B, V
    if special:
        protected = mx.zeros((logits.shape[-1],), dtype=mx.bool_).at[mx.array(special)].add(True)
        mask = mask & ~protected
    return mx.where(mx.random.uniform(0, 1) > probability, logits, mx.where(mask, -mx.inf, logits))


def _special_tokens(tokens: Sequence[int] | None, vocab: int | None = None) -> list[int]:
    """`xtc_special_tokens` as a list of token ids, each checked to be in [0, vocab - 1]."""
    if tokens is None:
        return []
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
        raise ValueError(f"xtc_special_tokens must be a list of token ids or None, got {tokens!r}")
    maximum = None if vocab is None else vocab - 1
    return [check_int("xtc_special_tokens entry", token, minimum=0, maximum=maximum) for token in tokens]


def make_logits_processors(
    logit_bias: Mapping[int, float] | None = None,
    repetition_penalty: float | None = None,
    repetition_context_size: int = 20,
    presence_penalty: float | None = None,
    presence_context_size: int = 20,
    frequency_penalty: float | None = None,
    frequency_context_size: int = 20,
) -> list[LogitsProcessor]:
    """The processors mlx-lm builds for these options, in mlx-lm's order."""
    processors: list[LogitsProcessor] = []
    if logit_bias:
        for token in logit_bias:
            check_int("logit_bias token", token, minimum=0)
        largest = max(logit_bias)
        indices = mx.array(list(logit_bias.keys()))
        values = mx.array([check_float("logit_bias value", v) for v in logit_bias.values()])

        def logit_bias_processor(_tokens: mx.array, logits: mx.array) -> mx.array:
            if largest >= logits.shape[-1]:
                raise ValueError(
                    f"logit_bias names token {largest}, but the vocabulary has {logits.shape[-1]} tokens"
                )
            return logits.at[:, indices].add(values)

        processors.append(logit_bias_processor)
    for make, penalty, context in (
        (make_repetition_penalty, repetition_penalty, repetition_context_size),
        (make_presence_penalty, presence_penalty, presence_context_size),
        (make_frequency_penalty, frequency_penalty, frequency_context_size),
    ):
        if penalty is not None and penalty != 0:
            processors.append(make(penalty, context))
    return processors


def _penalty_processor(
    name: str, penalty: float, context_size: int, apply: Callable
) -> LogitsProcessor:
    context_size = check_int(f"{name} context_size", context_size, minimum=1)

    def processor(tokens: mx.array, logits: mx.array) -> mx.array:
        tokens = mx.array(tokens) if not isinstance(tokens, mx.array) else tokens
        if tokens.shape[-1] == 0:
            return logits
        window = tokens[..., -context_size:]
        return apply(logits, token_counts(window, logits.shape[-1], logits.shape[0]), penalty)

    return processor


def make_repetition_penalty(penalty: float, context_size: int = 20) -> LogitsProcessor:
    """Divide positive (multiply negative) logits of the last `context_size` tokens by `penalty`."""
    penalty = check_float("repetition_penalty", penalty, minimum=0.0, min_open=True)
    return _penalty_processor("repetition_penalty", penalty, context_size, apply_repetition)


def make_presence_penalty(penalty: float, context_size: int = 20) -> LogitsProcessor:
    """Subtract `penalty` from each token seen in the last `context_size` tokens."""
    penalty = check_float("presence_penalty", penalty)
    return _penalty_processor("presence_penalty", penalty, context_size, apply_presence)


def make_frequency_penalty(penalty: float, context_size: int = 20) -> LogitsProcessor:
    """Subtract `penalty` per occurrence in the last `context_size` tokens."""
    penalty = check_float("frequency_penalty", penalty)
    return _penalty_processor("frequency_penalty", penalty, context_size, apply_frequency)
