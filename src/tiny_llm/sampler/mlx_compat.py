"""Engine — drop-in equivalents of `mlx_lm.sample_utils`: same names, arguments and results.

Two differences: bad arguments raise `ValueError` here, when the function is called or the
processor is built, never from inside compiled code; and the penalty processors also accept
`tokens [B, T]`, one history per row (mlx-lm applies one shared history to every row).
`apply_top_k` keeps tokens tied with the k-th largest (mlx-lm keeps exactly k, choosing
among ties arbitrarily); on logits without ties the results are identical.
"""

from collections.abc import Callable, Mapping, Sequence

import mlx.core as mx

from .basic import categorical_draw, keep_top_k, keep_top_p, make_sampler
from .checks import check_float, check_int
from .filters import keep_min_p, xtc_mask
from .penalties import apply_frequency, apply_presence, apply_repetition, token_counts

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]

__all__ = [
    "make_sampler", "make_logits_processors", "greedy_sampler", "categorical_sampling",
    "apply_top_k", "apply_top_p", "apply_min_p", "apply_xtc",
    "make_repetition_penalty", "make_presence_penalty", "make_frequency_penalty",
]


def greedy_sampler(logprobs: mx.array) -> mx.array:
    """The most likely token of each row (the lowest index on ties)."""
    return mx.argmax(logprobs, axis=-1)


def categorical_sampling(logits: mx.array, temp: float) -> mx.array:
    """One token per row drawn from `softmax(logits / temp)`."""
    temp = check_float("temp", temp, minimum=0.0, min_open=True)
    return categorical_draw(logits, 1.0 / temp)


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
    V = logits.shape[-1]
    special = list(xtc_special_tokens)
    for token in special:
        check_int("xtc_special_tokens entry", token, minimum=0, maximum=V - 1)
    mask = xtc_mask(mx.softmax(logits, axis=-1), xtc_threshold)
    if special:
        protected = mx.zeros((V,), dtype=mx.bool_).at[mx.array(special)].add(True)
        mask = mask & ~protected
    return mx.where(
        mx.random.uniform(0, 1) > xtc_probability, logits, mx.where(mask, -mx.inf, logits)
    )


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
