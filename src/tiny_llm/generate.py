"""Course: week 1 day 6 and week 2 day 2 — generation: prefill the prompt, then decode one token at a time.

`generate_step` yields `(token, logprobs)`; `stream_generate` adds detokenized text and
statistics; `generate` returns the whole text. Names and meanings follow `mlx_lm.generate`.
What `stream_generate` runs around `generate_step` (checks, the prefix cache's pages,
speculative decoding, the sampling engine, the responses) is the engine's, in
`tiny_llm.streaming`.

Tests: tests/test_week1_day6.py, tests/test_week2_day2.py, tests/test_progress.py
"""

from collections.abc import Callable, Generator, Iterable, Sequence
from typing import TYPE_CHECKING

import mlx.core as mx

from .defaults import MAX_TOKENS, NUM_DRAFT_TOKENS, PREFILL_STEP_SIZE
from .model import Cache, CachedModel, Progress, check_progress, prefill
from .progress import implemented
from .sampler import LogitsProcessor, Sampler, SamplerFunction, SamplingParams, greedy_sampler
from .sampler.checks import check_int
from .streaming import GenerationResponse, StepTimes, choose_tokens, open_request, speculative_steps
from .tokenizer import Tokenizer

if TYPE_CHECKING:  # week 3 loads only when speculative decoding or the prefix cache is asked for
    from .prefix_cache import PrefixCache
    from .speculative import SpeculativeStats

# Week 1's loop runs any function of `tokens [B, L]` to logits `[B, L, V]`; the cached loop
# needs a `CachedModel`.
LogitsFunction = Callable[[mx.array], mx.array]


def generate_step(
    prompt: mx.array,
    model: CachedModel | LogitsFunction,
    *,
    max_tokens: int = MAX_TOKENS,
    sampler: SamplerFunction | None = None,
    logits_processors: Sequence[LogitsProcessor] | None = None,
    prompt_cache: list[Cache] | None = None,
    prefill_step_size: int = PREFILL_STEP_SIZE,
    kv_cache: bool | None = None,
    prompt_progress: Progress | None = None,
) -> Generator[tuple[int, mx.array], None, None]:
    """Yield `(token, logprobs [V])` for up to `max_tokens` tokens (-1: no limit).

    With a KV cache (`prompt_cache`, or a new one from `model.make_cache()`), the prompt
    `[L]` is prefilled in chunks of `prefill_step_size` tokens and each decode step feeds
    only the newest token (week 2). With `kv_cache=False`, or a model that is not a
    `CachedModel` (a plain function of tokens), every step runs the whole sequence through
    the model (week 1).
    `kv_cache=None` (the default) uses the cache once week 2 day 2 is implemented, which
    in the finished engine it always is.
    Logits processors see every token so far (prompt and generated) as `tokens [T]`.

    The cached loop runs one step ahead: when the caller stops early (at an end-of-sequence
    token), that last token has already been fed to `prompt_cache`; after `max_tokens` it
    has not.

    `prompt_progress(done, total)`, if given, follows the prefill of the `total = L` prompt
    tokens: the cached loop calls it after each chunk is evaluated (`done` positions are in
    the cache; all but the last token go in chunks) and last as `(L, L)` once the last
    token's logits are evaluated; week 1's loop, which runs the whole prompt in its first
    step, calls it once, as `(L, L)`, when the first token is ready.
    """
    sampler = sampler or greedy_sampler
    processors = list(logits_processors or [])
    prefill_step_size = check_int("prefill_step_size", prefill_step_size, minimum=1)
    prompt_progress = check_progress(prompt_progress)
    cacheable = isinstance(model, CachedModel)
    if kv_cache and prompt_cache is None and not cacheable:
        raise ValueError("kv_cache=True needs a model with make_cache() (a CachedModel) or a prompt_cache")
    if kv_cache is None:
        kv_cache = prompt_cache is not None or (cacheable and cached_loop_implemented())
    if prompt_cache is None and kv_cache and cacheable:
        prompt_cache = model.make_cache()
    if prompt_cache is None:
        steps = _recompute_steps(prompt, model, max_tokens=max_tokens, sampler=sampler, processors=processors)
        return steps if prompt_progress is None else _with_first_report(steps, prompt.size, prompt_progress)
    return _cached_steps(prompt, model, prompt_cache, max_tokens=max_tokens, step_size=prefill_step_size,
                         sampler=sampler, processors=processors, progress=prompt_progress)


def _with_first_report(steps: Iterable[tuple[int, mx.array]], total: int,
                       progress: Progress) -> Generator[tuple[int, mx.array], None, None]:
    """`steps`, calling `progress(total, total)` when the first one is ready."""
    for n, step in enumerate(steps):
        if n == 0:
            progress(total, total)
        yield step


def next_token(
    tokens: mx.array, logits: mx.array, sampler: SamplerFunction, processors: Sequence[LogitsProcessor]
) -> tuple[mx.array, mx.array]:
    """From the last position's `logits [1, V]`: run the processors over them (with the
    history `tokens [T]`), normalise to log-probabilities and sample. Returns
    `(token [1], logprobs [V])`."""
    # BEGIN SOLUTION week1-day6
    for processor in processors:
        logits = processor(tokens, logits)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # 1, V
    return sampler(logprobs), logprobs[0]
    # END SOLUTION


def _recompute_steps(prompt, model, *, max_tokens, sampler, processors):
    """Week 1: each step feeds the whole sequence so far and keeps only the last logits."""
    # BEGIN SOLUTION week1-day6
    tokens = prompt  # T: everything so far
    n = 0
    while n != max_tokens:
        logits = model(tokens[None])[:, -1, :]  # 1, V: the last position predicts the next token
        token, logprobs = next_token(tokens, logits, sampler, processors)
        mx.eval(token, logprobs)
        yield int(token.item()), logprobs
        tokens = mx.concatenate([tokens, token.astype(tokens.dtype)])
        n += 1
    # END SOLUTION


def _cached_steps(prompt, model, cache, *, max_tokens, step_size, sampler, processors, progress=None):
    """Week 2: prefill once (reporting to `progress`, see `prefill`), then one token per
    step. The next step's graph is built and started (`mx.async_eval`) before the current
    token is handed out, so the model works while the caller handles the token."""
    # BEGIN SOLUTION week2-day2
    tokens = prompt
    token, logprobs = next_token(tokens, prefill(model, prompt[None], cache, step_size, progress), sampler, processors)
    mx.async_eval(token, logprobs)
    n = 0
    while True:
        n += 1
        if n != max_tokens:
            tokens = mx.concatenate([tokens, token.astype(tokens.dtype)])
            logits = model(token[None].astype(tokens.dtype), cache=cache)[:, -1, :]
            following = next_token(tokens, logits, sampler, processors)
            mx.async_eval(*following)
        yield int(token.item()), logprobs
        if n == max_tokens:
            return
        token, logprobs = following
    # END SOLUTION


def cached_loop_implemented() -> bool:
    """Whether week 2 day 2 (the KV cache, `prefill` and the cached loop) is implemented;
    always True in the finished engine."""
    return implemented("week2-day2", _probe_cached_loop)


def _probe_cached_loop() -> None:
    from .kv_cache import KVCache

    class Stub:  # one head of zeros per token goes into the cache; the logits favour token 0
        def __call__(self, tokens: mx.array, cache: list) -> mx.array:
            B, L = tokens.shape
            kv = mx.zeros((B, 1, L, 2))
            cache[0].make_mask(L, mx.float32)
            cache[0].update_and_fetch(kv, kv)
            return mx.zeros((B, L, 3))

    cache = [KVCache()]
    list(_cached_steps(mx.array([1, 2, 1]), Stub(), cache, max_tokens=2, step_size=2, sampler=greedy_sampler,
                       processors=[]))
    cache[0].trim(1)


def stream_generate(
    model: CachedModel | LogitsFunction,
    tokenizer: Tokenizer,
    prompt: str | Sequence[int] | mx.array,
    max_tokens: int = MAX_TOKENS,
    *,
    sampler: SamplerFunction | None = None,
    logits_processors: Sequence[LogitsProcessor] | None = None,
    params: SamplingParams | Sampler | None = None,
    prompt_cache: list[Cache] | None = None,
    prefill_step_size: int = PREFILL_STEP_SIZE,
    kv_cache: bool | None = None,
    draft_model: CachedModel | None = None,
    prompt_lookup: bool = False,
    num_draft_tokens: int = NUM_DRAFT_TOKENS,
    speculative_stats: "SpeculativeStats | None" = None,
    prefix_cache: "PrefixCache | None" = None,
    prompt_progress: Progress | None = None,
    step_times: StepTimes | None = None,
) -> Generator[GenerationResponse, None, None]:
    """Generate text from `prompt` (a string, token ids or `mx.array [L]`), one response per
    token. Generation ends at an end-of-sequence token (not shown) or after `max_tokens`.

    Choose tokens either with `sampler` (a function of log-probabilities, e.g. from
    `make_sampler`) and `logits_processors`, or with the sampling engine: `params` (a
    `SamplingParams`, or a `Sampler` to keep its state and statistics), which sees the whole
    history (prompt and generated tokens) for its penalties. `prompt_cache`,
    `prefill_step_size`, `kv_cache` and `prompt_progress` are passed to `generate_step`.

    Speculative decoding (`tiny_llm.speculative`): pass a `draft_model`, or
    `prompt_lookup=True` to draft from n-grams of the text so far, with `params` (a
    `SamplingParams`; default greedy) and `num_draft_tokens` per round. The tokens have
    exactly the distribution they would have without speculation; `from_draft` tells which
    came from the drafter. `speculative_stats` (a `SpeculativeStats`) collects the
    acceptance counts. `prompt_progress` follows the target model's prefill as in
    `generate_step`: all but the last prompt token in chunks, then `(L, L)` once the first
    round, which feeds the last one, is evaluated.

    `prefix_cache` (a `tiny_llm.prefix_cache.PrefixCache`, week 3 day 3): the prompt's
    start is taken from the pages of earlier generations, only the rest is prefilled (the
    `total` that `prompt_progress` sees), and the pages of this one are kept for later ones
    (a chat passes one cache to every turn).

    `step_times` (a `StepTimes`, with `params`): collects where each step's time goes, the
    model's forward pass and the sampling each evaluated on its own (`--verbose`).
    """
    speculative = draft_model is not None or prompt_lookup
    with open_request(model, tokenizer, prompt, max_tokens, prompt_cache=prompt_cache, kv_cache=kv_cache,
                      prefix_cache=prefix_cache, speculative=speculative) as request:
        if speculative:
            steps = speculative_steps(
                request, model, tokenizer, draft_model=draft_model, prompt_lookup=prompt_lookup, params=params,
                sampler=sampler, logits_processors=logits_processors, kv_cache=kv_cache,
                num_draft_tokens=num_draft_tokens, prefill_step_size=prefill_step_size, stats=speculative_stats,
                prompt_progress=prompt_progress,
            )
        else:
            choice = choose_tokens(request, tokenizer, sampler=sampler, logits_processors=logits_processors,
                                   params=params, times=step_times)
            steps = choice.steps(generate_step(
                request.prompt[request.reused:], model, max_tokens=request.max_tokens, sampler=choice.sampler,
                logits_processors=choice.processors, prompt_cache=request.cache, prefill_step_size=prefill_step_size,
                kv_cache=kv_cache, prompt_progress=prompt_progress,
            ))
        yield from request.responses(steps, tokenizer)


def generate(
    model: CachedModel | LogitsFunction,
    tokenizer: Tokenizer,
    prompt: str | Sequence[int] | mx.array,
    verbose: bool = False,
    **kwargs,
) -> str:
    """The whole text `stream_generate(model, tokenizer, prompt, **kwargs)` produces, as in
    `mlx_lm.generate`: every other argument (`max_tokens`, `params`, `sampler`, ...) is
    `stream_generate`'s, and one it does not take is a `TypeError` naming it before anything
    runs. `verbose=True` prints the text as it comes, then the statistics."""
    if not isinstance(verbose, bool):
        raise ValueError(f"verbose must be True or False, got {verbose!r} (max_tokens and the other options "
                         "are keywords: generate(model, tokenizer, prompt, max_tokens=...))")
    responses = stream_generate(model, tokenizer, prompt, **kwargs)  # an unknown keyword raises here
    if not verbose:
        return "".join(r.text for r in responses)
    print("=" * 10)
    text, last = "", None
    for last in responses:
        print(last.text, end="", flush=True)
        text += last.text
    print()
    print("=" * 10)
    if not text:
        print("No text generated for this prompt")
        return text
    print(f"Prompt: {last.prompt_tokens} tokens, {last.prompt_tps:.3f} tokens-per-sec")
    print(f"Generation: {last.generation_tokens} tokens, {last.generation_tps:.3f} tokens-per-sec")
    print(f"Peak memory: {last.peak_memory:.3f} GB")
    return text
