"""Course: week 2 days 4 and 5 — batched generation: many prompts at once, each row with its own `SamplingParams`.

Prompts of different lengths are left-padded to one length and prefilled together; a
`BatchKVCache` hides the padding and gives every row its own positions. Each decode step
runs one token per row through the model and one `Sampler` call for all rows.

A `RunningBatch` is the rows that decode together: each row's request, its rows of the
caches and of the sampler, and its next-token logits. Rows leave it (`filter`) and join it
(`extend`) between decode steps. `BatchGenerator` is continuous batching: the scheduler of
`tiny_llm.scheduler` (the queue, admission, pages, the prefix cache, the statistics) on a
`RunningBatch`. `batch_generate` runs a fixed list of prompts to the end.

    gen = BatchGenerator(model, tokenizer, max_batch_size=8)
    uid = gen.insert("Hello", max_tokens=32, params=SamplingParams(temperature=0.7, seed=1))
    while gen.has_work():
        for r in gen.step():
            print(r.uid, r.text, r.finish_reason)

Tests: tests/test_week2_day4.py, tests/test_week2_day5.py, tests/test_progress.py
"""

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from .caches import make_prompt_cache
from .defaults import MAX_TOKENS, PAGE_SIZE, PREFILL_STEP_SIZE
from .kv_cache import BatchKVCache
from .model import Model, prefill
from .paged_cache import PagedKVCache
from .sampler import Sampler, SamplingParams
from .scheduler import BatchRequest, BatchResult, Scheduler, batch_jobs, run_jobs
from .scheduler import BatchResponse, BatchStats, TokenLogprobs  # noqa: F401 (public here too)
from .tokenizer import Tokenizer


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


@dataclass
class RunningBatch:
    """The rows that decode together. Row b is `requests[b]` (its prompt, sampler, history,
    ...), row b of every layer's cache, row b of `sampler` and `logits[b]`, its next-token
    logits: all four list the rows in the same order."""

    requests: list[BatchRequest]
    cache: list[BatchKVCache] | list[PagedKVCache]  # one per layer
    sampler: Sampler  # one row per request
    logits: mx.array  # B, V

    @classmethod
    def prefilled(cls, model: Model, requests: list[BatchRequest], step_size: int) -> "RunningBatch":
        """`requests` prefilled as one left-padded batch in chunks of `step_size`, requests
        with equal prompts from one prefill; the logits are evaluated."""
        # BEGIN SOLUTION week2-day4
        prompts, copies = distinct([r.prompt for r in requests])
        tokens, padding = left_pad(prompts)
        cache = make_prompt_cache(model, padding=padding)
        logits = prefill(model, tokens, cache, step_size)
        if len(prompts) < len(requests):
            for c in cache:
                c.filter(copies)
            logits = logits[mx.array(copies)]
        mx.eval(logits)
        return cls(requests, cache, Sampler.concat([r.sampler for r in requests]), logits)
        # END SOLUTION

    def filter(self, keep: list[int]) -> None:
        """Keep the rows `keep` (at least one), in that order."""
        # BEGIN SOLUTION week2-day4
        for c in self.cache:
            c.filter(keep)
        self.sampler = self.sampler.select(keep)
        self.requests = [self.requests[b] for b in keep]
        self.logits = self.logits[mx.array(keep)]
        # END SOLUTION

    def advance(self, model: Model, tokens: mx.array) -> None:
        """Run each row's new token, `tokens [B]`, through `model` and start computing the
        next-token logits (the model runs while the caller handles the tokens)."""
        # BEGIN SOLUTION week2-day4
        self.logits = model(tokens[:, None], cache=self.cache)[:, -1, :]
        mx.async_eval(self.logits)
        # END SOLUTION

    def extend(self, other: "RunningBatch") -> None:
        """Append `other`'s rows (freshly prefilled) after these."""
        # BEGIN SOLUTION week2-day5
        for running, joining in zip(self.cache, other.cache):
            running.extend(joining)
        self.sampler = Sampler.concat([self.sampler, other.sampler])
        self.logits = mx.concatenate([self.logits, other.logits.astype(self.logits.dtype)])
        self.requests = self.requests + other.requests
        # END SOLUTION


class BatchGenerator(Scheduler):
    """Continuous batching over one model on a `RunningBatch`: `insert` requests, call
    `step` until `has_work()` is False (`tiny_llm.scheduler.Scheduler`, with its settings)."""

    batch_type = RunningBatch


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
    jobs = batch_jobs(prompts, max_tokens, params)
    gen = BatchGenerator(model, tokenizer, max_batch_size=len(jobs) if max_batch_size is None else max_batch_size,
                         prefill_step_size=prefill_step_size, paged=paged, page_size=page_size,
                         prefix_cache_bytes=prefix_cache_bytes)
    return run_jobs(gen, jobs)
