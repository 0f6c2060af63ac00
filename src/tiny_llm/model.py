"""Course: week 2 day 2 — `prefill`; and the model contract every generation path shares.

`Model` names what the engine needs from a model: `__call__(tokens, cache=None)`,
`make_cache()`, its `layers` (one cache per layer) and the two numbers of its configuration
that requests are checked against (`args.vocab_size`, `args.max_position_embeddings`).
`Qwen2Model` offers all of it; a test's stand-in offers what the path it drives uses.
Generation, batching, beam search and speculative decoding import from here, and nothing
here imports them: the import graph stays a DAG.

Tests: tests/test_week2_day2.py, tests/test_beam_search.py, tests/test_layout.py
"""

import contextlib
import numbers
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import mlx.core as mx

from .defaults import PREFILL_STEP_SIZE
from .tokenizer import Tokenizer

# `progress(done, total)`: `done` of the `total` prompt positions a prefill runs are evaluated.
Progress = Callable[[int, int], None]


class ModelConfig(Protocol):
    """The part of a model's configuration (`ModelArgs`) the engine reads."""

    vocab_size: int
    max_position_embeddings: int | None


@runtime_checkable
class Configured(Protocol):
    """A model that states its configuration: requests are checked against its vocabulary
    and context. (A wrapper must offer `args` as a real attribute or property: from Python
    3.12 on, `isinstance` against a protocol does not see attributes served by `__getattr__`.)"""

    args: ModelConfig


class Cache(Protocol):
    """One layer's key/value cache, as the engine uses it (`KVCache`, `BatchKVCache`):
    `offset` positions are stored in `keys`/`values [B, H, S, D]`; `trim(n)` forgets the
    last n (speculative decoding's rewind)."""

    offset: int
    keys: mx.array
    values: mx.array

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]: ...

    def make_mask(self, L: int, dtype: mx.Dtype = mx.float32) -> mx.array | None: ...

    def trim(self, n: int) -> int: ...


@runtime_checkable
class CachedModel(Protocol):
    """A model that continues from a cache: `make_cache()` gives one empty `Cache` per
    layer; `model(tokens [B, L], cache=cache)` returns logits `[B, L, V]` and extends it."""

    def __call__(self, tokens: mx.array, cache: list[Cache] | None = None) -> mx.array: ...

    def make_cache(self) -> list[Cache]: ...


@runtime_checkable
class Model(CachedModel, Configured, Protocol):
    """Everything the engine uses: a `CachedModel` with its configuration `args` and its
    `layers` (batching builds one batch cache per layer)."""

    layers: Sequence[Any]


def vocab_size(model: CachedModel) -> int | None:
    """The model's vocabulary size, or None for a stand-in without a configuration."""
    return model.args.vocab_size if isinstance(model, Configured) else None


def check_context(model: CachedModel, prompt_tokens: int, max_tokens: int) -> int:
    """Refuse a request that cannot fit the model's context (`args.max_position_embeddings`,
    when the model has one): a prompt of `prompt_tokens` plus `max_tokens` new tokens. Returns
    `max_tokens`, with -1 (no limit) turned into the room the context leaves. The one check
    of generation, beam search, speculative decoding and batching."""
    context = model.args.max_position_embeddings if isinstance(model, Configured) else None
    if not context:
        return max_tokens
    if prompt_tokens >= context:
        raise ValueError(f"prompt of {prompt_tokens} tokens leaves no room in the model's context of "
                         f"{context} positions")
    if max_tokens == -1:
        return context - prompt_tokens
    if prompt_tokens + max_tokens > context:
        raise ValueError(f"prompt of {prompt_tokens} tokens plus max_tokens={max_tokens} exceeds the "
                         f"model's context of {context} positions")
    return max_tokens


def prompt_array(prompt: str | Sequence[int] | mx.array, tokenizer: Tokenizer) -> mx.array:
    """A request's prompt as token ids `[L]`: a string is encoded with `tokenizer`; token
    ids (a list or an `mx.array [L]` of integers) are taken as they are. An empty prompt, or
    one holding anything but token ids (non-negative integers below 2**31), is refused."""
    if isinstance(prompt, str):
        prompt = tokenizer.encode(prompt)
    if not isinstance(prompt, mx.array):
        prompt = list(prompt)
        bad = [t for t in prompt if isinstance(t, bool) or not isinstance(t, numbers.Integral)
               or not 0 <= t < 2**31]
        if bad:
            raise ValueError(f"prompt must hold token ids (integers from 0 to 2**31 - 1), got {bad[0]!r}")
        prompt = mx.array(prompt, dtype=mx.int32)
    elif mx.issubdtype(prompt.dtype, mx.floating) or prompt.dtype == mx.bool_:
        raise ValueError(f"prompt must hold token ids (integers), got an array of {prompt.dtype}")
    if prompt.ndim != 1 or prompt.size == 0:
        empty = "prompt is empty; " if prompt.size == 0 else ""
        raise ValueError(f"{empty}prompt must be a non-empty sequence of token ids, got shape {prompt.shape}")
    return prompt


_prompt_chunks = threading.local()


@contextlib.contextmanager
def prompt_chunks() -> Iterator[None]:
    """Inside the block, the model's one-token calls are chunks of a prompt, not decode
    steps: the fused decode step (week 2 day 7) leaves them to the layers on MLX ops. How a
    prompt is cut into chunks depends on what a prefix cache already held, so its positions
    must not be computed by one path or the other according to the cut: every position but
    the last goes through the same ops, alone or in a batch. (The last position, always a
    call of its own, and every decode step run fused.)"""
    depth = getattr(_prompt_chunks, "depth", 0)
    _prompt_chunks.depth = depth + 1
    try:
        yield
    finally:
        _prompt_chunks.depth = depth


def in_prompt_chunks() -> bool:
    """Whether this thread is inside `prompt_chunks()`."""
    return getattr(_prompt_chunks, "depth", 0) > 0


def prefill(
    model: CachedModel,
    tokens: mx.array,
    cache: list[Cache],
    step_size: int = PREFILL_STEP_SIZE,
    progress: Progress | None = None,
) -> mx.array:
    """Run `tokens [B, L]` into `cache` in chunks of at most `step_size` positions, and
    return the logits of the last position, `[B, V]`. Chunks bound the memory of the
    attention scores (`L x S` per head) and of the activations. Only the cache of the
    positions before the last is evaluated, so the output head (`E x V` per position) runs
    for the last position alone.

    `progress`, if given, is called as `progress(done, L)` after each chunk is evaluated
    (`done` positions are then in the cache), and last as `progress(L, L)` once the last
    position's logits are evaluated too."""
    L = tokens.shape[1]
    # Prefill the chunks (calling `progress` after each), and leave the last position's lazy
    # logits `[B, V]` in `logits`: the lines after the exercise report `(L, L)`.
    # BEGIN SOLUTION week2-day2
    done = 0
    with prompt_chunks():  # a chunk of one token is still a prompt's (see prompt_chunks)
        while tokens.shape[1] > 1:
            n = min(step_size, tokens.shape[1] - 1)
            model(tokens[:, :n], cache=cache)  # the logits are never evaluated: only the cache
            mx.eval([a for c in cache for a in (c.keys, c.values)])
            tokens = tokens[:, n:]
            done += n
            if progress is not None:
                progress(done, L)
    logits = model(tokens, cache=cache)[:, -1, :]
    # END SOLUTION
    if progress is not None:
        mx.eval(logits)
        progress(L, L)
    return logits


def check_progress(progress: object) -> Progress | None:
    """A prompt-progress callback: None, or a function of `(done, total)`."""
    if progress is not None and not callable(progress):
        raise ValueError(f"prompt_progress must be None or a function of (done, total), got {progress!r}")
    return progress


def heads_share(model: object) -> tuple[int, int]:
    """(key/value heads this process holds, key/value heads of the whole model): `(1, 1)`
    unless `model` is one rank's shard of a tensor-parallel model (`whole_args` set)."""
    args, whole = getattr(model, "args", None), getattr(model, "whole_args", None)
    if args is None or whole is None:
        return (1, 1)
    return (args.num_key_value_heads, whole.num_key_value_heads)
