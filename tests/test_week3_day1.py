"""Week 3, day 1: speculative decoding — the exact rejection sampler, and generation with a
draft model or prompt lookup that keeps the target's distribution."""

import mlx.core as mx
import numpy as np
import pytest
from conftest import tiny_model
from scipy.stats import chisquare

import tiny_llm
from tiny_llm.generate import generate_step
from tiny_llm.sampler import SamplingParams, token_distribution
from tiny_llm.speculative import SpeculativeStats, rejection_sample, speculative_generate_step

ALPHA = 1e-4  # false-alarm rate of each chi-square test


def run(drafts, q, p, u):
    accepted, tokens = rejection_sample(mx.array(drafts), mx.array(q, mx.float32), mx.array(p, mx.float32),
                                        mx.array(u, mx.float32))
    return np.array(accepted).tolist(), np.array(tokens).tolist()


# ---- the rejection sampler on hand-made cases -------------------------------------------------

P0, Q0 = [0.5, 0.3, 0.2], [0.2, 0.6, 0.2]
P1 = [0.1, 0.1, 0.8]


def test_draft_accepted_below_p_over_q():
    """Draft 1: p/q = 0.3/0.6 = 0.5, so u = 0.49 accepts it and the bonus token is drawn
    from p1 (u = 0.5 lands in token 2: cdf 0.1, 0.2, 1.0)."""
    assert run([[1]], [[Q0]], [[P0, P1]], [[0.49, 0.5]]) == ([1], [[1, 2]])


def test_rejected_draft_draws_from_the_residual():
    """u = 0.51 rejects draft 1; max(0, p - q) = [0.3, 0, 0]: token 0, whatever the draw."""
    for r in (0.01, 0.99):
        assert run([[1]], [[Q0]], [[P0, P1]], [[0.51, r]]) == ([0], [[0, -1]])


def test_draft_where_p_exceeds_q_is_always_accepted():
    """Draft 0: p/q = 2.5 >= 1, accepted for any u; then draft 2 (p/q = 1) too; the bonus
    comes from the last row."""
    p = [P0, [0.2, 0.2, 0.6], [0.0, 1.0, 0.0]]
    assert run([[0, 2]], [[Q0, [0.2, 0.2, 0.6]]], [p], [[0.999, 0.999, 0.3]]) == ([2], [[0, 2, 1]])


def test_rows_of_a_batch_are_independent():
    drafts, q, p = [[1], [1]], [[Q0], [Q0]], [[P0, P1], [P0, P1]]
    assert run(drafts, q, p, [[0.49, 0.5], [0.51, 0.5]]) == ([1, 0], [[1, 2], [0, -1]])


def test_point_mass_draft_is_accepted_with_probability_p():
    """Prompt lookup's q is one-hot: accept iff u < p(x); else the residual is p without x."""
    q = [[0.0, 1.0, 0.0]]
    assert run([[1]], [q], [[P0, P1]], [[0.29, 0.5]])[0] == [1]
    accepted, tokens = run([[1]], [q], [[P0, P1]], [[0.31, 0.70]])  # residual [0.5, 0, 0.2] / 0.7
    assert accepted == [0] and tokens == [[0, -1]]
    assert run([[1]], [q], [[P0, P1]], [[0.31, 0.72]])[1] == [[2, -1]]


# ---- exactness --------------------------------------------------------------------------------


def random_case(rng, V: int, G: int):
    """Random p [G+1, V] and q [G, V] with some zeros (tokens one side never proposes)."""
    p = rng.dirichlet(np.full(V, 0.7), size=G + 1)
    q = rng.dirichlet(np.full(V, 0.7), size=G)
    p[0, 0] = 0.0
    q[-1, V - 1] = 0.0
    return p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_first_token_is_exactly_p_by_quadrature(seed):
    """Enumerate the draft token x (weight q0(x)) and cover both uniforms with an N x N grid
    of midpoints: the weighted frequency of the first emitted token is p0 up to the grid's
    resolution (an error of at most 2 / N per token; nothing random)."""
    rng = np.random.default_rng(seed)
    V, N = 5, 200
    p, q = random_case(rng, V, 1)
    mid = (np.arange(N) + 0.5) / N
    u0, u1 = np.meshgrid(mid, mid, indexing="ij")
    x = np.repeat(np.arange(V), N * N)
    uni = np.stack([np.tile(u0.ravel(), V), np.tile(u1.ravel(), V)], axis=1)
    accepted, tokens = rejection_sample(mx.array(x[:, None]), mx.array(np.broadcast_to(q, (len(x), 1, V)), mx.float32),
                                        mx.array(np.broadcast_to(p, (len(x), 2, V)), mx.float32), mx.array(uni, mx.float32))
    first = np.array(tokens)[:, 0]
    weight = q[0][x] / (N * N)
    freq = np.bincount(first, weights=weight, minlength=V)
    np.testing.assert_allclose(freq, p[0], atol=2.0 / N)
    assert freq[0] == 0.0  # p0 = 0: never emitted, not even by the residual


@pytest.mark.parametrize("G", [1, 3])
def test_emitted_tokens_follow_p_chi_square(G):
    """200,000 rounds on one random case, drafts drawn from q: every emitted position
    follows p at that position given the drafts before it (chi-square, fixed seed)."""
    rng = np.random.default_rng(10 + G)
    V, B = 6, 200_000
    p1, q1 = random_case(rng, V, G)
    # One fixed draft prefix per position would not test q; draw the drafts from q for
    # real, with p rows that do not depend on them (a target that ignores its input).
    drafts = np.stack([rng.choice(V, size=B, p=q1[i]) for i in range(G)], axis=1)
    accepted, tokens = rejection_sample(mx.array(drafts), mx.array(np.broadcast_to(q1, (B, G, V)), mx.float32),
                                        mx.array(np.broadcast_to(p1, (B, G + 1, V)), mx.float32),
                                        mx.array(rng.random((B, G + 1)), mx.float32))
    accepted, tokens = np.array(accepted), np.array(tokens)
    assert np.all((accepted >= 0) & (accepted <= G))
    for i in range(G + 1):
        emitted = tokens[accepted >= i, i]  # rounds that reach position i
        observed = np.bincount(emitted, minlength=V)
        assert np.all(observed[p1[i] == 0] == 0)
        support = p1[i] > 0
        stat, pvalue = chisquare(observed[support], p1[i][support] / p1[i][support].sum() * observed.sum())
        assert pvalue > ALPHA, (i, observed, p1[i])
    # Acceptance of the first draft: probability sum_x min(q(x), p(x)).
    rate = np.mean(accepted >= 1)
    assert abs(rate - np.minimum(p1[0], q1[0]).sum()) < 5 * np.sqrt(0.25 / B)


# ---- generation -------------------------------------------------------------------------------


def models(V: int = 8):
    target, _ = tiny_model("qwen2-untied", seed=50, vocab_size=V)
    draft, _ = tiny_model("llama-tied", seed=51, vocab_size=V)
    return target, draft


@pytest.mark.parametrize("drafter", ["model", "lookup"])
@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_speculation_equals_greedy_generation(drafter, gamma):
    """The same greedy tokens, with drafts proposed (a repetitive prompt feeds the lookup
    1-token matches) and some of them rejected."""
    target, draft = models(16)
    prompt = mx.array([3, 5, 3, 5, 3, 9, 1, 3, 5, 3, 5])
    plain = [t for t, _ in generate_step(prompt, target, max_tokens=20)]
    stats = SpeculativeStats()
    spec = [t for t, _, _ in speculative_generate_step(
        prompt, target, draft if drafter == "model" else None, num_draft_tokens=gamma, max_tokens=20,
        min_ngram=1, stats=stats)]
    assert spec == plain
    assert stats.drafted > stats.accepted


def test_seeded_speculation_is_reproducible_and_reports_drafts():
    target, draft = models()
    params = SamplingParams(temperature=1.0, seed=4)
    stats = SpeculativeStats()
    a = list(speculative_generate_step(mx.array([1, 2]), target, draft, num_draft_tokens=3,
                                       params=params, max_tokens=12, stats=stats))
    b = list(speculative_generate_step(mx.array([1, 2]), target, draft, num_draft_tokens=3,
                                       params=params, max_tokens=12))
    assert [t for t, _, _ in a] == [t for t, _, _ in b] and len(a) == 12
    assert stats.emitted == 12 and stats.accepted == sum(d for _, _, d in a)
    assert stats.rounds == 12 - stats.accepted and stats.drafted >= stats.accepted


class TokensSeen:
    """The cache of `Trigrams`: the token ids it has seen, after a start marker, as `keys`
    `[B, 1 + offset]`; `trim(n)` forgets the last n."""

    def __init__(self, start: mx.array):
        self.keys = self.values = start

    @property
    def offset(self) -> int:
        return self.keys.shape[1] - 1

    def trim(self, n: int) -> int:
        n = min(n, self.offset)
        self.keys = self.values = self.keys[:, : self.keys.shape[1] - n]
        return n


class Trigrams:
    """A stand-in model for tests of the sampling itself: position i's logits are
    `A[token i] + B[token i-1]` (a start marker before the first), so the next token's
    distribution depends on the last two tokens, the earlier one read from the cache. A
    wrong rewind of the cache changes it. A few array ops a pass, where the small random
    models cost hundreds."""

    def __init__(self, V: int, seed: int):
        rng = np.random.default_rng(seed)
        self.start = V
        # It likes to repeat its last token (the diagonal): a repetition penalty that misses
        # a token of the history shows.
        self.A = mx.array(rng.normal(scale=1.5, size=(V, V)) + 2.0 * np.eye(V), mx.float32)
        self.B = mx.array(np.vstack([rng.normal(scale=1.5, size=(V, V)), np.zeros((1, V))]), mx.float32)

    def make_cache(self, rows: int = 1) -> list[TokensSeen]:
        return [TokensSeen(mx.full((rows, 1), self.start, mx.int32))]

    def __call__(self, tokens: mx.array, cache: list[TokensSeen] | None = None) -> mx.array:
        (seen,) = cache if cache is not None else self.make_cache(tokens.shape[0])
        L = tokens.shape[1]
        seen.keys = seen.values = mx.concatenate([seen.keys, tokens.astype(mx.int32)], axis=1)
        return self.A[tokens] + self.B[seen.keys[:, -L - 1 : -1]]


def test_two_token_distribution_equals_the_targets():
    """1,500 seeded runs of 2 tokens (temperature 1.2, top-k 6, repetition penalty): the
    joint frequency of (t1, t2) matches p(t1) p(t2 | t1) computed from the target alone
    (chi-square, fixed seeds). Target and draft are `Trigrams` stand-ins: what is tested is
    the sampling (uniforms, histories, the rewind), and a run costs a third of one on the
    small random models."""
    V = 8
    target, draft = Trigrams(V, seed=50), Trigrams(V, seed=51)
    # The stand-in reads the token before from its cache, rewound or not.
    cache = target.make_cache()
    target(mx.array([[1, 3]]), cache=cache)
    assert mx.array_equal(target(mx.array([[2]]), cache=cache)[0, 0], target(mx.array([[1, 3, 2]]))[0, 2])
    cache[0].trim(1)  # forget the 2: the 3 is the token before again
    assert mx.array_equal(target(mx.array([[0]]), cache=cache)[0, 0], target.A[0] + target.B[3])
    params = dict(temperature=1.2, top_k=6, repetition_penalty=1.3)
    prompt = [2, 6, 1]
    first = np.array(token_distribution(target(mx.array([prompt]))[:, -1, :], SamplingParams(**params),
                                        [prompt]))[0]
    rows = mx.array([prompt + [t] for t in range(V)])
    second = np.array(token_distribution(target(rows)[:, -1, :], SamplingParams(**params),
                                         [prompt + [t] for t in range(V)]))
    expected = (first[:, None].astype(np.float64) * second.astype(np.float64)).ravel()
    runs = 1500
    observed = np.zeros(V * V)
    for seed in range(runs):
        out = [t for t, _, _ in speculative_generate_step(
            mx.array(prompt), target, draft, num_draft_tokens=2,
            params=SamplingParams(**params, seed=seed), max_tokens=2)]
        observed[out[0] * V + out[1]] += 1
    assert np.all(observed[expected == 0] == 0)
    keep = expected * runs >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum()) * runs
    stat, pvalue = chisquare(obs, exp * obs.sum() / exp.sum())
    assert pvalue > ALPHA, (stat, pvalue)


def test_default_model_greedy_speculation_equals_greedy(course_default_model):
    """On the default model, prompt lookup on a copying prompt: the same 24 greedy tokens,
    and most of them come from the drafts."""
    model, tokenizer = course_default_model
    text = tokenizer.apply_chat_template([{"role": "user", "content": (
        "Repeat exactly: The quick brown fox jumps over the lazy dog. "
        "The quick brown fox jumps over the lazy dog.")}])
    prompt = mx.array(tokenizer.encode(text))
    plain = [t for t, _ in generate_step(prompt, model, max_tokens=24)]
    stats = SpeculativeStats()
    spec = [t for t, _, _ in speculative_generate_step(prompt, model, None, num_draft_tokens=4,
                                                        max_tokens=24, stats=stats)]
    assert spec == plain
    assert stats.accepted > 0


def test_stream_generate_with_prompt_lookup_marks_drafted_tokens(course_default_model):
    model, tokenizer = course_default_model
    text = "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3,"
    plain = [r.token for r in tiny_llm.stream_generate(model, tokenizer, text, 10)]
    responses = list(tiny_llm.stream_generate(model, tokenizer, text, 10, prompt_lookup=True))
    assert [r.token for r in responses] == plain
    assert any(r.from_draft for r in responses)
