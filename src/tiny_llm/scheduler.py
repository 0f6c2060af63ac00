"""Engine — the batch scheduler: requests queue, join the running batch in free rows, draw one token per row each step and leave.

`Scheduler` is continuous batching around a running batch: it checks and queues requests,
admits them into free rows (prefilled together, or on pages, each into its own pages, with
the prefix cache's share of a prompt taken from it), answers every row's token with its
text and log-probabilities, takes out a request that fails or is cancelled without
disturbing the others, gives pages back and keeps the statistics. The running batch itself
is a `BatchRows`: what the course writes in week 2 days 4 and 5 (`tiny_llm.batch.RunningBatch`),
plugged in by `tiny_llm.batch.BatchGenerator`, the public name.

`batch_jobs` and `run_jobs` are `batch_generate`'s two halves: the prompts' checks and a
fixed list of requests run to the end.

Tests: tests/test_batch.py, tests/test_week2_day4.py, tests/test_week2_day5.py
"""

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, Self

import mlx.core as mx

from .caches import make_prompt_cache
from .defaults import MAX_BATCH_SIZE, MAX_TOKENS, PAGE_SIZE, PREFILL_STEP_SIZE, PREFIX_CACHE_BYTES, TEMPERATURE
from .kv_cache import BatchKVCache
from .model import Model, check_context, heads_share, prefill, prompt_array, vocab_size
from .paged_cache import BlockTable, PagedKVCache, PagePool, check_page_size, paged_cache_implemented
from .prefix_cache import PrefixCache, check_budget, prefix_cache_implemented
from .sampler import Sampler, SamplingParams
from .sampler.checks import RowError, check_int
from .tokenizer import StreamingDetokenizer, Tokenizer


@dataclass(frozen=True)
class TokenLogprobs:
    """The drawn token's log-probability under the model (log-softmax of its logits, before
    any sampling stage), and the `top` most likely tokens as (token, log-probability), most
    likely first; `top` holds the request's `SamplingParams.logprobs` entries."""

    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class BatchResponse:
    """One generated token of one request. `text` is the newly released text;
    `finish_reason` is `"stop"` (end-of-sequence token, not shown), `"length"`
    (`max_tokens` reached), `"error"` (the request failed alone: `error` says why, `token`
    is None and `text` is whatever its detokenizer still held) or None while the request
    goes on."""

    uid: int
    token: int | None
    text: str
    generation_tokens: int
    finish_reason: str | None
    error: str | None = None
    logprobs: TokenLogprobs | None = None  # for requests inserted with logprobs=True
    cached_tokens: int = 0  # prompt tokens found in the prefix cache (not prefilled)


@dataclass
class BatchStats:
    """Totals over every request so far; rates are tokens per second, memory in GB.
    `prompt_tokens` were prefilled; `cached_tokens` more came from the prefix cache."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    prompt_time: float = 0.0
    generation_tokens: int = 0
    generation_time: float = 0.0
    peak_memory: float = 0.0

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_time if self.prompt_time else 0.0

    @property
    def generation_tps(self) -> float:
        return self.generation_tokens / self.generation_time if self.generation_time else 0.0


@dataclass(frozen=True)
class BatchResult:
    """What `batch_generate` returns, one entry per prompt, in the prompts' order."""

    texts: list[str]
    tokens: list[list[int]]  # generated tokens, without a final end-of-sequence token
    finish_reasons: list[str]
    stats: BatchStats
    errors: list[str | None] = field(default_factory=list)  # why each "error" request failed


@dataclass
class BatchRequest:
    """One request's own state, queued or in a row of the running batch."""

    uid: int
    prompt: list[int]
    max_tokens: int
    sampler: Sampler  # one row, its params; the running batch's sampler holds its row
    detokenizer: StreamingDetokenizer
    history: list[int] = field(default_factory=list)  # prompt and generated tokens
    generated: int = 0
    logprobs: bool = False  # report each token's TokenLogprobs
    table: BlockTable | None = None  # its pages, when the batch runs on a paged cache
    cached_tokens: int = 0  # prompt tokens its table took from the prefix cache

    def add(self, token: int, eos: set[int]) -> BatchResponse:
        """Take the drawn `token`: its text, and whether the request ends with it (`"stop"`
        at an end-of-sequence token of `eos`, `"length"` at `max_tokens`)."""
        self.generated += 1
        finish = "stop" if token in eos else ("length" if self.generated == self.max_tokens else None)
        self.history.append(token)
        return BatchResponse(self.uid, token, self.detokenizer.step(token, finish), self.generated, finish)


class BatchRows(Protocol):
    """What the scheduler needs of its running batch (`tiny_llm.batch.RunningBatch`): row b
    is `requests[b]`, row b of every layer's `cache`, row b of `sampler` and `logits[b]`,
    its next-token logits `[B, V]`. The class is built as `(requests, cache, sampler,
    logits)` from prefilled pages too."""

    requests: list[BatchRequest]
    cache: list[BatchKVCache] | list[PagedKVCache]
    sampler: Sampler
    logits: mx.array

    @classmethod
    def prefilled(cls, model: Model, requests: list[BatchRequest], step_size: int) -> Self:
        """`requests` prefilled together, left-padded into one `BatchKVCache` per layer."""

    def filter(self, keep: list[int]) -> None:
        """Keep rows `keep`, in that order."""

    def extend(self, other: Self) -> None:
        """Append `other`'s rows after these."""

    def advance(self, model: Model, tokens: mx.array) -> None:
        """Feed each row's `tokens [B]` and start its next logits."""


class Scheduler:
    """Continuous batching over one model: `insert` requests, call `step` until
    `has_work()` is False. At most `max_batch_size` requests decode together; the others
    wait and join as rows finish.

    `paged`: keep keys and values in pages of `page_size` positions (week 3 day 2), so a
    row holds its own length, not the longest row's. On pages, a prefix cache of up to
    `prefix_cache_bytes` (week 3 day 3; 0 turns it off) keeps the pages of earlier requests,
    and a request whose prompt starts like one of them prefills only the rest. None, the
    default of both, turns each on once its day is implemented (with `PREFIX_CACHE_BYTES`);
    a budget above 0 needs pages.

    A subclass names the class of its running batch, `batch_type` (a `BatchRows`).
    `batch` is the running batch, None while no request runs."""

    batch_type: type[BatchRows]

    def __init__(self, model: Model, tokenizer: Tokenizer, *, max_batch_size: int = MAX_BATCH_SIZE,
                 prefill_step_size: int = PREFILL_STEP_SIZE, paged: bool | None = None,
                 page_size: int = PAGE_SIZE, prefix_cache_bytes: int | None = None):
        if not hasattr(self, "batch_type"):
            raise TypeError(f"{type(self).__name__} names no batch_type: use tiny_llm.batch.BatchGenerator")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = check_int("max_batch_size", max_batch_size, minimum=1)
        self.prefill_step_size = check_int("prefill_step_size", prefill_step_size, minimum=1)
        check_page_size(page_size)
        if paged not in (None, True, False):
            raise ValueError(f"paged must be True, False or None, got {paged!r}")
        if prefix_cache_bytes is not None and check_budget(prefix_cache_bytes) and paged is False:
            raise ValueError(f"prefix_cache_bytes={prefix_cache_bytes} needs pages: pass paged=True or None, "
                             "or prefix_cache_bytes=0")
        if paged is None:
            paged = bool(prefix_cache_bytes) or paged_cache_implemented()
        if prefix_cache_bytes is None:
            prefix_cache_bytes = PREFIX_CACHE_BYTES if paged and prefix_cache_implemented() else 0
        self.pool = PagePool(page_size, heads_share=heads_share(model)) if paged else None
        self.prefix_cache = PrefixCache(self.pool, prefix_cache_bytes) if prefix_cache_bytes else None
        self.stats = BatchStats()
        self.batch: BatchRows | None = None
        self._eos = tokenizer.eos_token_ids
        self._waiting: deque[BatchRequest] = deque()
        self._next_uid = 0
        self._drawn: list[TokenLogprobs | None] = []  # the last draw's log-probabilities, per row

    def insert(self, prompt: str | Sequence[int], max_tokens: int = MAX_TOKENS,
               params: SamplingParams | None = None, *, logprobs: bool = False) -> int:
        """Queue one request and return its uid. Bad input raises `ValueError` here, before
        anything changes, so the requests already queued or running are not affected.
        `logprobs=True`: each response carries the token's `TokenLogprobs`. Requests with the
        same prompt that join the batch together share one prefill."""
        prompt = prompt_array(prompt, self.tokenizer).tolist()
        max_tokens = check_context(self.model, len(prompt), check_int("max_tokens", max_tokens, minimum=1))
        vocab = vocab_size(self.model)
        if vocab and not all(isinstance(t, int) and 0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt holds token ids outside the vocabulary [0, {vocab})")
        params = SamplingParams(temperature=TEMPERATURE) if params is None else params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams or None, got {type(params).__name__}")
        if vocab:
            params.check_vocabulary(vocab)
        sampler = Sampler([params], self.tokenizer)  # may still refuse the params
        if not isinstance(logprobs, bool):
            raise ValueError(f"logprobs must be True or False, got {logprobs!r}")
        uid, self._next_uid = self._next_uid, self._next_uid + 1
        self._waiting.append(BatchRequest(
            uid, prompt, max_tokens, sampler, StreamingDetokenizer(self.tokenizer), history=list(prompt),
            logprobs=logprobs,
        ))
        return uid

    def has_work(self) -> bool:
        return bool(self.batch is not None or self._waiting)

    @property
    def running(self) -> list[int]:
        """The uids in the running batch."""
        return [] if self.batch is None else [r.uid for r in self.batch.requests]

    @property
    def waiting(self) -> list[int]:
        """The uids queued for a free row."""
        return [r.uid for r in self._waiting]

    def step(self) -> list[BatchResponse]:
        """Admit waiting requests into free rows (prefilling them), draw one token for every
        running row, and start the model on the next step. Returns one response per row."""
        if self._waiting and len(self.running) < self.max_batch_size:
            self._admit()
        if self.batch is None:
            return []
        start = time.perf_counter()
        failed, running = [], list(self.batch.requests)
        while True:
            try:
                responses = failed + self._with_logprobs(self._decode())
                break
            except RowError as e:  # nothing has changed yet: the row leaves, the others go on
                r = self.batch.requests[e.row]
                r.detokenizer.finalize()  # what it still held is released with the error
                failed.append(BatchResponse(r.uid, None, r.detokenizer.last_segment, r.generated, "error",
                                            f"request {r.uid}: {e.reason}"))
                self._remove(e.row)
                if self.batch is None:
                    responses = failed
                    break
        self._release_finished(running)
        self.stats.generation_time += time.perf_counter() - start
        self.stats.generation_tokens += len(responses)
        self.stats.peak_memory = max(self.stats.peak_memory, mx.get_peak_memory() / 1e9)
        if self.pool is not None:
            cached = {r.uid: r.cached_tokens for r in running}
            responses = [replace(x, cached_tokens=cached.get(x.uid, 0)) for x in responses]
        return responses

    def cancel(self, uid: int) -> bool:
        """Take request `uid` out of the queue or the running batch (a client that went
        away); True if it was there. The other rows go on with unchanged tokens."""
        for r in self._waiting:
            if r.uid == uid:
                self._waiting.remove(r)
                return True
        for b, r in enumerate(self.batch.requests if self.batch is not None else []):
            if r.uid == uid:
                self._remove(b)
                self._release_finished([r])
                return True
        return False

    def _release_finished(self, rows: list[BatchRequest]) -> None:
        """Give back the pages of those of `rows` that have left the batch (the prefix cache
        keeps what its budget allows)."""
        staying = set() if self.batch is None else {id(r) for r in self.batch.requests}
        for r in rows:
            if id(r) not in staying and r.table is not None:
                if self.prefix_cache is not None:
                    self.prefix_cache.release(r.table, r.history)
                else:
                    r.table.release()
                r.table = None

    def _sample(self) -> mx.array:
        """One token per running row, `[B]`. Keeps, for `_with_logprobs`, the log-probabilities
        of the rows that asked for them."""
        batch = self.batch
        history = [r.history for r in batch.requests]
        self._drawn = []
        if not any(r.logprobs for r in batch.requests):
            return batch.sampler.sample(batch.logits, history)
        result = batch.sampler.sample_with_logprobs(batch.logits, history)
        columns = zip(batch.requests, result.raw_logprob.tolist(), result.raw_top_tokens.tolist(),
                      result.raw_top_logprobs.tolist())
        for r, logprob, tops, top_logprobs in columns:
            n = r.sampler.params[0].logprobs
            self._drawn.append(TokenLogprobs(logprob, tuple(zip(tops[:n], top_logprobs[:n]))) if r.logprobs else None)
        return result.tokens

    def _with_logprobs(self, responses: list[BatchResponse]) -> list[BatchResponse]:
        """`responses` (one per row sampled, in row order) with their rows' log-probabilities."""
        drawn, self._drawn = self._drawn, []
        if not drawn:
            return responses
        return [r if lp is None else replace(r, logprobs=lp) for r, lp in zip(responses, drawn)]

    def _remove(self, b: int) -> None:
        """Drop running row `b`: its request, cache rows, sampler row and next-token logits."""
        keep = [k for k in range(len(self.batch.requests)) if k != b]
        if keep:
            self.batch.filter(keep)
        else:
            self.batch = None

    def _admit(self) -> None:
        """Prefill as many waiting requests as there are free rows and add them to the
        running batch: as one left-padded batch, or on pages (`_admit_paged`)."""
        start = time.perf_counter()
        free = self.max_batch_size - len(self.running)
        new = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
        if self.pool is not None:
            joining = self._admit_paged(new)
        else:
            joining = self.batch_type.prefilled(self.model, new, self.prefill_step_size)
            self.stats.prompt_tokens += sum(len(p) for p in {tuple(r.prompt) for r in new})  # equal ones once
        if self.batch is None:
            self.batch = joining
        else:
            self.batch.extend(joining)
        self.stats.prompt_time += time.perf_counter() - start

    def _admit_paged(self, new: list[BatchRequest]) -> BatchRows:
        """The rows of `new`, each prefilled into its own pages: what the prefix cache holds
        of a prompt is taken from it, equal prompts share pages (the first write copies a
        shared page), and each prompt's full pages are cached at once, so a request admitted
        next to one with the same system prompt reuses it."""
        first, rows = {}, []
        for r in new:
            twin = first.get(tuple(r.prompt))
            if twin is not None:  # the same prompt: the same pages and logits
                r.table, r.cached_tokens = new[twin].table.fork(), new[twin].cached_tokens
                rows.append(rows[twin])
                continue
            first[tuple(r.prompt)] = len(rows)
            r.table = self.prefix_cache.lookup(r.prompt) if self.prefix_cache else BlockTable(self.pool)
            r.cached_tokens = r.table.length
            cache = make_prompt_cache(self.model, pool=self.pool, tables=[r.table])
            rows.append(prefill(self.model, mx.array(r.prompt[r.table.length:])[None], cache, self.prefill_step_size))
            mx.eval(rows[-1])
            if self.prefix_cache is not None:
                self.prefix_cache.insert(r.table, r.prompt, full_pages_only=True)
            self.stats.prompt_tokens += len(r.prompt) - r.cached_tokens
            self.stats.cached_tokens += r.cached_tokens
        cache = make_prompt_cache(self.model, pool=self.pool, tables=[r.table for r in new])
        return self.batch_type(new, cache, Sampler.concat([r.sampler for r in new]), mx.concatenate(rows))

    def _decode(self) -> list[BatchResponse]:
        """Sample every running row, answer each, drop the rows that finished, and start the
        model on the remaining rows' new tokens."""
        tokens = self._sample()
        responses = [r.add(token, self._eos) for r, token in zip(self.batch.requests, tokens.tolist())]
        keep = [b for b, x in enumerate(responses) if x.finish_reason is None]
        if not keep:
            self.batch = None
            return responses
        if len(keep) < len(responses):
            self.batch.filter(keep)
            tokens = tokens[mx.array(keep)]
        self.batch.advance(self.model, tokens)
        return responses


Job = tuple[str | Sequence[int], int, SamplingParams | None]  # a prompt, its max_tokens and params


def batch_jobs(prompts: Sequence[str | Sequence[int]], max_tokens: int | Sequence[int],
               params: SamplingParams | Sequence[SamplingParams] | None) -> list[Job]:
    """One `(prompt, max_tokens, params)` per prompt, from `max_tokens` and `params` given
    once for all prompts or once per prompt."""
    if not isinstance(prompts, Sequence) or isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings or token-id lists")
    n = len(prompts)
    limits = [max_tokens] * n if isinstance(max_tokens, int) else list(max_tokens)
    plist = [params] * n if params is None or isinstance(params, SamplingParams) else list(params)
    for name, values in (("max_tokens", limits), ("params", plist)):
        if len(values) != n:
            raise ValueError(f"{name} has {len(values)} entries for {n} prompts")
    return list(zip(prompts, limits, plist))


def run_jobs(gen: Scheduler, jobs: list[Job]) -> BatchResult:
    """Insert every job into `gen`, which runs nothing else (a bad one raises `ValueError` naming its prompt, before
    the model runs) and step to the end; the result lists the jobs in order."""
    index = {}  # uid -> the job's place
    for i, (prompt, limit, p) in enumerate(jobs):
        try:
            index[gen.insert(prompt, limit, p)] = i
        except ValueError as e:
            raise ValueError(f"prompt {i}: {e}") from None
    mx.reset_peak_memory()
    n = len(jobs)
    texts, tokens, reasons, errors = [""] * n, [[] for _ in range(n)], [""] * n, [None] * n
    while gen.has_work():
        for r in gen.step():
            i = index[r.uid]
            texts[i] += r.text
            if r.token is not None and r.finish_reason != "stop":
                tokens[i].append(r.token)
            if r.finish_reason:
                reasons[i], errors[i] = r.finish_reason, r.error
    return BatchResult(texts, tokens, reasons, gen.stats, errors)
