"""Beam search: exhaustive-width search against brute force, hand-derived cases on a table
model, transformers' vectorised `_beam_search` written out in numpy as a reference, greedy
equality at one beam, bad input, and one short run on the default model."""

import itertools
import math
import re

import mlx.core as mx
import numpy as np
import pytest
from conftest import tiny_model, vocab_tokenizer

from tiny_llm import generate_step
from tiny_llm.beam_search import BeamHypothesis, beam_search
from tiny_llm.model import prefill
from tiny_llm.kv_cache import KVCache

EOS_ID, A, B, C, S = range(5)


class TableModel:
    """Next-token probabilities fixed by the last token, `probs[last]` (`[V, V]`), with real
    `KVCache`s: every layer stores each token id as its key and value, so `histories` shows
    what every cache row holds at each call. `calls` records the shapes fed."""

    def __init__(self, probs: list[list[float]]):
        self.logits = mx.log(mx.array(probs))  # V, V
        self.calls: list[tuple[int, int]] = []
        self.histories: list[list[list[int]]] = []

    def make_cache(self) -> list[KVCache]:
        return [KVCache(), KVCache()]

    def __call__(self, tokens: mx.array, cache: list[KVCache]) -> mx.array:
        self.calls.append(tuple(tokens.shape))
        x = tokens.astype(mx.float32)[:, None, :, None]  # B, 1, L, 1
        for c in cache:
            c.update_and_fetch(x, x)
        rows = cache[0].keys[:, 0, : cache[0].offset, 0]
        self.histories.append(rows.astype(mx.int32).tolist())
        return self.logits[tokens]  # B, L, V


# Greedy takes A (.5), then C (.35): .175. Two beams keep B (.4), whose A (.9) gives .36.
GREEDY_TRAP = [
    [0.20, 0.20, 0.20, 0.20, 0.20],  # after EOS
    [0.02, 0.30, 0.29, 0.35, 0.04],  # after A
    [0.02, 0.90, 0.03, 0.02, 0.03],  # after B
    [0.10, 0.15, 0.20, 0.25, 0.30],  # after C
    [0.02, 0.50, 0.40, 0.05, 0.03],  # after S (the prompt)
]

# End-of-sequence tokens come early and often; see test_early_stopping_by_hand.
EARLY_EOS = [
    [0.20, 0.20, 0.20, 0.20, 0.20],  # after EOS
    [0.90, 0.04, 0.03, 0.02, 0.01],  # after A
    [0.10, 0.60, 0.15, 0.11, 0.04],  # after B
    [0.40, 0.25, 0.20, 0.10, 0.05],  # after C
    [0.50, 0.30, 0.15, 0.03, 0.02],  # after S (the prompt)
]


def full_logprobs(model, prompt: list[int], sequences: list[list[int]]) -> np.ndarray:
    """`[N, T]`: log p(token t of sequence n | prompt, its tokens before t), from one
    forward pass over the whole sequences (no cache). The sequences have equal lengths."""
    tokens = mx.array([prompt + list(s) for s in sequences])
    logits = model(tokens).astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # N, L + T, V
    L = len(prompt)
    picked = mx.take_along_axis(logprobs[:, L - 1 : -1], mx.array(sequences)[..., None], axis=-1)
    return np.array(picked[..., 0], dtype=np.float64)


def sequence_logprob(model, prompt: list[int], hyp: BeamHypothesis, eos: int) -> float:
    """The summed log-probability of a hypothesis (with its end-of-sequence token if it
    finished), recomputed without a cache."""
    tokens = hyp.tokens + [eos] * hyp.finished
    return float(full_logprobs(model, prompt, [tokens]).sum())


def continuation_logprob(model, prompt: list[int], tokens: list[int]) -> float:
    """The summed log-probability of `tokens` after `prompt`: the prompt is prefilled, then
    all the tokens but the last run in one call. Cheaper than `full_logprobs` on a large
    vocabulary, since the output head runs only for the continuation's positions."""
    cache = model.make_cache()
    logits = prefill(model, mx.array([prompt]), cache)[:, None]  # 1, 1, V
    if len(tokens) > 1:
        logits = mx.concatenate([logits, model(mx.array([tokens[:-1]]), cache=cache)], axis=1)
    logits = logits[0].astype(mx.float32)  # T, V
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return mx.take_along_axis(logprobs, mx.array(tokens)[:, None], axis=-1).sum().item()


def greedy(model, prompt: list[int], max_tokens: int, eos: frozenset[int]) -> tuple[list[int], bool, float]:
    """Greedy tokens from `generate_step` up to the first end-of-sequence token (excluded),
    whether one came, and the summed log-probability (that token's included)."""
    tokens, total = [], 0.0
    for token, logprobs in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        total += logprobs.astype(mx.float32)[token].item()
        if token in eos:
            return tokens, True, total
        tokens.append(token)
    return tokens, False, total


# ---------------------------------------------------------------------------------------------
# Brute force


def brute_force(model, prompt: list[int], V: int, T: int, length_penalty: float) -> list[tuple]:
    """Every distinct hypothesis of at most `T` tokens, scored like transformers, best first,
    as `(score, tokens, finished)`. A sequence ends at its first end-of-sequence token (id
    0), which counts in its length and log-probability but is not one of its tokens; a
    sequence without one has length `T`."""
    sequences = [list(s) for s in itertools.product(range(V), repeat=T)]
    logprobs = full_logprobs(model, prompt, sequences)
    hyps = {}
    for seq, lps in zip(sequences, logprobs):
        end = seq.index(EOS_ID) + 1 if EOS_ID in seq else T
        tokens, finished = tuple(seq[: end - 1] if EOS_ID in seq else seq), EOS_ID in seq
        hyps[tokens, finished] = float(lps[:end].sum()) / end**length_penalty
    return sorted(((s, t, f) for (t, f), s in hyps.items()), reverse=True)


@pytest.mark.parametrize("early_stopping", [False, "never"])
@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_exhaustive_width_finds_the_brute_force_best(length_penalty, early_stopping):
    """With 36 = 6^2 beams, every 2-token prefix survives, so three steps of beam search
    find the best of all 6^3 sequences (scored the transformers way) for any length
    penalty; the brute force scores them from full forward passes without a cache."""
    V, T, prompt = 6, 3, [3, 1, 4, 1, 5]
    model, _ = tiny_model("qwen2-untied", seed=1, vocab_size=V)
    ranked = brute_force(model, prompt, V, T, length_penalty)
    (best_score, best_tokens, best_finished), (second, _, _) = ranked[:2]
    assert best_score - second > 1e-4  # no near tie for rounding to decide
    hyp = beam_search(model, vocab_tokenizer(V), prompt, num_beams=V ** (T - 1), max_tokens=T,
                      length_penalty=length_penalty, early_stopping=early_stopping)[0]
    assert (tuple(hyp.tokens), hyp.finished) == (best_tokens, best_finished)
    assert hyp.score == pytest.approx(best_score, abs=1e-5)
    assert hyp.logprob == pytest.approx(sequence_logprob(model, prompt, hyp, EOS_ID), abs=1e-5)


def test_brute_force_best_depends_on_the_length_penalty():
    """The three penalties do not all pick the same hypothesis: the test above compares
    different answers, short ones for 0 and long ones for 2."""
    model, _ = tiny_model("qwen2-untied", seed=1, vocab_size=6)
    best = [brute_force(model, [3, 1, 4, 1, 5], 6, 3, lp)[0] for lp in (0.0, 1.0, 2.0)]
    lengths = [len(tokens) + finished for _, tokens, finished in best]
    assert lengths[0] < lengths[2]


# ---------------------------------------------------------------------------------------------
# Hand-derived cases


def test_two_beams_beat_greedy_by_hand():
    """Greedy: A (.5), then C (.35), probability .175. Two beams keep A and B after step 1;
    step 2 ranks BA (.4 x .9 = .36) above AC (.175). Both come back, best first, unfinished,
    with score = log p / 2."""
    model = TableModel(GREEDY_TRAP)
    tokens, _, total = greedy(model, [S], 2, frozenset({EOS_ID}))
    assert tokens == [A, C] and total == pytest.approx(math.log(0.175), abs=1e-6)
    hyps = beam_search(TableModel(GREEDY_TRAP), vocab_tokenizer(5), [S], num_beams=2, max_tokens=2,
                       num_return_sequences=2)
    assert [h.tokens for h in hyps] == [[B, A], [A, C]]
    assert [h.finished for h in hyps] == [False, False]
    assert [h.text for h in hyps] == ["w2 w1", "w1 w3"]
    for h, p in zip(hyps, (0.36, 0.175)):
        assert h.logprob == pytest.approx(math.log(p), abs=1e-6)
        assert h.score == pytest.approx(math.log(p) / 2, abs=1e-6)


def test_one_beam_falls_into_the_greedy_trap():
    """With one beam the same table gives greedy's A, C."""
    hyp, = beam_search(TableModel(GREEDY_TRAP), vocab_tokenizer(5), [S], num_beams=1, max_tokens=2)
    assert hyp.tokens == [A, C]
    assert hyp.logprob == pytest.approx(math.log(0.175), abs=1e-6)


def test_cache_rows_follow_their_beams():
    """The prompt is prefilled once (`[1, 1]`); its row is copied to both beams, and before
    step 3 the rows are reordered: beam 0 is now BA (from old row 1), beam 1 AC (from old
    row 0). Every cache row holds the prompt and its own beam's tokens."""
    model = TableModel(GREEDY_TRAP)
    beam_search(model, vocab_tokenizer(5), [S], num_beams=2, max_tokens=3)
    assert model.calls == [(1, 1), (2, 1), (2, 1)]
    assert model.histories == [[[S]], [[S, A], [S, B]], [[S, B, A], [S, A, C]]]


@pytest.mark.parametrize("early_stopping, calls, expected", [
    # Step 2 fills the pool with [] (log .5 / 1) and [A] (log .27 / 4): True stops there.
    (True, 2, [([A], [0.3, 0.9]), ([], [0.5])]),
    # False goes on while the best running beam, at its current length, could beat the
    # worst finished score: BA (log .09 / 4 = -.60 > log .5 = -.69) can, so step 3 runs and
    # adds [B, A] (log .081 / 9 = -.279), which pushes [] out; then BBA (log .0135 / 9 =
    # -.478) cannot beat -.327, and it stops.
    (False, 3, [([B, A], [0.15, 0.6, 0.9]), ([A], [0.3, 0.9])]),
    # "never" bounds with max_tokens = 5 instead: log .0135 / 25 = -.172 can still win, so
    # step 4 runs and adds [B, B, A] (log .01215 / 16 = -.276); then BBAA (log .00054 / 25 =
    # -.301) cannot beat -.279.
    ("never", 4, [([B, B, A], [0.15, 0.15, 0.6, 0.9]), ([B, A], [0.15, 0.6, 0.9])]),
])
def test_early_stopping_by_hand(early_stopping, calls, expected):
    """Length penalty 2, two beams, up to 5 tokens: the three stopping rules stop after 2, 3
    and 4 steps (one model call per step) with different answers. Finished hypotheses leave
    out their end-of-sequence token and count it in the length and log-probability."""
    model = TableModel(EARLY_EOS)
    hyps = beam_search(model, vocab_tokenizer(5), [S], num_beams=2, max_tokens=5, length_penalty=2.0,
                       early_stopping=early_stopping, num_return_sequences=2)
    assert len(model.calls) == calls
    assert [h.tokens for h in hyps] == [tokens for tokens, _ in expected]
    assert all(h.finished for h in hyps)
    for h, (tokens, probs) in zip(hyps, expected):
        logprob = sum(math.log(p) for p in probs)
        assert h.logprob == pytest.approx(logprob, abs=1e-5)
        assert h.score == pytest.approx(logprob / (len(tokens) + 1) ** 2, abs=1e-5)


# ---------------------------------------------------------------------------------------------
# transformers' algorithm as a reference


def reference_beam_search(model, prompt: list[int], eos: set[int], num_beams: int, max_tokens: int,
                          length_penalty: float, early_stopping) -> tuple[list[tuple], int]:
    """transformers 5's vectorised `_beam_search` for a batch of one, in numpy (float64),
    with full forward passes instead of a cache. Returns the final pool, best first, as
    `(score, tokens, finished)` (tokens without the end-of-sequence token), and the number
    of steps run. Needs `2 * num_beams <= V` so that the prompt's copies, which start at
    -1e9, are never chosen."""
    K, NEG = max(2, 1 + len(eos)) * num_beams, -1.0e9
    running = np.array([prompt] * num_beams)  # beams, L + t
    running_lp = np.array([0.0] + [NEG] * (num_beams - 1))
    pool_seqs = [None] * num_beams
    pool_scores = np.full(num_beams, NEG)
    pool_finished = np.zeros(num_beams, dtype=bool)
    improvable = True
    for length in range(1, max_tokens + 1):
        logits = model(mx.array(running))[:, -1, :].astype(mx.float32)
        logprobs = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True), dtype=np.float64)
        V = logprobs.shape[-1]
        acc = (logprobs + running_lp[:, None]).reshape(-1)
        top = np.argsort(-acc, kind="stable")[:K]
        top_lp, parents, tokens = acc[top], top // V, top % V
        candidates = np.concatenate([running[parents], tokens[:, None]], axis=1)
        hits = np.isin(tokens, list(eos)) | (length == max_tokens)
        running_scores = top_lp + hits * NEG
        keep = np.argsort(-running_scores, kind="stable")[:num_beams]
        new_scores = top_lp / length**length_penalty
        new_scores += NEG * (bool(pool_finished.all()) and early_stopping is True)
        new_scores += NEG * (not improvable)
        new_scores += NEG * ~(hits & (np.arange(K) < num_beams))
        merged_scores = np.concatenate([pool_scores, new_scores])
        merged_seqs = pool_seqs + list(candidates)
        merged_finished = np.concatenate([pool_finished, hits & (np.arange(K) < num_beams)])
        best = np.argsort(-merged_scores, kind="stable")[:num_beams]
        pool_scores, pool_finished = merged_scores[best], merged_finished[best]
        pool_seqs = [merged_seqs[i] for i in best]
        running, running_lp = candidates[keep], running_scores[keep]
        bound_length = max_tokens if early_stopping == "never" and length_penalty > 0 else length
        best_possible = running_lp[0] / bound_length**length_penalty
        worst = np.where(pool_finished, pool_scores.min(), NEG)
        improvable = improvable and bool(np.any(best_possible > worst))
        if not improvable or (pool_finished.all() and early_stopping is True) or hits.all():
            break
    L = len(prompt)
    pool = []
    for score, seq in zip(pool_scores, pool_seqs):
        generated = [int(t) for t in seq[L:]]
        finished = generated[-1] in eos
        pool.append((float(score), generated[:-1] if finished else generated, finished))
    return pool, length


class StepCounter:
    """A model that counts its calls on one position per row: one per beam-search step (the
    last position of the prompt, then one per decode step)."""

    def __init__(self, model):
        self.model, self.steps = model, 0

    def make_cache(self):
        return self.model.make_cache()

    def __call__(self, tokens, cache=None):
        self.steps += tokens.shape[1] == 1
        return self.model(tokens, cache=cache)


@pytest.fixture(scope="module")
def eight_token_model():
    model, _ = tiny_model("llama-untied", seed=11, vocab_size=8)
    return model


@pytest.mark.parametrize("num_beams", [2, 4])
@pytest.mark.parametrize("early_stopping", [True, False, "never"])
@pytest.mark.parametrize("length_penalty", [-0.5, 1.0, 2.0])
def test_agrees_with_the_transformers_algorithm(eight_token_model, num_beams, early_stopping, length_penalty):
    """Every returned hypothesis (tokens, finished, score, in order) and the number of steps
    agree with the numpy transcription of transformers' `_beam_search`, on 8 tokens and up
    to 8 steps."""
    prompt = [2, 3, 5]
    expected, steps = reference_beam_search(eight_token_model, prompt, {EOS_ID}, num_beams, 8,
                                            length_penalty, early_stopping)
    model = StepCounter(eight_token_model)
    hyps = beam_search(model, vocab_tokenizer(8), prompt, num_beams=num_beams, max_tokens=8,
                       length_penalty=length_penalty, early_stopping=early_stopping,
                       num_return_sequences=num_beams)
    assert [(h.tokens, h.finished) for h in hyps] == [(tokens, f) for _, tokens, f in expected]
    assert [h.score for h in hyps] == pytest.approx([s for s, _, _ in expected], abs=1e-5)
    assert model.steps == steps


def test_the_reference_cases_cover_early_stops_and_both_endings(eight_token_model):
    """The cases above are not trivial: some stop before 8 steps, and hypotheses end both
    ways (end-of-sequence token and length)."""
    steps, endings = set(), set()
    for early_stopping in (True, False, "never"):
        pool, n = reference_beam_search(eight_token_model, [2, 3, 5], {EOS_ID}, 4, 8, 1.0, early_stopping)
        steps.add(n)
        endings |= {f for _, _, f in pool}
    assert min(steps) < 8 and endings == {True, False}


# ---------------------------------------------------------------------------------------------
# Greedy, several sequences


@pytest.mark.parametrize("name", ["qwen2-untied", "llama-tied"])
def test_one_beam_is_greedy(name):
    """`num_beams=1` gives exactly `generate_step`'s greedy tokens and their log-probability."""
    model, _ = tiny_model(name, seed=5)
    tokenizer = vocab_tokenizer(model.args.vocab_size)
    prompt = [7, 21, 3, 9, 40]
    tokens, finished, total = greedy(model, prompt, 12, tokenizer.eos_token_ids)
    hyp, = beam_search(model, tokenizer, prompt, num_beams=1, max_tokens=12)
    assert (hyp.tokens, hyp.finished) == (tokens, finished)
    assert hyp.logprob == pytest.approx(total, abs=1e-4)


def test_several_sequences_are_distinct_and_sorted():
    """Four returned sequences: all different, best score first, each score its logprob over
    its length, each logprob what a forward pass without a cache gives, each text its
    tokens decoded; asking for two gives the first two."""
    model, _ = tiny_model("qwen2-tied", seed=2)
    tokenizer = vocab_tokenizer(model.args.vocab_size)
    prompt = [11, 12, 13]
    hyps = beam_search(model, tokenizer, prompt, num_beams=4, max_tokens=5, num_return_sequences=4)
    assert len(hyps) == 4
    assert len({tuple(h.tokens) for h in hyps}) == 4
    scores = [h.score for h in hyps]
    assert scores == sorted(scores, reverse=True)
    for h in hyps:
        assert h.score == pytest.approx(h.logprob / (len(h.tokens) + h.finished), abs=1e-6)
        assert h.logprob == pytest.approx(sequence_logprob(model, prompt, h, EOS_ID), abs=1e-4)
        assert h.text == tokenizer.decode(h.tokens)
    two = beam_search(model, tokenizer, mx.array(prompt), num_beams=4, max_tokens=5, num_return_sequences=2)
    assert [h.tokens for h in two] == [h.tokens for h in hyps[:2]]


def test_default_model_beams_beat_greedy(default_model):
    """SmolLM2, 4 beams, 6 tokens, no length penalty: the best hypothesis ("In twilight's
    hallow tapestry", log p = -4.22) is more likely than the greedy continuation ("In the
    depths of the ocean", -4.51), both measured by one pass over the whole continuation,
    and its own log-probability agrees with that measure."""
    model, tokenizer = default_model
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write a poem about the sea."}]
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages))  # a short system message: 24 tokens
    eos = tokenizer.eos_token_ids
    steps = [token for token, _ in generate_step(mx.array(prompt), model, max_tokens=6)]
    end = next((i + 1 for i, token in enumerate(steps) if token in eos), len(steps))
    best = beam_search(model, tokenizer, prompt, num_beams=4, max_tokens=6, length_penalty=0.0)[0]
    assert best.finished is False  # six tokens do not finish a poem: no end-of-sequence token to add
    greedy_total = continuation_logprob(model, prompt, steps[:end])
    recomputed = continuation_logprob(model, prompt, best.tokens)
    assert recomputed > greedy_total + 0.1
    assert best.logprob == pytest.approx(recomputed, abs=2e-2)
    assert best.score == best.logprob and best.text.strip()


# ---------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize("changes, fragments", [
    (dict(num_beams=0), ["num_beams", "0"]),
    (dict(num_beams=2.0), ["num_beams", "2.0"]),
    (dict(num_return_sequences=0), ["num_return_sequences", "0"]),
    (dict(num_beams=2, num_return_sequences=3), ["num_return_sequences", "3"]),
    (dict(max_tokens=0), ["max_tokens", "0"]),
    (dict(prompt=[]), ["prompt", "(0,)"]),
    (dict(prompt=""), ["prompt", "(0,)"]),
    (dict(length_penalty=math.inf), ["length_penalty", "inf"]),
    (dict(length_penalty=math.nan), ["length_penalty", "nan"]),
    (dict(length_penalty="1"), ["length_penalty", "'1'"]),
    (dict(early_stopping="always"), ["early_stopping", "'always'"]),
    (dict(early_stopping=1), ["early_stopping", "1"]),
    (dict(prefill_step_size=0), ["prefill_step_size", "0"]),
], ids=["beams-0", "beams-float", "return-0", "return-above-beams", "max-tokens-0", "empty-prompt",
        "empty-text", "penalty-inf", "penalty-nan", "penalty-str", "stopping-always", "stopping-1",
        "prefill-0"])
def test_bad_input_is_refused_before_the_model_runs(changes, fragments):
    """Each bad argument raises a ValueError naming it and its value; the model never runs."""
    model = TableModel(GREEDY_TRAP)
    kwargs = dict(prompt=[S], num_beams=2, max_tokens=3) | changes
    with pytest.raises(ValueError) as error:
        beam_search(model, vocab_tokenizer(5), **kwargs)
    for fragment in fragments:
        assert re.search(re.escape(fragment), str(error.value)), (fragment, str(error.value))
    assert model.calls == []
