"""Shared fixtures: random-weight reference models from mlx-lm and the default model."""

import importlib
import json
import os

import day_hits

day_hits.install()  # before anything imports tiny_llm: with TINY_LLM_DAY_HITS set, record each day's code run
from day_hits import pytest_configure, pytest_fixture_setup, pytest_runtest_protocol, pytest_sessionfinish  # noqa: E402,F401

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers

from tiny_llm.tokenizer import Tokenizer

# The property-based tests (test_fuzz, test_json_schema_hypothesis, test_serve_fuzz) draw
# fixed corpora of examples (the same on every run). A run with TINY_LLM_FUZZ=full (CI's)
# draws each corpus whole; any other run draws a fifth as many, so that `make test` keeps a
# developer's budget while every property still runs.
FUZZ_FULL = os.environ.get("TINY_LLM_FUZZ") == "full"


def examples(full: int) -> int:
    """How many examples a property test draws: `full` in a full run, a fifth (at least one)
    otherwise."""
    return full if FUZZ_FULL else max(1, full // 5)


TINY_CONFIGS = {
    # GQA ratio 2, untied head, Qwen2 q/k/v biases.
    "qwen2-untied": dict(
        model_type="qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128, rms_norm_eps=1e-6,
        rope_theta=1_000_000.0, tie_word_embeddings=False,
    ),
    # GQA ratio 7, tied head.
    "qwen2-tied": dict(
        model_type="qwen2", hidden_size=56, num_hidden_layers=2, intermediate_size=80,
        num_attention_heads=7, num_key_value_heads=1, vocab_size=96, rms_norm_eps=1e-6,
        rope_theta=10_000.0, tie_word_embeddings=True,
    ),
    # Llama: no biases, tied head, GQA ratio 3 like SmolLM2.
    "llama-tied": dict(
        model_type="llama", hidden_size=48, num_hidden_layers=3, intermediate_size=64,
        num_attention_heads=6, num_key_value_heads=2, vocab_size=112, rms_norm_eps=1e-5,
        rope_theta=100_000.0, tie_word_embeddings=True,
    ),
    # Llama without GQA and with an untied head.
    "llama-untied": dict(
        model_type="llama", hidden_size=32, num_hidden_layers=2, intermediate_size=48,
        num_attention_heads=2, num_key_value_heads=2, vocab_size=100, rms_norm_eps=1e-5,
        rope_theta=10_000.0, tie_word_embeddings=False,
    ),
}


# (atol, rtol) per dtype. float16 keeps 11 significant bits and bfloat16 only 8, so inputs
# and outputs rounded to half precision differ from the oracle by about one unit in the
# last place of values of order 1.
TOLERANCES = {
    mx.float32: (1e-5, 1e-5),
    mx.float16: (1e-2, 1e-2),
    mx.bfloat16: (5e-2, 5e-2),
}


def assert_close(actual: mx.array, expected: mx.array, dtype: mx.Dtype) -> None:
    """Same shape, same dtype, and values (compared in float32) within the tolerance of `dtype`."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    atol, rtol = TOLERANCES[dtype]
    np.testing.assert_allclose(
        np.array(actual.astype(mx.float32)),
        np.array(expected.astype(mx.float32)),
        atol=atol,
        rtol=rtol,
    )


# Unit roundoff of each dtype.
EPS = {mx.float32: 2.0**-23, mx.float16: 2.0**-11, mx.bfloat16: 2.0**-8}


@pytest.fixture(scope="module")
def kernels_on_the_cpu():
    """Our kernels, built, on the CPU stream (on a Mac's GPU MLX's own op would run instead)."""
    from tiny_llm import kernels

    kernels.require()
    before = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(before)


def assert_half_precision_close(actual: mx.array, expected: mx.array) -> None:
    """float16 logits of a whole model against a reference on the same float16 weights.
    Every intermediate value is rounded to 11 significant bits, by other kernels (and in
    other orders) than the reference's, across layers and dozens of positions: single
    logits drift by up to about ten units in the last place (0.004 at |x| = 4), so the
    largest difference may reach 5e-2. The mean bound is 1e-2 rather than the 5e-3 that two
    half-precision pipelines show: on the CPU our kernels (week 2 day 6) sum each product in
    float32 and round once, while MLX's float16 matrix products, which the reference runs,
    round as they go (measured: 20x further from a float64 product than ours), so part of
    the difference is the reference's own error (means of 5.3e-3 seen on Qwen2 shapes)."""
    diff = np.abs(np.array(actual.astype(mx.float32)) - np.array(expected.astype(mx.float32)))
    assert diff.max() < 5e-2 and diff.mean() < 1e-2, (diff.max(), diff.mean())


def normal(key: mx.array, shape: tuple[int, ...], dtype: mx.Dtype, scale: float = 1.0) -> mx.array:
    """Seeded normal values of `dtype` (std `scale`)."""
    return (scale * mx.random.normal(shape, key=key)).astype(dtype)


def reference_model(config: dict, seed: int = 0, scale: float = 0.2):
    """An mlx-lm model of `config` with seeded random weights (normal, std `scale`)."""
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    key = mx.random.key(seed)
    params = tree_flatten(model.parameters())
    keys = mx.random.split(key, len(params))
    new = {name: mx.random.normal(p.shape, key=k) * scale for (name, p), k in zip(params, keys)}
    # Norm weights near 1, as in trained models.
    new = {n: (1.0 + v if n.endswith("norm.weight") else v)
           for n, v in new.items()}
    model.load_weights(list(new.items()))
    mx.eval(model.parameters())
    return model


def save_dir(path, config: dict, weights: dict):
    """A model directory in mlx-lm's layout: `config.json` and one `model.safetensors`."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    return path


def model_weights(model) -> dict[str, mx.array]:
    return dict(tree_flatten(model.parameters()))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, default_model_dir):
    """`serve_support.TINY_SERVED` as a model directory named "tiny-served": a random-weight
    model with the default model's tokenizer, for the live servers of the server tests."""
    from serve_support import tiny_served_model

    return tiny_served_model(tmp_path_factory.mktemp("served") / "tiny-served", default_model_dir)


@pytest.fixture(scope="session")
def default_model_dir():
    """The converted default model (SmolLM2-135M-Instruct), shared by all tests."""
    from tiny_llm.loader import resolve

    return resolve("default")


@pytest.fixture(scope="session")
def default_model(default_model_dir):
    from tiny_llm import load

    return load("default")


@pytest.fixture(scope="session")
def fused_default_model(default_model_dir):
    """The default model on the fused kernels, asked for by name: without week 2 day 3,
    its first forward pass raises that day's NotImplementedError instead of falling back."""
    from tiny_llm import load

    return load("default", fused=True)


@pytest.fixture(scope="session")
def default_tokenizer(default_model_dir):
    """The default model's tokenizer alone: tests of text need no course day."""
    return Tokenizer.from_directory(default_model_dir)


@pytest.fixture(scope="session")
def course_default_model(default_model_dir):
    """The default model on the course's hand-written RMSNorm, RoPE and attention."""
    from tiny_llm import load

    return load("default", fused=False)


def tiny_model(name: str, seed: int = 0, fused: bool = False, **overrides):
    """tiny-llm's model of `TINY_CONFIGS[name]` (plus `overrides`) with mlx-lm's seeded
    random weights, and that mlx-lm reference model."""
    from tiny_llm.qwen2 import ModelArgs, Qwen2Model

    config = dict(TINY_CONFIGS[name], **overrides)
    ref = reference_model(config, seed=seed)
    return Qwen2Model(ModelArgs.from_config(config), model_weights(ref), fused=fused), ref


def vocab_tokenizer(n: int) -> Tokenizer:
    """`n` whole-word tokens `w0 .. w{n-1}`; token 0 ends the sequence."""
    words = [f"w{i}" for i in range(n)]
    backend = Backend(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece(prefix="##")
    return Tokenizer(backend, eos_tokens=["w0"])


class MlxLmDefault:
    """mlx-lm's copy of the default model (`model`, `tokenizer`), and its answers, each
    computed once per test process: several days' tests compare against the same logits and
    greedy tokens, and on a CPU mlx-lm needs about a fifth of a second per token."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self._answers: dict[tuple, object] = {}

    def logits(self, tokens: list[int]) -> mx.array:
        """`[L, V]`: mlx-lm's logits at every position of `tokens`, in one forward pass."""
        key = ("logits", tuple(tokens))
        if key not in self._answers:
            self._answers[key] = self.model(mx.array([tokens]))[0]
            mx.eval(self._answers[key])
        return self._answers[key]

    def greedy(self, ids: list[int], max_tokens: int) -> list[int]:
        """The tokens `mlx_lm.stream_generate` writes after the prompt `ids`, greedy."""
        import mlx_lm

        key = ("greedy", tuple(ids), max_tokens)
        if key not in self._answers:
            self._answers[key] = [r.token for r in mlx_lm.stream_generate(self.model, self.tokenizer, ids,
                                                                          max_tokens=max_tokens)]
        return list(self._answers[key])


@pytest.fixture(scope="session")
def reference_default_model(default_model_dir) -> MlxLmDefault:
    import mlx_lm

    return MlxLmDefault(*mlx_lm.load(str(default_model_dir)))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    """The tests that use mlx-lm's copy of the default model run on one test worker: it is
    loaded once, and its answers are shared (`MlxLmDefault`)."""
    for item in items:
        if "reference_default_model" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("mlx-lm-default"))


VOCAB = ["<eos>", "a", "b", "c", "d", "e", "f", "g"]
V = len(VOCAB)
EOS = 0


def word_tokenizer() -> Tokenizer:
    """Eight whole-word tokens; token 0 ends the sequence."""
    backend = Backend(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<eos>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return Tokenizer(backend, eos_tokens=["<eos>"])


class CountingModel:
    """Fixed rule: the next token is (last token + 1) mod V, with logit 5 against 0.

    Without `make_cache` the loop must feed it the whole sequence; it records what it saw.
    """

    def __init__(self):
        self.calls: list[list[int]] = []

    def logits(self, tokens: mx.array) -> mx.array:
        B, L = tokens.shape
        nxt = (tokens + 1) % V  # B, L
        return mx.where(mx.arange(V) == nxt[..., None], 5.0, 0.0)  # B, L, V

    def __call__(self, tokens: mx.array, cache=None) -> mx.array:
        assert cache is None
        self.calls.append(tokens[0].tolist())
        return self.logits(tokens)


class CachedCountingModel(CountingModel):
    """Same rule, with a cache: the loop must feed only the tokens the cache has not seen."""

    def make_cache(self):
        return [{"seen": 0}]

    def __call__(self, tokens: mx.array, cache=None) -> mx.array:
        assert cache is not None
        self.calls.append(tokens[0].tolist())
        cache[0]["seen"] += tokens.shape[1]
        return self.logits(tokens)



def generate_alone(model, tokenizer, prompt, max_tokens, params=None) -> list[int]:
    """The tokens one prompt generates by itself through `stream_generate` (greedy unless
    `params`), without a final end-of-sequence token."""
    import tiny_llm
    from tiny_llm.sampler import SamplingParams

    params = params or SamplingParams(temperature=0.0)
    out = [r.token for r in tiny_llm.stream_generate(model, tokenizer, prompt, max_tokens, params=params)]
    return out[:-1] if out and out[-1] in tokenizer.eos_token_ids else out


def filled_batch_cache(padding: list[int], length: int, base: float):
    """A `BatchKVCache` whose key at (row b, slot s) is base + 10 b + s (values: the negative)."""
    from tiny_llm.kv_cache import BatchKVCache

    B = len(padding)
    cache = BatchKVCache(padding)
    k = base + 10 * mx.arange(B)[:, None, None, None] + mx.arange(length)[None, None, :, None]
    k = mx.broadcast_to(k.astype(mx.float32), (B, 2, length, 3))
    cache.update_and_fetch(k, -k)
    return cache


def cache_slots(cache, row: int) -> list[float]:
    """The keys a cache row holds in its used slots (feature 0 of head 0)."""
    return [float(v) for v in cache.keys[row, 0, : cache.offset, 0].tolist()]


__all__ = ["TINY_CONFIGS", "reference_model", "model_weights", "tree_map", "VOCAB", "V", "EOS",
           "word_tokenizer", "vocab_tokenizer", "tiny_model", "CountingModel", "CachedCountingModel",
           "generate_alone", "filled_batch_cache", "cache_slots", "pooled"]


def pooled(observed, expected, minimum=5.0):
    """Merge the bins of smallest expected count until every bin expects >= `minimum`."""
    order = np.argsort(expected)
    obs, exp = list(observed[order]), list(expected[order])
    while len(exp) > 2 and exp[0] < minimum:
        small_exp, small_obs = exp.pop(0), obs.pop(0)
        exp[0] += small_exp
        obs[0] += small_obs
    return np.array(obs, float), np.array(exp, float)
