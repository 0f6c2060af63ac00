"""The mlx-lm-compatible facade of `tiny_llm.sampler` against `mlx_lm.sample_utils`.

Same names, arguments and results as mlx-lm on seeded random inputs (for `make_sampler`,
the same tokens under the same seed, and its filter order on hand-made rows), hand-made exact
cases, the documented differences (ties kept by top-k, per-row histories in the penalties,
values mlx-lm accepts silently) and a clear `ValueError` for every bad argument.
"""

import inspect
import math
import re

import mlx.core as mx
import mlx_lm.sample_utils as ref
import numpy as np
import pytest

from tiny_llm import sampler as ours

# (B, V): one and four rows, vocabularies from 8 to 1000.
SHAPES = [(1, 8), (4, 8), (1, 100), (4, 1000)]
DTYPES = [mx.float32, mx.float16, mx.bfloat16]
# Unit roundoff (half an ulp of 1.0) of each dtype.
EPS = {mx.float32: 2.0**-24, mx.float16: 2.0**-11, mx.bfloat16: 2.0**-8}


def random_logits(shape, dtype=mx.float32, seed=0, scale=3.0) -> mx.array:
    """Seeded unnormalised logits `[B, V]` ~ N(0, scale^2), rounded to `dtype`."""
    return (mx.random.normal(shape, key=mx.random.key(seed)) * scale).astype(dtype)


def log_softmax(x: mx.array) -> mx.array:
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


# Bit pattern of -4.0 and the unsigned type of the same width.
_MINUS_FOUR = {
    mx.float32: (0xC0800000, mx.uint32), mx.float16: (0xC400, mx.uint16), mx.bfloat16: (0xC080, mx.uint16),
}


def distinct_logits(shape, dtype, seed) -> mx.array:
    """Rows of pairwise-distinct values in a random order per row.

    Consecutive bit patterns of a float are consecutive representable numbers, so
    `-4.0, next below, ...` gives V distinct values even in bfloat16 (where random normals
    of a 1000-token row always tie): top-k then has no tie to break.
    """
    ranks = mx.argsort(mx.random.uniform(shape=shape, key=mx.random.key(seed)), axis=-1)  # B, V
    base, utype = _MINUS_FOUR[dtype]
    return mx.view(ranks.astype(utype) + mx.array(base, utype), dtype)


def kth_largest_is_unique(x: mx.array, k: int) -> bool:
    """True when no other entry of any row equals that row's k-th largest value."""
    rows = np.array(x.astype(mx.float32))
    kth = -np.sort(-rows, axis=-1)[:, k - 1 : k]
    return bool(((rows == kth).sum(axis=-1) == 1).all())


def apply_all(processors, tokens, logits):
    for processor in processors:
        logits = processor(tokens, logits)
    return logits


def run_reference(processors, tokens, logits):
    """mlx-lm's processors assign into `logits` in place: give them their own copy."""
    return apply_all(processors, tokens, mx.array(logits))


def assert_close_after_repeated_subtraction(ours_out, ref_out, dtype, max_count):
    """Frequency penalty: mlx-lm subtracts `penalty` once per occurrence (`max_count`
    roundings), we subtract `count * penalty` once (two roundings), so the results differ
    by at most `max_count + 2` roundings at the largest magnitude involved."""
    a = np.array(ours_out.astype(mx.float32))
    b = np.array(ref_out.astype(mx.float32))
    bound = (max_count + 2) * EPS[dtype] * 2 * max(np.abs(a).max(), np.abs(b).max())
    np.testing.assert_allclose(a, b, rtol=0, atol=bound)


# ---------------------------------------------------------------------------------------------
# Filters: top-k, top-p, min-p, XTC


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_apply_top_k_matches_mlx_lm(shape, dtype):
    """apply_top_k equals mlx-lm's on rows without ties, for k from 1 to V - 1."""
    B, V = shape
    x = distinct_logits(shape, dtype, seed=V + B)
    for k in sorted({1, 3, V // 2, V - 1}):
        out = ours.apply_top_k(x, k)
        assert out.dtype == dtype
        assert mx.array_equal(out, ref.apply_top_k(x, k)), k
        assert (mx.isfinite(out).sum(axis=-1) == k).all().item()


@pytest.mark.parametrize("shape", SHAPES)
def test_apply_top_k_matches_mlx_lm_on_random_logprobs(shape):
    """apply_top_k equals mlx-lm's on float32 normal log-probabilities (checked tie-free)."""
    B, V = shape
    x = log_softmax(random_logits(shape, seed=11 + V))
    for k in sorted({1, 5 % V, V - 1}):
        assert kth_largest_is_unique(x, k)  # the premise of an exact comparison
        assert mx.array_equal(ours.apply_top_k(x, k), ref.apply_top_k(x, k)), k


def test_apply_top_k_keeps_every_token_tied_with_the_kth():
    """Ties at the k-th value are all kept (mlx-lm keeps exactly k, choosing among the ties)."""
    x = mx.array([[1.0, 3.0, 2.0, 3.0, 0.0, 2.0], [5.0, 4.0, 4.0, 4.0, 1.0, 0.0]])
    inf = -math.inf
    expected = mx.array([[inf, 3.0, 2.0, 3.0, inf, 2.0], [5.0, 4.0, 4.0, 4.0, inf, inf]])
    assert mx.array_equal(ours.apply_top_k(x, 3), expected)
    # The documented difference: mlx-lm keeps exactly k = 3 per row.
    assert mx.isfinite(ref.apply_top_k(x, 3)).sum(axis=-1).tolist() == [3, 3]


@pytest.mark.parametrize("normalised", [True, False], ids=["logprobs", "logits"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_apply_top_p_matches_mlx_lm(shape, dtype, normalised):
    """apply_top_p equals mlx-lm's for p from 1e-4 to 1, on log-probabilities and raw logits."""
    B, V = shape
    x = random_logits(shape, dtype, seed=21 + V + B)
    if normalised:
        x = log_softmax(x)
    for p in (1.0, 0.95, 0.5, 0.1, 1e-4):
        out = ours.apply_top_p(x, p)
        assert out.dtype == dtype
        assert mx.array_equal(out, ref.apply_top_p(x, p)), p
    # p = 1 keeps all but the least likely tokens whose mass is lost in the float32 rounding
    # of a V-term sum (at most about V * 2^-24 = 6e-5 for V = 1000); mlx-lm drops them too.
    kept = np.isfinite(np.array(ours.apply_top_p(x, 1.0).astype(mx.float32)))
    probs = np.exp(np.array(log_softmax(x.astype(mx.float32)), dtype=np.float64))
    assert (probs * ~kept).sum(axis=-1).max() < V * 2.0**-24
    assert (mx.isfinite(ours.apply_top_p(x, 1e-4)).sum(axis=-1) == 1).all().item()


def test_apply_top_p_exact_small_case():
    """Probabilities [0.5, 0.3, 0.2]: p = 0.6 keeps two tokens, p = 0.4 one, p = 0 only the argmax."""
    x = mx.log(mx.array([[0.3, 0.5, 0.2]]))
    inf = -math.inf
    assert mx.array_equal(ours.apply_top_p(x, 0.6), mx.array([[x[0, 0].item(), x[0, 1].item(), inf]]))
    assert mx.array_equal(ours.apply_top_p(x, 0.4), mx.array([[inf, x[0, 1].item(), inf]]))
    assert mx.array_equal(ours.apply_top_p(x, 0.0), mx.array([[inf, x[0, 1].item(), inf]]))


@pytest.mark.parametrize("min_tokens_to_keep", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_apply_min_p_matches_mlx_lm(shape, dtype, min_tokens_to_keep):
    """apply_min_p equals mlx-lm's for min_p from 0.01 to 1, keeping at least 1 or 3 tokens."""
    B, V = shape
    x = log_softmax(random_logits(shape, dtype, seed=31 + V + B))
    assert kth_largest_is_unique(x, min_tokens_to_keep)  # no tie where mlx-lm picks arbitrarily
    for min_p in (0.01, 0.1, 0.5, 0.9, 1.0):
        out = ours.apply_min_p(x, min_p, min_tokens_to_keep)
        assert out.dtype == dtype
        assert mx.array_equal(out, ref.apply_min_p(x, min_p, min_tokens_to_keep)), min_p
        assert (mx.isfinite(out).sum(axis=-1) >= min_tokens_to_keep).all().item()


def test_apply_min_p_exact_small_case():
    """Probabilities [0.5, 0.3, 0.15, 0.05] with min_p 0.5 keep p >= 0.25; min_tokens_to_keep 3 keeps three."""
    x = mx.log(mx.array([[0.15, 0.5, 0.05, 0.3]]))
    inf = -math.inf
    v = x[0].tolist()
    assert mx.array_equal(ours.apply_min_p(x, 0.5), mx.array([[inf, v[1], inf, v[3]]]))
    assert mx.array_equal(ours.apply_min_p(x, 0.5, 3), mx.array([[v[0], v[1], inf, v[3]]]))


def test_apply_min_p_zero_keeps_every_token():
    """min_p = 0 is accepted by the check ([0, 1]) and keeps every token (p >= 0 always holds)."""
    x = log_softmax(random_logits((2, 10), seed=35))
    assert mx.array_equal(ours.apply_min_p(x, 0.0), x)


# Seeds whose first uniform draw is below 0.5 (0, 13) and above it (4, 11): with probability
# 0.5 XTC fires for the first two and not for the others.
XTC_SEEDS = (0, 4, 11, 13)


def xtc_logits(shape, dtype=mx.float32) -> mx.array:
    """Logits whose softmax puts two or more tokens above 0.1 in most rows, so XTC has work."""
    B, V = shape
    return random_logits(shape, dtype, seed=41 + V + B, scale={8: 1.5, 100: 3.0}.get(V, 5.0))


@pytest.mark.parametrize("special", [False, True], ids=["no-special", "special"])
@pytest.mark.parametrize("probability", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("threshold", [0.05, 0.1, 0.3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_apply_xtc_matches_mlx_lm(shape, dtype, threshold, probability, special):
    """apply_xtc equals mlx-lm's after the same mx.random.seed (the same single coin)."""
    B, V = shape
    x = xtc_logits(shape, dtype)
    # Protect the most likely token of row 0 (the one XTC would mask first) and token 0.
    specials = [0, int(mx.argmax(x[0]).item())] if special else []
    changed = []
    for seed in XTC_SEEDS:
        mx.random.seed(seed)
        out = ours.apply_xtc(x, probability, threshold, specials)
        mx.random.seed(seed)
        expected = ref.apply_xtc(x, probability, threshold, specials)
        assert out.dtype == dtype
        assert mx.array_equal(out, expected), seed
        changed.append(not mx.array_equal(out, x).item())
    if probability == 0.0:
        assert changed == [False] * len(XTC_SEEDS)
    if probability == 0.5:
        assert changed[1] is False and changed[2] is False  # coin above 0.5: never applied


def test_apply_xtc_fires_on_the_parity_inputs():
    """The parity inputs really exercise masking: with probability 1 and threshold 0.1 XTC masks tokens."""
    for shape in SHAPES:
        x = xtc_logits(shape)
        mx.random.seed(0)
        assert not mx.array_equal(ours.apply_xtc(x, 1.0, 0.1, []), x).item(), shape


def test_apply_xtc_exact_small_case():
    """Probabilities [0.4, 0.35, 0.2, 0.05], threshold 0.1: tokens 0 and 1 go (2 is the least
    above the threshold); token 0 as a special token stays; one token above does nothing."""
    x = mx.log(mx.array([[0.4, 0.35, 0.2, 0.05]]))
    v = x[0].tolist()
    inf = -math.inf
    mx.random.seed(0)
    assert mx.array_equal(ours.apply_xtc(x, 1.0, 0.1, []), mx.array([[inf, inf, v[2], v[3]]]))
    assert mx.array_equal(ours.apply_xtc(x, 1.0, 0.1, [0]), mx.array([[v[0], inf, v[2], v[3]]]))
    assert mx.array_equal(ours.apply_xtc(x, 1.0, 0.36, []), x)


# ---------------------------------------------------------------------------------------------
# Samplers


@pytest.mark.parametrize("temp", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_categorical_sampling_matches_mlx_lm(shape, dtype, temp):
    """The same seed gives the same tokens as mlx-lm's categorical_sampling."""
    B, V = shape
    x = log_softmax(random_logits(shape, dtype, seed=51 + V + B, scale=1.0))
    draws = []
    for seed in range(5):
        mx.random.seed(seed)
        tokens = ours.categorical_sampling(x, temp)
        mx.random.seed(seed)
        expected = ref.categorical_sampling(x, temp)
        assert tokens.shape == (B,)
        assert mx.array_equal(tokens, expected), seed
        draws.append(tuple(tokens.tolist()))
    assert len(set(draws)) > 1  # the seed matters: this is sampling, not argmax


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_greedy_sampler_matches_mlx_lm(shape, dtype):
    """greedy_sampler returns mlx-lm's tokens: the argmax of each row."""
    B, V = shape
    x = random_logits(shape, dtype, seed=61 + V + B)
    tokens = ours.greedy_sampler(x)
    assert tokens.shape == (B,)
    assert mx.array_equal(tokens, ref.greedy_sampler(x))
    assert tokens.tolist() == np.argmax(np.array(x.astype(mx.float32)), axis=-1).tolist()


def test_greedy_sampler_picks_lowest_index_on_ties():
    """On a tie for the maximum, greedy_sampler returns the lowest index, as mlx-lm does."""
    x = mx.array([[0.0, 2.0, 2.0, 1.0], [3.0, 0.0, 0.0, 3.0]])
    assert ours.greedy_sampler(x).tolist() == [1, 0]
    assert mx.array_equal(ours.greedy_sampler(x), ref.greedy_sampler(x))


# ---------------------------------------------------------------------------------------------
# Logits processors

# Histories: duplicates; longer than the default context of 20; empty.
HISTORIES = {
    "duplicates": [1, 1, 3, 1, 7, 3, 0],
    "long": [(5 * i + i // 3) % 8 for i in range(37)],
    "empty": [],
}

PROCESSOR_OPTIONS = {
    "logit_bias": dict(logit_bias={0: 2.0, 5: -1.5, 7: 10.0}),
    "repetition": dict(repetition_penalty=1.3),
    "repetition-context-4": dict(repetition_penalty=0.8, repetition_context_size=4),
    "presence": dict(presence_penalty=0.4),
    "presence-context-4": dict(presence_penalty=-0.7, presence_context_size=4),
    "frequency": dict(frequency_penalty=0.3),
    "frequency-context-4": dict(frequency_penalty=0.6, frequency_context_size=4),
    "all": dict(
        logit_bias={2: -3.0, 6: 1.25}, repetition_penalty=1.5, repetition_context_size=10,
        presence_penalty=0.5, presence_context_size=15, frequency_penalty=0.25,
        frequency_context_size=30,
    ),
}


@pytest.mark.parametrize("history", sorted(HISTORIES))
@pytest.mark.parametrize("options", sorted(PROCESSOR_OPTIONS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B", [1, 4])
def test_make_logits_processors_matches_mlx_lm(B, dtype, options, history):
    """The processors built from the same options change logits as mlx-lm's do."""
    kwargs = PROCESSOR_OPTIONS[options]
    tokens = mx.array(HISTORIES[history], dtype=mx.int32)
    x = random_logits((B, 8), dtype, seed=71 + B)
    processors = ours.make_logits_processors(**kwargs)
    assert len(processors) == len(ref.make_logits_processors(**kwargs))
    out = apply_all(processors, tokens, x)
    expected = run_reference(ref.make_logits_processors(**kwargs), tokens, x)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    if "frequency_penalty" in kwargs and history != "empty":
        context = kwargs.get("frequency_context_size", 20)
        max_count = max(np.bincount(HISTORIES[history][-context:]))
        assert_close_after_repeated_subtraction(out, expected, dtype, max_count)
    else:
        assert mx.array_equal(out, expected)
    assert mx.array_equal(out, x).item() == (history == "empty" and "logit_bias" not in kwargs)


def test_make_logits_processors_without_options_is_empty():
    """No options (or zero penalties) build no processors, as in mlx-lm."""
    assert ours.make_logits_processors() == []
    assert ours.make_logits_processors(logit_bias={}, repetition_penalty=0, presence_penalty=0.0) == []


PENALTIES = {
    "repetition": (ours.make_repetition_penalty, ref.make_repetition_penalty, 1.7),
    "presence": (ours.make_presence_penalty, ref.make_presence_penalty, 0.9),
    "frequency": (ours.make_frequency_penalty, ref.make_frequency_penalty, 0.45),
}


@pytest.mark.parametrize("context_size", [3, 20])
@pytest.mark.parametrize("history", sorted(HISTORIES))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 8), (4, 8), (4, 1000)])
@pytest.mark.parametrize("name", sorted(PENALTIES))
def test_penalty_matches_mlx_lm(name, shape, dtype, history, context_size):
    """make_{repetition,presence,frequency}_penalty equal mlx-lm's on a shared 1-D history."""
    make_ours, make_ref, penalty = PENALTIES[name]
    tokens = mx.array(HISTORIES[history], dtype=mx.int32)
    x = random_logits(shape, dtype, seed=81 + shape[0] + shape[1])
    out = make_ours(penalty, context_size)(tokens, x)
    expected = make_ref(penalty, context_size)(tokens, mx.array(x))
    assert out.dtype == expected.dtype
    if name == "frequency" and history != "empty":
        max_count = max(np.bincount(HISTORIES[history][-context_size:]))
        assert_close_after_repeated_subtraction(out, expected, dtype, max_count)
    else:
        assert mx.array_equal(out, expected)
    seen = sorted(set(HISTORIES[history][-context_size:]))
    changed = np.nonzero((np.array(out.astype(mx.float32)) != np.array(x.astype(mx.float32))).any(0))[0]
    assert changed.tolist() == seen  # exactly the tokens in the window move


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(PENALTIES))
def test_penalty_rows_with_their_own_histories(name, dtype):
    """With tokens [B, T], row i equals processing row i alone with its 1-D history (and mlx-lm on it)."""
    make_ours, make_ref, penalty = PENALTIES[name]
    B, V, T, context = 4, 50, 30, 20
    tokens = mx.random.randint(0, 12, (B, T), key=mx.random.key(91)).astype(mx.int32)  # repeats
    x = random_logits((B, V), dtype, seed=92)
    processor = make_ours(penalty, context)
    out = processor(tokens, x)
    assert out.shape == (B, V)
    for i in range(B):
        alone = processor(tokens[i], x[i : i + 1])
        assert mx.array_equal(out[i : i + 1], alone), i
        expected = make_ref(penalty, context)(tokens[i], mx.array(x[i : i + 1]))
        if name == "frequency":
            max_count = max(np.bincount(np.array(tokens[i, -context:])))
            assert_close_after_repeated_subtraction(alone, expected, dtype, max_count)
        else:
            assert mx.array_equal(alone, expected), i
    # The rows' histories differ, so their penalties differ from one shared history.
    assert not mx.array_equal(out, processor(tokens[0], x)).item()


def test_make_logits_processors_rows_with_their_own_histories():
    """All processors together on tokens [B, T]: row i equals row i processed alone."""
    processors = ours.make_logits_processors(**PROCESSOR_OPTIONS["all"])
    tokens = mx.random.randint(0, 8, (3, 25), key=mx.random.key(93)).astype(mx.int32)
    x = random_logits((3, 8), seed=94)
    out = apply_all(processors, tokens, x)
    for i in range(3):
        assert mx.array_equal(out[i : i + 1], apply_all(processors, tokens[i], x[i : i + 1])), i


def test_repetition_penalty_exact():
    """Repetition 2.0 on logits [2, -2, 1] with history [0, 1] gives [1, -4, 1]."""
    out = ours.make_repetition_penalty(2.0)(mx.array([0, 1]), mx.array([[2.0, -2.0, 1.0]]))
    assert out.tolist() == [[1.0, -4.0, 1.0]]


def test_frequency_penalty_exact():
    """Frequency 0.5 with history [0, 0, 2] subtracts 1.0 from token 0 and 0.5 from token 2."""
    out = ours.make_frequency_penalty(0.5)(mx.array([0, 0, 2]), mx.array([[1.0, 2.0, 3.0]]))
    assert out.tolist() == [[0.0, 2.0, 2.5]]


def test_presence_penalty_exact():
    """Presence 0.5 with history [0, 0, 2] subtracts 0.5 once from tokens 0 and 2."""
    out = ours.make_presence_penalty(0.5)(mx.array([0, 0, 2]), mx.array([[1.0, 2.0, 3.0]]))
    assert out.tolist() == [[0.5, 2.0, 2.5]]


def test_penalty_context_window_exact():
    """Context size 2 with history [0, 1, 2] penalises only tokens 1 and 2."""
    out = ours.make_repetition_penalty(2.0, 2)(mx.array([0, 1, 2]), mx.array([[2.0, 2.0, -2.0]]))
    assert out.tolist() == [[2.0, 1.0, -4.0]]
    out = ours.make_frequency_penalty(1.0, 2)(mx.array([[0, 1, 1], [2, 2, 0]]), mx.zeros((2, 3)))
    assert out.tolist() == [[0.0, -2.0, 0.0], [-1.0, 0.0, -1.0]]


def test_logit_bias_exact():
    """logit_bias {1: 5, 3: -2} adds to those tokens in every row and leaves the rest."""
    (processor,) = ours.make_logits_processors(logit_bias={1: 5.0, 3: -2.0})
    out = processor(mx.array([], dtype=mx.int32), mx.zeros((2, 4)))
    assert out.tolist() == [[0.0, 5.0, 0.0, -2.0]] * 2


# ---------------------------------------------------------------------------------------------
# Bad arguments: a ValueError naming the argument and the value, before any compiled code


X8 = random_logits((2, 8), seed=101)


@pytest.mark.parametrize(
    "top_k, pattern",
    [(0, r"top_k .*\[1, 7\].*got 0"), (8, r"top_k .*got 8"), (100, r"top_k .*got 100"),
     (-1, r"top_k .*got -1"), (2.5, r"top_k must be an integer, got 2\.5"),
     (True, r"top_k must be an integer, got True")],
)
def test_apply_top_k_rejects_bad_k(top_k, pattern):
    """apply_top_k: k must be an integer (not a bool) in [1, V - 1]."""
    with pytest.raises(ValueError, match=pattern):
        ours.apply_top_k(X8, top_k)


@pytest.mark.parametrize(
    "top_p, pattern",
    [(-0.1, r"top_p .*\[0\.0, 1\.0\].*got -0\.1"), (1.5, r"top_p .*got 1\.5"),
     (math.nan, r"top_p must be a number, got nan")],
)
def test_apply_top_p_rejects_bad_p(top_p, pattern):
    """apply_top_p: p must be a number in [0, 1]."""
    with pytest.raises(ValueError, match=pattern):
        ours.apply_top_p(X8, top_p)


@pytest.mark.parametrize(
    "min_p, keep, pattern",
    [(-0.1, 1, r"min_p .*\[0\.0, 1\.0\].*got -0\.1"), (1.5, 1, r"min_p .*got 1\.5"),
     (math.nan, 1, r"min_p must be a number, got nan"),
     (0.1, 0, r"min_tokens_to_keep .*\[1, inf\).*got 0"),
     (0.1, 1.5, r"min_tokens_to_keep must be an integer, got 1\.5")],
)
def test_apply_min_p_rejects_bad_arguments(min_p, keep, pattern):
    """apply_min_p: min_p in [0, 1], min_tokens_to_keep an integer >= 1."""
    with pytest.raises(ValueError, match=pattern):
        ours.apply_min_p(X8, min_p, keep)


@pytest.mark.parametrize(
    "probability, threshold, specials, pattern",
    [(0.5, 0.6, [], r"xtc_threshold .*\[0\.0, 0\.5\].*got 0\.6"),
     (0.5, -0.1, [], r"xtc_threshold .*got -0\.1"),
     (1.5, 0.1, [], r"xtc_probability .*\[0\.0, 1\.0\].*got 1\.5"),
     (math.nan, 0.1, [], r"xtc_probability must be a number, got nan"),
     (0.5, 0.1, [2, 8], r"xtc_special_tokens .*\[0, 7\].*got 8"),
     (0.5, 0.1, [-1], r"xtc_special_tokens .*got -1")],
)
def test_apply_xtc_rejects_bad_arguments(probability, threshold, specials, pattern):
    """apply_xtc: threshold in [0, 0.5], probability in [0, 1], special tokens inside the vocabulary."""
    with pytest.raises(ValueError, match=pattern):
        ours.apply_xtc(X8, probability, threshold, specials)


@pytest.mark.parametrize(
    "temp, pattern",
    [(0, r"temp .*\(0\.0, inf\).*got 0"), (-1.0, r"temp .*got -1\.0"),
     (math.nan, r"temp must be a number, got nan")],
)
def test_categorical_sampling_rejects_bad_temp(temp, pattern):
    """categorical_sampling: temp must be a positive number."""
    with pytest.raises(ValueError, match=pattern):
        ours.categorical_sampling(X8, temp)


@pytest.mark.parametrize(
    "penalty, pattern",
    [(0, r"repetition_penalty .*\(0\.0, inf\).*got 0"), (-1.2, r"repetition_penalty .*got -1\.2"),
     (math.nan, r"repetition_penalty must be a number, got nan")],
)
def test_make_repetition_penalty_rejects_bad_penalty(penalty, pattern):
    """make_repetition_penalty: the factor must be a positive number (it divides logits)."""
    with pytest.raises(ValueError, match=pattern):
        ours.make_repetition_penalty(penalty)


@pytest.mark.parametrize("make", [ours.make_presence_penalty, ours.make_frequency_penalty])
def test_additive_penalties_reject_nan(make):
    """make_presence_penalty / make_frequency_penalty: NaN is not a penalty."""
    name = make.__name__.removeprefix("make_")
    with pytest.raises(ValueError, match=rf"{name} must be a number, got nan"):
        make(math.nan)


@pytest.mark.parametrize("name", sorted(PENALTIES))
def test_penalties_reject_zero_context_size(name):
    """Each penalty, built directly or through make_logits_processors, needs context_size >= 1."""
    make, _, penalty = PENALTIES[name]
    pattern = rf"{name}_penalty context_size .*\[1, inf\).*got 0"
    with pytest.raises(ValueError, match=pattern):
        make(penalty, 0)
    with pytest.raises(ValueError, match=pattern):
        ours.make_logits_processors(**{f"{name}_penalty": penalty, f"{name}_context_size": 0})


def test_logit_bias_rejects_tokens_outside_the_vocabulary():
    """A logit_bias token >= V raises when the processor runs; a negative one when it is built."""
    (processor,) = ours.make_logits_processors(logit_bias={3: 1.0, 8: 1.0})
    with pytest.raises(ValueError, match=r"logit_bias .*token 8.*8 tokens"):
        processor(mx.array([1, 2]), X8)
    with pytest.raises(ValueError, match=r"logit_bias token .*got -1"):
        ours.make_logits_processors(logit_bias={-1: 1.0})


def test_errors_leave_the_random_state_usable():
    """After every kind of bad-argument error, seeded sampling still reproduces its tokens
    (mlx-lm raises inside mx.compile, which breaks the random state for the process)."""
    mx.random.seed(5)
    before = ours.categorical_sampling(X8, 1.0)
    for call in (
        lambda: ours.apply_top_k(X8, 0),
        lambda: ours.apply_top_p(X8, 2.0),
        lambda: ours.apply_min_p(X8, 2.0),
        lambda: ours.apply_xtc(X8, 0.5, 0.9, []),
        lambda: ours.categorical_sampling(X8, 0.0),
    ):
        with pytest.raises(ValueError):
            call()
    mx.random.seed(5)
    assert mx.array_equal(ours.categorical_sampling(X8, 1.0), before)


def test_error_messages_name_the_argument_and_the_value():
    """A message reads '<argument> must be ..., got <value>' (checked on one example per kind)."""
    with pytest.raises(ValueError) as info:
        ours.apply_top_k(X8, 9)
    assert re.fullmatch(r"top_k must be in \[1, 7\], got 9", str(info.value))
    with pytest.raises(ValueError) as info:
        ours.make_repetition_penalty(-2.0)
    assert re.fullmatch(r"repetition_penalty must be in \(0\.0, inf\), got -2\.0", str(info.value))


# ---------------------------------------------------------------------------------------------
# make_sampler: the drop-in for mlx-lm's (tiny_llm.sampler.make_sampler is the course's)

# Each half-precision row of `distinct_logits` is scaled by a power of two (exact, so still
# tie-free) until its top values lie about 0.25 apart, so that the filters have work to do.
SPREAD = {mx.float16: 64.0, mx.bfloat16: 8.0}
# Stands for "token 0 and the two most likely tokens of row 0" in a configuration.
TOP_OF_ROW_0 = "token 0 and the two most likely tokens of row 0"

SAMPLER_CONFIGS = {
    "greedy": dict(),
    "greedy-ignores-filters": dict(temp=0.0, top_p=0.5, min_p=0.2, top_k=3, xtc_probability=1.0),
    "temp": dict(temp=0.7),
    "top_p": dict(temp=0.9, top_p=0.8),
    "top_p-1-is-off": dict(temp=0.9, top_p=1.0),
    "min_p": dict(temp=1.0, min_p=0.1),
    "min_p-keep-5": dict(temp=1.0, min_p=0.9, min_tokens_to_keep=5),
    "top_k": dict(temp=1.5, top_k=5),
    "xtc-always": dict(temp=1.0, xtc_probability=1.0, xtc_threshold=0.05),
    "xtc-never": dict(temp=1.0, xtc_probability=0.0, xtc_threshold=0.05),
    "xtc-half": dict(temp=1.0, xtc_probability=0.5, xtc_threshold=0.05),
    "xtc-special": dict(temp=1.0, xtc_probability=1.0, xtc_threshold=0.05, xtc_special_tokens=TOP_OF_ROW_0),
    "all-but-xtc": dict(temp=0.7, top_p=0.9, min_p=0.05, min_tokens_to_keep=2, top_k=40),
    "all": dict(temp=0.8, top_p=0.95, min_p=0.02, min_tokens_to_keep=3, top_k=20,
                xtc_probability=1.0, xtc_threshold=0.05, xtc_special_tokens=TOP_OF_ROW_0),
    "all-xtc-half": dict(temp=1.2, top_p=0.9, min_p=0.01, min_tokens_to_keep=2, top_k=30,
                         xtc_probability=0.5, xtc_threshold=0.04, xtc_special_tokens=[0, 1, 2]),
}
# Configurations under which every filter is off: their tokens are plain temperature draws.
NO_FILTER = {"greedy", "greedy-ignores-filters", "temp", "top_p-1-is-off", "xtc-never"}
# (B, V): one row to sixteen; V above every top_k of the configurations.
SAMPLER_SHAPES = [(1, 64), (4, 1000), (16, 256)]


def sampler_inputs(shape, dtype, seed) -> mx.array:
    """Tie-free rows (checked): float32 normal log-probabilities, or in half precision
    `distinct_logits` scaled and shifted to a maximum of 0 (their exponentials do not
    underflow; mlx-lm's top-p divides by their sum)."""
    if dtype == mx.float32:
        x = log_softmax(random_logits(shape, seed=seed))
    else:
        x = distinct_logits(shape, dtype, seed) * SPREAD[dtype]
        x = x - mx.max(x, axis=-1, keepdims=True)
    assert x.dtype == dtype
    assert all(kth_largest_is_unique(x, k) for k in (1, 2, 3, 5, 20, 30, 40))
    return x


def resolve(config, x) -> dict:
    """The configuration's keyword arguments, with TOP_OF_ROW_0 replaced by those tokens of `x`."""
    kwargs = dict(config)
    if kwargs.get("xtc_special_tokens") == TOP_OF_ROW_0:
        top2 = mx.argsort(-x[0].astype(mx.float32))[:2].tolist()
        kwargs["xtc_special_tokens"] = [0, *top2]
    return kwargs


def seeded_draws(sampler, x, seeds, calls=3) -> list[list[list[int]]]:
    """For each seed: `mx.random.seed(seed)`, then `calls` draws in a row (so the random state
    each call leaves behind matters too)."""
    out = []
    for seed in seeds:
        mx.random.seed(seed)
        out.append([sampler(x).tolist() for _ in range(calls)])
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SAMPLER_SHAPES)
@pytest.mark.parametrize("name", list(SAMPLER_CONFIGS))
def test_make_sampler_matches_mlx_lm(name, shape, dtype):
    """Under the same mx.random.seed, the drop-in's tokens are mlx-lm's, call after call."""
    B, V = shape
    x = sampler_inputs(shape, dtype, seed=71 + V + B)
    kwargs = resolve(SAMPLER_CONFIGS[name], x)
    sampler = ours.mlx_compat.make_sampler(**kwargs)
    seeds = range(10)
    draws = seeded_draws(sampler, x, seeds)
    assert draws == seeded_draws(ref.make_sampler(**kwargs), x, seeds)
    mx.random.seed(0)
    tokens = sampler(x)
    assert tokens.shape == (B,) and tokens.dtype == mx.uint32
    if name.startswith("greedy"):
        assert all(d == [mx.argmax(x, axis=-1).tolist()] * 3 for d in draws)
        return
    assert len({str(d) for d in draws}) > 1  # sampling, not argmax
    if name not in NO_FILTER:  # the inputs give the filters something to remove
        plain = seeded_draws(ref.make_sampler(temp=kwargs["temp"]), x, seeds)
        assert draws != plain


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_make_sampler_matches_mlx_lm_on_half_precision_logprobs(dtype):
    """On half-precision log-probabilities (ties and all, as a model's logits give them),
    filters without a top-k give mlx-lm's tokens: the draw scales `logprobs / temp` in their
    dtype, as mlx-lm does (in float32 about 1 draw in 500 comes out differently)."""
    x = log_softmax(random_logits((256, 2000), dtype, seed=81))
    for kwargs in (dict(temp=0.3), dict(temp=0.7, top_p=0.9), dict(temp=1.3, min_p=0.05)):
        draws = seeded_draws(ours.mlx_compat.make_sampler(**kwargs), x, range(4), calls=1)
        assert draws == seeded_draws(ref.make_sampler(**kwargs), x, range(4), calls=1), kwargs
    # categorical_sampling is the same draw.
    draws = seeded_draws(lambda x: ours.categorical_sampling(x, 0.3), x, range(4), calls=1)
    assert draws == seeded_draws(lambda x: ref.categorical_sampling(x, 0.3), x, range(4), calls=1)


def support(sampler, rows, n=1000, seed=0) -> list[set[int]]:
    """The tokens drawn for each of `rows` (probabilities) over `n` copies of it in one batch."""
    R = len(rows)
    x = mx.tile(mx.log(mx.array(rows)), (n, 1))  # n * R, V: the rows in turn
    mx.random.seed(seed)
    tokens = np.array(sampler(x)).reshape(n, R)
    return [set(tokens[:, r].tolist()) for r in range(R)]


# Hand-made rows on which mlx-lm's order (top-p, min-p, XTC, top-k, then temperature) keeps
# other tokens than a neighbouring order would: (row, arguments, kept, kept by that other order).
ORDER_CASES = {
    # top-p on the full row: the mass above token 2 is 0.4 < 0.5; top-k first keeps {2, 3}
    # and top-p on their renormalised (3/7, 4/7) stops at token 3.
    "top_p-before-top_k": ([0.1, 0.2, 0.3, 0.4], dict(temp=1.0, top_p=0.5, top_k=2), {2, 3}, {3}),
    # top-p keeps {0, 1, 2} (mass above token 2 is 0.8 < 0.85), min-p 0.2 drops token 3 only;
    # min-p first leaves a mass of 0.92, over which 0.8 / 0.92 >= 0.85 drops token 2.
    "top_p-before-min_p": ([0.5, 0.3, 0.12, 0.08], dict(temp=1.0, top_p=0.85, min_p=0.2), {0, 1, 2}, {0, 1}),
    # min-p 0.45 keeps {0, 1, 2}, all above 0.15 once renormalised: XTC leaves the least, 2;
    # XTC first keeps {2, 3}, and min-p then keeps both.
    "min_p-before-xtc": ([0.4, 0.3, 0.2, 0.1], dict(temp=1.0, min_p=0.45, xtc_probability=1.0,
                                                    xtc_threshold=0.15), {2}, {2, 3}),
    # XTC keeps {2, 3}, top-k 1 then token 2; top-k first keeps token 0, which XTC leaves.
    "xtc-before-top_k": ([0.4, 0.3, 0.2, 0.1], dict(temp=1.0, xtc_probability=1.0, xtc_threshold=0.15,
                                                    top_k=1), {2}, {0}),
    # top-p 0.6 keeps {0, 1}, XTC leaves token 1; XTC first keeps {2, 3}, top-p then token 2.
    "top_p-before-xtc": ([0.4, 0.3, 0.2, 0.1], dict(temp=1.0, top_p=0.6, xtc_probability=1.0,
                                                    xtc_threshold=0.15), {1}, {2}),
    # Temperature last: softmax(3, 2, 1) = (.665, .245, .090), top-p 0.8 keeps {0, 1}; with
    # temperature 0.5 first, token 0 alone has 0.867 > 0.8.
    "temperature-last": ([0.6652, 0.2447, 0.0900], dict(temp=0.5, top_p=0.8), {0, 1}, {0}),
}


@pytest.mark.parametrize("name", list(ORDER_CASES))
def test_make_sampler_filter_order(name):
    """mlx-lm's filter order, on rows where another order keeps other tokens."""
    row, kwargs, kept, other_order = ORDER_CASES[name]
    assert kept != other_order
    (drawn,) = support(ours.mlx_compat.make_sampler(**kwargs), [row])
    assert drawn == kept
    assert support(ref.make_sampler(**kwargs), [row]) == [kept]


def test_make_sampler_filters_each_row_on_its_own():
    """Two rows in one batch keep their own tokens (a union of the rows' masks would not)."""
    rows = [[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]]
    kwargs = dict(temp=1.0, top_p=0.5, top_k=2, xtc_probability=1.0, xtc_threshold=0.35)
    # Row 0: top-p keeps {2, 3}, renormalised to 3/7 and 4/7, both above 0.35, so XTC
    # removes all but the least likely: token 2. Row 1 mirrors it.
    expected = [{2}, {1}]
    assert support(ours.mlx_compat.make_sampler(**kwargs), rows) == expected
    assert support(ref.make_sampler(**kwargs), rows) == expected


def test_make_sampler_signature_is_mlx_lm_s():
    """Same parameter names, order, kinds and defaults as mlx_lm.sample_utils.make_sampler."""
    def described(f):
        return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]
    assert described(ours.mlx_compat.make_sampler) == described(ref.make_sampler)
    assert [name for name, _, _ in described(ours.mlx_compat.make_sampler)] == [
        "temp", "top_p", "min_p", "min_tokens_to_keep", "top_k",
        "xtc_probability", "xtc_threshold", "xtc_special_tokens",
    ]


@pytest.mark.parametrize(
    "args, kwargs",
    [((0.7, 0.9, 0.05, 2, 40), dict(temp=0.7, top_p=0.9, min_p=0.05, min_tokens_to_keep=2, top_k=40)),
     ((1.0, 0.95, 0.02, 3, 20, 1.0, 0.05, [0, 7]),
      dict(temp=1.0, top_p=0.95, min_p=0.02, min_tokens_to_keep=3, top_k=20, xtc_probability=1.0,
           xtc_threshold=0.05, xtc_special_tokens=[0, 7])),
     ((0.8, 0.0, 0.0, 1, 5), dict(temp=0.8, top_k=5))],
    ids=["five", "eight", "top_k-fifth"],
)
def test_make_sampler_positional_calls_equal_keyword_calls(args, kwargs):
    """Positional arguments land where mlx-lm puts them: same tokens as the keyword call
    and as mlx-lm's positional call."""
    x = sampler_inputs((4, 1000), mx.float32, seed=91)
    by_position = seeded_draws(ours.mlx_compat.make_sampler(*args), x, range(5))
    assert by_position == seeded_draws(ours.mlx_compat.make_sampler(**kwargs), x, range(5))
    assert by_position == seeded_draws(ref.make_sampler(*args), x, range(5))


def test_make_sampler_names():
    """The drop-in lives in the facade module; `tiny_llm.sampler.make_sampler` (and
    `tiny_llm.make_sampler`) stay the course's `(temp, top_p, top_k)` exercise."""
    import tiny_llm
    from tiny_llm.sampler import basic, mlx_compat
    from tiny_llm.sampler.mlx_compat import make_sampler

    assert make_sampler is mlx_compat.make_sampler and "make_sampler" in mlx_compat.__all__
    assert ours.make_sampler is basic.make_sampler is tiny_llm.make_sampler
    assert make_sampler is not ours.make_sampler
    assert make_sampler(0.0) is mlx_compat.greedy_sampler  # as mlx-lm returns its greedy_sampler


# Bad values of temp, and of each other argument (checked with temp = 1 and with temp = 0).
BAD_TEMPS = [
    (dict(temp=-0.5), r"temp must be in \[0\.0, inf\), got -0\.5"),
    (dict(temp=math.inf), r"temp must be in \[0\.0, inf\), got inf"),
    (dict(temp=math.nan), r"temp must be a number, got nan"),
    (dict(temp=True), r"temp must be a number, got True"),
]
BAD_OTHERS = [
    (dict(top_p=-0.1), r"top_p must be in \[0\.0, 1\.0\], got -0\.1"),
    (dict(top_p=1.5), r"top_p must be in \[0\.0, 1\.0\], got 1\.5"),
    (dict(top_p=None), r"top_p must be a number, got None"),
    (dict(min_p=1.5), r"min_p must be in \[0\.0, 1\.0\], got 1\.5"),
    (dict(min_p=0.1, min_tokens_to_keep=0), r"min_tokens_to_keep must be in \[1, inf\), got 0"),
    (dict(min_tokens_to_keep=2.5), r"min_tokens_to_keep must be an integer, got 2\.5"),
    (dict(top_k=-1), r"top_k must be in \[0, inf\), got -1"),
    (dict(top_k=2.5), r"top_k must be an integer, got 2\.5"),
    (dict(top_k=True), r"top_k must be an integer, got True"),
    (dict(xtc_probability=-0.5), r"xtc_probability must be in \[0\.0, 1\.0\], got -0\.5"),
    (dict(xtc_probability=1.5), r"xtc_probability must be in \[0\.0, 1\.0\], got 1\.5"),
    (dict(xtc_threshold=0.6), r"xtc_threshold must be in \[0\.0, 0\.5\], got 0\.6"),
    (dict(xtc_special_tokens=[3, -1]), r"xtc_special_tokens entry must be in \[0, inf\), got -1"),
    (dict(xtc_special_tokens=[1.5]), r"xtc_special_tokens entry must be an integer, got 1\.5"),
    (dict(xtc_special_tokens=7), r"xtc_special_tokens must be a list of token ids or None, got 7"),
]


@pytest.mark.parametrize(
    "kwargs, pattern",
    BAD_TEMPS + [(dict(case, temp=temp), pattern) for temp in (1.0, 0.0) for case, pattern in BAD_OTHERS],
)
def test_make_sampler_rejects_bad_arguments(kwargs, pattern):
    """Every argument is checked when the sampler is built, even for temp = 0 (mlx-lm then
    returns its greedy sampler without looking at the others)."""
    with pytest.raises(ValueError, match=pattern):
        ours.mlx_compat.make_sampler(**kwargs)


# What mlx-lm accepts without a word and the drop-in refuses, with what mlx-lm does with it.
MLX_LM_SILENT = {
    "negative-temp": dict(temp=-1.0),  # draws from the reversed distribution
    "top_p-above-1": dict(temp=1.0, top_p=1.5),  # top-p off
    "negative-top_p": dict(temp=1.0, top_p=-0.2),  # top-p off
    "negative-top_k": dict(temp=1.0, top_k=-1),  # top-k off
    "negative-xtc_probability": dict(temp=1.0, xtc_probability=-0.5),  # XTC off
    "xtc_threshold-unused": dict(temp=1.0, xtc_threshold=0.9),  # ignored while XTC is off
    "min_tokens_to_keep-unused": dict(temp=1.0, min_tokens_to_keep=0),  # ignored while min-p is off
    "negative-special-token": dict(temp=1.0, xtc_probability=1.0, xtc_special_tokens=[-1]),  # the last token
    "min_p-under-greedy": dict(temp=0.0, min_p=5.0),  # ignored: greedy
}


@pytest.mark.parametrize("name", list(MLX_LM_SILENT))
def test_make_sampler_refuses_what_mlx_lm_accepts_silently(name):
    """The documented difference: values mlx-lm ignores or misreads raise here."""
    kwargs = MLX_LM_SILENT[name]
    x = mx.log(mx.array([[0.1, 0.2, 0.3, 0.4]]))
    assert ref.make_sampler(**kwargs)(x).shape == (1,)
    with pytest.raises(ValueError, match="must be"):
        ours.mlx_compat.make_sampler(**kwargs)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [(dict(temp=1.0, top_k=8), r"top_k must be in \[0, 7\] for logprobs of 8 tokens \(0 is off\), got 8"),
     (dict(temp=1.0, top_k=100), r"top_k must be in \[0, 7\] .*got 100"),
     (dict(temp=1.0, xtc_probability=0.5, xtc_special_tokens=[2, 8]),
      r"xtc_special_tokens entry must be in \[0, 7\], got 8")],
)
def test_make_sampler_checks_the_vocabulary_when_called(kwargs, pattern):
    """What depends on V is checked when the sampler is called, before anything runs: the
    random state is left as it was (mlx-lm raises top_k's error inside mx.compile)."""
    sampler = ours.mlx_compat.make_sampler(**kwargs)
    mx.random.seed(5)
    before = mx.random.uniform().item()
    mx.random.seed(5)
    with pytest.raises(ValueError, match=pattern):
        sampler(X8)
    assert mx.random.uniform().item() == before


def test_make_sampler_ignores_special_tokens_while_xtc_is_off():
    """With XTC off, special tokens beyond the vocabulary are not looked at (mlx-lm's
    generate passes the tokenizer's newline and end tokens whatever the options)."""
    sampler = ours.mlx_compat.make_sampler(1.0, xtc_special_tokens=[3, 99])
    mx.random.seed(2)
    tokens = sampler(X8)
    mx.random.seed(2)
    assert mx.array_equal(tokens, ref.make_sampler(1.0)(X8))
