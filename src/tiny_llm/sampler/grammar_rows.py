"""Engine — grammar rows: the final distribution with the tokens a row's grammar forbids taken out.

A grammar row draws as the other rows do; a token its grammar forbids is drawn again from
the constrained distribution (`Sampler._grammar_draw`). `constrain` gives that distribution
over the whole vocabulary; `window_redraw` draws from it through the fast path's window
for top-k rows, where the grammar checks only the window's candidates.

Tests: tests/test_constrain_sampling.py, tests/test_sampler_draw_order.py
"""

import math

import mlx.core as mx
import numpy as np

from . import chain, fast
from .checks import RowError
from .params import SamplingParams
from .rows import Row

FEW_CANDIDATES = 256  # a grammar row with at most this many tokens left checks each one


def constrain(x: mx.array, hist: list[list[int]], final: mx.array, rows: list[Row],
              chains: chain.Chains) -> mx.array:
    """The final logits of grammar rows with the tokens the grammar forbids at -inf. Where
    the chain's filters left no allowed token (greedy, say, whose argmax is forbidden),
    the chain (`chains`: each group's chain and members) runs again on the masked logits
    instead."""
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
        again = chain.final(masked, hist, rows, chains)
        out = mx.where(mx.array(emptied)[:, None], again, out)
    return out


def window_redraw(x: mx.array, hist: list[list[int]], rows: list[Row], redo: list[int],
                  u: mx.array) -> tuple[dict[int, int], list[int]]:
    """Draw the grammar rows `redo` (rows whose window holds every token their chain keeps:
    `plans.Checked.window_redraw`) from their constrained distributions, with uniforms `u
    [B]`: the grammar checks only the window's candidates, and no stage runs over the
    vocabulary. Where the chain keeps no allowed token, the chain runs again on the masked
    logits, as in `constrain`, through the window too. Returns `{row: token}` and the rows
    left for the full path (the window cannot answer, or nothing finite is left: it raises)."""
    found: dict[int, tuple] = {}
    rest: list[int] = []
    groups: dict[tuple, list[int]] = {}
    for b in redo:
        groups.setdefault(rows[b].params.order, []).append(b)
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
    tokens: dict[int, int] = {}
    if found:
        drawn = [found[b] for b in sorted(found)]
        t = fast.window_draw(mx.array(np.stack([d[0] for d in drawn])), mx.array(np.stack([d[1] for d in drawn])),
                             mx.stack([d[2] for d in drawn]))
        tokens = dict(zip(sorted(found), t.tolist()))
    return tokens, sorted(rest)


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
