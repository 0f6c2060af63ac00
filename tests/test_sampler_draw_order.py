"""Every inverse-CDF draw picks a token of positive mass, whatever order the running sums are
added in (Metal's `cumsum` is a parallel scan that re-associates the additions).

The draws sum through `draw.running_sum`; each test swaps in a scan that adds in another
order and checks, on rows with mass-0 tails, grammar-like masks and uniforms at the edges,
that no token of mass 0 is ever drawn: `draw.draw` (both levels), `draw.draw_flat`,
`speculative.draw`, the fast path's window draw and the grammar's redraw.
"""

import itertools
import math

import mlx.core as mx
import numpy as np
import pytest

from tiny_llm import speculative
from tiny_llm.constrain import Grammar, TokenMatcher, TokenTable
from tiny_llm.sampler import Sampler, SamplingParams, draw, fast, rng, stages

C = stages.CHUNK
V_CHUNKED = 40 * C  # `draw.draw` takes the two-level road
V_FLAT = 40 * C + 7  # `draw.draw` falls back to `draw.draw_flat`


# ---- running sums added in other orders ---------------------------------------------------


def blocked_scan(w: mx.array) -> mx.array:
    """Two passes, as a GPU scans: running sums inside blocks of 5, plus the running sum of
    the blocks before."""
    *lead, N = w.shape
    pad = -N % 5
    if pad:
        w = mx.concatenate([w, mx.zeros((*lead, pad), dtype=w.dtype)], axis=-1)
    inside = mx.cumsum(w.reshape(*lead, -1, 5), axis=-1)  # ..., N / 5, 5
    before = mx.cumsum(inside[..., -1], axis=-1, inclusive=False)
    return (before[..., None] + inside).reshape(*lead, -1)[..., :N]


def reversed_scan(w: mx.array) -> mx.array:
    """The row total (a pairwise sum) minus what comes after each entry."""
    return mx.sum(w, axis=-1, keepdims=True) - mx.cumsum(w, axis=-1, reverse=True) + w


def ulp_scan(w: mx.array) -> mx.array:
    """The sequential running sums moved one ulp against the draw: down where the entry has
    mass, up over entries of mass 0, so the sums are not monotone (zero stays zero)."""
    s = mx.cumsum(w, axis=-1)
    step = mx.where(s > 0, mx.where(w > 0, -1, 1), 0)
    return (s.view(mx.int32) + step).view(mx.float32)


SCANS = {"blocked": blocked_scan, "reversed": reversed_scan, "ulp": ulp_scan}


@pytest.fixture(params=list(SCANS))
def scan(request, monkeypatch):
    """Every draw sums with another association order for the length of the test."""
    monkeypatch.setattr(draw, "running_sum", SCANS[request.param])
    mx.disable_compile()  # a compiled draw would keep the sum it was traced with
    yield request.param
    mx.enable_compile()


# ---- rows and uniforms --------------------------------------------------------------------

# The smallest and largest uniforms `rng.uniform` gives (1 - 2**-24 is also the largest
# float32 below 1); 1/4, 1/2 and 3/4 aim exactly at chunk ends of the `even` row below.
EDGES = [2.0**-24, 0.25, 0.5, 0.75, 1 - 2.0**-24]
GRID = (np.arange(200) + 0.5) / 200


def hand_made_rows(V: int) -> np.ndarray:
    """Logits `[R, V]` with tokens of mass 0 (-inf) where the old clamp landed."""
    g = np.random.default_rng(V)
    rows = []
    tail = g.normal(size=V)
    tail[V // 2 :] = -math.inf  # a tail of mass 0
    rows.append(tail)
    masked = g.normal(size=V)  # a grammar's mask: half the tokens, and every chunk's last
    masked[g.random(V) < 0.5] = -math.inf
    masked[C - 1 :: C] = -math.inf
    masked[-1] = -math.inf
    rows.append(masked)
    for t in (0, C - 1, C, V - 1):  # one token, on and across chunk edges
        one = np.full(V, -math.inf)
        one[t] = 0.0
        rows.append(one)
    even = np.full(V, -math.inf)
    even[: 4 * C] = 0.0  # masses of exactly 1
    rows.append(even)
    late = np.full(V, -math.inf)
    late[V // 2 :] = g.normal(size=V - V // 2)  # mass 0 first
    rows.append(late)
    light = np.full(V, -math.inf)
    light[[5, C - 1, C, 2 * C + 1, V - 2]] = [0.0, -30.0, -30.0, -30.0, -30.0]  # too light to move the sum
    rows.append(light)
    return np.stack(rows).astype(np.float32)


def weights(x: np.ndarray) -> np.ndarray:
    """The distribution of logits `x` (tokens of mass 0 are exactly 0)."""
    return np.array(stages.softmax(mx.array(x)))


def chunk_ends(w: np.ndarray) -> list[int]:
    """The last token of every chunk, and every chunk's last token of positive mass."""
    ends = set(range(C - 1, len(w), C)) | {len(w) - 1}
    for j in range(0, len(w), C):
        mass = np.flatnonzero(w[j : j + C] > 0)
        if len(mass):
            ends.add(j + int(mass[-1]))
    return sorted(ends)


def near(w: np.ndarray, ends: list[int]) -> np.ndarray:
    """Uniforms within 3 ulps of where the CDF of `w` ends at each of `ends`: where running
    sums that differ in the last bits disagree about the token."""
    cdf = np.cumsum(w.astype(np.float64))
    up = down = (cdf[ends] / cdf[-1]).astype(np.float32)
    out = [up]
    for _ in range(3):
        up, down = np.nextafter(up, np.float32(1)), np.nextafter(down, np.float32(0))
        out += [up, down]
    u = np.concatenate(out)
    return u[(u > 0) & (u < 1)]


def every_u(x: np.ndarray, ends=chunk_ends, w=None) -> tuple[mx.array, mx.array, np.ndarray]:
    """Each row of logits `x` once for each of its uniforms in (0, 1): the edges, a grid,
    and those near the `ends` of its distribution `w` (default: softmax of `x`). Returns the
    logits, the uniforms and the row numbers."""
    w = weights(x) if w is None else w
    us = [np.unique(np.concatenate([EDGES, GRID, near(w[r], ends(w[r]))]).astype(np.float32))
          for r in range(len(x))]
    which = np.concatenate([np.full(len(u), r) for r, u in enumerate(us)])
    return mx.array(x[which]), mx.array(np.concatenate(us)), which


def engine_draw(x, u):
    return draw.draw(x, u)[0]


def flat_draw(x, u):
    return draw.draw_flat(x, u)[0]


def speculative_draw(x, u):
    return speculative.draw(stages.softmax(x), u)


DRAWS = {
    "two-level": (engine_draw, V_CHUNKED),
    "flat": (engine_draw, V_FLAT),
    "flat on whole chunks": (flat_draw, V_CHUNKED),
    "speculative": (speculative_draw, V_FLAT),
    "speculative on whole chunks": (speculative_draw, V_CHUNKED),
}


# ---- the draws ----------------------------------------------------------------------------


def test_the_scans_add_in_another_order():
    """The swapped-in scans are running sums (to float32 rounding of the row total), yet
    differ from MLX's in the last bits."""
    w = stages.exp(mx.array(hand_made_rows(V_CHUNKED)))
    exact = np.cumsum(np.array(w, dtype=np.float64), axis=-1)
    plain = np.array(mx.cumsum(w, axis=-1))
    for name, other in SCANS.items():
        got = np.array(other(w))
        assert (np.abs(got - exact) <= 1e-5 * exact[:, -1:]).all(), name
        assert (got != plain).any(), name
    ulp = np.array(ulp_scan(w))
    assert (np.diff(ulp, axis=-1) < 0).any()  # not monotone


@pytest.mark.parametrize("name", DRAWS)
def test_draws_never_pick_a_token_of_mass_zero(name, scan):
    draw, V = DRAWS[name]
    x = hand_made_rows(V)
    keep = weights(x) > 0
    assert (~keep).any(axis=-1).all()  # every row has tokens of mass 0
    logits, u, which = every_u(x)
    tokens = np.array(draw(logits, u))
    assert tokens.shape == (len(which),)
    bad = ~keep[which, tokens]
    assert not bad.any(), (scan, [(int(r), float(v), int(t)) for r, v, t in
                                  zip(which[bad], np.array(u)[bad], tokens[bad])][:5])


@pytest.mark.parametrize("name", DRAWS)
def test_u_zero_draws_the_first_token_of_positive_mass(name, scan):
    """u = 0 (which `rng.uniform` never gives) still lands on a token of positive mass."""
    draw, V = DRAWS[name]
    x = hand_made_rows(V)
    first = np.argmax(weights(x) > 0, axis=-1)
    assert first[-2] == V // 2  # the `late` row starts with mass 0
    assert np.array(draw(mx.array(x), mx.zeros(len(x)))).tolist() == first.tolist()


@pytest.mark.parametrize("V", [V_CHUNKED, V_FLAT])
def test_draws_still_invert_the_cdf(V, scan):
    """Away from the ends of the intervals (by 1e-5), the token is the float64 inverse CDF:
    the guards change nothing but the last-ulp cases."""
    x = hand_made_rows(V)[:2]
    us = ((np.arange(997) + 0.5) / 997).astype(np.float32)
    which = np.repeat([0, 1], len(us))
    tokens = np.array(engine_draw(mx.array(x[which]), mx.array(np.tile(us, 2)))).reshape(2, -1)
    for r in range(2):
        p = np.exp(x[r].astype(np.float64) - x[r].max())
        cdf = np.cumsum(p) / p.sum()
        want = np.searchsorted(cdf, us)  # the first token whose cdf reaches u
        clear = np.min(np.abs(cdf[:, None] - us[None, :]), axis=0) > 1e-5
        assert clear.sum() > 900
        np.testing.assert_array_equal(tokens[r][clear], want[clear])


def test_the_fast_path_never_picks_a_token_of_mass_zero(scan):
    """The window draw (top-k 8): cut tokens share the window, before and after the kept
    ones in vocabulary order, and fall to mass 0."""
    V, g = V_CHUNKED, np.random.default_rng(8)
    kept = [[0, C - 1, C, 100, 500, 1000, 1500, 2000], list(range(V - 8, V)), [3, 64, 65, 66, 700, 701, 1200, V - 1]]
    rows = []
    for i, ids in enumerate(kept):
        x = np.full(V, -50.0 if i != 1 else -math.inf, dtype=np.float32)
        x[ids] = g.uniform(0, 3, size=8) if i != 2 else 0.0  # row 2: exact masses of 1
        rows.append(x)
    x = np.stack(rows)
    params = SamplingParams(top_k=8)
    probs = np.array(Sampler(params).distribution(mx.array(x)))
    assert ((probs > 0).sum(axis=-1) == 8).all()
    logits, u, which = every_u(x, ends=lambda w: np.flatnonzero(w > 0).tolist(), w=probs)
    tokens, needs_full, _ = fast.fast_tokens(logits, [params] * len(which), params.order, u)
    assert not np.array(needs_full).any()  # the window's own draw is the answer
    assert (probs[which, np.array(tokens)] > 0).all()


# ---- the grammar's redraw -----------------------------------------------------------------

GRAMMAR = Grammar.from_gbnf('root ::= [ab]* "y"')


def grammar_table() -> TokenTable:
    """256 tokens (four chunks): the end of sequence, then strings over "abxy"; the last
    token of every chunk starts with x, which the grammar never allows."""
    words = [bytes(w) for n in (1, 2, 3, 4) for w in itertools.product(b"abxy", repeat=n)]
    words = [w for w in words if not w.startswith(b"x")][:251]
    for t in (C - 1, 2 * C - 1, 3 * C - 1):
        words.insert(t - 1, b"x" + bytes([t % 26 + 97]) * 2)
    return TokenTable([b"<eos>"] + words + [b"xend"], eos_token_ids=[0])


@pytest.mark.parametrize("first", [True, False], ids=["grammar_first", "check then redraw"])
def test_grammar_redraws_are_allowed(first, scan, monkeypatch):
    """With the engine's uniforms set to the edges, a grid and values within ulps of the
    chunk ends, every token (redrawn from the masked distribution) is allowed, and the
    grammar goes on from it."""
    table = grammar_table()
    assert table.size == 4 * C
    matcher = TokenMatcher(GRAMMAR, table)
    allowed = matcher.mask(matcher.start)
    assert not allowed[C - 1 :: C].any() and 0 < allowed.sum() < table.size
    # Forbidden tokens are the likely ones, so the check-then-redraw path redraws often;
    # allowed ones have mass exactly 1.
    x = np.where(allowed, 0.0, 2.0).astype(np.float32)[None]
    x, u, _ = every_u(x)  # the uniforms near the chunk ends of the unconstrained row
    masked = np.where(allowed, 1.0, 0.0)
    u = mx.concatenate([u, mx.array(near(masked, chunk_ends(masked)))])  # and of the masked one
    x = mx.broadcast_to(x[:1], (len(u), table.size))
    monkeypatch.setattr(rng, "uniform", lambda seeds, counters, stream: u)
    sampler = Sampler(SamplingParams(temperature=1.0, seed=0, grammar=GRAMMAR, grammar_first=first), table)
    tokens = sampler.sample(x).tolist()
    assert allowed[tokens].all()
    again = sampler.sample(x).tolist()  # raises if a row's grammar had died
    assert all(matcher.allows(matcher.advance(matcher.start, t), t2) for t, t2 in zip(tokens, again))


# ---- the pieces ---------------------------------------------------------------------------


def test_argmax_of_booleans_is_the_first_true():
    N = 5000
    hit = np.zeros((5, N), dtype=bool)
    hit[0, 0] = hit[0, 1] = True
    hit[1, [N - 1]] = True
    hit[2, [4097, 4500, 4999]] = True
    hit[3, 64::64] = True
    got = np.array(mx.argmax(mx.array(hit), axis=-1)).tolist()
    assert got == [0, N - 1, 4097, 64, 0]  # row 4 has no True


def test_first_reaching_skips_mass_zero_and_non_monotone_sums():
    running = mx.array([[0.0, 1.0, 1.0000001, 0.9999999, 2.0, 2.0000002],
                        [0.5, 0.5, 0.5, 0.5, 0.5, 0.5],
                        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    positive = mx.array([[False, True, False, True, True, False],
                         [True, False, False, False, False, False],
                         [False] * 6])
    target = mx.array([1.0000001, 0.0, 0.0])
    # Row 0: entry 2 reaches the target but has mass 0; entry 3 has mass but sums lower.
    assert draw.first_reaching(running, positive, target).tolist() == [4, 0, 0]
    assert draw.reach(running, positive).tolist() == [2.0, 0.5, 0.0]


def test_inverse_cdf_exact_cases_and_batch_rows_equal_single_rows():
    w = mx.array([[0.0, 1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 3.0], [0.0] * 5])
    u = mx.array([0.5, 0.0, 0.7])
    # Row 0: u = 1/2 aims exactly at the end of token 1; row 2 has no mass at all.
    assert draw.inverse_cdf(w, u).tolist() == [1, 4, 0]
    assert draw.inverse_cdf(w, mx.array([1 - 2.0**-24] * 3)).tolist() == [3, 4, 0]
    g = np.random.default_rng(3)
    rows = weights(hand_made_rows(V_CHUNKED))
    us = g.random(len(rows)).astype(np.float32)
    batch = draw.inverse_cdf(mx.array(rows), mx.array(us)).tolist()
    single = [draw.inverse_cdf(mx.array(rows[r : r + 1]), mx.array(us[r : r + 1])).item() for r in range(len(rows))]
    assert batch == single
