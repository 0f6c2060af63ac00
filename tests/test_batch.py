"""The batch engine's edges: bad input, settings and one-row batches (outside the course
days, whose tests exercise the students' code)."""

import mlx.core as mx
import numpy as np
import pytest
from conftest import generate_alone, tiny_model, vocab_tokenizer

import tiny_llm
from tiny_llm.batch import BatchGenerator, batch_generate
from tiny_llm.constrain import Grammar
from tiny_llm.kv_cache import BatchKVCache
from tiny_llm.sampler import SamplingParams


def test_batch_cache_rejects_bad_padding_and_over_trimming():
    with pytest.raises(ValueError, match="left_padding"):
        BatchKVCache([])
    with pytest.raises(ValueError, match="left_padding"):
        BatchKVCache([0, -1])
    cache = BatchKVCache([0, 2])
    cache.update_and_fetch(mx.zeros((2, 1, 4, 4)), mx.zeros((2, 1, 4, 4)))
    with pytest.raises(ValueError, match="a row holds only 2 tokens"):
        cache.trim(3)
    assert cache.trim(2) == 2 and cache.offset == 2


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompts=[[1, 2], []]), "prompt 1: prompt is empty"),
    (dict(prompts=[]), "prompts must be a non-empty list"),
    (dict(prompts="w1 w2"), "prompts must be a non-empty list"),
    (dict(prompts=[[1]], max_tokens=0), "prompt 0: max_tokens must be"),
    (dict(prompts=[[1], [2]], max_tokens=[3]), "max_tokens has 1 entries for 2 prompts"),
    (dict(prompts=[[1], [2]], params=[SamplingParams()]), "params has 1 entries for 2 prompts"),
    (dict(prompts=[[1] * 30]), "exceeds the model's context of 32 positions"),
    (dict(prompts=[[1, 500]]), "outside the vocabulary"),
    (dict(prompts=[[1]], params=[{"temperature": 1}]), "params must be a SamplingParams"),
    (dict(prompts=[[1], [2]], params=[SamplingParams(), SamplingParams(logit_bias={112: 1.0})]),
     r"prompt 1: logit_bias names token 112, outside the vocabulary \[0, 112\)"),
])
def test_bad_input_is_refused_before_the_model_runs(kwargs, match):
    model, _ = tiny_model("llama-tied", max_position_embeddings=32)
    calls = []
    spy = type("Spy", (), {"__call__": lambda self, *a, **k: calls.append(1), "args": model.args,
                           "layers": model.layers, "make_cache": lambda self: calls.append(1)})()
    kwargs.setdefault("max_tokens", 4)
    with pytest.raises(ValueError, match=match):
        batch_generate(spy, vocab_tokenizer(model.args.vocab_size), **kwargs)
    assert calls == []


def test_bad_generator_settings_are_refused():
    model, _ = tiny_model("llama-tied")
    tok = vocab_tokenizer(model.args.vocab_size)
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchGenerator(model, tok, max_batch_size=0)
    with pytest.raises(ValueError, match="prefill_step_size"):
        BatchGenerator(model, tok, prefill_step_size=0)


def test_the_scheduler_needs_a_running_batch_class():
    """`Scheduler` drives a batch it does not define: without a `batch_type` it refuses to
    start and names the class that has one."""
    from tiny_llm.scheduler import Scheduler

    model, _ = tiny_model("llama-tied")
    with pytest.raises(TypeError, match="Scheduler names no batch_type: use tiny_llm.batch.BatchGenerator"):
        Scheduler(model, vocab_tokenizer(model.args.vocab_size))


def test_one_row_at_a_time_matches_each_prompt_alone():
    """max_batch_size=1: requests run one after another, each as if alone."""
    model, _ = tiny_model("qwen2-untied", seed=40)
    tok = vocab_tokenizer(model.args.vocab_size)
    prompts, limits = [[5, 17, 3], [44], [8, 8, 21, 40]], [4, 6, 3]
    result = batch_generate(model, tok, prompts, limits, max_batch_size=1)
    expected = []
    for p, n in zip(prompts, limits):
        out = [r.token for r in tiny_llm.stream_generate(model, tok, p, n)]
        expected.append(out[:-1] if out[-1] in tok.eos_token_ids else out)
    assert result.tokens == expected



# ---- a request that fails alone -----------------------------------------------------------


class FaultyModel:
    """`model`, except that on some calls (a seeded choice) one row's next-token logits turn
    NaN: the request in that row can no longer be sampled, whichever request it is."""

    def __init__(self, model, seed: int, rate: float):
        self.model, self.rng, self.rate = model, np.random.default_rng(seed), rate
        self.faults = 0
        self.args, self.layers, self.make_cache = model.args, model.layers, model.make_cache  # the contract

    def __call__(self, tokens, cache=None):
        logits = self.model(tokens, cache=cache)
        if self.rng.random() < self.rate:
            row = int(self.rng.integers(tokens.shape[0]))
            self.faults += 1
            poisoned = mx.arange(tokens.shape[0])[:, None] == row
            logits = mx.concatenate([logits[:, :-1], mx.where(poisoned, mx.nan, logits[:, -1])[:, None]], axis=1)
        return logits


def run_generator(gen: BatchGenerator, steps: int | None = None, tokens=None, reasons=None, errors=None):
    """Step `gen` to the end (or `steps` times), adding each uid's tokens, finish reason and
    error to the dicts given (new ones if none)."""
    tokens, reasons, errors = ({} if d is None else d for d in (tokens, reasons, errors))
    while gen.has_work() and steps != 0:
        for r in gen.step():
            if r.token is not None and r.finish_reason != "stop":
                tokens.setdefault(r.uid, []).append(r.token)
            if r.finish_reason:
                reasons[r.uid], errors[r.uid] = r.finish_reason, r.error
        steps = None if steps is None else steps - 1
    return tokens, reasons, errors


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_requests_that_fail_at_random_steps_leave_the_others_unchanged(seed):
    """Fault injection: sixteen seeded requests through four rows, a row poisoned at random
    on a fifth of the model calls. Each failed request ends alone with finish_reason "error"
    naming its uid, the tokens it had are its solo run's; every other request's tokens
    equal its solo run."""
    model, _ = tiny_model("qwen2-untied", seed=40)
    tok = vocab_tokenizer(model.args.vocab_size)
    rng = np.random.default_rng(seed)
    requests = [([int(t) for t in rng.integers(1, model.args.vocab_size, int(rng.integers(1, 6)))],
                 int(rng.integers(3, 9)), SamplingParams(temperature=0.9, top_k=20, seed=i)) for i in range(16)]
    faulty = FaultyModel(model, seed, rate=0.2)
    gen = BatchGenerator(faulty, tok, max_batch_size=4)
    uids = [gen.insert(p, n, params) for p, n, params in requests]
    tokens, reasons, errors = run_generator(gen)
    failed = [u for u in uids if reasons[u] == "error"]
    assert faulty.faults >= 2 and 1 <= len(failed) < len(uids)  # the seeds inject real faults
    for uid, (prompt, n, params) in zip(uids, requests):
        alone = generate_alone(model, tok, prompt, n, params)
        if uid in failed:
            assert errors[uid].startswith(f"request {uid}: the logits have no finite value")
            assert tokens.get(uid, []) == alone[:len(tokens.get(uid, []))]
        else:
            assert errors[uid] is None and tokens.get(uid, []) == alone, uid


def test_a_grammar_dead_end_ends_that_request_alone():
    """A grammar that needs a character no token has: the request ends with an error naming
    its uid (not its row); the rows around it give their solo tokens."""
    model, _ = tiny_model("qwen2-untied", seed=40)
    tok = vocab_tokenizer(model.args.vocab_size)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, grammar=Grammar.from_regex("w1q")),
              SamplingParams(temperature=0.7, seed=3)]
    prompts = [[5, 17, 3], [44, 2], [8]]
    result = batch_generate(model, tok, prompts, 6, params=params, max_batch_size=2)
    assert result.finish_reasons == ["length", "error", "length"]
    assert result.tokens[1] == [1] and result.texts[1] == "w1"  # what it had is kept
    assert result.errors[1].startswith("request 1: the grammar allows no token here")
    assert result.errors[0] is None and result.errors[2] is None
    for i in (0, 2):
        assert result.tokens[i] == generate_alone(model, tok, prompts[i], 6, params[i])


def test_cancel_takes_a_request_out_of_the_queue_or_the_batch():
    """Cancelling a waiting and a running request: they never answer again, the others
    give their solo tokens; an unknown uid is False."""
    model, _ = tiny_model("qwen2-untied", seed=40)
    tok = vocab_tokenizer(model.args.vocab_size)
    prompts = [[5, 17, 3], [44, 2], [8], [9, 9]]
    params = [SamplingParams(temperature=0.8, seed=i) for i in range(4)]
    gen = BatchGenerator(model, tok, max_batch_size=2)
    for p, sp in zip(prompts, params):
        gen.insert(p, 8, sp)
    tokens, reasons, errors = run_generator(gen, steps=2)
    assert gen.running == [0, 1] and gen.waiting == [2, 3]
    assert gen.cancel(3) and gen.waiting == [2]
    assert gen.cancel(0) and gen.running == [1]
    assert not gen.cancel(0) and not gen.cancel(99)
    run_generator(gen, None, tokens, reasons, errors)
    assert sorted(reasons) == [1, 2]
    for uid in (1, 2):
        assert tokens.get(uid, []) == generate_alone(model, tok, prompts[uid], 8, params[uid])


def test_logprobs_are_the_models_log_softmax_for_the_drawn_tokens():
    """logprobs=True: each token's log-probability and the top `params.logprobs` equal
    log-softmax of the model's logits over prompt + reply (teacher forcing); rows that did
    not ask carry none."""
    model, _ = tiny_model("qwen2-untied", seed=42)
    tok = vocab_tokenizer(model.args.vocab_size)
    gen = BatchGenerator(model, tok)
    prompt = [7, 3, 99, 12]
    asked = gen.insert(prompt, 5, SamplingParams(temperature=1.0, seed=3, logprobs=3), logprobs=True)
    other = gen.insert([1, 2], 5, SamplingParams(temperature=1.0, seed=4))
    seen = {asked: [], other: []}
    while gen.has_work():
        for r in gen.step():
            seen[r.uid].append(r)
    assert all(r.logprobs is None for r in seen[other])
    tokens = [r.token for r in seen[asked] if r.finish_reason != "stop"]
    logits = model(mx.array([prompt + tokens[:-1]]))[0, len(prompt) - 1:].astype(mx.float32)
    expected = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
    for i, (token, r) in enumerate(zip(tokens, seen[asked])):
        assert r.logprobs.logprob == pytest.approx(expected[i, token], abs=1e-5)
        best = np.argsort(-expected[i], kind="stable")[:3]
        assert [t for t, _ in r.logprobs.top] == best.tolist()
        assert [v for _, v in r.logprobs.top] == pytest.approx(expected[i, best].tolist(), abs=1e-5)
    with pytest.raises(ValueError, match="logprobs must be True or False"):
        gen.insert([1], 2, logprobs=1)
