"""Course: week 2 days 4 and 5 — batched generation: many prompts at once, each row with its own `SamplingParams`.

Prompts of different lengths are left-padded to one length and prefilled together; a
`BatchKVCache` hides the padding and gives every row its own positions. Each decode step
runs one token per row through the model and one `Sampler` call for all rows.

`BatchGenerator` is continuous batching: requests are inserted at any time, join the
running batch between decode steps, and leave it when they finish. `batch_generate` runs a
fixed list of prompts to the end.

    gen = BatchGenerator(model, tokenizer, max_batch_size=8)
    uid = gen.insert("Hello", max_tokens=32, params=SamplingParams(temperature=0.7, seed=1))
    while gen.has_work():
        for r in gen.step():
            print(r.uid, r.text, r.finish_reason)
"""

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

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
    logprobs: "TokenLogprobs | None" = None  # for requests inserted with logprobs=True
    cached_tokens: int = 0  # prompt tokens found in the prefix cache (not prefilled)


@dataclass(frozen=True)
class TokenLogprobs:
    """The drawn token's log-probability under the model (log-softmax of its logits, before
    any sampling stage), and the `top` most likely tokens as (token, log-probability), most
    likely first; `top` holds the request's `SamplingParams.logprobs` entries."""

    logprob: float
    top: tuple[tuple[int, float], ...]


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
class _Request:
    uid: int
    prompt: list[int]
    max_tokens: int
    sampler: Sampler
    detokenizer: StreamingDetokenizer
    history: list[int] = field(default_factory=list)  # prompt and generated tokens
    generated: int = 0
    logprobs: bool = False  # report each token's TokenLogprobs
    table: BlockTable | None = None  # its pages, when the batch runs on a paged cache
    cached_tokens: int = 0  # prompt tokens its table took from the prefix cache


def left_pad(prompts: Sequence[Sequence[int]], pad: int = 0) -> tuple[mx.array, list[int]]:
    """Token rows of equal length, `[B, L]` with `L` the longest prompt, and how many `pad`
    tokens each row starts with."""
    # BEGIN SOLUTION week2-day4
    L = max(len(p) for p in prompts)
    padding = [L - len(p) for p in prompts]
    rows = [[pad] * n + list(p) for n, p in zip(padding, prompts)]
    return mx.array(rows, dtype=mx.int32), padding
    # END SOLUTION


def distinct(prompts: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """The different prompts, in order of first appearance, and for each prompt the index
    of its copy among them."""
    first: dict[tuple[int, ...], int] = {}
    copies = [first.setdefault(tuple(p), len(first)) for p in prompts]
    return [list(p) for p in first], copies


class BatchGenerator:
    """Continuous batching over one model: `insert` requests, call `step` until
    `has_work()` is False. At most `max_batch_size` requests decode together; the others
    wait and join as rows finish.

    `paged`: keep keys and values in pages of `page_size` positions (week 3 day 2), so a
    row holds its own length, not the longest row's. On pages, a prefix cache of up to
    `prefix_cache_bytes` (week 3 day 3; 0 turns it off) keeps the pages of earlier requests,
    and a request whose prompt starts like one of them prefills only the rest. None, the
    default of both, turns each on once its day is implemented (with `PREFIX_CACHE_BYTES`);
    a budget above 0 needs pages."""

    def __init__(self, model: Model, tokenizer: Tokenizer, *, max_batch_size: int = MAX_BATCH_SIZE,
                 prefill_step_size: int = PREFILL_STEP_SIZE, paged: bool | None = None,
                 page_size: int = PAGE_SIZE, prefix_cache_bytes: int | None = None):
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
        self._eos = tokenizer.eos_token_ids
        self._waiting: deque[_Request] = deque()
        self._rows: list[_Request] = []  # the running batch, in cache-row order
        self._cache: list[BatchKVCache] | list[PagedKVCache] | None = None
        self._sampler: Sampler | None = None
        self._logits: mx.array | None = None  # [rows, V]: each running row's next-token logits
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
        self._waiting.append(_Request(
            uid, prompt, max_tokens, sampler, StreamingDetokenizer(self.tokenizer), history=list(prompt),
            logprobs=logprobs,
        ))
        return uid

    def has_work(self) -> bool:
        return bool(self._rows or self._waiting)

    @property
    def running(self) -> list[int]:
        """The uids in the running batch."""
        return [r.uid for r in self._rows]

    @property
    def waiting(self) -> list[int]:
        """The uids queued for a free row."""
        return [r.uid for r in self._waiting]

    def step(self) -> list[BatchResponse]:
        """Admit waiting requests into free rows (prefilling them), draw one token for every
        running row, and start the model on the next step. Returns one response per row."""
        if self._waiting and len(self._rows) < self.max_batch_size:
            self._admit()
        if not self._rows:
            return []
        start = time.perf_counter()
        failed, running = [], list(self._rows)
        while True:
            try:
                responses = failed + self._with_logprobs(self._decode())
                break
            except RowError as e:  # nothing has changed yet: the row leaves, the others go on
                r = self._rows[e.row]
                r.detokenizer.finalize()  # what it still held is released with the error
                failed.append(BatchResponse(r.uid, None, r.detokenizer.last_segment, r.generated, "error",
                                            f"request {r.uid}: {e.reason}"))
                self._remove(e.row)
                if not self._rows:
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

    def _release_finished(self, rows: list[_Request]) -> None:
        """Give back the pages of those of `rows` that have left the batch (the prefix cache
        keeps what its budget allows)."""
        staying = {id(r) for r in self._rows}
        for r in rows:
            if id(r) not in staying and r.table is not None:
                if self.prefix_cache is not None:
                    self.prefix_cache.release(r.table, r.history)
                else:
                    r.table.release()
                r.table = None

    def cancel(self, uid: int) -> bool:
        """Take request `uid` out of the queue or the running batch (a client that went
        away); True if it was there. The other rows go on with unchanged tokens."""
        for r in self._waiting:
            if r.uid == uid:
                self._waiting.remove(r)
                return True
        for b, r in enumerate(self._rows):
            if r.uid == uid:
                self._remove(b)
                self._release_finished([r])
                return True
        return False

    def _sample(self) -> mx.array:
        """One token per running row, `[B]`. Keeps, for `_with_logprobs`, the log-probabilities
        of the rows that asked for them."""
        history = [r.history for r in self._rows]
        self._drawn = []
        if not any(r.logprobs for r in self._rows):
            return self._sampler.sample(self._logits, history)
        result = self._sampler.sample_with_logprobs(self._logits, history)
        columns = zip(self._rows, result.raw_logprob.tolist(), result.raw_top_tokens.tolist(),
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
        """Drop running row `b`: its cache rows, sampler row and next-token logits."""
        keep = [k for k in range(len(self._rows)) if k != b]
        if not keep:
            self._rows, self._cache, self._sampler, self._logits = [], None, None, None
            return
        for c in self._cache:
            c.filter(keep)
        self._sampler = self._sampler.select(keep)
        self._rows = [self._rows[k] for k in keep]
        self._logits = self._logits[mx.array(keep)]

    def _admit(self) -> None:
        """Prefill as many waiting requests as there are free rows, as one left-padded
        batch, and add them to the running batch."""
        if self.pool is not None:
            return self._admit_paged()
        # BEGIN SOLUTION week2-day4
        start = time.perf_counter()
        free = self.max_batch_size - len(self._rows)
        new = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
        prompts, copies = distinct([r.prompt for r in new])  # equal prompts are prefilled once
        tokens, padding = left_pad(prompts)
        cache = make_prompt_cache(self.model, padding=padding)
        logits = prefill(self.model, tokens, cache, self.prefill_step_size)
        if len(prompts) < len(new):
            for c in cache:
                c.filter(copies)
            logits = logits[mx.array(copies)]
        mx.eval(logits)
        sampler = Sampler.concat([r.sampler for r in new])
        if self._rows:
            self._join(new, cache, sampler, logits)
        else:
            self._rows, self._cache, self._sampler, self._logits = new, cache, sampler, logits
        self.stats.prompt_tokens += sum(len(p) for p in prompts)  # the tokens prefilled
        self.stats.prompt_time += time.perf_counter() - start
        # END SOLUTION

    def _admit_paged(self) -> None:
        """Prefill waiting requests into free rows, each into its own pages: what the prefix
        cache holds of a prompt is taken from it, equal prompts share pages (the first
        write copies a shared page), and each prompt's full pages are cached at once, so a
        request admitted next to one with the same system prompt reuses it."""
        start = time.perf_counter()
        free = self.max_batch_size - len(self._rows)
        new = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
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
        logits, sampler = mx.concatenate(rows), Sampler.concat([r.sampler for r in new])
        if self._rows:
            self._join(new, cache, sampler, logits)
        else:
            self._rows, self._cache, self._sampler, self._logits = new, cache, sampler, logits
        self.stats.prompt_time += time.perf_counter() - start

    def _join(self, new: list[_Request], cache: list[BatchKVCache] | list[PagedKVCache], sampler: Sampler,
              logits: mx.array) -> None:
        """Append freshly prefilled rows to the running batch."""
        # BEGIN SOLUTION week2-day5
        for running, joining in zip(self._cache, cache):
            running.extend(joining)
        self._sampler = Sampler.concat([self._sampler, sampler])
        self._logits = mx.concatenate([self._logits, logits.astype(self._logits.dtype)])
        self._rows = self._rows + new
        # END SOLUTION

    def _decode(self) -> list[BatchResponse]:
        """Sample every running row, report, drop the rows that finished, and start the
        model on the remaining rows' new tokens."""
        # BEGIN SOLUTION week2-day4
        tokens = self._sample()
        responses, keep = [], []
        for b, (r, token) in enumerate(zip(self._rows, tokens.tolist())):
            r.generated += 1
            finish = "stop" if token in self._eos else ("length" if r.generated == r.max_tokens else None)
            r.history.append(token)
            text = r.detokenizer.step(token, finish)
            responses.append(BatchResponse(r.uid, token, text, r.generated, finish))
            if finish is None:
                keep.append(b)
        if len(keep) < len(self._rows):
            if not keep:
                self._rows, self._cache, self._sampler, self._logits = [], None, None, None
                return responses
            for c in self._cache:
                c.filter(keep)
            self._sampler = self._sampler.select(keep)
            self._rows = [self._rows[b] for b in keep]
            tokens = tokens[mx.array(keep)]
        self._logits = self.model(tokens[:, None], cache=self._cache)[:, -1, :]
        mx.async_eval(self._logits)  # the model runs while the caller handles the responses
        return responses
        # END SOLUTION


def batch_generate(
    model: Model,
    tokenizer: Tokenizer,
    prompts: Sequence[str | Sequence[int]],
    max_tokens: int | Sequence[int] = MAX_TOKENS,
    *,
    params: SamplingParams | Sequence[SamplingParams] | None = None,
    prefill_step_size: int = PREFILL_STEP_SIZE,
    max_batch_size: int | None = None,
    paged: bool | None = None,
    page_size: int = PAGE_SIZE,
    prefix_cache_bytes: int | None = None,
) -> BatchResult:
    """Generate for every prompt, all in one batch (or `max_batch_size` rows at a time),
    each with its own `max_tokens` and `params` (one for all, or one per prompt; None:
    greedy). Rows finish independently. `paged`, `page_size` and `prefix_cache_bytes` are
    `BatchGenerator`'s."""
    if not isinstance(prompts, Sequence) or isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings or token-id lists")
    n = len(prompts)
    limits = [max_tokens] * n if isinstance(max_tokens, int) else list(max_tokens)
    plist = [params] * n if params is None or isinstance(params, SamplingParams) else list(params)
    for name, values in (("max_tokens", limits), ("params", plist)):
        if len(values) != n:
            raise ValueError(f"{name} has {len(values)} entries for {n} prompts")
    gen = BatchGenerator(model, tokenizer, max_batch_size=n if max_batch_size is None else max_batch_size,
                         prefill_step_size=prefill_step_size, paged=paged, page_size=page_size,
                         prefix_cache_bytes=prefix_cache_bytes)
    for i, (prompt, limit, p) in enumerate(zip(prompts, limits, plist)):
        try:
            gen.insert(prompt, limit, p)
        except ValueError as e:
            raise ValueError(f"prompt {i}: {e}") from None
    mx.reset_peak_memory()
    texts, tokens, reasons, errors = [""] * n, [[] for _ in range(n)], [""] * n, [None] * n
    while gen.has_work():
        for r in gen.step():
            texts[r.uid] += r.text
            if r.token is not None and r.finish_reason != "stop":
                tokens[r.uid].append(r.token)
            if r.finish_reason:
                reasons[r.uid], errors[r.uid] = r.finish_reason, r.error
    return BatchResult(texts, tokens, reasons, gen.stats, errors)
