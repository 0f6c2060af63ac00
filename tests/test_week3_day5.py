"""Week 3, day 5: tensor parallelism — the plan, cutting weights (packed ones too), the sum
over ranks, and real ranks: processes on 127.0.0.1 started by `mlx.launch` (MLX's ring
backend), compared with one process."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from conftest import model_weights, reference_model, vocab_tokenizer

from tiny_llm.attention import causal_mask
from tiny_llm.sampler import SamplingParams
from tiny_llm.quantize import QuantizedWeight, project
from tiny_llm.qwen2 import ModelArgs, Qwen2Model
from tiny_llm.tensor_parallel import COLUMNS, ROWS, AllSum, Slice, plan, shard, shard_weights, split

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from make_random_model import write_random_model  # noqa: E402

CONFIGS = {
    # Qwen2: q/k/v biases, 4 query heads over 2 key/value heads.
    "qwen2": dict(model_type="qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=128, rms_norm_eps=1e-6,
                  rope_theta=1e6, tie_word_embeddings=False),
    # Llama with 3 key/value heads (like the default model): 2 ranks get 2 and 1 of them.
    "llama-uneven": dict(model_type="llama", hidden_size=72, num_hidden_layers=2, intermediate_size=80,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=112, rms_norm_eps=1e-5,
                         rope_theta=1e4, tie_word_embeddings=True, attention_bias=True, mlp_bias=True),
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
                      rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False, max_position_embeddings=512,
                      num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1,
                      mlp_only_layers=[1]),
    "qwen2_moe": dict(model_type="qwen2_moe", hidden_size=64, num_hidden_layers=1, intermediate_size=96,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128, rms_norm_eps=1e-6,
                      rope_theta=1e6, tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32, shared_expert_intermediate_size=48),
}
TOKENS = mx.array(np.random.default_rng(0).integers(0, 100, (2, 12)))


# ---- one process: the plan and the cuts ----------------------------------------------------


@pytest.mark.parametrize("n, world, unit", [(10, 3, 1), (9, 2, 1), (96, 2, 32), (7, 7, 1), (128, 3, 32)])
def test_split_is_contiguous_and_balanced(n, world, unit):
    parts = [split(n, world, r, unit) for r in range(world)]
    assert parts[0][0] == 0 and parts[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # contiguous, in rank order
    sizes = [b - a for a, b in parts]
    assert all(s % unit == 0 and s > 0 for s in sizes) and max(sizes) - min(sizes) <= unit


def test_split_refuses_empty_parts():
    with pytest.raises(ValueError, match="intermediate_size=64 cannot be split over 3 ranks in whole "
                                         "quantization groups of 32: each rank needs a part"):
        split(64, 3, 0, 32, "intermediate_size")


def test_plan_of_the_default_models_shape():
    """SmolLM2's 9 query heads over 3 key/value heads on 2 ranks: 6 and 3 query heads (each
    with its key/value head), and half the MLP each, cut on groups of 32."""
    args = ModelArgs.from_config(dict(CONFIGS["llama-uneven"], hidden_size=576, intermediate_size=1536))
    (a0, s0), (a1, s1) = plan(args, 0, 2, 32), plan(args, 1, 2, 32)
    Dh = args.head_dim  # 64
    assert (a0.num_attention_heads, a0.num_key_value_heads, a1.num_attention_heads, a1.num_key_value_heads) == (6, 2, 3, 1)
    assert a0.intermediate_size == a1.intermediate_size == 768 and a0.head_dim == a1.head_dim == Dh
    p = "model.layers.1."
    assert s0[p + "self_attn.q_proj.weight"] == Slice(ROWS, 0, 6 * Dh)
    assert s1[p + "self_attn.k_proj.weight"] == Slice(ROWS, 2 * Dh, 3 * Dh)
    assert s1[p + "self_attn.o_proj.weight"] == Slice(COLUMNS, 6 * Dh, 9 * Dh)
    assert s1[p + "self_attn.q_proj.bias"] == Slice(COLUMNS, 6 * Dh, 9 * Dh)
    assert s0[p + "self_attn.o_proj.bias"].first_rank_only
    assert s1[p + "mlp.down_proj.weight"] == Slice(COLUMNS, 768, 1536)
    assert s0[p + "mlp.gate_proj.weight"] == Slice(ROWS, 0, 768)
    for replicated in ("model.embed_tokens.weight", "model.norm.weight", p + "input_layernorm.weight"):
        assert replicated not in s0


def test_plan_refuses_fewer_key_value_heads_than_ranks():
    args = ModelArgs.from_config(CONFIGS["qwen2"])
    with pytest.raises(ValueError, match="num_key_value_heads=2 cannot be split over 3 ranks: each rank "
                                         "needs at least one key/value head"):
        plan(args, 0, 3)


def test_shard_cuts_packed_weights_on_groups():
    """Rows of a packed weight are rows of its three arrays; columns are whole groups, and
    the cut equals the cut of the unpacked values."""
    w = mx.random.normal((16, 128), key=mx.random.key(1))
    qw = QuantizedWeight(*mx.quantize(w, group_size=32, bits=4), 32, 4)
    full = mx.dequantize(*qw.arrays(), group_size=32, bits=4)
    for s in (Slice(ROWS, 4, 12), Slice(COLUMNS, 32, 96)):
        part = shard(qw, s, rank=1)
        assert isinstance(part, QuantizedWeight)
        index = (slice(s.start, s.stop), slice(None)) if s.axis == ROWS else (slice(None), slice(s.start, s.stop))
        assert mx.array_equal(mx.dequantize(*part.arrays(), group_size=32, bits=4), full[index])
    with pytest.raises(ValueError, match=r"columns \[16, 96\) do not fall on quantization groups of 32"):
        shard(qw, Slice(COLUMNS, 16, 96), rank=0)
    bias = mx.arange(4.0)
    assert mx.array_equal(shard(bias, Slice(COLUMNS, 0, 0, first_rank_only=True), 0), bias)
    assert mx.array_equal(shard(bias, Slice(COLUMNS, 0, 0, first_rank_only=True), 1), mx.zeros(4))


def summed_over_ranks(args: ModelArgs, weights: dict, world: int, unit: int = 1) -> mx.array:
    """The tensor-parallel forward pass in one process: each rank's sub-layers run on their
    own weights and their outputs are added, as the all_sum adds them across processes."""
    ranks = [Qwen2Model(*shard_weights(args, weights, r, world, unit)) for r in range(world)]
    base = ranks[0]
    h = base.embed_tokens(TOKENS)
    mask = causal_mask(TOKENS.shape[1], TOKENS.shape[1], h.dtype)
    for i, layer in enumerate(base.layers):
        x = layer.input_layernorm(h)
        h = h + sum(m.layers[i].self_attn(x, mask=mask) for m in ranks)
        x = layer.post_attention_layernorm(h)
        h = h + sum(m.layers[i].mlp(x) for m in ranks)
    h = base.norm(h)
    return base.embed_tokens.as_linear(h) if base.lm_head is None else project(h, base.lm_head)


@pytest.mark.parametrize("name, world", [(name, world) for name in sorted(CONFIGS) for world in (2, 3)
                                         if CONFIGS[name]["num_key_value_heads"] >= world])
def test_sum_over_ranks_equals_the_whole_model(name, world):
    config = CONFIGS[name]
    args = ModelArgs.from_config(config)
    weights = model_weights(reference_model(config, seed=3))
    np.testing.assert_allclose(np.array(summed_over_ranks(args, weights, world)),
                               np.array(Qwen2Model(args, weights)(TOKENS)), atol=1e-5, rtol=1e-5)


def test_sum_over_ranks_of_a_quantized_model():
    import mlx.nn as nn

    config = dict(CONFIGS["qwen2"], intermediate_size=128)
    ref = reference_model(config, seed=4)
    nn.quantize(ref, group_size=32, bits=4, class_predicate=lambda p, m: isinstance(m, nn.Linear))
    from tiny_llm.loader import gather_quantized

    weights = gather_quantized(model_weights(ref), {"group_size": 32, "bits": 4})
    args = ModelArgs.from_config(config)
    np.testing.assert_allclose(np.array(summed_over_ranks(args, weights, 2, unit=32)), np.array(ref(TOKENS)),
                               atol=1e-4, rtol=1e-4)


def test_ranks_count_cache_pages_of_the_whole_model():
    """The ranks' prefix caches must evict the same pages: each rank's page pool counts the
    bytes of a whole-model page, the same on a rank with 2 key/value heads and on one with 1,
    so that a prompt finds as many cached tokens on every rank."""
    from tiny_llm.batch import BatchGenerator
    from tiny_llm.tensor_parallel import parallel

    args = ModelArgs.from_config(CONFIGS["llama-uneven"])
    weights = model_weights(reference_model(CONFIGS["llama-uneven"], seed=5))
    whole = BatchGenerator(Qwen2Model(args, weights), vocab_tokenizer(112), paged=True, prefix_cache_bytes=1 << 20)
    cached = []
    for gen in [whole] + [BatchGenerator(parallel(Qwen2Model(*shard_weights(args, weights, r, 2)),
                                                  mx.distributed.init(), args),  # a group of one: sums nothing
                                         vocab_tokenizer(112), paged=True, prefix_cache_bytes=1 << 20)
                          for r in (0, 1)]:
        gen.insert(list(range(1, 40)), 2, SamplingParams(temperature=0.0))
        while gen.has_work():
            gen.step()
        cached.append((gen.pool.heads_share, gen.pool.page_nbytes))
    assert [share for share, _ in cached] == [(1, 1), (2, 3), (1, 3)]
    assert cached[0][1] == cached[1][1] == cached[2][1] > 0


def test_all_sum_of_one_rank_is_the_sub_layer():
    group = mx.distributed.init()  # alone: a group of one
    x = mx.arange(6.0).reshape(2, 3)
    assert mx.array_equal(AllSum(lambda t, scale: t * scale, group)(x, scale=2.0), x * 2.0)


# ---- real ranks: mlx.launch on 127.0.0.1 ---------------------------------------------------

LAUNCH = str(Path(sys.executable).parent / "mlx.launch")
TIMEOUT = 180  # seconds for one launch: loading and a few tokens in each of the ranks


def free_ports(n: int) -> int:
    """A first port of `n` consecutive free ones on 127.0.0.1 (the ring listens on port + rank)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        if first + n > 65535:
            continue
        try:
            socks = []
            for p in range(first, first + n):
                socks.append(socket.socket())
                socks[-1].bind(("127.0.0.1", p))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports")


# MLX's ring gives a rank 15 s (five tries, 1 + 2 + 4 + 8 s apart) to find its neighbour
# listening, and the ports picked free here may be taken by another process before a rank
# binds them. On a loaded machine (two test workers, the course checks' parallel jobs) either
# can fail the ring's set-up before tiny-llm runs: such a launch is made once more, on new ports.
RING_SETUP_FAILED = re.compile(r"\[ring\] Couldn't (connect|bind|listen|create socket)")


def launch(ranks: int, command: list[str], timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """`mlx.launch --backend ring -n RANKS -- command` on 127.0.0.1, bounded in time."""
    for attempt in (1, 2):
        argv = [LAUNCH, "--backend", "ring", "-n", str(ranks), "--starting-port", str(free_ports(ranks)), "--",
                *command]
        # A session of its own: on time-out the launcher and every rank it started are stopped.
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            pytest.fail(f"{' '.join(command[:4])} ... did not end within {timeout} s: {err[-2000:]}")
        if attempt == 1 and RING_SETUP_FAILED.search(err):
            print(f"the ring's set-up failed, launching again: {RING_SETUP_FAILED.search(err).group(0)}")
            continue
        return subprocess.CompletedProcess(argv, process.returncode, out, err)


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "tiny_llm", *args]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two random-weight model directories, after checking in this process that the plan
    splits them over 2 ranks (the ranks run the same plan)."""
    root = tmp_path_factory.mktemp("tp")
    paths = {"qwen2": write_random_model(root / "qwen2", "qwen2", seed=1),
             "qwen3_moe-4bit": write_random_model(root / "qwen3_moe", "qwen3_moe", bits=4, seed=2)}
    for path in paths.values():
        config = json.loads((path / "config.json").read_text())
        unit = config.get("quantization", {}).get("group_size", 1)
        halves = [plan(ModelArgs.from_config(config), r, 2, unit)[0] for r in (0, 1)]
        assert [a.num_key_value_heads for a in halves] == [1, 1]
        hidden = "moe_intermediate_size" if "num_experts" in config else "intermediate_size"  # what is cut
        assert sum(getattr(a, hidden) for a in halves) == config[hidden]
    return paths


WORKER = textwrap.dedent('''
    import json, sys
    import mlx.core as mx
    import tiny_llm
    from tiny_llm import distributed
    tokens = mx.array([[1, 17, 300, 4000, 52, 9, 77, 1000]])
    out = sys.argv[1]  # a folder: mlx.launch interleaves the ranks' long lines on its standard output
    for i, path in enumerate(sys.argv[2:]):
        model, _ = tiny_llm.load(path, group=distributed.group())
        cache = model.make_cache()
        prefill = model(tokens[:, :6], cache=cache)[0, -1]
        step = model(tokens[:, 6:7], cache=cache)[0, -1]
        logits = model(tokens)[0]  # L, V: its first and last 128 columns, and each position's argmax
        part = lambda x: mx.concatenate([x[..., :128], x[..., -128:]], axis=-1).tolist()
        with open(f"{out}/{i}-{distributed.rank()}.json", "w") as f:
            json.dump({"path": path, "rank": distributed.rank(), "bytes": model.weight_bytes,
                       "logits": part(logits), "argmax": mx.argmax(logits, axis=-1).tolist(),
                       "prefill": part(prefill), "step": part(step)}, f)
''')


def run_worker(tmp_path: Path, ranks: int, paths: list[str]) -> dict:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    (tmp_path / "out").mkdir()
    run = launch(ranks, [sys.executable, str(script), str(tmp_path / "out"), *paths])
    out = [json.loads(f.read_text()) for f in sorted((tmp_path / "out").glob("*.json"))]
    assert len(out) == ranks * len(paths), run.stderr[-2000:]
    return {(o["path"], o["rank"]): o for o in out}


def test_two_ranks_compute_the_logits_of_one(models, tmp_path):
    """Logits of a whole sequence and through a KV cache (prefill, then a decode step) on 2
    ranks equal one process's (float32 within 1e-4; the packed model too), the same on both
    ranks; each rank holds about half of the sharded weights plus the replicated ones. (The
    default model's greedy tokens: the next test.)"""
    import tiny_llm
    from tiny_llm.loader import _group_unit, gather_quantized, resolve, stack_experts

    paths = [str(p) for p in models.values()]
    two = run_worker(tmp_path, 2, paths)
    for path in paths:
        model, _ = tiny_llm.load(path)
        tokens = mx.array([[1, 17, 300, 4000, 52, 9, 77, 1000]])
        def part(x):  # the columns the ranks print
            return np.concatenate([np.array(x)[..., :128], np.array(x)[..., -128:]], axis=-1)

        logits = model(tokens)[0]
        for r in (0, 1):
            np.testing.assert_allclose(np.array(two[path, r]["logits"]), part(logits), atol=1e-4, rtol=1e-4)
            assert two[path, r]["argmax"] == mx.argmax(logits, axis=-1).tolist()
        for key in ("logits", "prefill", "step"):  # both ranks: the very same numbers
            assert two[path, 0][key] == two[path, 1][key]
        cache = model.make_cache()
        np.testing.assert_allclose(two[path, 0]["prefill"], part(model(tokens[:, :6], cache=cache)[0, -1]),
                                   atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(two[path, 0]["step"], part(model(tokens[:, 6:7], cache=cache)[0, -1]),
                                   atol=1e-4, rtol=1e-4)
        # Bytes: counted from the plan's cuts of the whole model's weights.
        directory = resolve(path)
        config = json.loads((directory / "config.json").read_text())
        args, unit = ModelArgs.from_config(config), _group_unit(config.get("quantization"))
        weights = gather_quantized(stack_experts(dict(mx.load(str(directory / "model.safetensors"))), args),
                                   config.get("quantization"))
        whole = Qwen2Model(args, weights).weight_bytes
        _, cut = plan(args, 0, 2, unit)
        sharded = sum(a.nbytes for name, w in weights.items() if name in cut and not cut[name].first_rank_only
                      for a in (w.arrays() if isinstance(w, QuantizedWeight) else [w]))
        kept = whole - sharded  # on every rank: replicated weights, and biases added after the sum
        for r in (0, 1):
            local = Qwen2Model(*shard_weights(args, weights, r, 2, unit)).weight_bytes
            assert two[path, r]["bytes"] == local  # what the rank read is its cut, nothing more
            assert 0.3 * sharded < local - kept < 0.7 * sharded  # about half of what is cut
        assert two[path, 0]["bytes"] + two[path, 1]["bytes"] - 2 * kept == sharded


def one_process(argv: list[str]) -> str:
    """What `tiny-llm ARGV` prints in this process (the reference for the ranks)."""
    import contextlib
    import io

    from tiny_llm.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) == 0
    return out.getvalue()


def test_two_ranks_generate_the_tokens_of_one_process(models, tmp_path):
    """`mlx.launch -n 2 -- tiny-llm batch` prints once, and what one process prints: a
    greedy request and a seeded sampled one, batched together, on a packed mixture of
    experts (every kind of sharded layer takes part)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Tell me about the sea.", "temperature": 0}) + "\n"
                       + json.dumps({"prompt": "Name three colours.", "temperature": 0.9, "seed": 3}) + "\n")
    argv = ["batch", "--model", str(models["qwen3_moe-4bit"]), "--prompts", str(prompts), "--max-tokens", "12"]
    want = one_process(argv)
    assert want.count("--- request") == 2
    two = launch(2, cli_argv(*argv))
    assert two.stdout == want, two.stderr[-2000:]


def test_two_ranks_generate_the_default_models_greedy_tokens():
    """The default model, its 3 key/value heads split 2 + 1: the greedy tokens of one process."""
    from tiny_llm.loader import resolve

    config = json.loads((resolve("default") / "config.json").read_text())
    halves = [plan(ModelArgs.from_config(config), r, 2, config["quantization"]["group_size"])[0] for r in (0, 1)]
    assert [a.num_key_value_heads for a in halves] == [2, 1]
    argv = ["generate", "--prompt", "The capital of France is", "--no-chat-template", "--max-tokens", "6",
            "--temp", "0"]
    want = one_process(argv)
    two = launch(2, cli_argv(*argv))
    assert want.strip() and two.stdout == want, two.stderr[-2000:]


def test_a_killed_rank_ends_the_others_with_a_message(models, tmp_path):
    """Rank 1 killed in the middle of a generation: rank 0 says so and exits, within the
    time bound; and the other way round. (The survivor sees the lost connection, or is
    stopped by mlx.launch first, which ends the other ranks when one fails: it says which.)"""
    script = tmp_path / "die.py"
    script.write_text(textwrap.dedent('''
        import os, sys
        from tiny_llm import cli
        from tiny_llm.qwen2 import Qwen2Model
        calls, forward = 0, Qwen2Model.__call__
        def dying(self, *args, **kwargs):
            global calls
            calls += 1
            if os.environ.get("MLX_RANK") == sys.argv[1] and calls == 4:
                os.kill(os.getpid(), 9)
            return forward(self, *args, **kwargs)
        Qwen2Model.__call__ = dying
        sys.exit(cli.main(sys.argv[2:]))
    '''))
    for dies, survivor in (("1", 0), ("0", 1)):
        start = time.monotonic()
        run = launch(2, [sys.executable, str(script), dies, "generate", "--model", str(models["qwen2"]),
                         "--prompt", "Hello", "--max-tokens", "50", "--temp", "0"], timeout=60)
        assert time.monotonic() - start < 60
        # Its own message, or (when mlx.launch stops it first) the launcher's stop, named.
        # (mlx.launch writes its own notes to the same stream, even in the middle of a line.)
        said = re.findall(rf"tiny-llm: error: rank {survivor}: [^\n]*", run.stderr)
        assert len(said) == 1 and "another rank" in said[0], run.stderr[-2000:]


def test_ranks_that_load_other_models_are_refused(models, tmp_path):
    script = tmp_path / "pick.py"
    script.write_text(textwrap.dedent('''
        import os, sys
        from tiny_llm import cli
        rank = int(os.environ["MLX_RANK"])
        sys.exit(cli.main([a.replace("{model}", sys.argv[1 + rank]) for a in sys.argv[3:]]))
    '''))
    run = launch(2, [sys.executable, str(script), str(models["qwen2"]), str(models["qwen3_moe-4bit"]),
                     "generate", "--model", "{model}", "--prompt", "Hi", "--max-tokens", "2"])
    # Every rank finds it; the first to say so may make mlx.launch stop the others.
    assert re.search(r"tiny-llm: error: rank \d: the ranks disagree on the model \(config.json and weight "
                     r"files\): rank 1 has another one than rank 0", run.stderr), run.stderr[-2000:]


def test_more_ranks_than_key_value_heads_is_a_clear_error(models):
    run = launch(3, cli_argv("generate", "--model", str(models["qwen2"]), "--prompt", "Hi", "--max-tokens", "2"))
    assert re.search(r"tiny-llm: error: rank \d: num_key_value_heads=2 cannot be split over 3 ranks: each rank "
                     r"needs at least one key/value head", run.stderr), run.stderr[-2000:]


def test_two_ranks_serve_http_from_rank_zero(models):
    """`mlx.launch -n 2 -- tiny-llm serve`: rank 0 answers over HTTP; a greedy reply equals
    one process's, and a sampled batch of two choices completes (the ranks stay in step)."""
    import httpx
    from serve_support import loopback

    import tiny_llm

    def start() -> tuple[subprocess.Popen, str]:
        ring = free_ports(3)  # the ring's two ports, then the HTTP port: three that differ
        argv = [LAUNCH, "--backend", "ring", "-n", "2", "--starting-port", str(ring), "--",
                *cli_argv("serve", "--model", str(models["qwen2"]), "--port", str(ring + 2))]
        return (subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                 stdin=subprocess.DEVNULL, start_new_session=True), f"http://127.0.0.1:{ring + 2}")

    server, url = start()
    try:
        deadline, attempt = time.monotonic() + TIMEOUT, 1
        while time.monotonic() < deadline:
            if server.poll() is not None:
                err = server.stderr.read()
                if attempt == 1 and RING_SETUP_FAILED.search(err):  # see RING_SETUP_FAILED
                    server, url, attempt = *start(), 2
                    continue
                pytest.fail(f"the server ended: {err[-2000:]}")
            try:
                if loopback.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            pytest.fail("the server did not come up")
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        reply = loopback.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 12,
                                                                  "temperature": 0}, timeout=TIMEOUT).json()
        model, tokenizer = tiny_llm.load(str(models["qwen2"]))
        want = tiny_llm.generate(model, tokenizer, tokenizer.apply_chat_template(messages), max_tokens=12,
                                 params=tiny_llm.SamplingParams(temperature=0.0))
        assert reply["choices"][0]["message"]["content"] == want
        sampled = loopback.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 8, "n": 2,
                                                                    "temperature": 0.9}, timeout=TIMEOUT).json()
        assert [c["finish_reason"] for c in sampled["choices"]] in (["length", "length"], ["stop", "length"],
                                                                     ["length", "stop"], ["stop", "stop"])
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        finally:
            try:  # a rank that outlived the launcher, or ignored SIGTERM, goes too
                os.killpg(server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
