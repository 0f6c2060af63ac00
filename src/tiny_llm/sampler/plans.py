"""Engine — the plans of a draw: which rows draw together and by which path, chosen once from their parameters.

A `Sampler` makes its `Plan` when its rows are set up (`make_plan`); a draw only runs it.
Rows draw together when they share a chain (stage order or mirostat version), a way of
drawing and whether top-p is on (top-p draws from its own selection, and a row without it
must draw as it would alone). Each such `Group` takes the cheapest path its parameters
allow:

- greedy: the argmax;
- divide: temperature alone, one division and one draw over every token;
- stages: the stages that are on, as passes over every token (top-k and top-p by
  selection, `search.py`);
- window: the fast path's window of the most likely tokens (`fast.py`), with the stages for
  the rows it cannot answer exactly;
- chain: the whole chain (`chain.py`) and a draw over the whole vocabulary (mirostat, the
  race with filters, stages the window does not know, and `sample_with_logprobs`).

Every path gives the tokens the chain gives. A batch takes one of three routes:

- `Unchecked`: no grammar, every row greedy or plain (`Row.kind`). The logits are not
  checked up front: the reductions these paths make anyway reveal a bad row, and the
  draw then raises `NeedsCheckedPath`.
- `Apart`: such rows beside grammar rows: the unchecked route for them, the checked one for
  the grammar rows, so that a grammar row does not send the others through the checks.
- `Checked`: the logits checked first, then each group by its path, then the grammars.

`NeedsCheckedPath` is always caught by the `Sampler`, which runs the checked route for the
whole batch: that route raises the error that names the row.

Tests: tests/test_sampler_engine.py, tests/test_sampler_fast.py
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from . import chain, fast, rng
from .chain import History, MirostatStep
from .draw import DRAWS, argmax_and_value, scatter_rows
from .params import stage_on
from .rows import Row

GREEDY, DIVIDE, STAGES, WINDOW, CHAIN = "greedy", "divide", "stages", "window", "chain"
PATHS = (GREEDY, DIVIDE, STAGES, WINDOW, CHAIN)
FREE_KINDS = ("greedy", "plain")  # `Row.kind`s whose rows may skip the up-front check


class NeedsCheckedPath(Exception):
    """An unchecked route met what only the checked route reports: a row with NaN, +inf or
    nothing finite, a history of the wrong length, a logit_bias token past the vocabulary."""


@dataclass(frozen=True)
class Group:
    """Rows that draw together: `members` (indices into the rows the plan was made for),
    their chain `key` (the stage order, or `("mirostat", version)`), `how` they draw
    (`SamplingParams.draw`) and their `path` (one of `PATHS`)."""

    members: tuple[int, ...]
    key: tuple
    how: str
    path: str

    def __post_init__(self):
        if self.path not in PATHS:
            raise ValueError(f"path must be one of {', '.join(PATHS)}, got {self.path!r}")


@dataclass(frozen=True)
class Unchecked:
    """The route without the up-front check. `lazy`: no row has top-p, whose selection
    needs the logits on the host, so the tokens can be returned before they are computed."""

    groups: tuple[Group, ...]
    lazy: bool

    def draw(self, logits: mx.array, history: History, rows: list[Row],
             clean: bool = False) -> tuple[mx.array, mx.array]:
        """The graph of the draw: tokens `[B]` and a probe `[B]` (NaN or +-inf: a bad row);
        nothing is evaluated. `clean`: NaN logits count as excluded first, as the checked
        route counts them, so that the tokens of good rows are the checked route's."""
        x = logits if logits.dtype == mx.float32 else logits.astype(mx.float32)
        B, V = x.shape
        hist = chain.histories(history, B)
        if hist is None or any(r.params.logit_bias and max(r.params.logit_bias) >= V for r in rows):
            raise NeedsCheckedPath  # the checked route reports it
        if clean:
            x = mx.where(mx.isnan(x), -mx.inf, x)
        y = chain.prefix(x, rows)
        if any(r.penalised for r in rows):
            y = fast.sparse_penalties(y, hist, [r.params for r in rows])

        def run(group: Group, idx: mx.array | None, yg: mx.array, hg: list[list[int]],
                rg: list[Row]) -> tuple[mx.array, mx.array]:
            u = None if group.path == GREEDY else chain.uniforms(rg, rng.DRAW)
            return _draw_group(group, yg, hg, rg, u)

        return _by_group(self.groups, y, hist, rows, run)

    def sample(self, logits: mx.array, history: History, rows: list[Row]) -> mx.array:
        """The tokens `[B]`, evaluated; raises `NeedsCheckedPath` for a bad row."""
        tokens, probe = self.draw(logits, history, rows)
        mx.eval(tokens, probe)
        if not all(map(math.isfinite, probe.tolist())):  # NaN or +-inf: a bad row
            raise NeedsCheckedPath
        return tokens


@dataclass(frozen=True)
class Checked:
    """The route that checks the logits first. `groups`: by chain, draw and top-p, with the
    paths of `sample`; `chains`: by chain alone (the distribution); `grammar`: a row has a
    grammar; `mask_first`: every row has one and asks for `grammar_first` (no unconstrained
    draw); `window_redraw`: the grammar rows whose redraw may go through the window (top-k
    rows of the fast stages)."""

    groups: tuple[Group, ...]
    chains: chain.Chains
    grammar: bool
    mask_first: bool
    window_redraw: frozenset[int]

    def draw(self, x: mx.array, hist: list[list[int]], rows: list[Row], u: mx.array,
             exact: bool) -> tuple[mx.array, mx.array, list[MirostatStep]]:
        """Draw each group by its path from checked logits `x [B, V]` (logit bias and
        min_tokens in already). Returns the tokens `[B]`, each row's largest final logit `[B]`
        (not finite: the row cannot be sampled) and mirostat's pending updates. `exact`:
        every group runs its whole chain (the final logits are reported)."""
        updates: list[MirostatStep] = []

        def run(group: Group, idx: mx.array | None, xg: mx.array, hg: list[list[int]],
                rg: list[Row]) -> tuple[mx.array, mx.array]:
            ug = u if idx is None else u[idx]
            if exact or group.path == CHAIN:  # the race runs over the chain's final logits of the whole vocabulary
                fg = chain.run(xg, hg, rg, group.key)
                t, top = chain.draw_by(group.how, fg, rg, ug)
                if group.key[:1] == ("mirostat",):
                    updates.append(MirostatStep(fg, t, rg))
                return t, top
            if any(r.penalised for r in rg):
                xg = fast.sparse_penalties(xg, hg, [r.params for r in rg])
            return _draw_group(group, xg, hg, rg, ug)

        tokens, tops = _by_group(self.groups, x, hist, rows, run)
        return tokens, tops, updates


@dataclass(frozen=True)
class Apart:
    """Rows without a grammar (`free`, by the unchecked route) beside grammar rows (`held`,
    by the checked route); each route's groups index its own rows."""

    free: tuple[int, ...]
    held: tuple[int, ...]
    unchecked: Unchecked
    checked: Checked


@dataclass(frozen=True)
class Plan:
    """A batch of `size` rows: the route `sample` takes first, and the checked route over
    every row (the distribution, `sample_with_logprobs`, and where the first route raises
    `NeedsCheckedPath`)."""

    size: int
    first: Unchecked | Apart | Checked
    checked: Checked

    @property
    def lazy(self) -> bool:
        """Whether `sample_lazily` can return the tokens before they are computed."""
        return isinstance(self.first, Unchecked) and self.first.lazy


def make_plan(rows: list[Row]) -> Plan:
    """The plan for `rows`, from their parameters alone."""
    checked = _checked(rows)
    free = tuple(b for b, r in enumerate(rows) if not r.matcher and r.kind in FREE_KINDS)
    first: Unchecked | Apart | Checked = checked
    if len(free) == len(rows):
        first = _unchecked(rows) or checked
    elif free and all(r.matcher for b, r in enumerate(rows) if b not in free):
        unchecked = _unchecked([rows[b] for b in free])
        held = tuple(b for b in range(len(rows)) if b not in free)
        if unchecked:
            first = Apart(free, held, unchecked, _checked([rows[b] for b in held]))
    return Plan(len(rows), first, checked)


def groups_of(rows: list[Row], by_draw: bool = False) -> dict[tuple, list[int]]:
    """Batch rows by chain: the stage order, or the mirostat version. `by_draw`: by chain, way
    of drawing and whether top-p is on, keyed `(chain, SamplingParams.draw, top_p on)`: top-p
    draws its rows from its own selection, and a row without it must draw as it would alone,
    whatever its neighbours ask for (a seeded request gives the same tokens in any batch)."""
    groups: dict[tuple, list[int]] = {}
    for b, r in enumerate(rows):
        p = r.params
        key = ("mirostat", p.mirostat) if p.mirostat else p.order
        groups.setdefault((key, p.draw, stage_on("top_p", p)) if by_draw else key, []).append(b)
    return groups


def _unchecked(rows: list[Row]) -> Unchecked | None:
    """The unchecked route for rows without a grammar, all greedy or plain; None where their
    rows take more than one chain or way of drawing (the checked route serves them)."""
    lazy = not any(stage_on("top_p", r.params) for r in rows)
    if all(r.kind == "greedy" for r in rows):  # every filter keeps the argmax
        return Unchecked((Group(tuple(range(len(rows))), (), DRAWS[0], GREEDY),), lazy)  # no chain, no draw
    groups = groups_of(rows, by_draw=True)
    if len({(key, how) for key, how, _ in groups}) > 1:
        return None
    return Unchecked(tuple(Group(tuple(m), key, how, _unchecked_path([rows[b] for b in m]))
                           for (key, how, _), m in groups.items()), lazy)


def _unchecked_path(rows: list[Row]) -> str:
    if all(r.kind == "greedy" for r in rows):
        return GREEDY
    # Dividing by a temperature of 0 gives no distribution: greedy rows need the stages.
    if any(r.kind == "greedy" or stage_on("min_p", r.params) or stage_on("top_p", r.params) for r in rows):
        return STAGES
    return DIVIDE


def _checked(rows: list[Row]) -> Checked:
    groups = tuple(Group(tuple(m), key, how, _checked_path(key, how, [rows[b] for b in m]))
                   for (key, how, _), m in groups_of(rows, by_draw=True).items())
    chains = tuple((key, tuple(m)) for key, m in groups_of(rows).items())
    grammar = any(r.matcher for r in rows)
    mask_first = grammar and all(r.matcher and r.params.grammar_first for r in rows)
    window_redraw = frozenset(b for b, r in enumerate(rows) if r.matcher and _redraws_in_window(r))
    return Checked(groups, chains, grammar, mask_first, window_redraw)


def _checked_path(key: tuple, how: str, rows: list[Row]) -> str:
    P = [r.params for r in rows]
    if key[:1] == ("mirostat",) or how == "race" or not fast.eligible(P, key):
        return CHAIN
    if all(p.temperature <= 0 for p in P):  # greedy: every filter keeps the argmax
        return GREEDY
    return WINDOW if fast.wants_window(P) else STAGES


def _redraws_in_window(r: Row) -> bool:
    """Whether a grammar row's redraw can go through the window: it holds every token the
    row's chain keeps (top-k rows of the fast stages)."""
    p = r.params
    return p.temperature > 0 and fast.eligible([p], p.order) and fast.wants_window([p])


# A group's draw: `(group, idx, x, hist, rows) -> (tokens, values)`, with the group's part of
# the batch (`idx`: its rows' indices, None where it is the whole batch).
GroupDraw = Callable[[Group, "mx.array | None", mx.array, list[list[int]], list[Row]], tuple[mx.array, mx.array]]


def _by_group(groups: tuple[Group, ...], x: mx.array, hist: list[list[int]], rows: list[Row],
              run: GroupDraw) -> tuple[mx.array, mx.array]:
    """`run` on each group's part of the batch; its tokens `[G]` and values `[G]` put back
    in the rows' places."""
    if len(groups) == 1:
        return run(groups[0], None, x, hist, rows)
    B = x.shape[0]
    tokens, values = mx.zeros((B,), dtype=mx.int32), mx.zeros((B,), dtype=mx.float32)
    for group in groups:
        m = group.members
        idx = mx.array(m)
        t, v = run(group, idx, x[idx], [hist[b] for b in m], [rows[b] for b in m])
        tokens = scatter_rows(tokens, idx, t.astype(mx.int32))
        values = scatter_rows(values, idx, v.astype(mx.float32))
    return tokens, values


def _draw_group(group: Group, y: mx.array, hist: list[list[int]], rows: list[Row],
                u: mx.array | None) -> tuple[mx.array, mx.array]:
    """One group by its path (greedy, divide, stages or window) from `y [G, V]`, its logits
    after logit bias, min_tokens and penalties, and its uniforms `u [G]` (greedy needs
    none). Returns the tokens `[G]` and each row's
    largest final logit `[G]` (NaN or +-inf: a bad row)."""
    if group.path == GREEDY:
        return argmax_and_value(y)  # the logit at the argmax: NaN or -inf reveal a bad row
    if group.path == DIVIDE:
        return chain.draw_by(group.how, y / chain.col(rows, "temperature"), rows, u)
    key = tuple(s for s in group.key if s != "penalties")  # in `y` already
    if group.path == STAGES:
        if group.how == "race":
            return chain.draw_by(group.how, chain.run_stages(y, hist, rows, key), rows, u)
        return chain.draw_stages(y, hist, rows, key, u)
    if group.path != WINDOW:
        raise ValueError(f"path must be greedy, divide, stages or window here, got {group.path!r}")
    t, needs_full, top = fast.fast_tokens(y, [r.params for r in rows], group.key, u)
    if mx.any(needs_full).item():
        slow, slow_top = chain.draw_stages(y, hist, rows, key, u)
        t, top = mx.where(needs_full, slow, t), mx.where(needs_full, slow_top, top)
    return t, top
