"""Engine — streaming generation around `generate_step`: request checks, prefix-cache pages, speculative steps, responses.

`tiny_llm.generate.stream_generate` (the course's entry point, week 1 day 6) is a few lines
over these pieces: `open_request` checks the request and takes the prompt's pages from a
prefix cache, `choose_tokens` adapts the sampling engine to `generate_step` (or
`speculative_steps` replaces it), and `Generation.responses` turns the steps into
`GenerationResponse`s. Nothing here imports `tiny_llm.generate`: the import graph stays a DAG.

Tests: tests/test_generate.py
"""

import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx

from .model import Cache, CachedModel, Model, Progress, check_context, prompt_array
from .sampler import LogitsProcessor, Sampler, SamplerFunction, SamplingParams
from .sampler.checks import check_int
from .tokenizer import StreamingDetokenizer, Tokenizer

if TYPE_CHECKING:  # week 3 loads only when speculative decoding or the prefix cache is asked for
    from .paged_cache import BlockTable
    from .prefix_cache import PrefixCache
    from .speculative import SpeculativeStats

# One step of generation: (token, logprobs [V], from_draft).
Step = tuple[int, mx.array, bool]


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


@dataclass
class Generation:
    """One `stream_generate` call after its checks. `prompt [L]` is the whole prompt,
    `max_tokens` the limit (-1 turned into the room the context leaves, when the model has a
    context) and `cache` the cache to continue: the caller's `prompt_cache`, or with a prefix
    cache the views of `table`'s pages, of which the first `reused` positions held the
    prompt's start already.

    Use it in a `with` block: leaving it gives the pages back to the prefix cache, which
    keeps them for later prompts, also when the caller stops early; after an error the
    pages are given back without being kept (they may hold a half-written step)."""

    prompt: mx.array
    max_tokens: int
    cache: list[Cache] | None = None
    reused: int = 0
    prefix_cache: "PrefixCache | None" = None
    table: "BlockTable | None" = None
    generated: list[int] = field(default_factory=list)

    def __enter__(self) -> "Generation":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if self.table is None:
            return
        table, self.table = self.table, None
        if kind is None or issubclass(kind, GeneratorExit):
            self.prefix_cache.release(table, self.prompt.tolist() + self.generated)
        else:
            self.prefix_cache.cancel(table)

    def processors(self, logits_processors: Sequence[LogitsProcessor] | None) -> list[LogitsProcessor]:
        """`logits_processors`, shown the whole history: generation starts after the reused
        positions, and each processor still sees the prompt's start before what it is given."""
        if not self.reused or not logits_processors:
            return list(logits_processors or [])
        head = self.prompt[: self.reused]
        return [lambda tokens, logits, p=p: p(mx.concatenate([head, tokens]), logits) for p in logits_processors]

    def responses(self, steps: Iterable[Step], tokenizer: Tokenizer) -> Generator[GenerationResponse, None, None]:
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
                prompt_tps = (self.prompt.size - self.reused) / ttft
                decode_start = time.perf_counter()
            finish = "stop" if token in eos else ("length" if n + 1 == self.max_tokens else None)
            text = detokenizer.step(token, finish)  # the end-of-sequence token itself is not shown
            elapsed = time.perf_counter() - decode_start
            self.generated.append(token)
            yield GenerationResponse(
                text=text,
                token=token,
                logprobs=logprobs,
                from_draft=from_draft,
                prompt_tokens=self.prompt.size,
                prompt_tps=prompt_tps,
                time_to_first_token=ttft,
                generation_tokens=n + 1,
                # The first token belongs to the prefill: the rate counts the tokens after it.
                generation_tps=n / elapsed if n and elapsed > 0 else 0.0,
                peak_memory=mx.get_peak_memory() / 1e9,
                finish_reason=finish,
                cached_tokens=self.reused,
            )
            if finish:
                return


def open_request(
    model: CachedModel | Callable[[mx.array], mx.array],
    tokenizer: Tokenizer,
    prompt: str | Sequence[int] | mx.array,
    max_tokens: int,
    *,
    prompt_cache: list[Cache] | None,
    kv_cache: bool | None,
    prefix_cache: "PrefixCache | None",
    speculative: bool,
) -> Generation:
    """Check `stream_generate`'s prompt, `max_tokens` and cache options and, with a
    `prefix_cache`, take the cached pages of the prompt's start (open the result in a `with`
    block: leaving it gives them back)."""
    max_tokens = check_int("max_tokens", max_tokens, minimum=-1)
    if max_tokens == 0:
        raise ValueError("max_tokens must be positive or -1 (no limit), got 0")
    prompt = prompt_array(prompt, tokenizer)
    cached = prompt_cache[0].offset if prompt_cache else 0  # positions the cache holds already
    max_tokens = check_context(model, cached + prompt.size, max_tokens)
    if prefix_cache is None:
        return Generation(prompt, max_tokens, prompt_cache)
    if prompt_cache is not None or kv_cache is False or speculative:
        raise ValueError("prefix_cache makes the cache itself: it does not combine with prompt_cache, "
                         "kv_cache=False or speculative decoding")
    if not isinstance(model, Model):
        raise ValueError("prefix_cache needs a model with layers and make_cache() (tiny_llm.model.Model)")
    from .caches import make_prompt_cache

    table = prefix_cache.lookup(prompt.tolist())
    cache = make_prompt_cache(model, pool=prefix_cache.pool, tables=[table])
    return Generation(prompt, max_tokens, cache, reused=table.length, prefix_cache=prefix_cache, table=table)


@dataclass
class StepTimes:
    """Where generation's time goes (`stream_generate(..., step_times=...)`), each part
    evaluated on its own so that lazy evaluation moves no time from one part to another:
    `model` (the forward passes, up to their logits), `sampling` (from the logits to the
    token), in seconds, over `steps` forward passes. The rest of a step is the host's
    (building graphs, detokenizing, the caller's own work). Evaluating each part separately
    gives up the overlap of the next step with the host's work: use it to see the split."""

    steps: int = 0
    model: float = 0.0
    sampling: float = 0.0

    def copy(self) -> "StepTimes":
        return StepTimes(self.steps, self.model, self.sampling)


@dataclass(frozen=True)
class TokenChoice:
    """How `generate_step` chooses `stream_generate`'s tokens: its `sampler` and
    `processors`, and `confirm` (or None), called once per step before the step's token is
    handed on."""

    sampler: SamplerFunction | None
    processors: list[LogitsProcessor]
    confirm: Callable[[], None] | None = None

    def steps(self, pairs: Iterable[tuple[int, mx.array]]) -> Iterator[Step]:
        """`generate_step`'s `(token, logprobs)` as steps `(token, logprobs, False)`, each
        confirmed first."""
        for token, logprobs in pairs:
            if self.confirm is not None:
                self.confirm()
            yield token, logprobs, False


def choose_tokens(
    request: Generation,
    tokenizer: Tokenizer,
    *,
    sampler: SamplerFunction | None,
    logits_processors: Sequence[LogitsProcessor] | None,
    params: SamplingParams | Sampler | None,
    times: StepTimes | None = None,
) -> TokenChoice:
    """Tokens from `sampler` (a function of log-probabilities) after `logits_processors`,
    or from the sampling engine (`params`), which sees the whole history. `times`: where
    each step's time goes (the engine's path only)."""
    processors = request.processors(logits_processors)
    if params is None:
        return TokenChoice(sampler, processors)
    if sampler is not None:
        raise ValueError("pass either sampler or params, not both")
    sample, record, confirm = _engine_sampler(params, tokenizer, request.prompt.tolist(), times)
    return TokenChoice(sample, [*processors, record], confirm)


def _engine_sampler(
    params: SamplingParams | Sampler, tokenizer: Tokenizer, prompt: list[int], times: StepTimes | None = None
) -> tuple[SamplerFunction, LogitsProcessor, Callable[[], None]]:
    """Adapt the engine to generate_step: a last logits processor hands it the logits (its
    repetition penalty acts on logits, not on normalised log-probabilities), and the
    sampler keeps the history. The engine samples lazily where it can
    (`Sampler.sample_lazily`), so the next step of the model is queued before the host
    waits for this one's token, as with a sampler function; the third function confirms
    the oldest token not confirmed yet, before it is handed on."""
    engine = params if isinstance(params, Sampler) else Sampler(params, tokenizer)
    history = list(prompt)
    needs_history = engine.needs_history
    seen: list[mx.array] = []
    drawn: list[mx.array] = []  # tokens sampled, not yet in `history`
    checks: deque[Callable[[], None]] = deque()

    def record(_tokens: mx.array, logits: mx.array) -> mx.array:
        seen[:] = [logits]
        if times is not None:  # the forward pass alone, up to its logits
            start = time.perf_counter()
            mx.eval(logits)
            times.steps += 1
            times.model += time.perf_counter() - start
        return logits

    def sample(_logprobs: mx.array) -> mx.array:
        start = time.perf_counter()
        if needs_history:  # the penalties look at every token so far
            history.extend(int(t.item()) for t in drawn)
            drawn.clear()
        token, confirm = engine.sample_lazily(seen[0], [history] if needs_history else None)
        if times is not None:  # from the logits to the token
            mx.eval(token)
            times.sampling += time.perf_counter() - start
        drawn.append(token)
        checks.append(confirm)
        return token

    def confirm_next() -> None:
        checks.popleft()()

    return sample, record, confirm_next


def speculative_steps(
    request: Generation,
    model: CachedModel,
    tokenizer: Tokenizer,
    *,
    draft_model: CachedModel | None,
    prompt_lookup: bool,
    params: SamplingParams | Sampler | None,
    sampler: SamplerFunction | None,
    logits_processors: Sequence[LogitsProcessor] | None,
    kv_cache: bool | None,
    num_draft_tokens: int,
    prefill_step_size: int,
    stats: "SpeculativeStats | None",
    prompt_progress: Progress | None,
) -> Generator[Step, None, None]:
    """`stream_generate`'s steps by speculative decoding (`tiny_llm.speculative`): drafts
    from `draft_model`, or with `prompt_lookup=True` from n-grams of the text so far."""
    from .speculative import speculative_generate_step

    if draft_model is not None and prompt_lookup:
        raise ValueError("pass either draft_model or prompt_lookup=True, not both")
    if sampler is not None or logits_processors or not isinstance(params, SamplingParams | None):
        raise ValueError("speculative decoding takes params=SamplingParams(...), not sampler, "
                         "logits_processors or a Sampler")
    if request.cache is not None or kv_cache is False:
        raise ValueError("speculative decoding makes its own caches: prompt_cache and "
                         "kv_cache=False do not apply")
    return speculative_generate_step(
        request.prompt, model, draft_model, num_draft_tokens=num_draft_tokens, params=params,
        max_tokens=request.max_tokens if request.max_tokens > 0 else 2**62, prefill_step_size=prefill_step_size,
        stats=stats, tokenizer=tokenizer, prompt_progress=prompt_progress,
    )
