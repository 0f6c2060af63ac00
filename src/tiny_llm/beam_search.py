"""Engine — beam search: follow the `num_beams` most likely partial sequences instead of one.

The rules are those of Hugging Face transformers' `_beam_search` (version 5; the older
`BeamSearchScorer` differs in details, such as testing the early stop with the step's
best candidate instead of the best running beam):

- each step ranks the continuations of every beam by cumulative log-probability and looks
  at the best `max(2, 1 + n_eos) * num_beams` of them, best first;
- a candidate ending in an end-of-sequence token is finished; it enters the pool of
  finished hypotheses only if it ranks among the first `num_beams` candidates;
- the other candidates, best first, become the next step's beams until there are
  `num_beams`;
- a hypothesis scores `logprob / length ** length_penalty`, where `logprob` sums the
  log-probabilities of its generated tokens and `length` counts them, the end-of-sequence
  token included;
- the pool keeps the `num_beams` best scores;
- once the pool is full, the search stops: with `early_stopping=True` at once; with
  `False` when the best running beam, scored at its current length, cannot beat the worst
  finished score (a heuristic: with `length_penalty > 0` a longer beam might); with
  `"never"` when it could not even at its best possible length (`max_tokens` if
  `length_penalty > 0`, else its current length), which is exact;
- after `max_tokens` steps the running beams join the pool as unfinished hypotheses.

The prompt is prefilled once; the beams share its cache. Each step gives every chosen beam
its parent's keys and values and feeds the beams' new tokens `[B, 1]`. On the paged cache
(week 3 day 2) a beam forks its parent's block table: beams share every page but the one
each writes; on a dense cache the rows are gathered (copied).

    hyps = beam_search(model, tokenizer, "The capital of France is", num_beams=4, max_tokens=8)
    print(hyps[0].text, hyps[0].score)

Tests: tests/test_progress.py, tests/test_architectures.py, tests/test_beam_search.py
"""

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import mlx.core as mx

from .caches import make_prompt_cache
from .defaults import PREFILL_STEP_SIZE
from .model import Cache, CachedModel, Model, check_context, prefill, prompt_array
from .paged_cache import BlockTable, PagedKVCache, PagePool, paged_cache_implemented, reorder
from .sampler.checks import check_int
from .tokenizer import Tokenizer


@dataclass(frozen=True)
class BeamHypothesis:
    """One result of `beam_search`.

    `tokens` are the generated tokens, without the prompt and without the end-of-sequence
    token that finished the hypothesis; `logprob` is the sum of the log-probabilities of
    the generated tokens (that end-of-sequence token's included) and
    `score = logprob / length ** length_penalty`, with `length = len(tokens) + finished`.
    `finished` is True when an end-of-sequence token ended the hypothesis, False when
    `max_tokens` did.
    """

    tokens: list[int]
    text: str
    score: float
    logprob: float
    finished: bool


class _Beam(NamedTuple):
    tokens: list[int]  # generated so far
    logprob: float  # their summed log-probabilities
    parent: int  # the row of the previous step's cache this beam continues


class _Hypothesis(NamedTuple):
    score: float
    logprob: float
    tokens: list[int]
    finished: bool


class _Pool:
    """The `size` best hypotheses so far, by score (HF's `BeamHypotheses`)."""

    def __init__(self, size: int, length_penalty: float):
        self.size = size
        self.length_penalty = length_penalty
        self.hyps: list[_Hypothesis] = []

    def score(self, logprob: float, length: int) -> float:
        return logprob / length**self.length_penalty

    @property
    def full(self) -> bool:
        return len(self.hyps) >= self.size

    @property
    def worst(self) -> float:
        return min(h.score for h in self.hyps)

    def add(self, tokens: list[int], logprob: float, length: int, finished: bool) -> None:
        """Keep the hypothesis if the pool has room or it beats the worst one (which then
        leaves)."""
        score = self.score(logprob, length)
        if self.full and score <= self.worst:
            return
        self.hyps.append(_Hypothesis(score, logprob, tokens, finished))
        if len(self.hyps) > self.size:
            self.hyps.remove(min(self.hyps, key=lambda h: h.score))

    def done(self, best_logprob: float, length: int, max_tokens: int, early_stopping: bool | str) -> bool:
        """HF's early-stop check: can no running beam enter the pool any more? `best_logprob`
        is the best running beam's, `length` its number of tokens."""
        if not self.full:
            return False
        if early_stopping is True:
            return True
        if early_stopping == "never" and self.length_penalty > 0:
            length = max_tokens
        return self.worst >= self.score(best_logprob, length)

    def best(self, n: int, tokenizer: Tokenizer) -> list[BeamHypothesis]:
        ranked = sorted(self.hyps, key=lambda h: h.score, reverse=True)[:n]
        return [BeamHypothesis(h.tokens, tokenizer.decode(h.tokens), h.score, h.logprob, h.finished)
                for h in ranked]


def beam_search(
    model: CachedModel,
    tokenizer: Tokenizer,
    prompt: str | Sequence[int] | mx.array,
    num_beams: int,
    max_tokens: int,
    *,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    num_return_sequences: int = 1,
    prefill_step_size: int = PREFILL_STEP_SIZE,
    paged: bool | None = None,
) -> list[BeamHypothesis]:
    """The `num_return_sequences` best hypotheses for `prompt` (a string, token ids or
    `mx.array [L]`), best first, by the rules in the module docstring. Fewer come back
    only when the vocabulary is too small to give that many different sequences.

    `model` needs `make_cache()`; `tokenizer.eos_token_ids` end hypotheses.
    `length_penalty > 0` favours longer hypotheses, `< 0` shorter ones; `early_stopping` is
    True, False or "never". With `num_beams=1` the result is the greedy continuation.
    `paged`: keep the beams' keys and values in shared pages (the model must be a
    `tiny_llm.model.Model`); None (the default) pages once week 3 day 2 is implemented.
    """
    _check(num_beams=num_beams, max_tokens=max_tokens, length_penalty=length_penalty,
           early_stopping=early_stopping, num_return_sequences=num_return_sequences,
           prefill_step_size=prefill_step_size)
    prompt = prompt_array(prompt, tokenizer)
    check_context(model, prompt.size, max_tokens)
    eos = tokenizer.eos_token_ids
    width = max(2, 1 + len(eos)) * num_beams
    pool = _Pool(num_beams, length_penalty)
    if paged not in (None, True, False):
        raise ValueError(f"paged must be True, False or None, got {paged!r}")
    if paged is None:
        paged = isinstance(model, Model) and paged_cache_implemented()
    if paged and not isinstance(model, Model):
        raise ValueError("paged=True needs a model with layers (tiny_llm.model.Model)")
    if paged:
        pages = PagePool()
        cache = make_prompt_cache(model, pool=pages, tables=[BlockTable(pages)])
    else:
        cache = model.make_cache()
    logits = prefill(model, prompt[None], cache, prefill_step_size)  # 1, V
    beams = [_Beam([], 0.0, 0)]
    for length in range(1, max_tokens + 1):
        beams = _advance(_candidates(logits, beams, width), beams, num_beams, eos, pool)
        if length == max_tokens or not beams or pool.done(beams[0].logprob, length, max_tokens, early_stopping):
            break
        _reorder(cache, [b.parent for b in beams])
        logits = model(mx.array([[b.tokens[-1]] for b in beams]), cache=cache)[:, -1, :]  # B, V
    if length == max_tokens:
        for beam in beams:
            pool.add(beam.tokens, beam.logprob, length, finished=False)
    return pool.best(num_return_sequences, tokenizer)


def _candidates(logits: mx.array, beams: list[_Beam], width: int) -> list[tuple[float, int, int]]:
    """The `width` best continuations over every beam and token, best first, as
    `(cumulative log-probability, beam, token)`. `logits [B, V]`, one row per beam."""
    logits = logits.astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # B, V
    totals = (logprobs + mx.array([b.logprob for b in beams])[:, None]).reshape(-1)  # B * V
    width = min(width, totals.size)
    top = mx.argpartition(-totals, kth=width - 1)[:width]
    top = top[mx.argsort(-totals[top])]  # width: flat indices, best first
    V = logits.shape[-1]
    return [(score, i // V, i % V) for score, i in zip(totals[top].tolist(), top.tolist())]


def _advance(candidates: list[tuple[float, int, int]], beams: list[_Beam], num_beams: int,
             eos: frozenset[int], pool: _Pool) -> list[_Beam]:
    """HF's `BeamSearchScorer.process`: walk the candidates best first; one that ends in an
    end-of-sequence token joins the pool if it ranks among the first `num_beams`, the
    others become the next beams until there are `num_beams` of them."""
    running = []
    for rank, (logprob, parent, token) in enumerate(candidates):
        tokens = beams[parent].tokens
        if token in eos:
            if rank < num_beams:
                pool.add(tokens, logprob, len(tokens) + 1, finished=True)
        else:
            running.append(_Beam(tokens + [token], logprob, parent))
            if len(running) == num_beams:
                break
    return running


def _reorder(cache: list[Cache], parents: list[int]) -> None:
    """Give row `i` of every layer's cache the keys and values of row `parents[i]`. After
    the prefill there is one row and every parent is 0: the beams start from the prompt's
    cache. On pages the tables are forked; a dense cache gathers along axis 0 of
    `[B, H, S, D]` (`offset` is the same for all rows and stays)."""
    if isinstance(cache[0], PagedKVCache):
        reorder(cache, parents)
        return
    index = mx.array(parents)
    for c in cache:
        c.keys, c.values = c.keys[index], c.values[index]


def _check(*, num_beams, max_tokens, length_penalty, early_stopping, num_return_sequences,
           prefill_step_size) -> None:
    """Refuse bad arguments with a `ValueError` naming them."""
    num_beams = check_int("num_beams", num_beams, minimum=1)
    n = check_int("num_return_sequences", num_return_sequences, minimum=1)
    if n > num_beams:
        raise ValueError(f"num_return_sequences must be at most num_beams={num_beams}, got {n}")
    check_int("max_tokens", max_tokens, minimum=1)
    check_int("prefill_step_size", prefill_step_size, minimum=1)
    if (isinstance(length_penalty, bool) or not isinstance(length_penalty, numbers.Real)
            or not math.isfinite(length_penalty)):
        raise ValueError(f"length_penalty must be a finite number, got {length_penalty!r}")
    if not (isinstance(early_stopping, bool) or (isinstance(early_stopping, str) and early_stopping == "never")):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
