"""Course: week 1 day 6 and week 2 day 2 — generation: prefill the prompt, then decode one token at a time.

`generate_step` yields `(token, logprobs)`; `stream_generate` adds detokenized text and
statistics; `generate` returns the whole text. Names and meanings follow `mlx_lm.generate`.
"""

import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import mlx.core as mx

from .defaults import MAX_TOKENS, NUM_DRAFT_TOKENS, PREFILL_STEP_SIZE
from .model import Cache, CachedModel, Model, check_context, prefill, prompt_array
from .progress import implemented
from .sampler import LogitsProcessor, Sampler, SamplerFunction, SamplingParams, greedy_sampler
from .sampler.checks import check_int
from .tokenizer import StreamingDetokenizer, Tokenizer

if TYPE_CHECKING:  # week 3 loads only when speculative decoding or the prefix cache is asked for
    from .prefix_cache import PrefixCache
    from .speculative import SpeculativeStats

# Week 1's loop runs any function of `tokens [B, L]` to logits `[B, L, V]`; the cached loop
# needs a `CachedModel`.
LogitsFunction = Callable[[mx.array], mx.array]


@dataclass(frozen=True)
class GenerationResponse:
    """One step of `stream_generate`.

    `text` is the newly released text (may be empty while a character is incomplete);
    `logprobs [V]` are the model's log-probabilities for this step, after the logits
    processors and before the sampler's filters. Rates are tokens per second; `peak_memory`
    is in GB. `finish_reason` is `"stop"` (an end-of-sequence token), `"length"`
    (`max_tokens` reached) or None while generation goes on. Of the `prompt_tokens`,
    `cached_tokens` came from a prefix cache; `prompt_tps` counts the others.
    """

    text: str
    token: int
    logprobs: mx.array
    from_draft: bool
    prompt_tokens: int
    prompt_tps: float
    time_to_first_token: float
    generation_tokens: int
    generation_tps: float
    peak_memory: float
    finish_reason: str | None = None
    cached_tokens: int = 0


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
    """
    sampler = sampler or greedy_sampler
    processors = list(logits_processors or [])
    prefill_step_size = check_int("prefill_step_size", prefill_step_size, minimum=1)
    cacheable = isinstance(model, CachedModel)
    if kv_cache and prompt_cache is None and not cacheable:
        raise ValueError("kv_cache=True needs a model with make_cache() (a CachedModel) or a prompt_cache")
    if kv_cache is None:
        kv_cache = prompt_cache is not None or (cacheable and cached_loop_implemented())
    if prompt_cache is None and kv_cache and cacheable:
        prompt_cache = model.make_cache()
    if prompt_cache is None:
        return _recompute_steps(prompt, model, max_tokens=max_tokens, sampler=sampler, processors=processors)
    return _cached_steps(prompt, model, prompt_cache, max_tokens=max_tokens, step_size=prefill_step_size,
                         sampler=sampler, processors=processors)


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


def _cached_steps(prompt, model, cache, *, max_tokens, step_size, sampler, processors):
    """Week 2: prefill once, then one token per step. The next step's graph is built and
    started (`mx.async_eval`) before the current token is handed out, so the model works
    while the caller handles the token."""
    # BEGIN SOLUTION week2-day2
    tokens = prompt
    token, logprobs = next_token(tokens, prefill(model, prompt[None], cache, step_size), sampler, processors)
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
) -> Generator[GenerationResponse, None, None]:
    """Generate text from `prompt` (a string, token ids or `mx.array [L]`), one response per
    token. Generation ends at an end-of-sequence token (not shown) or after `max_tokens`.

    Choose tokens either with `sampler` (a function of log-probabilities, e.g. from
    `make_sampler`) and `logits_processors`, or with the sampling engine: `params` (a
    `SamplingParams`, or a `Sampler` to keep its state and statistics), which sees the whole
    history (prompt and generated tokens) for its penalties. `prompt_cache`,
    `prefill_step_size` and `kv_cache` are passed to `generate_step`.

    Speculative decoding (`tiny_llm.speculative`): pass a `draft_model`, or
    `prompt_lookup=True` to draft from n-grams of the text so far, with `params` (a
    `SamplingParams`; default greedy) and `num_draft_tokens` per round. The tokens have
    exactly the distribution they would have without speculation; `from_draft` tells which
    came from the drafter. `speculative_stats` (a `SpeculativeStats`) collects the
    acceptance counts.

    `prefix_cache` (a `tiny_llm.prefix_cache.PrefixCache`, week 3 day 3): the prompt's
    start is taken from the pages of earlier generations, only the rest is prefilled, and
    the pages of this one are kept for later ones (a chat passes one cache to every turn).
    """
    max_tokens = check_int("max_tokens", max_tokens, minimum=-1)
    if max_tokens == 0:
        raise ValueError("max_tokens must be positive or -1 (no limit), got 0")
    prompt = prompt_array(prompt, tokenizer)
    cached = prompt_cache[0].offset if prompt_cache else 0  # positions the cache holds already
    max_tokens = check_context(model, cached + prompt.size, max_tokens)
    table, reused = None, 0  # with a prefix cache: the prompt's pages, and how many positions were found
    if prefix_cache is not None:
        if prompt_cache is not None or kv_cache is False or draft_model is not None or prompt_lookup:
            raise ValueError("prefix_cache makes the cache itself: it does not combine with prompt_cache, "
                             "kv_cache=False or speculative decoding")
        if not isinstance(model, Model):
            raise ValueError("prefix_cache needs a model with layers and make_cache() (tiny_llm.model.Model)")
        from .paged_cache import paged_views

        table = prefix_cache.lookup(prompt.tolist())
        reused = table.length
        prompt_cache = paged_views(prefix_cache.pool, len(model.layers), [table])
        if logits_processors:  # they see the whole history, also the part not prefilled
            head = prompt[:reused]
            logits_processors = [lambda tokens, logits, p=p: p(mx.concatenate([head, tokens]), logits)
                                 for p in logits_processors]

    if draft_model is not None or prompt_lookup:
        from .speculative import speculative_generate_step

        if draft_model is not None and prompt_lookup:
            raise ValueError("pass either draft_model or prompt_lookup=True, not both")
        if sampler is not None or logits_processors or not isinstance(params, SamplingParams | None):
            raise ValueError("speculative decoding takes params=SamplingParams(...), not sampler, "
                             "logits_processors or a Sampler")
        if prompt_cache is not None or kv_cache is False:
            raise ValueError("speculative decoding makes its own caches: prompt_cache and "
                             "kv_cache=False do not apply")
        steps = speculative_generate_step(
            prompt, model, draft_model, num_draft_tokens=num_draft_tokens, params=params,
            max_tokens=max_tokens if max_tokens > 0 else 2**62, prefill_step_size=prefill_step_size,
            stats=speculative_stats, tokenizer=tokenizer,
        )
    else:
        if params is not None:
            if sampler is not None:
                raise ValueError("pass either sampler or params, not both")
            sampler, recorder, confirmed = _engine_sampler(params, tokenizer, prompt.tolist())
            logits_processors = [*(logits_processors or []), recorder]
        steps = ((token, logprobs, False) for token, logprobs in generate_step(
            prompt[reused:], model, max_tokens=max_tokens, sampler=sampler, logits_processors=logits_processors,
            prompt_cache=prompt_cache, prefill_step_size=prefill_step_size, kv_cache=kv_cache,
        ))
        if params is not None:
            steps = confirmed(steps)

    if table is None:
        yield from _responses(steps, tokenizer, prompt, max_tokens, reused)
        return
    fed = prompt.tolist()  # the table holds the keys and values of a start of these tokens
    try:
        for response in _responses(steps, tokenizer, prompt, max_tokens, reused):
            fed.append(response.token)
            yield response
    finally:  # also when the caller stops early: the pages are kept for the next prompt
        prefix_cache.release(table, fed)


def _responses(steps, tokenizer: Tokenizer, prompt: mx.array, max_tokens: int,
               reused: int) -> Generator[GenerationResponse, None, None]:
    """`stream_generate`'s responses for the `(token, logprobs, from_draft)` of `steps`."""
    detokenizer = StreamingDetokenizer(tokenizer)
    eos = tokenizer.eos_token_ids
    mx.reset_peak_memory()
    start = time.perf_counter()
    ttft = prompt_tps = 0.0
    decode_start = start
    for n, (token, logprobs, from_draft) in enumerate(steps):
        if n == 0:
            ttft = time.perf_counter() - start
            prompt_tps = (prompt.size - reused) / ttft
            decode_start = time.perf_counter()
        finish = "stop" if token in eos else ("length" if n + 1 == max_tokens else None)
        text = detokenizer.step(token, finish)  # the end-of-sequence token itself is not shown
        elapsed = time.perf_counter() - decode_start
        yield GenerationResponse(
            text=text,
            token=token,
            logprobs=logprobs,
            from_draft=from_draft,
            prompt_tokens=prompt.size,
            prompt_tps=prompt_tps,
            time_to_first_token=ttft,
            generation_tokens=n + 1,
            # The first token belongs to the prefill: the rate counts the tokens after it.
            generation_tps=n / elapsed if n and elapsed > 0 else 0.0,
            peak_memory=mx.get_peak_memory() / 1e9,
            finish_reason=finish,
            cached_tokens=reused,
        )
        if finish:
            return


def _engine_sampler(
    params: SamplingParams | Sampler, tokenizer: Tokenizer, prompt: list[int]
) -> tuple[SamplerFunction, LogitsProcessor, Callable[[Iterable], Iterator]]:
    """Adapt the engine to generate_step: a last logits processor hands it the logits (its
    repetition penalty acts on logits, not on normalised log-probabilities), and the
    sampler keeps the history. The engine samples lazily where it can
    (`Sampler.sample_lazily`), so the next step of the model is queued before the host
    waits for this one's token, as with a sampler function; the third function wraps the
    steps and confirms each token before it is handed on."""
    engine = params if isinstance(params, Sampler) else Sampler(params, tokenizer)
    history = list(prompt)
    needs_history = engine.needs_history
    seen: list[mx.array] = []
    drawn: list[mx.array] = []  # tokens sampled, not yet in `history`
    checks: deque[Callable[[], None]] = deque()

    def record(_tokens: mx.array, logits: mx.array) -> mx.array:
        seen[:] = [logits]
        return logits

    def sample(_logprobs: mx.array) -> mx.array:
        if needs_history:  # the penalties look at every token so far
            history.extend(int(t.item()) for t in drawn)
            drawn.clear()
        token, confirm = engine.sample_lazily(seen[0], [history] if needs_history else None)
        drawn.append(token)
        checks.append(confirm)
        return token

    def confirmed(steps: Iterable) -> Iterator:
        for step in steps:
            checks.popleft()()
            yield step

    return sample, record, confirmed


def generate(
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
) -> str:
    """The whole text `stream_generate` produces with these arguments."""
    return "".join(r.text for r in stream_generate(
        model, tokenizer, prompt, max_tokens, sampler=sampler, logits_processors=logits_processors,
        params=params, prompt_cache=prompt_cache, prefill_step_size=prefill_step_size, kv_cache=kv_cache,
        draft_model=draft_model, prompt_lookup=prompt_lookup, num_draft_tokens=num_draft_tokens,
        speculative_stats=speculative_stats, prefix_cache=prefix_cache,
    ))
