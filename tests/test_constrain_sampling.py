"""Grammars in the sampler: the constrained distribution, both strategies, batches, errors."""

import dataclasses
import math

import mlx.core as mx
import numpy as np
import pytest
from scipy import stats

from tiny_llm.constrain import Grammar, TokenMatcher, TokenTable
from tiny_llm.sampler import Sampler, SamplingParams

EOS = 0
# 64 tokens: the end of sequence, a special token, and short pieces of letters and braces.
_rng = np.random.default_rng(3)
TOKENS = [b"<eos>", None] + list(dict.fromkeys(
    bytes(_rng.choice(list(b"abcxy{}"), size=_rng.integers(1, 4)).tolist()) for _ in range(200)))[:62]
TABLE = TokenTable(TOKENS, eos_token_ids=[EOS])
V = len(TOKENS)
GRAMMAR = Grammar.from_gbnf('root ::= ([abcx] | "{" [ab]* "}")* "y"')


def with_grammar(params: SamplingParams, **more) -> SamplingParams:
    return dataclasses.replace(params, grammar=GRAMMAR, **more)


def allowed(state=None) -> np.ndarray:
    m = TokenMatcher(GRAMMAR, TABLE)
    return m.mask(m.start if state is None else state)


def logits(seed: int, B: int = 1) -> mx.array:
    return mx.array(np.random.default_rng(seed).normal(0, 2, (B, V)).astype(np.float32))


CHAINS = {
    "plain": SamplingParams(),
    "temperature": SamplingParams(temperature=0.6),
    "top-k": SamplingParams(top_k=8, temperature=1.3),
    "llama.cpp": SamplingParams(top_k=20, top_p=0.9, min_p=0.05, temperature=0.8),
    "hf": SamplingParams(top_k=20, top_p=0.8, temperature=0.7, order="hf"),
    "penalties": SamplingParams(repetition_penalty=1.3, presence_penalty=0.5, top_p=0.95),
    "typical + top-n-sigma": SamplingParams(typical_p=0.7, top_n_sigma=1.5),
}


@pytest.mark.parametrize("name", CHAINS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_constrained_distribution_is_the_unconstrained_one_renormalised(name, seed):
    x, history = logits(seed), [[3, 4, 5, 3]]
    params = CHAINS[name]
    base = np.array(Sampler(params).distribution(x, history))[0].astype(np.float64)
    mask = allowed()
    assert 0 < mask.sum() < V
    got = np.array(Sampler(with_grammar(params), TABLE).distribution(x, history))[0]
    assert np.all(got[~mask] == 0)
    if (base * mask).sum() > 0:
        expected = base * mask / (base * mask).sum()
    else:  # the chain's filters left no allowed token: the chain runs on the masked logits
        masked = mx.where(mx.array(mask)[None], x, -math.inf)
        expected = np.array(Sampler(params).distribution(masked, history))[0]
    # float32 renormalisation rounds differently from float64: a few ulps apart.
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-7)
    assert got.sum() == pytest.approx(1.0, abs=1e-6)


def test_greedy_takes_the_best_allowed_token():
    x = logits(3)
    mask = allowed()
    order = np.argsort(-np.array(x)[0])
    assert not mask[order[0]]  # the overall argmax is not allowed (seed chosen so)
    best = next(int(t) for t in order if mask[t])
    s = Sampler(with_grammar(SamplingParams(temperature=0.0)), TABLE)
    assert np.array(s.distribution(x))[0].tolist() == [float(i == best) for i in range(V)]
    for first in (False, True):
        s = Sampler(with_grammar(SamplingParams(temperature=0.0), grammar_first=first), TABLE)
        assert s.sample(x).item() == best


def test_top_k_that_cuts_every_allowed_token_runs_on_the_masked_logits():
    x = logits(3)
    mask = allowed()
    order = [int(t) for t in np.argsort(-np.array(x)[0])]
    assert not mask[order[0]] and not mask[order[1]]
    params = SamplingParams(top_k=2, seed=1)
    got = np.array(Sampler(with_grammar(params), TABLE).distribution(x))[0]
    best2 = [t for t in order if mask[t]][:2]
    assert set(np.flatnonzero(got)) == set(best2)


def draws(params: SamplingParams, x: mx.array, n: int) -> np.ndarray:
    """`n` tokens, one per row, each row with its own seed."""
    rows = [dataclasses.replace(params, seed=1000 + i) for i in range(n)]
    kw = {"tokenizer": TABLE} if params.grammar else {}
    return np.array(Sampler(rows, **kw).sample(mx.repeat(x, n, axis=0)))


@pytest.mark.parametrize("first", [False, True])
@pytest.mark.parametrize("name", ["plain", "top-k", "llama.cpp"])
def test_both_strategies_sample_the_constrained_distribution(name, first):
    x, n = logits(11), 4000
    params = with_grammar(CHAINS[name], grammar_first=first)
    target = np.array(Sampler(params, TABLE).distribution(x))[0].astype(np.float64)
    tokens = draws(params, x, n)
    counts = np.bincount(tokens, minlength=V)
    assert counts[target == 0].sum() == 0
    keep = target > 0
    p = stats.chisquare(counts[keep], target[keep] / target[keep].sum() * n).pvalue
    assert p > 1e-4, (name, first, p)


def test_check_strategy_keeps_every_allowed_first_draw():
    x, n = logits(11), 400
    plain = draws(CHAINS["top-k"], x, n)
    checked = draws(with_grammar(CHAINS["top-k"]), x, n)
    mask = allowed()
    kept = mask[plain]
    assert 0 < kept.sum() < n  # some first draws are allowed, some are not
    assert np.array_equal(checked[kept], plain[kept])
    assert mask[checked].all()


def test_end_of_sequence_only_where_the_grammar_is_complete():
    table = TokenTable([b"<eos>", b"a", b"b", b"ab"], eos_token_ids=[0])
    s = Sampler(SamplingParams(temperature=0.0, grammar=Grammar.from_gbnf('root ::= "a" "b"?')), table)
    x = mx.array([[9.0, 1.0, 2.0, 3.0]])  # the model wants to stop at once
    assert s.sample(x).item() == 3  # "ab": end-of-sequence is not allowed yet
    assert s.sample(x).item() == 0  # the text is complete: only the end is left
    x = mx.array([[-9.0, 1.0, 2.0, 3.0]])
    s.reset_grammar()
    assert s.sample(x).item() == 3 and s.sample(x).item() == 0


def test_logprobs_come_from_the_constrained_distribution():
    x = logits(4)
    params = with_grammar(SamplingParams(temperature=0.8, seed=3, logprobs=3))
    probs = np.array(Sampler(params, TABLE).distribution(x))[0]
    r = Sampler(params, TABLE).sample_with_logprobs(x)
    token = r.tokens.item()
    assert probs[token] > 0
    assert r.logprob.item() == pytest.approx(math.log(probs[token]), abs=1e-5)
    assert np.array(r.top_tokens)[0].tolist() == np.argsort(-probs, kind="stable")[:3].tolist()


def test_rows_keep_their_own_grammar_state_in_a_batch():
    x = logits(6, B=2)
    grammar_row = with_grammar(SamplingParams(temperature=0.9, seed=5))
    plain_row = SamplingParams(temperature=0.9, seed=6)
    together = Sampler([grammar_row, plain_row], TABLE)
    alone = [Sampler(grammar_row, TABLE), Sampler(plain_row)]
    for _ in range(3):
        both = together.sample(x).tolist()
        assert both == [alone[0].sample(x[:1]).item(), alone[1].sample(x[1:]).item()]
    # A row that leaves the batch, and joins another one, goes on where it was.
    moved = Sampler.concat([Sampler([plain_row]), together.select([0])])
    assert moved.sample(x[::-1]).tolist()[1] == alone[0].sample(x[:1]).item()


def test_mask_first_rows_draw_the_same_tokens_alone_and_beside_other_rows():
    # Alone, a mask-first batch makes one draw from the masked distribution; beside a row
    # without a grammar, the batch draws unconstrained first and the row draws again.
    first = with_grammar(SamplingParams(top_k=20, temperature=1.5, seed=4), grammar_first=True)
    plain = SamplingParams(top_k=20, temperature=1.5, seed=5)
    alone, beside = Sampler(first, TABLE), Sampler([first, plain], TABLE)
    xs = [logits(200 + step, B=2) for step in range(30)]
    tokens = [(alone.sample(x[:1]).item(), beside.sample(x).tolist()[0]) for x in xs]
    assert all(a == b for a, b in tokens)
    assert len({a for a, _ in tokens}) > 3


def test_grammar_rows_leave_the_other_rows_on_their_own_path(monkeypatch):
    """Beside grammar rows, rows without one skip the up-front checks (only the grammar
    rows go through them) and draw what they draw alone; an error names its row's place
    in the whole batch."""
    sizes = []
    checked = Sampler._checked

    def spy(self, x, history, rows):
        sizes.append(x.shape[0])
        return checked(self, x, history, rows)

    monkeypatch.setattr(Sampler, "_checked", spy)
    params = [SamplingParams(temperature=0.9, seed=1), with_grammar(SamplingParams(temperature=0.9, seed=2)),
              SamplingParams(min_p=0.1, temperature=0.7, seed=3),
              with_grammar(SamplingParams(temperature=1.2, seed=4), grammar_first=True)]
    batch, alone = Sampler(params, TABLE), [Sampler(p, TABLE) for p in params]
    for step in range(4):
        x = logits(300 + step, B=4)
        sizes.clear()
        got = batch.sample(x).tolist()
        assert sizes == [2]
        assert got == [a.sample(x[b:b + 1]).item() for b, a in enumerate(alone)]
    stuck = params[:3] + [SamplingParams(grammar=Grammar.from_gbnf('root ::= "z"'))]
    with pytest.raises(ValueError, match="row 3: the grammar allows no token here"):
        Sampler(stuck, TABLE).sample(logits(0, B=4))
    nan = mx.where(mx.arange(4)[:, None] == 2, math.nan, logits(0, B=4))
    with pytest.raises(ValueError, match="row 2: the logits have no finite value"):
        Sampler(params, TABLE).sample(nan)


def test_few_candidates_are_checked_one_by_one_without_a_mask():
    """With top-k 5 a mask-first row checks its five candidates' bytes and builds no mask;
    its distribution is still the renormalised one. When none of them is allowed the whole
    mask is built, for the chain to run again on the masked logits."""
    params = with_grammar(SamplingParams(top_k=5, temperature=0.8), grammar_first=True)
    matcher = TokenMatcher.get(GRAMMAR, TABLE)
    x = logits(11)
    ok = allowed()
    top5 = np.argsort(-np.array(x[0]))[:5]
    assert ok[top5].any() and not ok[top5].all()
    matcher._masks.clear()
    built = matcher.stats.masks
    got = np.array(Sampler(params, TABLE).distribution(x)[0])
    assert matcher.stats.masks == built  # no mask
    keep = np.zeros(V, dtype=bool)
    keep[top5] = ok[top5]
    p = np.exp(np.array(x[0]) / 0.8 - np.max(np.array(x[0])[keep]) / 0.8) * keep
    np.testing.assert_allclose(got, p / p.sum(), rtol=1e-5, atol=1e-7)
    # No allowed candidate: the whole mask, and top-k on the allowed tokens.
    bias = {int(t): -50.0 for t in np.flatnonzero(ok)}
    worse = with_grammar(SamplingParams(top_k=5, temperature=0.8, logit_bias=bias), grammar_first=True)
    got = np.array(Sampler(worse, TABLE).distribution(x)[0])
    assert matcher.stats.masks == built + 1
    assert np.all(got[~ok] == 0) and np.count_nonzero(got) == 5


def test_shared_params_give_every_row_its_own_state():
    table = TokenTable([b"<eos>", b"a", b"b"], eos_token_ids=[0])
    s = Sampler(SamplingParams(temperature=0.0, grammar=Grammar.from_gbnf('root ::= "a" "b"')), table)
    x = mx.array([[0.0, 5.0, 1.0], [0.0, 5.0, 1.0]])
    assert s.sample(x).tolist() == [1, 1]
    assert s.sample(x).tolist() == [2, 2]
    assert s.sample(x).tolist() == [0, 0]


def test_generated_text_follows_the_grammar():
    s = Sampler(with_grammar(SamplingParams(temperature=1.5, seed=9)), TABLE)
    text = b""
    for step in range(40):
        token = s.sample(logits(100 + step)).item()
        if token == EOS:
            break
        text += TOKENS[token]
    assert token == EOS and GRAMMAR.accepts(text.decode())


def test_grammar_errors():
    with pytest.raises(ValueError, match="grammar must be a tiny_llm.constrain.Grammar .* got str"):
        SamplingParams(grammar='root ::= "a"')
    with pytest.raises(ValueError, match="grammar_first must be True or False, got 1"):
        SamplingParams(grammar=GRAMMAR, grammar_first=1)
    with pytest.raises(ValueError, match="grammar does not combine with mirostat=2"):
        SamplingParams(grammar=GRAMMAR, mirostat=2)
    with pytest.raises(ValueError, match="grammar needs the vocabulary: pass tokenizer="):
        Sampler(SamplingParams(grammar=GRAMMAR))


def test_a_grammar_no_token_can_follow_is_an_error():
    s = Sampler(SamplingParams(grammar=Grammar.from_gbnf('root ::= "z"')), TABLE)
    with pytest.raises(ValueError, match="row 0: the grammar allows no token here"):
        s.sample(logits(0))


def test_allowed_tokens_all_at_minus_infinity_is_an_error():
    mask = allowed()
    bias = {int(t): -math.inf for t in np.flatnonzero(mask)}
    s = Sampler(with_grammar(SamplingParams(logit_bias=bias)), TABLE)
    with pytest.raises(ValueError, match="row 0: every token the grammar allows has logit -inf"):
        s.sample(logits(0))


# A vocabulary larger than the fast path's window: 3,000 tokens of 1-4 letters and braces.
_big = np.random.default_rng(4)
BIG_TOKENS = [b"<eos>"] + [bytes(_big.choice(list(b"abcdexyz{}"), size=_big.integers(1, 5)).tolist())
                           for _ in range(2999)]
BIG_TABLE = TokenTable(BIG_TOKENS, eos_token_ids=[EOS])
BIG_V = len(BIG_TOKENS)


@pytest.mark.parametrize("first", [False, True])
@pytest.mark.parametrize("chain", [
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    dict(temperature=0.7, top_k=300, top_p=0.8, order="hf"),
    dict(temperature=1.5, top_k=300, order="hf"),
    dict(temperature=1.2, top_k=20, repetition_penalty=1.3, presence_penalty=0.4),
    dict(top_k=10, top_p=0.9, order="mlx-lm"),
])
def test_window_draws_the_constrained_tokens_of_the_full_path(chain, first, monkeypatch):
    """Grammar rows cut by top-k draw through the fast path's window: the grammar checks
    only the window's candidates. Seeded draws, step after step (the grammar advancing),
    give the same tokens as with the window switched off (the chain and the mask over the
    whole vocabulary). Some steps keep allowed candidates, some keep none (the chain runs
    again on the masked logits), some tie across the window's edge (the full path answers),
    and every token is allowed."""
    grammar = Grammar.from_gbnf('root ::= ([abcx] | "{" [ab]* "}")* "y"')
    params = [SamplingParams(seed=s, grammar=grammar, grammar_first=first, **chain) for s in (1, 2, 3)]
    rng = np.random.default_rng(5)
    steps = [rng.normal(0, 3, (3, BIG_V)).astype(np.float32) for _ in range(25)]
    for x in steps[::3]:  # push the likely tokens out of the grammar: the masked re-run
        x[:, [t for t, b in enumerate(BIG_TOKENS) if b and b[:1] in (b"d", b"e", b"z")]] += 6.0
    for x in steps[1::4]:  # whole numbers: ties across the window's edge send top-k 300 to the full path
        x[:] = np.round(x)
    history = [[7, 8, 9], [], [100, 100]]
    found = []
    window_draw = Sampler._window_grammar_draw

    def spy(self, *args):
        got, rest = window_draw(self, *args)
        found.append(len(got))
        return got, rest

    def run():
        sampler, tokens, state = Sampler(params, BIG_TABLE), [], None
        matcher = TokenMatcher.get(grammar, BIG_TABLE)
        for x in steps:
            states = [r.grammar_at() for r in sampler._rows]
            step = sampler.sample(mx.array(x), history).tolist()
            assert all(matcher.allows(s, t) for s, t in zip(states, step))
            tokens.append(step)
        return tokens

    monkeypatch.setattr(Sampler, "_window_grammar_draw", spy)
    windowed = run()
    assert sum(found) > 25  # most draws went through the window
    monkeypatch.setattr(Sampler, "_window_grammar_draw", lambda self, x, hist, rows, redo, u: ({}, redo))
    assert run() == windowed
