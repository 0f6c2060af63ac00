"""Engine — the chain over a group of rows: each stage with one parameter per row, and the draw from what it leaves.

A group is a list of `Row`s that share a chain (a stage order, or a mirostat version) and
their logits `x [G, V]`. Every stage takes its parameters as `[G, 1]` columns of the rows'
values; a stage that no row of the group switches on is skipped. The plans of a draw
(`plans.py`) and the grammar rows (`grammar_rows.py`) run the chain through here.

Tests: tests/test_sampler_engine.py, tests/test_sampler_stages.py
"""

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import mlx.core as mx

from . import fast, rng, search, stages
from .checks import RowError
from .draw import draw, race, scatter_rows
from .dry import dry_penalties
from .params import STAGE_ON
from .rows import Row

History = Sequence[Sequence[int]] | None
Chains = tuple[tuple[tuple, tuple[int, ...]], ...]  # (chain, members) per group of rows


def histories(history: History, B: int) -> list[list[int]] | None:
    """Each row's history as a list of ints; None when the number of rows is wrong."""
    if history is None:
        return [[] for _ in range(B)]
    hist = [list(map(int, h)) for h in history]
    return hist if len(hist) == B else None


def col(rows: list[Row], name: str, dtype: mx.Dtype = mx.float32) -> mx.array:
    """`[G, 1]`: parameter `name` of every row."""
    return fast.column([r.params for r in rows], name, dtype)


def uniforms(rows: list[Row], stream: int) -> mx.array:
    """`[B]`: each row's next uniform on `stream`, from its seed and draw counter."""
    return rng.uniform(mx.array([r.seed for r in rows], dtype=mx.uint32),
                       mx.array([r.counter for r in rows], dtype=mx.uint32), stream)


def draw_by(how: str, final: mx.array, rows: list[Row], u: mx.array) -> tuple[mx.array, mx.array]:
    """`draw(final, u)`, or for race rows (`how`, their `SamplingParams.draw`) the race on
    the 32 random bits their uniforms `u` are made from."""
    if how != "race":
        return draw(final, u)
    return race(final, rng.bits(mx.array([r.seed for r in rows], dtype=mx.uint32),
                                mx.array([r.counter for r in rows], dtype=mx.uint32), rng.DRAW))


def check_tops(tops: list[float], rows: Sequence[int]) -> None:
    """Raise for the first of `rows` whose largest final logit `tops[row]` is not finite."""
    for row in rows:
        if not math.isfinite(tops[row]):
            raise RowError(row, "the sampling stages left no finite logit (a temperature or "
                                "penalty this extreme overflows float32)")


def prefix(x: mx.array, rows: list[Row]) -> mx.array:
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


def run(x: mx.array, hist: list[list[int]], rows: list[Row], key: tuple) -> mx.array:
    """One group's chain on `x [G, V]`: mirostat (`key` `("mirostat", version)`), or the
    stages of the order `key`."""
    if key[:1] != ("mirostat",):
        return run_stages(x, hist, rows, key)
    G, V = x.shape
    x = stages.temperature(x, col(rows, "temperature"), mx.zeros((G, 1)), mx.ones((G, 1)))
    mu = mx.array([r.mu for r in rows], dtype=mx.float32)[:, None]
    return stages.mirostat_v2(x, mu) if key[1] == 2 else stages.mirostat_v1(x, mu, V)


def final(x: mx.array, hist: list[list[int]], rows: list[Row], chains: Chains) -> mx.array:
    """The final logits (after every stage) of every row, group by group (`chains`: each
    group's chain and members)."""
    if len(chains) == 1:
        ((key, _),) = chains
        return run(x, hist, rows, key)
    out = x
    for key, members in chains:
        idx = mx.array(members)
        part = run(x[idx], [hist[b] for b in members], [rows[b] for b in members], key)
        out = scatter_rows(out, idx, part)
    return out


def run_stages(x: mx.array, hist: list[list[int]], rows: list[Row], key: tuple[str, ...]) -> mx.array:
    """The stages of `key` in order, each with one parameter per row; a stage no row uses
    is skipped."""
    return _stages_and_nucleus(x, hist, rows, key)[0]


def draw_stages(x: mx.array, hist: list[list[int]], rows: list[Row], key: tuple[str, ...],
                u: mx.array) -> tuple[mx.array, mx.array]:
    """`draw(run_stages(...), u)`; where top-p was the last stage to change the logits, the
    draw is made from its selection (`search.Nucleus.draw`), with the probabilities it
    computed already."""
    out, found = _stages_and_nucleus(x, hist, rows, key)
    if found is None:
        return draw(out, u)
    return found.draw(u), found.top


def _stages_and_nucleus(x: mx.array, hist: list[list[int]], rows: list[Row],
                        key: tuple[str, ...]) -> tuple[mx.array, "search.Nucleus | None"]:
    """`run_stages`, and top-p's `search.Nucleus` if no stage after it changed the logits."""
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
    return stages.top_n_sigma(x, col(rows, "top_n_sigma"))


def _top_k(x: mx.array, hist: list[list[int]], rows: list[Row], uncut: list[bool]) -> mx.array:
    return search.top_k(x, col(rows, "top_k", mx.int32))


def _typical_p(x: mx.array, hist: list[list[int]], rows: list[Row], uncut: list[bool]) -> mx.array:
    return stages.typical_p(x, col(rows, "typical_p"))


def _top_p(x: mx.array, hist: list[list[int]], rows: list[Row], uncut: list[bool]) -> "mx.array | search.Nucleus":
    found = search.nucleus(x, col(rows, "top_p"), mx.array(uncut)[:, None])
    return x if found is None else found


def _min_p(x: mx.array, hist: list[list[int]], rows: list[Row], uncut: list[bool]) -> mx.array:
    return stages.min_p(x, col(rows, "min_p"))


def _xtc(x: mx.array, hist: list[list[int]], rows: list[Row], uncut: list[bool]) -> mx.array:
    coin = uniforms(rows, rng.XTC)
    prob = mx.array([r.params.xtc_probability if STAGE_ON["xtc"](r.params) else 0.0 for r in rows])
    return stages.xtc(x, col(rows, "xtc_threshold"), (coin < prob)[:, None])


def _temperature(x: mx.array, hist: list[list[int]], rows: list[Row], uncut: list[bool]) -> mx.array:
    if any(r.params.dynatemp_range > 0 for r in rows):
        return stages.temperature(x, col(rows, "temperature"), col(rows, "dynatemp_range"),
                                  col(rows, "dynatemp_exponent"))
    return stages.plain_temperature(x, col(rows, "temperature"), any(r.params.temperature <= 0 for r in rows))


_APPLY: dict[str, Callable[[mx.array, list[list[int]], list[Row], list[bool]], "mx.array | search.Nucleus"]] = {
    "penalties": _penalties, "dry": _dry, "top_n_sigma": _top_n_sigma, "top_k": _top_k,
    "typical_p": _typical_p, "top_p": _top_p, "min_p": _min_p, "xtc": _xtc, "temperature": _temperature,
}


class MirostatStep(NamedTuple):
    """A mirostat group's draw, kept until every row's draw is known to be valid."""

    final: mx.array  # [G, V]: the logits the tokens were drawn from
    tokens: mx.array  # [G]
    rows: list[Row]


def update_mu(step: MirostatStep) -> None:
    """Mirostat: mu -= eta * (surprise of the drawn token - tau)."""
    out, tokens, rows = step
    e = stages.exp(out - mx.max(out, axis=-1, keepdims=True))
    p = mx.take_along_axis(e, tokens[:, None], axis=-1)[:, 0] / mx.sum(e, axis=-1)
    mu = mx.array([r.mu for r in rows], dtype=mx.float32)
    tau = mx.array([r.params.mirostat_tau for r in rows])
    eta = mx.array([r.params.mirostat_eta for r in rows])
    for r, value in zip(rows, (mu - eta * (-mx.log2(p) - tau)).tolist()):
        r.mu = value
