"""Course: week 3 day 1 — speculative decoding with exact rejection sampling.

A cheap drafter proposes `γ` tokens; the target model scores all of them in one forward
pass. Draft token `x_i` (drawn from the draft distribution `q_i`) is accepted with
probability `min(1, p_i(x_i) / q_i(x_i))`; at the first rejection the next token is drawn
from `norm(max(0, p_i - q_i))`, and when all are accepted a bonus token is drawn from
`p_γ`. Every emitted token then has exactly the target's distribution `p` (the sampling
engine's distribution after its whole chain), whatever the drafter proposes.

Drafters: a second model sharing the tokenizer (its distribution after the same chain), or
prompt lookup, which proposes the tokens that followed the latest earlier occurrence of the
last few tokens (a point mass: `q(x) = 1`).

Tests: tests/test_week3_day1.py, tests/test_layout.py, tests/test_progress.py
"""

from collections.abc import Generator
from dataclasses import dataclass

import mlx.core as mx

from .distributed import fresh_seed
from .defaults import MAX_TOKENS, NUM_DRAFT_TOKENS, PREFILL_STEP_SIZE, TEMPERATURE
from .model import CachedModel, Progress, check_progress, prefill, vocab_size
from .sampler import Sampler, SamplingParams, rng
from .sampler.params import stage_on
from .sampler.draw import inverse_cdf
from .sampler.checks import check_int
from .tokenizer import Tokenizer

@dataclass
class SpeculativeStats:
    """Counts over one generation: rounds (target forward passes), tokens drafted and
    accepted, and tokens emitted."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def rejection_sample(
    draft_tokens: mx.array, q: mx.array, p: mx.array, uniforms: mx.array
) -> tuple[mx.array, mx.array]:
    """The verification step, for a batch of rows.

    `draft_tokens [B, γ]` were drawn from `q [B, γ, V]`; `p [B, γ+1, V]` are the target's
    distributions at the same positions plus one; `uniforms [B, γ+1]` in (0, 1): the first
    γ decide acceptance, the last draws the next token. Returns `accepted [B]` (how many
    leading drafts are kept, n) and `tokens [B, γ+1]`: the n kept drafts, then the drawn
    token, then -1.
    """
    # BEGIN SOLUTION week3-day1
    B, G = draft_tokens.shape
    drafts = draft_tokens.astype(mx.int32)
    px = mx.take_along_axis(p[:, :G], drafts[..., None], axis=-1)[..., 0]  # B, γ
    qx = mx.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
    keep = uniforms[:, :G] * qx < px  # u < p/q, without dividing by q
    accepted = mx.sum(mx.cumprod(keep.astype(mx.int32), axis=1), axis=1)  # B: leading accepts
    # The next token's distribution: max(0, p - q) at the first rejection, p after γ accepts.
    q_next = mx.concatenate([q, mx.zeros((B, 1, q.shape[-1]), q.dtype)], axis=1)
    residual = mx.maximum(p - q_next, 0.0)  # B, γ+1, V
    row = accepted[:, None, None]
    r = mx.take_along_axis(residual, row, axis=1)[:, 0]  # B, V
    r = mx.where(mx.sum(r, axis=-1, keepdims=True) > 0, r, mx.take_along_axis(p, row, axis=1)[:, 0])
    nxt = draw(r, uniforms[:, G])
    pos = mx.arange(G + 1)[None]
    padded = mx.concatenate([drafts, mx.zeros((B, 1), mx.int32)], axis=1)
    tokens = mx.where(pos < accepted[:, None], padded, mx.where(pos == accepted[:, None], nxt[:, None], -1))
    return accepted, tokens
    # END SOLUTION


def draw(probs: mx.array, u: mx.array) -> mx.array:
    """Inverse-CDF draws: one token per row of `probs [B, V]` for uniforms `u [B]` in
    [0, 1); always a token with positive probability, whatever the summation order."""
    return inverse_cdf(probs, u)


def prompt_lookup(history: list[int], count: int, ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to `count` tokens that followed the latest earlier occurrence of the longest
    suffix of `history` of `min_ngram` to `ngram` tokens; [] when nothing matches."""
    for n in range(min(ngram, len(history) - 1), min_ngram - 1, -1):
        suffix = history[-n:]
        for start in range(len(history) - n - 1, -1, -1):
            if history[start : start + n] == suffix:
                return history[start + n : start + n + count]
    return []


def refused_fields(params: SamplingParams) -> list[str]:
    """The fields of `params` that speculative decoding cannot honour, each on: mirostat, XTC
    and min_tokens (the distribution would depend on more than the logits and the history),
    a grammar (constrained decoding runs without a drafter) and the race (its tests accept
    and draw by the inverse CDF)."""
    return [field for field, on in (("mirostat", params.mirostat != 0), ("xtc_probability", stage_on("xtc", params)),
                                    ("min_tokens", params.min_tokens > 0), ("grammar", params.grammar is not None),
                                    ("draw", params.draw == "race"))
            if on]


def speculative_generate_step(
    prompt: mx.array,
    model: CachedModel,
    draft_model: CachedModel | None = None,
    *,
    num_draft_tokens: int = NUM_DRAFT_TOKENS,
    params: SamplingParams | None = None,
    max_tokens: int = MAX_TOKENS,
    ngram: int = 3,
    min_ngram: int = 3,
    prefill_step_size: int = PREFILL_STEP_SIZE,
    stats: SpeculativeStats | None = None,
    tokenizer: Tokenizer | None = None,
    prompt_progress: Progress | None = None,
) -> Generator[tuple[int, mx.array, bool], None, None]:
    """Yield `(token, logprobs [V], from_draft)` for up to `max_tokens` tokens.

    `draft_model`: a model with the target's vocabulary, or None for prompt lookup (drafts
    follow an earlier occurrence of the last `min_ngram` to `ngram` tokens; short matches
    propose more tokens that get rejected, and on a CPU every rejected token costs almost a
    decode step). `params`: the sampling parameters both
    distributions go through (default greedy); with temperature 0 the tokens are exactly
    the target's greedy tokens. `logprobs` are the target's log-softmax at that position.
    `stats`, if given, is filled in as generation goes. `prompt_progress(done, total)`, if
    given, follows the target's prefill of the `total = L` prompt tokens as in
    `generate_step`: all but the last token in chunks, then `(L, L)` once the first round,
    which feeds the last one, is evaluated.
    """
    num_draft_tokens = check_int("num_draft_tokens", num_draft_tokens, minimum=1)
    max_tokens = check_int("max_tokens", max_tokens, minimum=1)
    ngram = check_int("ngram", ngram, minimum=1)
    min_ngram = check_int("min_ngram", min_ngram, minimum=1)
    prompt_progress = check_progress(prompt_progress)
    params = SamplingParams(temperature=TEMPERATURE) if params is None else params
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
    if params.draw == "race":
        raise ValueError("speculative decoding draws by the inverse CDF: draw='race' does not apply")
    if any(field not in ("grammar", "draw") for field in refused_fields(params)):
        raise ValueError(
            "speculative decoding needs a distribution that depends only on the logits and the "
            f"history: mirostat={params.mirostat}, xtc_probability={params.xtc_probability} and "
            f"min_tokens={params.min_tokens} must be off"
        )
    if params.grammar is not None:
        raise ValueError("speculative decoding does not take a grammar: constrained decoding runs "
                         "without a drafter (drop draft_model / prompt_lookup)")
    vocab = vocab_size(model)
    draft_vocab = vocab_size(draft_model) if draft_model is not None else None
    if vocab and draft_vocab and vocab != draft_vocab:
        raise ValueError(
            f"the draft model's vocabulary has {draft_vocab} tokens, the target's {vocab}: "
            "they must share the tokenizer"
        )
    if prompt.ndim != 1 or prompt.size == 0:
        raise ValueError(f"prompt must be a non-empty sequence of token ids, got shape {prompt.shape}")
    return _speculate(prompt, model, draft_model, gamma=num_draft_tokens, params=params, max_tokens=max_tokens,
                      ngrams=(min_ngram, ngram), step_size=prefill_step_size, stats=stats or SpeculativeStats(),
                      tokenizer=tokenizer, progress=prompt_progress)


def _speculate(prompt, model, draft_model, *, gamma, params, max_tokens, ngrams, step_size, stats, tokenizer,
               progress):
    engine = Sampler(params, tokenizer)
    seed = params.seed if params.seed is not None else fresh_seed()
    counter = 0

    def uniforms(n: int) -> mx.array:
        nonlocal counter
        u = rng.uniform(mx.full((n,), seed, dtype=mx.uint32), mx.arange(counter, counter + n), rng.SPECULATIVE)
        counter += n
        return u

    def distributions(logits: mx.array, history: list[int], drafts: list[int]) -> mx.array:
        """The chain's distribution at each row of `logits [n, V]`, row i after drafts[:i]."""
        rows = [history + drafts[:i] for i in range(logits.shape[0])]
        return engine.distribution(logits.astype(mx.float32), rows)

    history = prompt.tolist()
    cache = model.make_cache()
    L = prompt.size
    if L > 1:  # the last prompt token goes with the first round
        prefill(model, prompt[None, :-1], cache, step_size,
                None if progress is None else lambda done, _: progress(done, L))
    draft_cache = draft_model.make_cache() if draft_model is not None else None
    pending = prompt.tolist()  # tokens the draft model has not seen yet
    emitted = 0
    while emitted < max_tokens:
        room = min(gamma, max_tokens - emitted - 1)  # a round emits up to room + 1 tokens
        if draft_model is None:
            drafts, q = (prompt_lookup(history, room, ngram=ngrams[1], min_ngram=ngrams[0]) if room else []), None
        else:
            drafts, q = _draft(draft_model, draft_cache, pending, history, count=room,
                               distributions=distributions, uniforms=uniforms, step_size=step_size)
        logits = model(mx.array([[history[-1], *drafts]]), cache=cache)[0]  # γ+1, V
        p = distributions(logits, history, drafts)
        logprobs = logits.astype(mx.float32) - mx.logsumexp(logits.astype(mx.float32), axis=-1, keepdims=True)
        if not drafts:
            n, out = 0, draw(p, uniforms(1)).tolist()
        else:
            if q is None:  # prompt lookup proposes with certainty: q is a point mass
                q = (mx.arange(p.shape[-1]) == mx.array(drafts)[:, None]).astype(mx.float32)
            if q.shape[-1] != p.shape[-1]:
                raise ValueError(f"the draft model has {q.shape[-1]} logits per token, the target "
                                 f"{p.shape[-1]}: they must share the tokenizer")
            accepted, tokens = rejection_sample(mx.array([drafts]), q[None], p[None],
                                                uniforms(len(drafts) + 1)[None])
            n = int(accepted.item())
            out = tokens[0, : n + 1].tolist()
        if progress is not None and emitted == 0:  # the first round fed the last prompt token
            progress(L, L)
        stats.rounds += 1
        stats.drafted += len(drafts)
        stats.accepted += n
        for c in cache:
            c.trim(len(drafts) - n)  # the target keeps its input token and the accepted drafts
        if draft_model is not None:  # the draft model still has to see these tokens
            pending = (_rewind_draft(draft_cache, drafts, n) if drafts else pending) + [out[-1]]
        for i, token in enumerate(out):
            history.append(token)
            emitted += 1
            stats.emitted += 1
            yield token, logprobs[i], i < n


def _draft(draft_model, cache, pending, history, *, count, distributions, uniforms, step_size):
    """Feed the draft model the tokens it lacks (`pending`), then draw `count` tokens from
    its chain distribution, one forward pass each. Returns the tokens and their
    distributions `q [count, V]`; the cache then holds every draft but the last. With
    `count == 0` nothing runs (the pending tokens wait for the next round)."""
    drafts, qs = [], []
    feed = list(pending)
    for _ in range(count):
        logits = prefill(draft_model, mx.array([feed]), cache, step_size)  # 1, V
        q = distributions(logits, history + drafts, [])
        drafts.append(int(draw(q, uniforms(1)).item()))
        qs.append(q[0])
        feed = drafts[-1:]
    return drafts, (mx.stack(qs) if qs else None)


def _rewind_draft(cache, drafts: list[int], n: int) -> list[int]:
    """After `n` of `drafts` were accepted, cut the draft cache back to the last accepted
    draft; returns the drafts it still lacks (the last one, when all were accepted)."""
    if not drafts:
        return []
    for c in cache:  # the cache holds every draft but the last
        c.trim(len(drafts) - 1 - min(n, len(drafts) - 1))
    return drafts[-1:] if n == len(drafts) else []
