"""Engine — the sampler: a batch of rows, each with its own `SamplingParams`, seed and state.

    sampler = Sampler([SamplingParams(temperature=0.7, top_k=40, seed=1), SamplingParams()])
    probs = sampler.distribution(logits)        # [B, V]: what the next token is drawn from
    tokens = sampler.sample(logits, history)    # [B]

The sampler is a list of `Row`s (`rows.py`) and its `Plan` (`plans.py`), made when the rows
are set up: rows that share a chain (the same stage order, or the same mirostat version)
run together as one group, with per-row parameter arrays (`chain.py`), and each group takes
the cheapest path its parameters allow: greedy, a pass over every token (temperature,
min-p, top-p), the fast path's window (`fast.py`), or the whole chain. Grammar rows draw
again where their grammar forbids the token (`grammar_rows.py`).

Tests: tests/test_sampler_engine.py, tests/test_constrain_sampling.py, tests/test_sampler_fast.py
"""

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import mlx.core as mx

from ..distributed import fresh_seed
from . import chain, grammar_rows, rng, stages
from .chain import History
from .checks import RowError
from .draw import draw, scatter_rows
from .params import SamplingParams, stage_on
from .plans import Apart, Checked, NeedsCheckedPath, Plan, Unchecked, make_plan
from .rows import Row, make_rows

if TYPE_CHECKING:
    from ..constrain import TokenTable
    from ..tokenizer import Tokenizer


@dataclass(frozen=True)
class SampleResult:
    """What `Sampler.sample_with_logprobs` returns. "Final" is the distribution the token was
    drawn from (after every stage); "raw" is log-softmax of the logits as given.

    tokens, logprob, raw_logprob, rank, raw_rank: `[B]`; top_tokens, top_logprobs,
    raw_top_tokens, raw_top_logprobs: `[B, n]` with n the largest `logprobs` of the rows
    (most likely first). Ranks count from 0 (the most likely token).
    """

    tokens: mx.array
    logprob: mx.array
    raw_logprob: mx.array
    rank: mx.array
    raw_rank: mx.array
    top_tokens: mx.array
    top_logprobs: mx.array
    raw_top_tokens: mx.array
    raw_top_logprobs: mx.array


@dataclass
class SamplerStats:
    draws: int = 0  # tokens drawn (rows times calls)
    seconds: float = 0.0  # wall time spent in sample / sample_with_logprobs (sample_lazily: building the draw)


class Sampler:
    """Samples one token per row. `params`: one `SamplingParams` for every row, or a list
    with one per row. `tokenizer` turns string `dry_sequence_breakers` into token ids, and
    gives a `grammar` its vocabulary (a `tiny_llm.constrain.TokenTable` also does).

    With one `SamplingParams`, the sampler serves a batch of any size: its first draw fixes
    the size (until `reset()`), and each batch row gets its own seed (the given one, or
    fresh ones)."""

    def __init__(self, params: SamplingParams | Sequence[SamplingParams],
                 tokenizer: "Tokenizer | TokenTable | None" = None):
        if isinstance(params, SamplingParams):
            rows = make_rows([params], tokenizer)
            self._setup(rows, template=rows[0])
        else:
            plist = list(params)
            if not plist or not all(isinstance(p, SamplingParams) for p in plist):
                raise ValueError("params must be a SamplingParams or a non-empty list of them")
            self._setup(make_rows(plist, tokenizer))

    def _setup(self, rows: list[Row], template: Row | None = None) -> None:
        self._rows = rows  # one per batch row; with a template, the rows of the fixed batch
        self._template = template  # one SamplingParams for every row: rows are made from it
        self._seeds = [template.seed] if template else []  # the template's seed per batch row
        self._batch: int | None = None  # with a template: the batch size its first draw fixed
        # The plan depends on the rows' parameters alone: `reset` and `new_reply` move the
        # rows on, not the plan. With a template, `_plan_of` makes it for the batch's size.
        self._plan = make_plan(rows)
        self.stats = SamplerStats()

    @classmethod
    def _of(cls, rows: list[Row]) -> "Sampler":
        sampler = cls.__new__(cls)
        sampler._setup(rows)
        return sampler

    @property
    def params(self) -> list[SamplingParams]:
        """Each row's parameters (one entry when one `SamplingParams` serves every row)."""
        return [self._template.params] if self._template else [r.params for r in self._rows]

    @property
    def needs_history(self) -> bool:
        """Whether a row looks at the tokens so far (penalties, DRY): without, `history`
        can be left out."""
        return any(r.penalised or stage_on("dry", r.params) for r in self._rows)

    def reset(self) -> None:
        """Forget the tokens drawn so far (counters), mirostat's running estimate and where
        each row's grammar has got to."""
        if self._template:
            self._rows, self._batch = [self._template], None
        for r in self._rows:
            r.restart()

    def reset_grammar(self) -> None:
        """Start every row's grammar again from the beginning (for a new reply)."""
        for r in self._rows:
            r.grammar_state = None

    def new_reply(self) -> None:
        """The next draws begin a new reply (a chat's next turn): every row's grammar starts
        again and `min_tokens` counts from here, while the random streams go on."""
        self.reset_grammar()
        for r in self._rows:
            r.reply_start = r.counter

    # ---- public API -----------------------------------------------------------------------

    def distribution(self, logits: mx.array, history: History = None) -> mx.array:
        """`[B, V]` float32 probabilities the next token would be drawn from (rows sum to 1;
        excluded tokens exactly 0). Changes no state."""
        rows = self._batch_rows(_check_shape(logits)[0])
        plan = self._plan_of(rows).checked
        x, hist = self._checked(logits, history, rows)
        final = chain.final(x, hist, rows, plan.chains)
        if plan.grammar:
            final = grammar_rows.constrain(x, hist, final, rows, plan.chains)
        return stages.softmax(final)

    def sample(self, logits: mx.array, history: History = None) -> mx.array:
        """One token per row, `[B]`; advances each row's counter (and mirostat state)."""
        rows = self._batch_rows(_check_shape(logits)[0])
        plan = self._plan_of(rows)
        mx.eval(logits)  # the model's work is not sampling time
        start = time.perf_counter()
        try:
            tokens = self._sample_by(plan.first, logits, history, rows)
        except NeedsCheckedPath:
            tokens, _ = self._sample_checked(plan.checked, logits, history, rows, keep_final=False)
        self._finish(tokens, rows, start)
        return tokens

    def sample_lazily(self, logits: mx.array, history: History = None) -> tuple[mx.array, Callable[[], None]]:
        """`sample` without waiting for the logits, where the rows allow it (greedy, and
        temperature and min-p without a grammar): returns the tokens `[B]` before they are
        computed, so that a caller can queue the next step of its model first, and a
        `confirm()` to call once they are, which raises what `sample` would have raised
        for a row that cannot be sampled (its token must not be used then; the draw is
        undone). Other rows (top-p's and top-k's selections, grammars, mirostat) need the
        logits on the host: they are sampled at once, and `confirm` has nothing to check."""
        rows = self._batch_rows(_check_shape(logits)[0])
        plan = self._plan_of(rows)
        if not plan.lazy:
            return self.sample(logits, history), lambda: None
        try:
            tokens, probe = plan.first.draw(logits, history, rows, clean=True)
        except NeedsCheckedPath:
            return self.sample(logits, history), lambda: None
        start = time.perf_counter()
        mx.async_eval(tokens, probe)
        before = (self._rows, self._batch, self.stats.draws, self.stats.seconds)
        self._finish(tokens, rows, start)

        def confirm() -> None:
            values = probe.tolist()
            if all(map(math.isfinite, values)):
                return
            # A bad row: undo the draw, as `sample` raises before any state changes.
            for r in rows:
                r.counter -= 1
            self._rows, self._batch, self.stats.draws, self.stats.seconds = before
            self._checked(logits, history, rows)  # raises for bad logits
            raise RowError(next(b for b, v in enumerate(values) if not math.isfinite(v)),
                           "the sampling stages left no finite logit (a temperature or penalty "
                           "this extreme overflows float32)")

        return tokens, confirm

    def sample_with_logprobs(self, logits: mx.array, history: History = None) -> SampleResult:
        """Like `sample`, with the chosen tokens' log-probabilities, ranks and the top
        `logprobs` candidates, both in the final and in the raw distribution."""
        rows = self._batch_rows(_check_shape(logits)[0])
        plan = self._plan_of(rows)
        mx.eval(logits)
        start = time.perf_counter()
        tokens, final = self._sample_checked(plan.checked, logits, history, rows, keep_final=True)
        result = _logprobs(logits, final, tokens, max(r.params.logprobs for r in rows))
        self._finish(tokens, rows, start)
        return result

    __call__ = sample

    def select(self, rows: Sequence[int]) -> "Sampler":
        """A sampler for `rows` of this one, in that order, that goes on where they are:
        same parameters, seeds, counters and mirostat state (for rows that leave a batch)."""
        if self._template:
            raise ValueError("select and concat need a Sampler built from a list of SamplingParams")
        rows = list(rows)
        bad = [r for r in rows if not 0 <= r < len(self._rows)]
        if not rows or bad:
            raise ValueError(f"rows must be a non-empty list of indices below {len(self._rows)}, got {rows}")
        return Sampler._of([self._rows[r].fork() for r in rows])

    @staticmethod
    def concat(samplers: Sequence["Sampler"]) -> "Sampler":
        """One sampler whose rows are the rows of `samplers`, one after another, each going
        on where it was (for rows that join a batch)."""
        samplers = list(samplers)
        if not samplers:
            raise ValueError("concat needs at least one Sampler")
        if any(s._template for s in samplers):
            raise ValueError("select and concat need a Sampler built from a list of SamplingParams")
        return Sampler._of([r.fork() for s in samplers for r in s._rows])

    # ---- rows -----------------------------------------------------------------------------

    def _batch_rows(self, B: int) -> list[Row]:
        """The `Row` of each of the `B` batch rows. With a template, before the first draw
        these are new rows (kept by `_finish` once a draw succeeds)."""
        if not self._template:
            if B != len(self._rows):
                raise ValueError(f"logits have {B} rows but the sampler has {len(self._rows)} SamplingParams")
            return self._rows
        if self._batch is None:
            return [self._template.fork(seed=self._seed(b)) for b in range(B)]
        if B != self._batch:
            raise ValueError(f"this sampler has been drawing for {self._batch} rows, now given {B}: call reset() first")
        return self._rows

    def _seed(self, b: int) -> int:
        """Batch row `b`'s seed with a template: the given seed for every row, or fresh ones
        (unseeded rows are independent of each other), kept across `reset()`."""
        seed = self._template.params.seed
        while len(self._seeds) <= b:
            self._seeds.append(seed if seed is not None else fresh_seed())
        return self._seeds[b]

    def _finish(self, tokens: mx.array, rows: list[Row], start: float) -> None:
        """A draw succeeded: every row moves one step on its stream."""
        for r in rows:
            r.counter += 1
        if self._template and self._batch is None:
            self._rows, self._batch = rows, len(rows)
        self.stats.draws += len(rows)
        self.stats.seconds += time.perf_counter() - start
    def _plan_of(self, rows: list[Row]) -> Plan:
        """The plan for the batch rows `rows`: the one made with the rows; with a template,
        one per batch size (every row has the template's parameters)."""
        if self._plan.size != len(rows):
            self._plan = make_plan(rows)
        return self._plan

    # ---- checks -----------------------------------------------------------------------------

    def _checked(self, logits: mx.array, history: History, rows: list[Row]) -> tuple[mx.array, list[list[int]]]:
        """float32 logits after logit bias and min_tokens, with NaN excluded; a row that cannot
        be sampled raises `RowError`. Also each row's history as a list."""
        B, V = logits.shape
        for p in {id(r.params): r.params for r in rows}.values():
            if p.logit_bias and max(p.logit_bias) >= V:
                raise ValueError(f"logit_bias names token {max(p.logit_bias)}, but the vocabulary has {V} tokens")
        x = logits.astype(mx.float32)
        # One reduction answers every question: a row's max is NaN if it holds a NaN, +inf
        # if it holds +inf, and -inf if nothing can be sampled.
        top = mx.max(x, axis=-1)
        if mx.any(mx.isnan(top)).item():
            x = mx.where(mx.isnan(x), -math.inf, x)  # NaN counts as excluded
        # Logit bias and min_tokens come first in every chain; they may remove the last
        # candidate, so the check looks at what they leave.
        x = chain.prefix(x, rows)
        for row, value in enumerate(mx.max(x, axis=-1).tolist()):
            if math.isnan(value) or value == math.inf:
                raise RowError(row, "the logits have +inf: probabilities are undefined")
            if value == -math.inf:
                raise RowError(row, "the logits have no finite value (after logit_bias and min_tokens): "
                                    "nothing can be sampled")
        hist = chain.histories(history, B)
        if hist is None:
            raise ValueError(f"history has {len(history)} rows but the logits have {B}")
        return x, hist

    # ---- the routes of a draw ---------------------------------------------------------------

    def _sample_by(self, route: Unchecked | Apart | Checked, logits: mx.array, history: History,
                   rows: list[Row]) -> mx.array:
        """The tokens by `route`; an unchecked route raises `NeedsCheckedPath` where it gives up."""
        if isinstance(route, Unchecked):
            return route.sample(logits, history, rows)
        if isinstance(route, Apart):
            return self._sample_apart(route, logits, history, rows)
        return self._sample_checked(route, logits, history, rows, keep_final=False)[0]

    def _sample_apart(self, route: Apart, logits: mx.array, history: History, rows: list[Row]) -> mx.array:
        """A batch of grammar rows and rows of the unchecked route: each part by its own
        route, so that a grammar row does not send the others through the checks. Raises
        `NeedsCheckedPath` if a row of the unchecked part turns out bad or the history does
        not fit; a grammar row's `RowError` names its row in the whole batch."""
        B = len(rows)
        hist = chain.histories(history, B)
        if hist is None:
            raise NeedsCheckedPath
        free, held = list(route.free), list(route.held)
        tokens_free = route.unchecked.sample(logits[mx.array(free)], [hist[b] for b in free], [rows[b] for b in free])
        try:
            tokens_held, _ = self._sample_checked(route.checked, logits[mx.array(held)], [hist[b] for b in held],
                                                  [rows[b] for b in held], keep_final=False)
        except RowError as e:
            raise RowError(held[e.row], e.reason) from None
        tokens = scatter_rows(mx.zeros((B,), dtype=mx.int32), mx.array(free), tokens_free.astype(mx.int32))
        return scatter_rows(tokens, mx.array(held), tokens_held.astype(mx.int32))

    def _sample_checked(self, plan: Checked, logits: mx.array, history: History, rows: list[Row],
                        keep_final: bool) -> tuple[mx.array, mx.array | None]:
        """Check the logits, then draw every group by its path, then let the grammars have
        their say, then move mirostat's estimates. Returns the tokens and, with `keep_final`,
        the final logits they were drawn from (before mirostat moves)."""
        x, hist = self._checked(logits, history, rows)
        B = x.shape[0]
        u = chain.uniforms(rows, rng.DRAW)
        final = chain.final(x, hist, rows, plan.chains) if keep_final else None
        if final is not None and plan.grammar:
            final = grammar_rows.constrain(x, hist, final, rows, plan.chains)
        updates = []
        if plan.mask_first:
            # Mask first in every row: no unconstrained draw; `_grammar_draw` draws from the
            # constrained distribution with the same uniform (and checks what it draws from).
            tokens = mx.zeros((B,), dtype=mx.int32)
        else:
            tokens, tops, updates = plan.draw(x, hist, rows, u, exact=keep_final)
            mx.eval(tokens, tops)
            chain.check_tops(tops.tolist(), range(B))
        if plan.grammar:
            tokens = self._grammar_draw(plan, x, hist, rows, tokens=tokens, final=final, u=u)
        for update in updates:  # state changes only once the draw is valid
            chain.update_mu(update)
        return tokens, final

    # ---- grammars ---------------------------------------------------------------------------

    def _grammar_draw(self, plan: Checked, x: mx.array, hist: list[list[int]], rows: list[Row], *,
                      tokens: mx.array, final: mx.array | None, u: mx.array) -> mx.array:
        """Keep each grammar row's token if the grammar allows it (and the row does not ask
        for grammar_first); otherwise draw again from the constrained distribution, with an
        independent uniform. Either way the token follows the final distribution
        renormalised over the allowed tokens: the first draw lands on an allowed token t
        with probability p(t), and is redrawn with probability 1 - p(allowed)."""
        chosen = tokens.tolist()
        redo = [b for b, r in enumerate(rows) if r.matcher and (
            r.params.grammar_first or not r.matcher.allows(r.grammar_at(), chosen[b]))]
        if redo:
            first = mx.array([r.params.grammar_first for r in rows])
            again = mx.where(first, u, chain.uniforms(rows, rng.GRAMMAR))
            windowed = [b for b in redo if b in plan.window_redraw] if final is None else []
            found, rest = {}, redo
            if windowed:
                found, rest = self._window_grammar_draw(x, hist, rows, windowed, again)
                rest = sorted(rest + [b for b in redo if b not in plan.window_redraw])
            for b, t in found.items():
                chosen[b] = t
            if rest:
                if final is None:
                    final = grammar_rows.constrain(x, hist, chain.final(x, hist, rows, plan.chains), rows, plan.chains)
                chain.check_tops(mx.max(final, axis=-1).tolist(), rest)
                idx = mx.array(rest)
                # `draw` only picks tokens of positive mass, and `final` holds the forbidden
                # ones at -inf (mass 0): the redrawn token is allowed, for any summation order.
                t, _ = draw(final[idx], again[idx])
                for b, value in zip(rest, t.tolist()):
                    chosen[b] = value
            tokens = mx.array(chosen, dtype=mx.int32)
        for b, r in enumerate(rows):
            if r.matcher:
                r.grammar_state = r.matcher.advance(r.grammar_at(), chosen[b])
        return tokens

    def _window_grammar_draw(self, x: mx.array, hist: list[list[int]], rows: list[Row], redo: list[int],
                             u: mx.array) -> tuple[dict[int, int], list[int]]:
        """`grammar_rows.window_redraw`: `{row: token}` drawn through the window for the
        grammar rows `redo`, and the rows left for the full path."""
        return grammar_rows.window_redraw(x, hist, rows, redo, u)


def token_distribution(logits: mx.array, params: SamplingParams | Sequence[SamplingParams],
                       history: History = None, tokenizer: "Tokenizer | TokenTable | None" = None) -> mx.array:
    """The distribution a fresh `Sampler(params)` would draw the next token from."""
    return Sampler(params, tokenizer).distribution(logits, history)


def _check_shape(logits: mx.array) -> tuple[int, int]:
    if not isinstance(logits, mx.array) or logits.ndim != 2:
        shape = getattr(logits, "shape", None)
        raise ValueError(f"logits must be an mx.array [B, V], got shape {shape}")
    return logits.shape


def _logprobs(logits: mx.array, final: mx.array, tokens: mx.array, n: int) -> SampleResult:
    """The chosen tokens' log-probabilities and ranks, and the top `n`, in the final and in
    the raw distribution."""
    raw = logits.astype(mx.float32)
    raw = mx.where(mx.isnan(raw), -math.inf, raw)
    raw = raw - mx.logsumexp(raw, axis=-1, keepdims=True)
    fin = final - mx.logsumexp(final, axis=-1, keepdims=True)

    def describe(lp):
        chosen = mx.take_along_axis(lp, tokens[:, None], axis=-1)  # B, 1
        rank = mx.sum(lp > chosen, axis=-1)
        # The n most likely by a selection, then only they are sorted.
        B, V = lp.shape
        if n == 0:
            order = mx.zeros((B, 0), dtype=mx.uint32)
        else:
            order = mx.argpartition(-lp, n - 1, axis=-1)[:, :n] if n < V else mx.argsort(-lp, axis=-1)
            order = mx.take_along_axis(order, mx.argsort(-mx.take_along_axis(lp, order, axis=-1), axis=-1), axis=-1)
        return chosen[:, 0], rank, order, mx.take_along_axis(lp, order, axis=-1)

    lp, rank, top, top_lp = describe(fin)
    rlp, rrank, rtop, rtop_lp = describe(raw)
    return SampleResult(tokens, lp, rlp, rank, rrank, top, top_lp, rtop, rtop_lp)
