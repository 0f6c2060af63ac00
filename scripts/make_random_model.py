#!/usr/bin/env python3
"""Write a small model directory with seeded random weights, for any supported architecture.

    python scripts/make_random_model.py DEST [--arch qwen3_moe] [--bits 4] [--seed 0]

No real Qwen3, Llama 3 or mixture-of-experts checkpoint can be downloaded offline; this
writes one of the same layout (mlx-lm's `config.json` and `model.safetensors`, the default
model's tokenizer), small enough to run anywhere, so that every command runs on every
architecture: `tiny-llm generate --model DEST --prompt Hi`. The text is noise: the weights
are random. `--bits 4` or `8` stores the projections, embedding and experts MLX-quantized.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx

VOCAB = 49_152  # the default model's tokenizer
BASE = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=VOCAB, rms_norm_eps=1e-6, max_position_embeddings=8192,
            rope_theta=1_000_000.0)
ARCHITECTURES = {
    "qwen2": dict(BASE, model_type="qwen2", tie_word_embeddings=True),
    "llama": dict(BASE, model_type="llama", tie_word_embeddings=False, rope_theta=10_000.0),
    "llama3": dict(BASE, model_type="llama", tie_word_embeddings=True, rope_theta=500_000.0,
                   rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=1024)),
    "qwen3": dict(BASE, model_type="qwen3", head_dim=32, tie_word_embeddings=True),
    "qwen2_moe": dict(BASE, model_type="qwen2_moe", tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=64, shared_expert_intermediate_size=64),
    "qwen3_moe": dict(BASE, model_type="qwen3_moe", head_dim=32, tie_word_embeddings=True, num_experts=8,
                      num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True,
                      decoder_sparse_step=1, mlp_only_layers=[]),
}
GROUP_SIZE = 32


def write_random_model(dest: Path, arch: str, bits: int | None = None, seed: int = 0) -> Path:
    """Write `ARCHITECTURES[arch]` with seeded random weights (normal, std 0.05; norms 1) into
    `dest`, with the default model's tokenizer files; `bits` quantizes every matrix."""
    from tiny_llm.loader import resolve
    from tiny_llm.qwen2 import ModelArgs, expected_weight_shapes

    config = dict(ARCHITECTURES[arch])
    shapes = expected_weight_shapes(ModelArgs.from_config(config))
    keys = mx.random.split(mx.random.key(seed), len(shapes))
    weights = {}
    for (name, shape), key in zip(sorted(shapes.items()), keys):
        if name.endswith("norm.weight"):
            weights[name] = mx.ones(shape)
            continue
        value = 0.05 * mx.random.normal(shape, key=key)
        if bits and len(shape) >= 2 and shape[-1] % GROUP_SIZE == 0:
            packed, scales, biases = mx.quantize(value, group_size=GROUP_SIZE, bits=bits)
            base = name[: -len(".weight")]
            weights.update({name: packed, base + ".scales": scales, base + ".biases": biases})
        else:
            weights[name] = value
    if bits:
        config["quantization"] = {"group_size": GROUP_SIZE, "bits": bits}
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    mx.save_safetensors(str(dest / "model.safetensors"), weights)
    source = resolve("default")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, dest / name)
    return dest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write a small random-weight model of a supported architecture.")
    parser.add_argument("dest", type=Path, help="the directory to write (created if missing)")
    parser.add_argument("--arch", default="qwen3_moe", choices=sorted(ARCHITECTURES))
    parser.add_argument("--bits", type=int, choices=(4, 8), default=None, help="store the matrices quantized")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    dest = write_random_model(args.dest, args.arch, args.bits, args.seed)
    print(f"wrote a random {args.arch} model to {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
