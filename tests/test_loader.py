"""Loading checkpoints: mlx-lm directories (float and quantized), GGUF files, the default model,
and every error a user can run into."""

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import TINY_CONFIGS, model_weights, reference_model, save_dir

import tiny_llm
from tiny_llm.gguf import _gguf_weights
from tiny_llm.loader import load_model, resolve
from tiny_llm.qwen2 import ModelArgs, Qwen2Model
from tiny_llm.quantize import QuantizedWeight


def close(a, b, atol):
    np.testing.assert_allclose(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)),
                               atol=atol, rtol=atol)


TOKENS = mx.array([[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]])


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_load_mlx_lm_directory(tmp_path, name):
    """A float checkpoint directory loads into a model whose logits equal mlx-lm's."""
    config = TINY_CONFIGS[name]
    ref = reference_model(config, seed=11)
    weights = model_weights(ref)
    # Files from Hugging Face may carry unused rotary tables: they are ignored.
    weights["model.layers.0.self_attn.rotary_emb.inv_freq"] = mx.zeros((4,))
    model = load_model(save_dir(tmp_path / name, {**config, "architectures": ["X"]}, weights))
    close(model(TOKENS), ref(TOKENS), atol=2e-4)


@pytest.mark.parametrize("bits", [4, 8])
def test_load_quantized_mlx_checkpoint(tmp_path, bits):
    """A quantized mlx-lm checkpoint (per-module overrides included) loads with its weights
    kept packed (the same quantized products as mlx-lm), or unpacked to float32 on request
    (the same values; products differ by float32 summation order and rounding).
    """
    config = TINY_CONFIGS["qwen2-untied"]
    ref = reference_model(config, seed=12)
    nn.quantize(ref, group_size=32, bits=bits,
                class_predicate=lambda p, m: isinstance(m, (nn.Linear, nn.Embedding)))
    # The output head stays 8-bit whatever the rest is: a per-module override.
    ref.lm_head = nn.QuantizedLinear.from_linear(
        nn.Linear(config["hidden_size"], config["vocab_size"], bias=False), group_size=32, bits=8)
    mx.eval(ref.parameters())
    quantization = {"group_size": 32, "bits": bits, "lm_head": {"group_size": 32, "bits": 8}}
    path = save_dir(tmp_path / "q", {**config, "quantization": quantization}, model_weights(ref))
    model = load_model(path)
    assert isinstance(model.layers[0].self_attn.wq, QuantizedWeight)  # kept packed
    assert model.layers[0].self_attn.wq.shape == (64, 64)
    close(model(TOKENS), ref(TOKENS), atol=1e-4)
    unpacked = load_model(path, dequantize=True)
    assert unpacked.layers[0].self_attn.wq.dtype == mx.float32
    close(unpacked(TOKENS), ref(TOKENS), atol=1e-3)


def permute_like_llama_cpp(w: mx.array, heads: int) -> mx.array:
    """llama.cpp's converter: per head, interleave the first and second half of the rows."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def write_gguf(path: Path, config: dict, weights: dict) -> Path:
    """Write a float GGUF the way llama.cpp's converter lays it out (names, q/k permutation)."""
    arch = config["model_type"]
    tensors = {}
    for name, value in weights.items():
        module, kind = name.rsplit(".", 1)
        if module.startswith("model.layers."):
            layer, part = module[len("model.layers."):].split(".", 1)
            if arch == "llama" and part in ("self_attn.q_proj", "self_attn.k_proj"):
                heads = config["num_attention_heads" if "q_proj" in part else "num_key_value_heads"]
                value = permute_like_llama_cpp(value, heads)
            tensors[f"blk.{layer}.{GGUF_NAMES[part]}.{kind}"] = value
        else:
            gguf = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
            tensors[f"{gguf[module]}.{kind}"] = value
    # A byte-level vocabulary: the 94 printable ASCII characters, then filler tokens.
    vocab = [chr(c) for c in range(33, 127)] + ["ab"]
    vocab += [f"<extra_{i}>" for i in range(config["vocab_size"] - len(vocab))]
    meta = {
        "general.architecture": arch,
        f"{arch}.block_count": mx.array(config["num_hidden_layers"], dtype=mx.uint32),
        f"{arch}.embedding_length": mx.array(config["hidden_size"], dtype=mx.uint32),
        f"{arch}.feed_forward_length": mx.array(config["intermediate_size"], dtype=mx.uint32),
        f"{arch}.attention.head_count": mx.array(config["num_attention_heads"], dtype=mx.uint32),
        f"{arch}.attention.head_count_kv": mx.array(config["num_key_value_heads"], dtype=mx.uint32),
        f"{arch}.attention.layer_norm_rms_epsilon": mx.array(config["rms_norm_eps"], dtype=mx.float32),
        f"{arch}.rope.freq_base": mx.array(config["rope_theta"], dtype=mx.float32),
        f"{arch}.context_length": mx.array(512, dtype=mx.uint32),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": vocab,
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.token_type": mx.array([1] * len(vocab), dtype=mx.int32),
        "tokenizer.ggml.eos_token_id": mx.array(len(vocab) - 1, dtype=mx.uint32),
    }
    mx.save_gguf(str(path), tensors, meta)
    return path


@pytest.mark.parametrize("name", ["llama-tied", "llama-untied", "qwen2-untied"])
def test_gguf_file_loads_with_mlx_lm_logits(tmp_path, monkeypatch, name):
    """A GGUF in llama.cpp's layout (q/k rows permuted for Llama) gives mlx-lm's logits.

    This is what proves the un-permutation: with it missing, RoPE would rotate the wrong
    pairs of features and the logits would differ at every position after the first.
    """
    monkeypatch.setenv("TINY_LLM_CACHE", str(tmp_path / "cache"))
    config = TINY_CONFIGS[name]
    ref = reference_model(config, seed=13)
    gguf = write_gguf(tmp_path / "tiny.gguf", config, model_weights(ref))
    model, tokenizer = tiny_llm.load(str(gguf))
    close(model(TOKENS), ref(TOKENS), atol=2e-4)
    # "a b" is the only merge: "ab" becomes one token, "ba" stays two.
    assert tokenizer.encode("ab!ba") == [94, ord("!") - 33, ord("b") - 33, ord("a") - 33]
    assert tokenizer.eos_token_ids == {config["vocab_size"] - 1}
    # Converted once: the second load reads the cache and does not convert again.
    stamp = next((tmp_path / "cache").glob("*/tiny-llm-conversion.json"))
    before = stamp.stat().st_mtime_ns
    tiny_llm.load(str(gguf))
    assert stamp.stat().st_mtime_ns == before


def test_default_gguf_unpermutation_agrees_with_traditional_rope(default_model_dir):
    """The default model's raw GGUF q/k rows with interleaved RoPE equal the converted ones
    with half-split RoPE: two independent routes to the same logits (mlx-lm on both sides)."""
    from mlx_lm.models import llama
    from tiny_llm.gguf import default_gguf_path

    config = json.loads((default_model_dir / "config.json").read_text())
    raw = mx.load(str(default_gguf_path()))
    ref_args = llama.ModelArgs.from_dict({**config, "rope_traditional": True})
    ref = llama.Model(ref_args)
    nn.quantize(ref, group_size=32, bits=4,
                class_predicate=lambda p, m: (
                    {"group_size": 32, "bits": 8} if p == "model.embed_tokens"
                    else isinstance(m, nn.Linear)))
    weights, _ = _gguf_weights(raw, config)
    for key in list(weights):  # put back the GGUF (permuted) rows of q and k
        if ".q_proj." in key or ".k_proj." in key:
            layer = key.split(".")[2]
            part = "attn_q" if ".q_proj." in key else "attn_k"
            weights[key] = raw[f"blk.{layer}.{part}.{key.rsplit('.', 1)[1]}"]
    ref.load_weights(list(weights.items()))
    import mlx_lm

    converted, _ = mlx_lm.load(str(default_model_dir))
    tokens = mx.array([[1, 9690, 198, 2683, 359, 253, 5356, 5646]])
    close(ref(tokens), converted(tokens), atol=1e-3)


def test_default_model_resolves_to_a_cached_directory(default_model_dir):
    """'default' converts the packaged GGUF once into an mlx-lm directory, then reuses it."""
    assert resolve("default") == default_model_dir
    config = json.loads((default_model_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 30 and config["hidden_size"] == 576
    assert config["quantization"]["bits"] == 4
    assert config["quantization"]["model.embed_tokens"]["bits"] == 8


def test_default_tokenizer_round_trips_and_keeps_special_tokens(default_model):
    """Text survives encode/decode; chat markers are single tokens; digits split one by one."""
    _, tokenizer = default_model
    text = "Grüße, 世界! Numbers: 12345 and émojis 🙂\n  indented"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.encode("<|im_start|>user") [0] == 1
    assert len(tokenizer.encode("12345")) == 5
    assert tokenizer.eos_token_ids == {2}


# ---- errors a user can make -------------------------------------------------------------


def test_missing_directory_is_reported(tmp_path):
    """A path that does not exist names the path."""
    with pytest.raises(FileNotFoundError, match="no model at .*nowhere"):
        tiny_llm.load(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nowhere")


def test_directory_without_config_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_model(tmp_path)


def test_invalid_config_json_is_reported(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_model(tmp_path)


def test_unsupported_model_type_is_reported(tmp_path):
    """A config.json for another architecture names the type and the supported ones."""
    save_dir(tmp_path, {**TINY_CONFIGS["llama-tied"], "model_type": "gpt2"}, {})
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'.*qwen2, llama"):
        load_model(tmp_path)


def test_config_missing_keys_is_reported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(ValueError, match="lacks required keys: hidden_size"):
        load_model(tmp_path)


def test_missing_weight_files_are_reported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIGS["llama-tied"]))
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        load_model(tmp_path)


def test_missing_weight_is_reported(tmp_path):
    """A checkpoint without one parameter names it and its expected shape."""
    config = TINY_CONFIGS["qwen2-untied"]
    weights = model_weights(reference_model(config))
    del weights["model.layers.1.self_attn.k_proj.bias"]
    with pytest.raises(ValueError, match=r"missing weight 'model.layers.1.self_attn.k_proj.bias' \(expected shape \(32,\)\)"):
        load_model(save_dir(tmp_path, config, weights))


def test_misshaped_weight_is_reported(tmp_path):
    config = TINY_CONFIGS["llama-tied"]
    weights = model_weights(reference_model(config))
    weights["model.layers.0.mlp.up_proj.weight"] = mx.zeros((64, 47))
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp.up_proj.weight' has shape \(64, 47\), expected \(64, 48\)"):
        Qwen2Model(ModelArgs.from_config(config), weights)
    with pytest.raises(ValueError, match="has shape"):
        load_model(save_dir(tmp_path, config, weights))


def test_corrupt_safetensors_is_reported(tmp_path):
    """A truncated weight file names the file instead of crashing deep inside MLX."""
    config = TINY_CONFIGS["llama-tied"]
    path = save_dir(tmp_path, config, model_weights(reference_model(config)))
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[:100])
    with pytest.raises(ValueError, match="cannot read weights from .*model.safetensors"):
        load_model(path)


def test_non_gguf_file_is_reported(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="not a .gguf"):
        tiny_llm.load(str(tmp_path / "weights.bin"))


def test_unsupported_gguf_architecture_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("TINY_LLM_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "other.gguf"
    mx.save_gguf(str(path), {"x": mx.zeros((2,))}, {"general.architecture": "gpt2"})
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'gpt2'"):
        tiny_llm.load(str(path))


def test_offline_uncached_repo_id_is_reported(monkeypatch, tmp_path):
    """A Hugging Face repo id that is not cached, while offline, names the repo."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="'tiny-llm-tests/no-such-model'.*not in the local cache"):
        tiny_llm.load("tiny-llm-tests/no-such-model")


def test_a_broken_tokenizer_file_is_named(tmp_path):
    """A truncated tokenizer.json, or a config that is not JSON, is a ValueError naming the
    file (the tokenizers library's own message names none)."""
    from conftest import vocab_tokenizer
    from tiny_llm.tokenizer import Tokenizer

    vocab_tokenizer(8).save(tmp_path)
    data = (tmp_path / "tokenizer.json").read_text()
    (tmp_path / "tokenizer.json").write_text(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"tokenizer\.json is not a readable tokenizer file: EOF while parsing"):
        Tokenizer.from_directory(tmp_path)
    (tmp_path / "tokenizer.json").write_text(data)
    (tmp_path / "tokenizer_config.json").write_text("{garbage")
    with pytest.raises(ValueError, match=r"tokenizer_config\.json is not valid JSON"):
        Tokenizer.from_directory(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"tokenizer_config\.json should hold a JSON object, got list"):
        Tokenizer.from_directory(tmp_path)


def test_an_unreadable_conversion_stamp_converts_again(tmp_path, monkeypatch):
    """Garbage in the conversion cache's stamp means "not converted": the GGUF file is
    converted again and loads, instead of failing on the stamp."""
    monkeypatch.setenv("TINY_LLM_CACHE", str(tmp_path / "cache"))
    config = TINY_CONFIGS["llama-tied"]
    ref = reference_model(config, seed=13)
    gguf = write_gguf(tmp_path / "tiny.gguf", config, model_weights(ref))
    tiny_llm.load(str(gguf))
    stamp = next((tmp_path / "cache").glob("*/tiny-llm-conversion.json"))
    stamp.write_bytes(b"\xff\x00garbage")
    model, _ = tiny_llm.load(str(gguf))
    assert json.loads(stamp.read_text())["version"]  # written anew by the conversion
    close(model(TOKENS), ref(TOKENS), atol=2e-4)



def test_loads_of_one_gguf_at_once_convert_it_once(tmp_path, monkeypatch):
    """Three loads of the same unconverted GGUF file at once (test workers or ranks on one
    machine do this) all get the model: one converts, the others wait for its directory
    instead of converting over it while it is being read. The lock is a file lock, so
    threads here stand for processes."""
    import threading
    import time

    import tiny_llm.gguf as loader

    monkeypatch.setenv("TINY_LLM_CACHE", str(tmp_path / "cache"))
    config = TINY_CONFIGS["llama-tied"]
    ref = reference_model(config, seed=13)
    gguf = write_gguf(tmp_path / "tiny.gguf", config, model_weights(ref))
    conversions = []
    real_config = loader._gguf_config

    def slow_config(meta, tensors):  # a conversion long enough for the others to arrive
        conversions.append(1)
        time.sleep(0.3)
        return real_config(meta, tensors)

    monkeypatch.setattr(loader, "_gguf_config", slow_config)
    results, errors = [], []

    def load():
        try:
            results.append(tiny_llm.load(str(gguf))[0])
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and len(results) == 3
    assert len(conversions) == 1
    for model in results:
        close(model(TOKENS), ref(TOKENS), atol=2e-4)
