"""Each sampling stage alone on tiny hand-made distributions, with exact expected
probabilities derived by hand in each test (the derivation is in the comments).

`token_distribution(logits, params)` with only the stage under test switched on must return
the renormalised distribution over the survivors, with excluded tokens exactly 0.0.
Logits are often written as `log(p)` so that the untouched distribution is `p` itself.
"""

import math

import mlx.core as mx
import numpy as np
import pytest
from conftest import word_tokenizer

from tiny_llm.sampler import Sampler, SamplingParams, token_distribution

LN = np.log
INF = math.inf
P4 = [0.5, 0.3, 0.15, 0.05]  # a distribution with well-separated masses


def as_logits(rows) -> mx.array:
    x = np.asarray(rows, dtype=np.float32)
    if x.ndim == 1:
        x = x[None]
    return mx.array(x)


def dist(logits, history=None, **params) -> np.ndarray:
    """`token_distribution` of one row (1-D logits) or several (2-D) with these params, as
    numpy; checks the contract every result must meet: float32, the logits' shape, rows
    summing to 1."""
    arr = np.asarray(logits, dtype=np.float32)
    x = as_logits(arr)
    out = token_distribution(x, SamplingParams(**params), history)
    assert out.dtype == mx.float32
    assert tuple(out.shape) == tuple(x.shape)
    out = np.array(out)
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, atol=1e-6)
    return out[0] if arr.ndim == 1 else out


def check(got, weights):
    """`got` equals `weights` normalised (atol 1e-6); tokens of weight 0 are exactly 0.0."""
    w = np.asarray(weights, dtype=np.float64)
    expected = w / w.sum()
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
    zero = expected == 0
    assert np.all(np.asarray(got)[zero] == 0.0), f"excluded tokens not exactly 0: {got}"


# --------------------------------------------------------------------------- no stage at all


def test_no_stage_is_plain_softmax():
    """With every stage off the distribution is softmax(logits)."""
    check(dist(LN(P4)), P4)
    check(dist([0.0, 1.0, 2.0]), np.exp([0.0, 1.0, 2.0]))


# --------------------------------------------------------------------------- logit bias


def test_logit_bias_added_and_minus_inf_excludes():
    """Bias is added to the logits: zeros + {1: ln 3, 2: -inf} -> weights [1, 3, 0, 1]."""
    check(dist([0.0, 0.0, 0.0, 0.0], logit_bias={1: math.log(3.0), 2: -INF}), [1, 3, 0, 1])


def test_logit_bias_runs_before_filters():
    """Bias comes before top-k: [5, 0, 0, 0] + {3: 10} gives token 3 the top logit (10)."""
    check(dist([5.0, 0.0, 0.0, 0.0], logit_bias={3: 10.0}, top_k=1), [0, 0, 0, 1])


def test_logit_bias_per_row_params():
    """With a list of params each row gets its own bias."""
    s = Sampler([SamplingParams(logit_bias={0: math.log(3.0)}), SamplingParams(logit_bias={2: -INF})])
    got = np.array(s.distribution(as_logits([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])))
    check(got[0], [3, 1, 1])
    check(got[1], [1, 1, 0])


# --------------------------------------------------------------------------- min_tokens


def test_min_tokens_suppresses_eos_then_releases():
    """EOS (id 0) gets -inf until the row has sampled min_tokens=2 tokens with this Sampler;
    after two draws the plain softmax is back; reset() suppresses it again."""
    logits = as_logits([5.0, 0.0, 0.0, 0.0])
    s = Sampler(SamplingParams(min_tokens=2, eos_token_ids=(0,), seed=3))
    suppressed, free = [0, 1, 1, 1], np.exp([5.0, 0.0, 0.0, 0.0])
    check(np.array(s.distribution(logits))[0], suppressed)
    t1 = int(s.sample(logits)[0])
    assert t1 != 0
    check(np.array(s.distribution(logits))[0], suppressed)  # one token sampled: 1 < 2
    t2 = int(s.sample(logits)[0])
    assert t2 != 0
    check(np.array(s.distribution(logits))[0], free)  # two sampled: released
    s.reset()
    check(np.array(s.distribution(logits))[0], suppressed)


def test_min_tokens_counts_sampled_tokens_not_history():
    """A long history (prompt) does not count towards min_tokens: only sampled tokens do."""
    s = Sampler(SamplingParams(min_tokens=1, eos_token_ids=(0,)))
    got = np.array(s.distribution(as_logits([5.0, 0.0, 0.0, 0.0]), history=[[1, 2, 3] * 10]))
    check(got[0], [0, 1, 1, 1])


def test_min_tokens_all_eos_ids_and_per_row():
    """Every id in eos_token_ids is suppressed; each row counts its own sampled tokens
    against its own min_tokens (row 0: 1, row 1: 3)."""
    logits = as_logits([[2.0, 1.0, 0.0, 2.0], [2.0, 1.0, 0.0, 2.0]])
    s = Sampler([
        SamplingParams(min_tokens=1, eos_token_ids=(0, 3), seed=1),
        SamplingParams(min_tokens=3, eos_token_ids=(0, 3), seed=2),
    ])
    suppressed = [0, math.e, 1, 0]  # exp of [-inf, 1, 0, -inf]
    got = np.array(s.distribution(logits))
    check(got[0], suppressed)
    check(got[1], suppressed)
    s.sample(logits)
    got = np.array(s.distribution(logits))
    check(got[0], np.exp([2.0, 1.0, 0.0, 2.0]))
    check(got[1], suppressed)


# --------------------------------------------------------------------------- penalties


def test_penalties_hand_example():
    """logits [2, -2, 1, 0], history [0, 1, 0], r=2, freq 0.5, pres 0.25:
    token 0 (count 2): 2/2 - 2*0.5 - 0.25 = -0.25; token 1 (count 1): -2*2 - 0.5 - 0.25 = -4.75;
    tokens 2, 3 unchanged."""
    got = dist([2.0, -2.0, 1.0, 0.0], history=[[0, 1, 0]],
               repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    check(got, np.exp([-0.25, -4.75, 1.0, 0.0]))


def test_repetition_penalty_divides_positive_multiplies_non_positive():
    """r=1.5 on history {0, 1, 2}: 1.5/1.5 = 1; -1*1.5 = -1.5; 0*1.5 = 0; token 3 untouched."""
    got = dist([1.5, -1.0, 0.0, 3.0], history=[[0, 1, 2]], repetition_penalty=1.5)
    check(got, np.exp([1.0, -1.5, 0.0, 3.0]))


def test_penalty_last_n_window():
    """Only the last penalty_last_n history tokens count: window 1 of [0, 1, 0] is [0], so
    token 0: 2/2 - 0.5 - 0.25 = 0.25 and token 1 is untouched; window 0 changes nothing."""
    kw = dict(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    logits = [2.0, -2.0, 1.0, 0.0]
    check(dist(logits, history=[[0, 1, 0]], penalty_last_n=1, **kw), np.exp([0.25, -2.0, 1.0, 0.0]))
    check(dist(logits, history=[[0, 1, 0]], penalty_last_n=0, **kw), np.exp(logits))


def test_penalty_last_n_default_64_and_all():
    """History: ten 3s then sixty 2s; frequency 0.01. Default window (64) sees four 3s:
    token 3: 0 - 0.04, token 2: 1 - 0.6. penalty_last_n=-1 sees all ten 3s: token 3: -0.1."""
    history = [[3] * 10 + [2] * 60]
    logits = [0.5, 0.0, 1.0, 0.0]
    check(dist(logits, history=history, frequency_penalty=0.01), np.exp([0.5, 0.0, 0.4, -0.04]))
    check(dist(logits, history=history, frequency_penalty=0.01, penalty_last_n=-1),
          np.exp([0.5, 0.0, 0.4, -0.1]))


def test_penalties_per_row_history_and_none():
    """Each row is penalised by its own history only (no union over rows); no history = none."""
    logits = [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    got = dist(logits, history=[[0], [1, 1]], presence_penalty=1.0)
    check(got[0], np.exp([0.0, 1.0, 1.0]))
    check(got[1], np.exp([1.0, 0.0, 1.0]))
    check(dist(logits, presence_penalty=1.0)[1], [1, 1, 1])


# --------------------------------------------------------------------------- DRY

DRY = dict(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=2, dry_sequence_breakers=())


def test_dry_hand_example():
    """History [1,2,3,4,1,2,3]: the suffix [1,2,3] occurred before, followed by 4, so n = 3 and
    token 4 gets -1 * 2**(3-2) = -2. No other token extends a repeat of length >= 2."""
    got = dist(np.zeros(6), history=[[1, 2, 3, 4, 1, 2, 3]], **DRY)
    check(got, np.exp([0, 0, 0, 0, -2.0, 0]))


def test_dry_multiplier_base_allowed_length():
    """Same history (n = 3): multiplier 0.5, base 1.75 -> -0.875; allowed_length 3 ->
    -1 * 2**0 = -1; allowed_length 4 > n -> nothing; allowed_length 1 -> -2**2 = -4."""
    h = [[1, 2, 3, 4, 1, 2, 3]]
    z = np.zeros(6)
    check(dist(z, history=h, **{**DRY, "dry_multiplier": 0.5, "dry_base": 1.75}),
          np.exp([0, 0, 0, 0, -0.875, 0]))
    check(dist(z, history=h, **{**DRY, "dry_allowed_length": 3}), np.exp([0, 0, 0, 0, -1.0, 0]))
    check(dist(z, history=h, **{**DRY, "dry_allowed_length": 4}), np.ones(6))
    check(dist(z, history=h, **{**DRY, "dry_allowed_length": 1}), np.exp([0, 0, 0, 0, -4.0, 0]))


def test_dry_breaker_stops_the_match():
    """Breaker (2,) in [1,2,3,4,1,2,3]: the suffix after the last breaker is [3], n = 1 < 2,
    so nothing is penalised."""
    got = dist(np.zeros(6), history=[[1, 2, 3, 4, 1, 2, 3]], **{**DRY, "dry_sequence_breakers": [(2,)]})
    check(got, np.ones(6))


def test_dry_breaker_inside_the_repeat():
    """History [5,1,2,3,4,5,1,2,3]. Without breakers the suffix [5,1,2,3] repeats -> n = 4,
    token 4 gets -2**(4-2) = -4. With breaker (1,) the match stops after the last 1: suffix
    [2,3], which occurred before followed by 4 -> n = 2, token 4 gets -2**0 = -1."""
    h = [[5, 1, 2, 3, 4, 5, 1, 2, 3]]
    check(dist(np.zeros(6), history=h, **DRY), np.exp([0, 0, 0, 0, -4.0, 0]))
    check(dist(np.zeros(6), history=h, **{**DRY, "dry_sequence_breakers": [(1,)]}),
          np.exp([0, 0, 0, 0, -1.0, 0]))


def test_dry_string_breaker_uses_the_tokenizer():
    """A string breaker is encoded with the Sampler's tokenizer: "b" is token 2 in the word
    tokenizer, so it behaves like breaker (2,) (no penalty), while without it token 4 gets -2."""
    h = [[1, 2, 3, 4, 1, 2, 3]]
    logits = as_logits(np.zeros(8))
    with_b = Sampler(SamplingParams(**{**DRY, "dry_sequence_breakers": ("b",)}), tokenizer=word_tokenizer())
    check(np.array(with_b.distribution(logits, history=h))[0], np.ones(8))
    with_g = Sampler(SamplingParams(**{**DRY, "dry_sequence_breakers": ("g",)}), tokenizer=word_tokenizer())
    check(np.array(with_g.distribution(logits, history=h))[0], np.exp([0, 0, 0, 0, -2.0, 0, 0, 0]))


def test_dry_longest_match_with_overlap():
    """History [7,7,7,7]: candidate 7 after position 3 is preceded by [7,7,7] = the last three
    tokens, so n = 3 and token 7 gets -2**(3-2) = -2."""
    check(dist(np.zeros(8), history=[[7, 7, 7, 7]], **DRY), np.exp([0] * 7 + [-2.0]))


def test_dry_penalty_last_n_window():
    """dry_penalty_last_n=6 of [1,2,3,4,1,2,3] is [2,3,4,1,2,3]: n = 2 for token 4 (-1);
    window 4 is [4,1,2,3]: no earlier occurrence of the suffix, no penalty."""
    h = [[1, 2, 3, 4, 1, 2, 3]]
    check(dist(np.zeros(6), history=h, **{**DRY, "dry_penalty_last_n": 6}), np.exp([0, 0, 0, 0, -1.0, 0]))
    check(dist(np.zeros(6), history=h, **{**DRY, "dry_penalty_last_n": 4}), np.ones(6))


# --------------------------------------------------------------------------- top-n-sigma


def test_top_n_sigma_hand_computed():
    """logits [4,3,2,1,0]: max 4, population std sqrt(2) = 1.4142.
    n=1: threshold 2.586 keeps {4,3}; n=1.5: 1.879 keeps {4,3,2}; n=0.5: 3.293 keeps {4};
    n=3: -0.243 keeps all."""
    x = [4.0, 3.0, 2.0, 1.0, 0.0]
    e = np.exp(x)
    check(dist(x, top_n_sigma=1.0), e * [1, 1, 0, 0, 0])
    check(dist(x, top_n_sigma=1.5), e * [1, 1, 1, 0, 0])
    check(dist(x, top_n_sigma=0.5), e * [1, 0, 0, 0, 0])
    check(dist(x, top_n_sigma=3.0), e)


def test_top_n_sigma_ignores_excluded_logits():
    """Only finite logits count: [4,3,2,-inf] has mean 3 and std sqrt(2/3) = 0.8165.
    n=1: threshold 3.18 keeps {4}; n=1.5: 2.78 keeps {4,3}."""
    x = [4.0, 3.0, 2.0, -INF]
    check(dist(x, top_n_sigma=1.0), [1, 0, 0, 0])
    check(dist(x, top_n_sigma=1.5), [math.exp(4), math.exp(3), 0, 0])


# --------------------------------------------------------------------------- top-k


def test_top_k_keeps_ties():
    """[1,3,2,3,0]: k=1 keeps both 3s (ties); k=2 as well (2nd largest is 3); k=3 adds 2."""
    x = [1.0, 3.0, 2.0, 3.0, 0.0]
    check(dist(x, top_k=1), [0, 1, 0, 1, 0])
    check(dist(x, top_k=2), [0, 1, 0, 1, 0])
    check(dist(x, top_k=3), np.exp(x) * [0, 1, 1, 1, 0])


def test_top_k_boundaries():
    """k=1 without ties is the argmax; k = V and k > V are no-ops."""
    x = [0.5, 2.0, 1.0, -1.0, 0.0]
    check(dist(x, top_k=1), [0, 1, 0, 0, 0])
    check(dist(x, top_k=5), np.exp(x))
    check(dist(x, top_k=100), np.exp(x))


def test_top_k_counts_only_candidates():
    """NaN and -inf are not candidates: [1, nan, 2, -inf] has 2, so k=2 is a no-op and k=1
    keeps token 2."""
    x = [1.0, math.nan, 2.0, -INF]
    check(dist(x, top_k=2), [math.e, 0, math.e**2, 0])
    check(dist(x, top_k=1), [0, 0, 1, 0])


# --------------------------------------------------------------------------- typical


def test_typical_p_can_drop_the_most_likely_token():
    """p = [1/2, 1/4, 1/8, 1/8]: H = 1.75 ln2; -ln p = 1, 2, 3, 3 (x ln2), so the scores are
    0.75, 0.25, 1.25, 1.25 (x ln2) and the order is 1, 0, {2, 3}.
    typical_p=0.2: token 1 (mass before 0) kept, token 0 (before 0.25 > 0.2) dropped.
    typical_p=0.5: tokens 1, 0 (before 0.25 <= 0.5); token 2 (before 0.75) dropped.
    typical_p=0: only the first in score order (token 1)."""
    p = [0.5, 0.25, 0.125, 0.125]
    check(dist(LN(p), typical_p=0.2), [0, 1, 0, 0])
    check(dist(LN(p), typical_p=0.5), [0.5, 0.25, 0, 0])
    check(dist(LN(p), typical_p=0.0), [0, 1, 0, 0])


def test_typical_p_keeps_score_ties():
    """Same p, typical_p=0.8: token 2 has mass 0.75 before it (kept); token 3 has 0.875 but
    the same score as token 2, so it is kept too: nothing is dropped."""
    p = [0.5, 0.25, 0.125, 0.125]
    check(dist(LN(p), typical_p=0.8), p)


def test_typical_p_dominant_token():
    """p = [0.9, 0.05, 0.05]: H = 0.3944; scores 0.289, 2.601, 2.601. typical_p=0.5 keeps only
    the dominant token; typical_p=0.95 adds token 1 (before 0.9 <= 0.95) and its tie token 2."""
    p = [0.9, 0.05, 0.05]
    check(dist(LN(p), typical_p=0.5), [1, 0, 0])
    check(dist(LN(p), typical_p=0.95), p)


# --------------------------------------------------------------------------- top-p


def test_top_p_smallest_prefix_reaching_p():
    """p = [.5,.3,.15,.05]: masses before each token 0, .5, .8, .95. top_p=0.75 keeps two,
    0.85 keeps three, 0.99 keeps all."""
    check(dist(LN(P4), top_p=0.75), [0.5, 0.3, 0, 0])
    check(dist(LN(P4), top_p=0.85), [0.5, 0.3, 0.15, 0])
    check(dist(LN(P4), top_p=0.99), P4)


def test_top_p_boundaries():
    """top_p=0 keeps only the top token; top_p=1 is off; top_p=0 keeps ties of the top."""
    check(dist(LN(P4), top_p=0.0), [1, 0, 0, 0])
    check(dist(LN(P4), top_p=1.0), P4)
    check(dist([2.0, 2.0, 1.0], top_p=0.0), [1, 1, 0])


def test_top_p_keeps_ties_of_last_kept():
    """p = [.4,.2,.2,.2]: top_p=0.5 reaches the tied 0.2s (before .4 < .5), so all three ties
    are kept; top_p=0.3 stops after token 0."""
    p = [0.4, 0.2, 0.2, 0.2]
    check(dist(LN(p), top_p=0.5), p)
    check(dist(LN(p), top_p=0.3), [1, 0, 0, 0])


def test_top_p_renormalises_over_candidates():
    """Bias -inf on token 0 leaves [.3,.15,.05] -> renormalised [.6,.3,.1]; top_p=0.75:
    before-masses 0, .6 (< .75), .9 -> tokens 1, 2 kept. (Without renormalising, the masses
    .3, .45 < .75 would also keep token 3.)"""
    check(dist(LN(P4), top_p=0.75, logit_bias={0: -INF}), [0, 0.3, 0.15, 0])


# --------------------------------------------------------------------------- min-p


def test_min_p():
    """p = [.5,.3,.15,.05]: min_p=0.5 -> threshold .25 keeps {.5,.3}; 0.2 -> .1 keeps three;
    0.05 -> .025 keeps all."""
    check(dist(LN(P4), min_p=0.5), [0.5, 0.3, 0, 0])
    check(dist(LN(P4), min_p=0.2), [0.5, 0.3, 0.15, 0])
    check(dist(LN(P4), min_p=0.05), P4)


def test_min_p_one_keeps_max_and_ties():
    """min_p=1 keeps exactly the tokens with the max probability."""
    check(dist([1.0, 2.0, 2.0, 0.0], min_p=1.0), [0, 1, 1, 0])
    check(dist(LN(P4), min_p=1.0), [1, 0, 0, 0])


def test_min_p_relative_to_candidates():
    """After bias -inf on token 0 the max is .3: min_p=0.4 -> threshold .12 keeps {.3,.15}."""
    check(dist(LN(P4), min_p=0.4, logit_bias={0: -INF}), [0, 0.3, 0.15, 0])


# --------------------------------------------------------------------------- XTC

XTC = dict(xtc_probability=1.0)


def test_xtc_one_token_over_threshold_is_no_op():
    """p = [.5,.3,.15,.05], threshold .4: only token 0 is over it -> nothing changes."""
    check(dist(LN(P4), xtc_threshold=0.4, **XTC), P4)


def test_xtc_two_tokens_over_threshold():
    """Threshold .25: tokens 0 and 1 are over it; all but the least probable (token 1) go."""
    check(dist(LN(P4), xtc_threshold=0.25, **XTC), [0, 0.3, 0.15, 0.05])


def test_xtc_many_tokens_over_threshold():
    """Threshold .1: tokens 0, 1, 2 are over it -> 0 and 1 go; threshold .01: all four are
    over it -> only the least probable (token 3) stays."""
    check(dist(LN(P4), xtc_threshold=0.1, **XTC), [0, 0, 0.15, 0.05])
    check(dist(LN(P4), xtc_threshold=0.01, **XTC), [0, 0, 0, 1])


def test_xtc_keeps_ties_of_least_probable():
    """p = [.4,.25,.25,.1], threshold .2: over it are 0, 1, 2; the least probable (.25) has a
    tie, so only token 0 goes."""
    p = [0.4, 0.25, 0.25, 0.1]
    check(dist(LN(p), xtc_threshold=0.2, **XTC), [0, 0.25, 0.25, 0.1])


def test_xtc_none_over_threshold_and_disabled_above_half():
    """Ten tokens of .1 with threshold .2: none over it, nothing changes. A threshold above 0.5
    switches XTC off even with probability 1."""
    check(dist(np.zeros(10), xtc_threshold=0.2, **XTC), np.ones(10))
    check(dist(LN(P4), xtc_threshold=0.6, **XTC), P4)


def test_xtc_renormalises_over_candidates():
    """Bias -inf on token 0: [.6,.3,.1] renormalised; threshold .25 -> tokens 1 and 2 are over
    it, token 1 goes, tokens 2, 3 stay. (Unrenormalised, only .3 would be over .25.)"""
    check(dist(LN(P4), xtc_threshold=0.25, logit_bias={0: -INF}, **XTC), [0, 0, 0.15, 0.05])


def test_xtc_token_exactly_at_the_threshold_is_a_top_choice_in_every_xtc():
    """Logits [log 2, 0, 0] give p = [.5, .25, .25] exactly in float32; threshold .25 (exact
    too). llama.cpp counts p >= threshold as a top choice: all three are, the least likely
    (.25, with its tie) stay and token 0 goes; the engine's stage and the shared mask make
    that cut. mlx-lm compares with a strict >: only .5 is above .25 and one top choice is
    never cut, so its `apply_xtc` and our facade's keep every token."""
    from mlx_lm.sample_utils import apply_xtc as mlx_lm_apply_xtc

    from tiny_llm.sampler import apply_xtc, filters, stages

    x = as_logits([math.log(2.0), 0.0, 0.0])
    probs = mx.softmax(x, axis=-1)
    assert probs.tolist() == [[0.5, 0.25, 0.25]] == stages.softmax(x).tolist()
    assert filters.xtc_above(probs, 0.25).tolist() == [[True, True, True]]
    assert filters.xtc_mask(probs, 0.25).tolist() == [[True, False, False]]
    assert stages.xtc(x, mx.array([[0.25]]), mx.array([[True]])).tolist() == [[-INF, 0.0, 0.0]]
    assert filters.xtc_mask(probs, 0.25, strict=True).tolist() == [[False, False, False]]
    assert apply_xtc(x, 1.0, 0.25, []).tolist() == mlx_lm_apply_xtc(x, 1.0, 0.25, []).tolist() == x.tolist()
    check(dist([math.log(2.0), 0.0, 0.0], xtc_threshold=0.25, **XTC), [0, 0.25, 0.25])


# --------------------------------------------------------------------------- temperature


def test_temperature_zero_is_greedy_lowest_index_on_ties():
    """T=0: one-hot at the argmax; with tied maxima (tokens 1 and 2) the lowest index wins."""
    check(dist([1.0, 3.0, 3.0, 2.0], temperature=0.0), [0, 1, 0, 0])
    check(dist([0.5, 2.0, 2.0, 1.0], temperature=0.0), [0, 1, 0, 0])


def test_negative_temperature_is_refused():
    """Greedy is spelled temperature=0; a negative temperature (greedy in llama.cpp) is a
    ValueError here, so that a sign slip does not silently turn sampling off."""
    with pytest.raises(ValueError, match=r"temperature must be in \[0.0, inf\), got -1.0"):
        SamplingParams(temperature=-1.0)


def test_temperature_zero_over_candidates_only():
    """Greedy picks the argmax among the candidates: -inf bias or NaN on the max removes it."""
    check(dist([5.0, 1.0, 3.0], temperature=0.0, logit_bias={0: -INF}), [0, 0, 1])
    check(dist([math.nan, 1.0, 3.0], temperature=0.0), [0, 0, 1])


def test_temperature_scales_logits():
    """[0, ln2, ln4] / 0.5 = [0, ln4, ln16] -> weights 1, 4, 16; [0, ln4, ln16] / 2 -> 1, 2, 4."""
    check(dist([0.0, LN(2), LN(4)], temperature=0.5), [1, 4, 16])
    check(dist([0.0, LN(4), LN(16)], temperature=2.0), [1, 2, 4])


def test_dynamic_temperature_hand_computed():
    """p = [1/2,1/4,1/8,1/8]: H = 1.75 ln2, log N = 2 ln2, H_norm = 0.875 (the -inf token
    is not a candidate, so N = 4).
    T=1, range .5 (min .5, max 1.5), exponent 1: T_dyn = .5 + 1 * .875 = 1.375.
    Exponent 2: .5 + .875**2 = 1.265625. Exponent 0: H_norm**0 = 1 -> 1.5.
    T=.3, range .5: min_t = max(0, -.2) = 0, max_t = .8 -> T_dyn = .8 * .875 = .7.
    logits log p / T_dyn -> weights p ** (1 / T_dyn)."""
    p = np.array([0.5, 0.25, 0.125, 0.125, 0.0])
    x = [*LN(p[:4]), -INF]
    check(dist(x, temperature=1.0, dynatemp_range=0.5), p ** (1 / 1.375))
    check(dist(x, temperature=1.0, dynatemp_range=0.5, dynatemp_exponent=2.0), p ** (1 / 1.265625))
    check(dist(x, temperature=1.0, dynatemp_range=0.5, dynatemp_exponent=0.0), p ** (1 / 1.5))
    check(dist(x, temperature=0.3, dynatemp_range=0.5), p ** (1 / 0.7))


def test_dynamic_temperature_single_candidate_unchanged():
    """One candidate: the distribution is one-hot whatever the temperature."""
    check(dist([-INF, 2.0, -INF], temperature=0.7, dynatemp_range=0.5), [0, 1, 0])


# --------------------------------------------------------------------------- bad logits


def test_nan_logits_excluded():
    """NaN logits are excluded: [nan, 0, ln3] -> [0, 1/4, 3/4], per row."""
    got = dist([[math.nan, 0.0, LN(3)], [0.0, 0.0, math.nan]])
    check(got[0], [0, 1, 3])
    check(got[1], [1, 1, 0])


def test_row_without_finite_logit_raises():
    """A row of all -inf (or all NaN) raises ValueError naming the row."""
    with pytest.raises(ValueError, match="row"):
        dist([-INF, -INF, -INF])
    with pytest.raises(ValueError, match="row 2"):
        dist([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0], [-INF, -INF, -INF]])
    with pytest.raises(ValueError, match="row 1"):
        dist([[0.0, 1.0, 2.0], [math.nan, math.nan, math.nan], [1.0, 1.0, 1.0]])


# --------------------------------------------------------------------------- mirostat

P5 = [0.4, 0.3, 0.15, 0.1, 0.05]  # surprises (bits): 1.32, 1.74, 2.74, 3.32, 4.32
P5_LOGITS = [*LN(P5), -INF, -INF, -INF]  # V = 8


def test_mirostat_v2_truncation_and_mu_update():
    """tau=2 -> mu = 4 bits: token 4 (4.32 bits) goes -> [.4,.3,.15,.1]/.95.
    After a draw from 8 equal candidates (surprise 3 bits, eta 1): mu = 4 - (3 - 2) = 3, so
    token 3 (3.32 bits) goes as well. reset() restores mu = 4. A draw from a single candidate
    (surprise 0) raises mu to 4 + 2 = 6 > 4.32: nothing is cut."""
    s = Sampler(SamplingParams(mirostat=2, mirostat_tau=2.0, mirostat_eta=1.0, seed=5))
    x = as_logits(P5_LOGITS)
    check(np.array(s.distribution(x))[0], [*P5[:4], 0, 0, 0, 0])
    s.sample(as_logits(np.zeros(8)))
    check(np.array(s.distribution(x))[0], [*P5[:3], 0, 0, 0, 0, 0])
    s.reset()
    check(np.array(s.distribution(x))[0], [*P5[:4], 0, 0, 0, 0])
    assert int(s.sample(as_logits([-INF, -INF, 1.0, -INF, -INF, -INF, -INF, -INF]))[0]) == 2
    check(np.array(s.distribution(x))[0], [*P5, 0, 0, 0])


def test_mirostat_v2_after_temperature_and_ignores_order_stages():
    """Mirostat runs temperature then its own truncation; top_k/top_p in the params are
    ignored. T=.5 squares p: [.16,.09,.0225,.01,.0025]/.285 = [.561,.316,.079,.035,.009];
    mu = 4 keeps p >= 1/16: the first three."""
    got = dist(P5_LOGITS, mirostat=2, mirostat_tau=2.0, temperature=0.5, top_k=1, top_p=0.1)
    check(got, [0.16, 0.09, 0.0225, 0, 0, 0, 0, 0])
    check(dist(P5_LOGITS, mirostat=2, mirostat_tau=2.0, temperature=0.0), [1, 0, 0, 0, 0, 0, 0, 0])


def mirostat_v1_k(p_sorted: np.ndarray, mu: float, n_vocab: int, m: int = 100) -> float:
    """llama.cpp's k for mirostat v1 (Zipf exponent estimated from the top m tokens)."""
    num = den = 0.0
    for i in range(min(m - 1, len(p_sorted) - 1)):
        t = math.log((i + 2) / (i + 1))
        num += t * math.log(p_sorted[i] / p_sorted[i + 1])
        den += t * t
    s_hat = num / den
    eps = s_hat - 1
    return ((eps * 2**mu) / (1 - n_vocab ** (-eps))) ** (1 / s_hat)


def test_mirostat_v1_zipf_hand_computed():
    """p_i ∝ (i+1)^-1.5 over V = 8 tokens: b_i = 1.5 t_i, so s_hat = 1.5 exactly, eps = .5.
    tau=2 (mu=4): k = (.5 * 16 / (1 - 8**-.5)) ** (1/1.5) = 12.375 ** (2/3) = 5.35 -> top 5.
    tau=1 (mu=2): k = 3.094 ** (2/3) = 2.12 -> top 2."""
    w = np.arange(1, 9, dtype=np.float64) ** -1.5
    x = LN(w / w.sum())
    assert int(mirostat_v1_k(w / w.sum(), 4.0, 8)) == 5  # the hand value above
    check(dist(x, mirostat=1, mirostat_tau=2.0), w * (np.arange(8) < 5))
    check(dist(x, mirostat=1, mirostat_tau=1.0), w * (np.arange(8) < 2))


def test_mirostat_v1_mu_update():
    """After a draw, mu -= eta * (-log2 p_chosen - tau), with p_chosen in the truncated,
    renormalised distribution; the next distribution keeps the top int(k(mu)) tokens.
    With eta = 1 every possible first token gives a distinct k (9, 4, 3, 2, 1; see
    the formula above), so this checks the update whichever token is drawn."""
    w = np.arange(1, 9, dtype=np.float64) ** -1.5
    p = w / w.sum()
    x = as_logits(LN(p))
    for seed in range(4):
        s = Sampler(SamplingParams(mirostat=1, mirostat_tau=2.0, mirostat_eta=1.0, seed=seed))
        first = np.array(s.distribution(x))[0]
        token = int(s.sample(x)[0])
        assert 0 <= token < 5 and first[token] > 0
        mu = 4.0 - (-math.log2(first[token]) - 2.0)
        k = mirostat_v1_k(p, mu, 8)
        assert abs(k - round(k)) > 0.05  # the test's own safety margin
        kept = max(int(k), 1)
        check(np.array(s.distribution(x))[0], w * (np.arange(8) < kept))
