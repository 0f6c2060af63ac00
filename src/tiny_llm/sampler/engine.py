"""Engine — the sampler: a batch of rows, each with its own `SamplingParams`, seed and state.

    sampler = Sampler([SamplingParams(temperature=0.7, top_k=40, seed=1), SamplingParams()])
    probs = sampler.distribution(logits)        # [B, V]: what the next token is drawn from
    tokens = sampler.sample(logits, history)    # [B]

The sampler is a list of `Row`s (`rows.py`) and the dispatch over them. Rows that share a
chain (the same stage order, or the same mirostat version) run together as one group, with
per-row parameter arrays; stages that no row of a group uses are skipped. Each group takes
the cheapest path its parameters allow: greedy, a pass over every token (temperature and
min-p), the fast path's window (`fast.py`), or the whole chain (`stages.py`).
"""

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import mlx.core as mx
import numpy as np

from ..distributed import fresh_seed
from . import fast, rng, search, stages
from .checks import RowError
from .draw import argmax_and_value, draw, race, scatter_rows
from .dry import dry_penalties
from .params import STAGE_ON, SamplingParams, stage_on
from .rows import Row, make_rows

if TYPE_CHECKING:
    from ..constrain import TokenTable
    from ..tokenizer import Tokenizer

History = Sequence[Sequence[int]] | None


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
        x, hist = self._checked(logits, history, rows)
        final = self._final(x, hist, rows)
        if any(r.matcher for r in rows):
            final = self._constrain(x, hist, final, rows)
        return stages.softmax(final)

    def sample(self, logits: mx.array, history: History = None) -> mx.array:
        """One token per row, `[B]`; advances each row's counter (and mirostat state)."""
        rows = self._batch_rows(_check_shape(logits)[0])
        mx.eval(logits)  # the model's work is not sampling time
        start = time.perf_counter()
        tokens = None
        free = [b for b, r in enumerate(rows) if not r.matcher and r.kind in ("greedy", "plain")]
        if len(free) == len(rows):
            tokens = self._sample_plain(logits, history, rows)
        elif free and all(r.matcher or r.kind in ("greedy", "plain") for r in rows):
            tokens = self._sample_apart(logits, history, rows, free)
        if tokens is None:
            tokens, _ = self._sample_checked(logits, history, rows, keep_final=False)
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
        lazy = (not any(r.matcher for r in rows) and {r.kind for r in rows} <= {"greedy", "plain"}
                and not any(stage_on("top_p", r.params) for r in rows))
        drawn = self._plain_draw(logits, history, rows, clean=True) if lazy else None
        if drawn is None:
            return self.sample(logits, history), lambda: None
        start = time.perf_counter()
        tokens, probe = drawn
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
        mx.eval(logits)
        start = time.perf_counter()
        tokens, final = self._sample_checked(logits, history, rows, keep_final=True)
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
        x = _prefix(x, rows)
        for row, value in enumerate(mx.max(x, axis=-1).tolist()):
            if math.isnan(value) or value == math.inf:
                raise RowError(row, "the logits have +inf: probabilities are undefined")
            if value == -math.inf:
                raise RowError(row, "the logits have no finite value (after logit_bias and min_tokens): "
                                    "nothing can be sampled")
        hist = _histories(history, B)
        if hist is None:
            raise ValueError(f"history has {len(history)} rows but the logits have {B}")
        return x, hist

    # ---- the distribution -------------------------------------------------------------------

    def _final(self, x: mx.array, hist: list[list[int]], rows: list[Row]) -> mx.array:
        """The final logits (after every stage) of every row, group by group."""
        groups = _groups(rows)
        if len(groups) == 1:
            (key,) = groups
            return self._chain(x, hist, rows, key)
        out = x
        for key, members in groups.items():
            idx = mx.array(members)
            part = self._chain(x[idx], [hist[b] for b in members], [rows[b] for b in members], key)
            out = scatter_rows(out, idx, part)
        return out

    def _chain(self, x: mx.array, hist: list[list[int]], rows: list[Row], key: tuple) -> mx.array:
        """One group's chain: mirostat, or the stages of its order."""
        if key[0] != "mirostat":
            return _stages(x, hist, rows, key)
        G, V = x.shape
        x = stages.temperature(x, _col(rows, "temperature"), mx.zeros((G, 1)), mx.ones((G, 1)))
        mu = mx.array([r.mu for r in rows], dtype=mx.float32)[:, None]
        return stages.mirostat_v2(x, mu) if key[1] == 2 else stages.mirostat_v1(x, mu, V)

    # ---- the paths of a draw ----------------------------------------------------------------

    def _sample_plain(self, logits: mx.array, history: History, rows: list[Row]) -> mx.array | None:
        """Greedy and plain rows (temperature, min-p, top-p), without the up-front check: the
        reductions these paths need anyway reveal NaN and empty rows. None if a row turns out
        to hold NaN or nothing finite (the checked path then runs, and raises)."""
        drawn = self._plain_draw(logits, history, rows)
        if drawn is None:
            return None
        tokens, probe = drawn
        mx.eval(tokens, probe)
        if not all(map(math.isfinite, probe.tolist())):  # NaN or +-inf: a bad row
            return None
        return tokens

    def _sample_apart(self, logits: mx.array, history: History, rows: list[Row],
                      free: list[int]) -> mx.array | None:
        """A batch of grammar rows and rows of the plain path: each part by its own path, so
        that a grammar row does not send the others through the checks. None if a plain
        row turns out bad or the history does not fit (the checked path then runs, and
        raises); a grammar row's `RowError` names its row in the whole batch."""
        B = len(rows)
        hist = _histories(history, B)
        if hist is None:
            return None
        held = sorted(set(range(B)) - set(free))  # the grammar rows
        tokens_free = self._sample_plain(logits[mx.array(free)], [hist[b] for b in free], [rows[b] for b in free])
        if tokens_free is None:
            return None
        try:
            tokens_held, _ = self._sample_checked(logits[mx.array(held)], [hist[b] for b in held],
                                                  [rows[b] for b in held], keep_final=False)
        except RowError as e:
            raise RowError(held[e.row], e.reason) from None
        tokens = scatter_rows(mx.zeros((B,), dtype=mx.int32), mx.array(free), tokens_free.astype(mx.int32))
        return scatter_rows(tokens, mx.array(held), tokens_held.astype(mx.int32))

    def _plain_draw(self, logits: mx.array, history: History, rows: list[Row],
                    clean: bool = False) -> tuple[mx.array, mx.array] | None:
        """The graph of `_sample_plain`'s draw: tokens `[B]` and a probe `[B]` (NaN or +-inf:
        a bad row). `clean`: NaN logits count as excluded first, as the checked path counts
        them, so that the tokens of good rows are the checked path's. None where these
        paths do not apply."""
        x = logits if logits.dtype == mx.float32 else logits.astype(mx.float32)
        B, V = x.shape
        hist = _histories(history, B)
        if hist is None or any(r.params.logit_bias and max(r.params.logit_bias) >= V for r in rows):
            return None  # the checked path reports it
        if clean:
            x = mx.where(mx.isnan(x), -math.inf, x)
        y = _prefix(x, rows)
        if any(r.penalised for r in rows):
            y = fast.sparse_penalties(y, hist, [r.params for r in rows])
        if all(r.kind == "greedy" for r in rows):
            return argmax_and_value(y)  # probe: the logit at the argmax, NaN or -inf: bad row
        groups = _groups(rows, by_draw=True)
        if len({(key, how) for key, how, _ in groups}) > 1:
            return None
        if len(groups) > 1:  # rows with top-p and rows without: each part by its own draw
            tokens, probe = mx.zeros((B,), dtype=mx.int32), mx.zeros((B,), dtype=mx.float32)
            for members in groups.values():
                idx = mx.array(members)
                part = self._plain_draw(logits[idx], [hist[b] for b in members], [rows[b] for b in members], clean)
                if part is None:
                    return None
                t, p = part
                tokens = scatter_rows(tokens, idx, t.astype(mx.int32))
                probe = scatter_rows(probe, idx, p.astype(mx.float32))
            return tokens, probe
        ((key, how, _),) = groups
        u = _uniforms(rows, rng.DRAW)
        if not any(stage_on(s, r.params) for r in rows for s in ("min_p", "top_p")):  # temperature alone: one pass
            return _draw_by(how, y / _col(rows, "temperature"), rows, u)  # probe: the row max, NaN or -inf: bad row
        return _draw_stages(y, hist, rows, tuple(s for s in key if s != "penalties"), u)

    def _sample_checked(self, logits: mx.array, history: History, rows: list[Row],
                        keep_final: bool) -> tuple[mx.array, mx.array | None]:
        """Check the logits, then draw every group by its path, then let the grammars have
        their say, then move mirostat's estimates. Returns the tokens and, with `keep_final`,
        the final logits they were drawn from (before mirostat moves)."""
        x, hist = self._checked(logits, history, rows)
        B = x.shape[0]
        u = _uniforms(rows, rng.DRAW)
        grammar = any(r.matcher for r in rows)
        final = self._final(x, hist, rows) if keep_final else None
        if final is not None and grammar:
            final = self._constrain(x, hist, final, rows)
        updates = []
        if grammar and all(r.matcher and r.params.grammar_first for r in rows):
            # Mask first in every row: no unconstrained draw; `_grammar_draw` draws from the
            # constrained distribution with the same uniform (and checks what it draws from).
            tokens = mx.zeros((B,), dtype=mx.int32)
        else:
            tokens, tops, updates = self._draw_groups(x, hist, rows, u=u, exact=keep_final)
            mx.eval(tokens, tops)
            _check_tops(tops.tolist(), range(B))
        if grammar:
            tokens = self._grammar_draw(x, hist, rows, tokens=tokens, final=final, u=u)
        for update in updates:  # state changes only once the draw is valid
            _update_mu(update)
        return tokens, final

    def _draw_groups(self, x: mx.array, hist: list[list[int]], rows: list[Row], *, u: mx.array,
                     exact: bool) -> tuple[mx.array, mx.array, list["MirostatStep"]]:
        """Draw each group by its path. Returns the tokens `[B]`, each row's largest final
        logit `[B]` (not finite: the row cannot be sampled) and mirostat's pending updates.
        `exact`: the chain runs in full (its final logits are reported)."""
        B = x.shape[0]
        groups = _groups(rows, by_draw=True)
        tokens = mx.zeros((B,), dtype=mx.int32)
        tops = mx.zeros((B,), dtype=mx.float32)
        updates = []
        for (key, how, _), members in groups.items():
            whole = len(groups) == 1
            idx = None if whole else mx.array(members)
            xg = x if whole else x[idx]
            hg = hist if whole else [hist[b] for b in members]
            rg = rows if whole else [rows[b] for b in members]
            ug = u if whole else u[idx]
            if not exact and key[0] != "mirostat" and how != "race" and fast.eligible([r.params for r in rg], key):
                t, top = self._draw_fast(xg, hg, rg, key=key, u=ug)
            else:  # the race runs over the chain's final logits of the whole vocabulary
                fg = self._chain(xg, hg, rg, key)
                t, top = _draw_by(how, fg, rg, ug)
                if key[0] == "mirostat":
                    updates.append(MirostatStep(fg, t, rg))
            tokens = t if whole else scatter_rows(tokens, idx, t)
            tops = top if whole else scatter_rows(tops, idx, top)
        return tokens, tops, updates

    def _draw_fast(self, x: mx.array, hist: list[list[int]], rows: list[Row], *, key: tuple[str, ...],
                   u: mx.array) -> tuple[mx.array, mx.array]:
        """A group of the fast stages (penalties, top-k, top-p, min-p, temperature): greedy,
        one pass over every token, or the window, with the chain for rows the window cannot
        answer exactly. Logit bias and min_tokens are in `x` already."""
        P = [r.params for r in rows]
        y = fast.sparse_penalties(x, hist, P) if any(r.penalised for r in rows) else x
        if all(p.temperature <= 0 for p in P):  # greedy: every filter keeps the argmax
            return argmax_and_value(y)
        chain = tuple(s for s in key if s != "penalties")
        if not fast.wants_window(P):  # no filter that the window serves: passes over all tokens
            return _draw_stages(y, hist, rows, chain, u)
        t, needs_full, top = fast.fast_tokens(y, P, key, u)
        if mx.any(needs_full).item():
            slow, slow_top = _draw_stages(y, hist, rows, chain, u)
            t, top = mx.where(needs_full, slow, t), mx.where(needs_full, slow_top, top)
        return t, top

    # ---- grammars ---------------------------------------------------------------------------

    def _constrain(self, x: mx.array, hist: list[list[int]], final: mx.array, rows: list[Row]) -> mx.array:
        """The final logits of grammar rows with the tokens the grammar forbids at -inf. Where
        the chain's filters left no allowed token (greedy, say, whose argmax is forbidden),
        the chain runs again on the masked logits instead."""
        B, V = x.shape
        masks = np.ones((B, V), dtype=bool)
        kept = final > -math.inf  # outside it the mask does not matter: those tokens are out
        sizes = mx.sum(kept, axis=-1).tolist()
        for b, r in enumerate(rows):
            if not r.matcher:
                continue
            state = r.grammar_at()
            if sizes[b] <= FEW_CANDIDATES and not r.matcher.has_mask(state):
                # Few candidates (top-k, a sharp top-p): check each one's bytes instead of
                # building the mask over the whole vocabulary.
                ids = np.flatnonzero(np.array(kept[b]))
                masks[b] = False
                masks[b, ids] = [r.matcher.allows(state, int(t)) for t in ids]
                if masks[b].any():
                    continue  # otherwise the fallback below needs the whole mask
            masks[b] = r.matcher.mask(state, V)
            if not masks[b].any():
                raise RowError(b, "the grammar allows no token here (the text so far can only go on "
                                  "with characters no token of this vocabulary has)")
        allowed = mx.array(masks)
        out = mx.where(allowed, final, -math.inf)
        emptied = (mx.max(out, axis=-1) == -math.inf).tolist()
        if any(emptied):
            masked = mx.where(allowed, x, -math.inf)
            for b, value in enumerate(mx.max(masked, axis=-1).tolist()):
                if value == -math.inf:
                    raise RowError(b, "every token the grammar allows has logit -inf (after "
                                      "logit_bias and min_tokens): nothing can be sampled")
            again = self._final(masked, hist, rows)
            out = mx.where(mx.array(emptied)[:, None], again, out)
        return out

    def _grammar_draw(self, x, hist, rows: list[Row], *, tokens: mx.array, final: mx.array | None,
                      u: mx.array) -> mx.array:
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
            again = mx.where(first, u, _uniforms(rows, rng.GRAMMAR))
            found, rest = ({}, redo) if final is not None else self._window_grammar_draw(x, hist, rows, redo, again)
            for b, t in found.items():
                chosen[b] = t
            if rest:
                if final is None:
                    final = self._constrain(x, hist, self._final(x, hist, rows), rows)
                _check_tops(mx.max(final, axis=-1).tolist(), rest)
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
        """Draw the grammar rows `redo` from their constrained distributions through the fast
        path's window, where it holds every token the row's chain keeps (top-k rows): the
        grammar checks only those candidates, and no stage runs over the vocabulary. Where
        the chain keeps no allowed token, the chain runs again on the masked logits, as in
        `_constrain`, through the window too. Returns `{row: token}` and the rows left for
        the full path (the window cannot answer, or nothing finite is left: it raises)."""
        found: dict[int, int] = {}
        rest: list[int] = []
        groups: dict[tuple, list[int]] = {}
        for b in redo:
            p = rows[b].params
            if p.temperature > 0 and fast.eligible([p], p.order) and fast.wants_window([p]):
                groups.setdefault(p.order, []).append(b)
            else:
                rest.append(b)
        V = x.shape[1]
        for key, members in groups.items():
            rg = [rows[b] for b in members]
            P = [r.params for r in rg]
            y = x[mx.array(members)]
            if any(r.penalised for r in rg):
                y = fast.sparse_penalties(y, [hist[b] for b in members], P)
            ug = u[mx.array(members)]
            emptied = []  # rows whose kept tokens the grammar all forbids
            answered, others = _windows(y, P, key)
            rest += [members[g] for g in others]
            for g, ids, yw in answered:
                r = rg[g]
                state, cand = r.grammar_at(), np.flatnonzero(yw > -math.inf)
                if r.matcher.has_mask(state):
                    ok = r.matcher.mask(state, V)[ids[cand]]
                else:
                    ok = np.array([r.matcher.allows(state, int(t)) for t in ids[cand]], dtype=bool)
                if ok.any():
                    yw[cand[~ok]] = -math.inf
                    found[members[g]] = (ids, yw, ug[g])
                else:
                    emptied.append(g)
            if emptied:
                masks = mx.array(np.stack([rg[g].matcher.mask(rg[g].grammar_at(), V) for g in emptied]))
                masked = mx.where(masks, y[mx.array(emptied)], -math.inf)
                answered, others = _windows(masked, [P[g] for g in emptied], key)
                rest += [members[emptied[i]] for i in others]
                for i, ids, yw in answered:
                    found[members[emptied[i]]] = (ids, yw, ug[emptied[i]])
        if found:
            drawn = [found[b] for b in sorted(found)]
            t = fast.window_draw(mx.array(np.stack([d[0] for d in drawn])), mx.array(np.stack([d[1] for d in drawn])),
                                 mx.stack([d[2] for d in drawn]))
            found = dict(zip(sorted(found), t.tolist()))
        return found, sorted(rest)


def _windows(y: mx.array, params: list[SamplingParams], key: tuple[str, ...]) -> tuple[list, list[int]]:
    """The fast path's window of each row of `y [G, V]`: `(answered, others)`, where
    `answered` holds `(g, ids, yw)` (numpy, in vocabulary order; `yw` the final logits) for
    the rows whose final distribution lies in the window with a finite top, and `others`
    the indices of the rest (the full path answers them, or raises)."""
    ids, yw, full = fast.window(y, params, key)
    top = mx.max(yw, axis=-1)
    mx.eval(ids, yw, full, top)
    ids, yw = np.array(ids), np.array(yw)
    answered, others = [], []
    for g, (f, t) in enumerate(zip(full.tolist(), top.tolist())):
        if f or not math.isfinite(t):
            others.append(g)
        else:
            answered.append((g, ids[g], yw[g]))
    return answered, others


def _check_tops(tops: list[float], rows: Sequence[int]) -> None:
    """Raise for the first of `rows` whose largest final logit `tops[row]` is not finite."""
    for row in rows:
        if not math.isfinite(tops[row]):
            raise RowError(row, "the sampling stages left no finite logit (a temperature or "
                                "penalty this extreme overflows float32)")


FEW_CANDIDATES = 256  # a grammar row with at most this many tokens left checks each one


def token_distribution(logits: mx.array, params: SamplingParams | Sequence[SamplingParams],
                       history: History = None, tokenizer: "Tokenizer | TokenTable | None" = None) -> mx.array:
    """The distribution a fresh `Sampler(params)` would draw the next token from."""
    return Sampler(params, tokenizer).distribution(logits, history)


# ---- helpers over a list of rows ------------------------------------------------------------


def _check_shape(logits: mx.array) -> tuple[int, int]:
    if not isinstance(logits, mx.array) or logits.ndim != 2:
        shape = getattr(logits, "shape", None)
        raise ValueError(f"logits must be an mx.array [B, V], got shape {shape}")
    return logits.shape


def _histories(history: History, B: int) -> list[list[int]] | None:
    """Each row's history as a list of ints; None when the number of rows is wrong."""
    if history is None:
        return [[] for _ in range(B)]
    hist = [list(map(int, h)) for h in history]
    return hist if len(hist) == B else None


def _col(rows: list[Row], name: str, dtype: mx.Dtype = mx.float32) -> mx.array:
    """`[G, 1]`: parameter `name` of every row."""
    return fast.column([r.params for r in rows], name, dtype)


def _draw_by(how: str, final: mx.array, rows: list[Row], u: mx.array) -> tuple[mx.array, mx.array]:
    """`draw(final, u)`, or for race rows (`how`, their `SamplingParams.draw`) the race on
    the 32 random bits their uniforms `u` are made from."""
    if how != "race":
        return draw(final, u)
    return race(final, rng.bits(mx.array([r.seed for r in rows], dtype=mx.uint32),
                                mx.array([r.counter for r in rows], dtype=mx.uint32), rng.DRAW))


def _uniforms(rows: list[Row], stream: int) -> mx.array:
    """`[B]`: each row's next uniform on `stream`, from its seed and draw counter."""
    return rng.uniform(mx.array([r.seed for r in rows], dtype=mx.uint32),
                       mx.array([r.counter for r in rows], dtype=mx.uint32), stream)


def _groups(rows: list[Row], by_draw: bool = False) -> dict[tuple, list[int]]:
    """Batch rows by chain: the stage order, or the mirostat version. `by_draw`: by chain, way
    of drawing and whether top-p is on, keyed `(chain, SamplingParams.draw, top_p on)`: top-p
    draws its rows from its own selection, and a row without it must draw as it would alone,
    whatever its neighbours ask for (a seeded request gives the same tokens in any batch)."""
    groups: dict[tuple, list[int]] = {}
    for b, r in enumerate(rows):
        p = r.params
        chain = ("mirostat", p.mirostat) if p.mirostat else p.order
        groups.setdefault((chain, p.draw, stage_on("top_p", p)) if by_draw else chain, []).append(b)
    return groups


def _prefix(x: mx.array, rows: list[Row]) -> mx.array:
    """Logit bias, then min_tokens' end-of-sequence suppression: always first."""
    G, V = x.shape
    r_, c_, v_ = [], [], []
    for g, r in enumerate(rows):
        for token, value in r.params.logit_bias.items():
            r_.append(g), c_.append(token), v_.append(value)
    if r_:
        x = x.at[mx.array(r_), mx.array(c_)].add(mx.array(v_, dtype=mx.float32))
    r_, c_ = [], []
    for g, r in enumerate(rows):
        if r.counter - r.reply_start < r.params.min_tokens:
            for token in r.params.eos_token_ids:
                if token < V:
                    r_.append(g), c_.append(token)
    if r_:
        x = x.at[mx.array(r_), mx.array(c_)].add(-math.inf)
    return x


def _stages(x: mx.array, hist: list[list[int]], rows: list[Row], key: tuple[str, ...]) -> mx.array:
    """The stages of `key` in order, each with one parameter per row; a stage no row uses
    is skipped."""
    return _stages_and_nucleus(x, hist, rows, key)[0]


def _draw_stages(x: mx.array, hist: list[list[int]], rows: list[Row], key: tuple[str, ...],
                 u: mx.array) -> tuple[mx.array, mx.array]:
    """`draw(_stages(...), u)`; where top-p was the last stage to change the logits, the
    draw is made from its selection (`search.Nucleus.draw`), with the probabilities it
    computed already."""
    final, found = _stages_and_nucleus(x, hist, rows, key)
    if found is None:
        return draw(final, u)
    return found.draw(u), found.top


def _stages_and_nucleus(x: mx.array, hist: list[list[int]], rows: list[Row],
                        key: tuple[str, ...]) -> tuple[mx.array, "search.Nucleus | None"]:
    """`_stages`, and top-p's `search.Nucleus` if no stage after it changed the logits."""
    P = [r.params for r in rows]
    found = None
    # Rows that no top-k / top-p / min-p has cut yet (decided by the parameters, as the
    # fast path decides it): top-p sums their normaliser over the whole vocabulary.
    uncut = [True] * len(rows)
    for stage in key:
        on = [STAGE_ON[stage](p) for p in P]
        if not any(on):
            continue  # no row uses it
        out = _APPLY[stage](x, hist, rows, uncut)
        if isinstance(out, search.Nucleus):
            found, x = out, out.logits
        elif out is not x:  # the logits changed: top-p's selection no longer describes them
            found, x = None, out
        if stage in fast.FILTERS:
            uncut = [u and not o for u, o in zip(uncut, on)]
    return x, found


# The stages of the chain. Each maps a group's logits `x [G, V]` (with its histories, rows
# and `uncut` flags, as `_stages_and_nucleus` keeps them) to new logits, the same `x` where
# nothing changed, or top-p's `search.Nucleus`. They run when a row switches them on.

def _penalties(x: mx.array, hist: list[list[int]], rows: list[Row], uncut: list[bool]) -> mx.array:
    return fast.sparse_penalties(x, hist, [r.params for r in rows])  # touches only the tokens each row has seen


def _dry(x: mx.array, hist: list[list[int]], rows: list[Row], uncut: list[bool]) -> mx.array:
    G, V = x.shape
    r_, c_, v_ = [], [], []
    for g, r in enumerate(rows):
        p = r.params
        amounts = dry_penalties(hist[g], multiplier=p.dry_multiplier, base=p.dry_base,
                                allowed_length=p.dry_allowed_length, last_n=p.dry_penalty_last_n,
                                breakers=r.breakers)
        for token, amount in amounts.items():
            if token < V:
                r_.append(g), c_.append(token), v_.append(-amount)
    if not r_:
        return x
    return x.at[mx.array(r_), mx.array(c_)].add(mx.array(v_, dtype=mx.float32))


def _top_n_sigma(x: mx.array, hist: list[list[int]], rows: list[Row], uncut: list[bool]) -> mx.array:
    return stages.top_n_sigma(x, _col(rows, "top_n_sigma"))


def _top_k(x: mx.array, hist: list[list[int]], rows: list[Row], uncut: list[bool]) -> mx.array:
    return search.top_k(x, _col(rows, "top_k", mx.int32))


def _typical_p(x: mx.array, hist: list[list[int]], rows: list[Row], uncut: list[bool]) -> mx.array:
    return stages.typical_p(x, _col(rows, "typical_p"))


def _top_p(x: mx.array, hist: list[list[int]], rows: list[Row], uncut: list[bool]) -> "mx.array | search.Nucleus":
    found = search.nucleus(x, _col(rows, "top_p"), mx.array(uncut)[:, None])
    return x if found is None else found


def _min_p(x: mx.array, hist: list[list[int]], rows: list[Row], uncut: list[bool]) -> mx.array:
    return stages.min_p(x, _col(rows, "min_p"))


def _xtc(x: mx.array, hist: list[list[int]], rows: list[Row], uncut: list[bool]) -> mx.array:
    coin = _uniforms(rows, rng.XTC)
    prob = mx.array([r.params.xtc_probability if STAGE_ON["xtc"](r.params) else 0.0 for r in rows])
    return stages.xtc(x, _col(rows, "xtc_threshold"), (coin < prob)[:, None])


def _temperature(x: mx.array, hist: list[list[int]], rows: list[Row], uncut: list[bool]) -> mx.array:
    if any(r.params.dynatemp_range > 0 for r in rows):
        return stages.temperature(x, _col(rows, "temperature"), _col(rows, "dynatemp_range"),
                                  _col(rows, "dynatemp_exponent"))
    return stages.plain_temperature(x, _col(rows, "temperature"), any(r.params.temperature <= 0 for r in rows))


_APPLY: dict[str, Callable[[mx.array, list[list[int]], list[Row], list[bool]], "mx.array | search.Nucleus"]] = {
    "penalties": _penalties, "dry": _dry, "top_n_sigma": _top_n_sigma, "top_k": _top_k,
    "typical_p": _typical_p, "top_p": _top_p, "min_p": _min_p, "xtc": _xtc, "temperature": _temperature,
}


class MirostatStep(NamedTuple):
    """A mirostat group's draw, kept until every row's draw is known to be valid."""

    final: mx.array  # [G, V]: the logits the tokens were drawn from
    tokens: mx.array  # [G]
    rows: list[Row]


def _update_mu(step: MirostatStep) -> None:
    """Mirostat: mu -= eta * (surprise of the drawn token - tau)."""
    final, tokens, rows = step
    e = stages.exp(final - mx.max(final, axis=-1, keepdims=True))
    p = mx.take_along_axis(e, tokens[:, None], axis=-1)[:, 0] / mx.sum(e, axis=-1)
    mu = mx.array([r.mu for r in rows], dtype=mx.float32)
    tau = mx.array([r.params.mirostat_tau for r in rows])
    eta = mx.array([r.params.mirostat_eta for r in rows])
    for r, value in zip(rows, (mu - eta * (-mx.log2(p) - tau)).tolist()):
        r.mu = value


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
