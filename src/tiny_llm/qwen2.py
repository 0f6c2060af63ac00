"""Course: week 1 days 3, 4 and 5 — the Qwen2 / Llama decoder, built from the week-1 primitives.

Weights are looked up by their Hugging Face names (`model.layers.0.self_attn.q_proj.weight`,
...), so checkpoints load without renaming. Llama is the same network without the q/k/v
biases; Qwen3 drops them too and normalises each head's queries and keys before RoPE
(`q_norm`, `k_norm`). Qwen2-MoE and Qwen3-MoE replace the MLP of their sparse layers with
a mixture of experts (`moe.py`, week 3 day 4). A weight may be kept quantized (`Weight`: an
array or a `QuantizedWeight`); `project` multiplies with either.

Tests: tests/test_week1_day3.py, tests/test_week1_day4.py, tests/test_week1_day5.py
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import mlx.core as mx

from .attention import causal_mask, scaled_dot_product_attention_grouped
from .basics import silu
from .embedding import Embedding, QuantizedEmbedding
from .layer_norm import DEFAULT_RMS_NORM_EPS, RMSNorm
from .positional_encoding import RoPE, ScaledRoPE, rope_scaling_type
from .quantize import QuantizedWeight, Weight, project

if TYPE_CHECKING:  # week 2 modules load only when a model uses them
    from .kv_cache import KVCache

SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "qwen3", "qwen2_moe", "qwen3_moe")
MOE_MODEL_TYPES = ("qwen2_moe", "qwen3_moe")


@dataclass(frozen=True)
class ModelArgs:
    """Architecture hyper-parameters, read from a checkpoint's `config.json`."""

    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    rms_norm_eps: float = DEFAULT_RMS_NORM_EPS
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rope_traditional: bool = False
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = True
    attention_bias: bool | None = None  # q/k/v bias; None: the model type's default
    mlp_bias: bool = False
    max_position_embeddings: int | None = None
    # Mixture of experts (qwen2_moe, qwen3_moe): `num_experts` experts of hidden size
    # `moe_intermediate_size`, `num_experts_per_tok` of them per token; the layers listed in
    # `mlp_only_layers`, and those not on the `decoder_sparse_step` grid, keep a dense MLP.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's shared expert (0: none)
    norm_topk_prob: bool = False  # renormalise the chosen experts' weights to sum to 1
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {self.model_type!r}: "
                f"tiny-llm runs {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        for name in ("hidden_size", "num_hidden_layers", "intermediate_size",
                     "num_attention_heads", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"config {name} must be a positive integer, got {value!r}")
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"hidden_size={self.hidden_size} is not divisible by "
                    f"num_attention_heads={self.num_attention_heads} and no head_dim is given"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.attention_bias is None:
            object.__setattr__(self, "attention_bias", self.model_type in ("qwen2", "qwen2_moe"))
        rope_scaling_type(self.rope_scaling)  # raises for a kind tiny-llm does not implement
        object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
        if self.model_type in MOE_MODEL_TYPES:
            for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"):
                value = getattr(self, name)
                if not isinstance(value, int) or value <= 0:
                    raise ValueError(f"config {name} must be a positive integer for {self.model_type}, got {value!r}")
            if self.num_experts_per_tok > self.num_experts:
                raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} exceeds "
                                 f"num_experts={self.num_experts}")

    @classmethod
    def from_config(cls, config: Mapping) -> "ModelArgs":
        """Keep the keys this class knows; a checkpoint's other keys are ignored."""
        known = {f.name for f in fields(cls)}
        missing = [f.name for f in fields(cls)
                   if f.name in ("model_type", "hidden_size", "num_hidden_layers",
                                 "intermediate_size", "num_attention_heads", "vocab_size")
                   and f.name not in config]
        if missing:
            raise ValueError(f"config.json lacks required keys: {', '.join(missing)}")
        return cls(**{k: v for k, v in config.items() if k in known})

    @property
    def o_bias(self) -> bool:
        # Qwen2 has biases on q/k/v only; Llama's and Qwen3's attention_bias covers o_proj too.
        return self.model_type in ("llama", "qwen3", "qwen3_moe") and bool(self.attention_bias)

    @property
    def qk_norm(self) -> bool:
        """Whether each head's queries and keys are RMS-normalised before RoPE (Qwen3)."""
        return self.model_type in ("qwen3", "qwen3_moe")

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer `i` has a mixture of experts instead of the dense MLP."""
        return (self.model_type in MOE_MODEL_TYPES and i not in self.mlp_only_layers
                and (i + 1) % self.decoder_sparse_step == 0)


def expected_weight_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every parameter the model needs, by Hugging Face name, with its shape."""
    E, I, V, Dh = args.hidden_size, args.intermediate_size, args.vocab_size, args.head_dim
    Hq, Hkv = args.num_attention_heads, args.num_key_value_heads
    shapes = {"model.embed_tokens.weight": (V, E), "model.norm.weight": (E,)}
    if not args.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, E)
    for i in range(args.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (E,)
        shapes[p + "post_attention_layernorm.weight"] = (E,)
        shapes[p + "self_attn.q_proj.weight"] = (Hq * Dh, E)
        shapes[p + "self_attn.k_proj.weight"] = (Hkv * Dh, E)
        shapes[p + "self_attn.v_proj.weight"] = (Hkv * Dh, E)
        shapes[p + "self_attn.o_proj.weight"] = (E, Hq * Dh)
        if args.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (Hq * Dh,)
            shapes[p + "self_attn.k_proj.bias"] = (Hkv * Dh,)
            shapes[p + "self_attn.v_proj.bias"] = (Hkv * Dh,)
        if args.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (E,)
        if args.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (Dh,)
            shapes[p + "self_attn.k_norm.weight"] = (Dh,)
        if args.is_moe_layer(i):
            shapes.update(moe_weight_shapes(args, p + "mlp."))
            continue
        shapes[p + "mlp.gate_proj.weight"] = (I, E)
        shapes[p + "mlp.up_proj.weight"] = (I, E)
        shapes[p + "mlp.down_proj.weight"] = (E, I)
        if args.mlp_bias:
            shapes[p + "mlp.gate_proj.bias"] = (I,)
            shapes[p + "mlp.up_proj.bias"] = (I,)
            shapes[p + "mlp.down_proj.bias"] = (E,)
    return shapes


def moe_weight_shapes(args: ModelArgs, p: str) -> dict[str, tuple[int, ...]]:
    """A mixture-of-experts layer's parameters under `p` (`...mlp.`): the router, the experts
    stacked along a first axis (mlx-lm's `switch_mlp` layout), and the shared expert."""
    E, X, I = args.hidden_size, args.num_experts, args.moe_intermediate_size
    shapes = {p + "gate.weight": (X, E), p + "switch_mlp.gate_proj.weight": (X, I, E),
              p + "switch_mlp.up_proj.weight": (X, I, E), p + "switch_mlp.down_proj.weight": (X, E, I)}
    if S := args.shared_expert_intermediate_size:
        shapes.update({p + "shared_expert.gate_proj.weight": (S, E), p + "shared_expert.up_proj.weight": (S, E),
                       p + "shared_expert.down_proj.weight": (E, S), p + "shared_expert_gate.weight": (1, E)})
    return shapes


def check_weights(args: ModelArgs, weights: Mapping[str, Weight]) -> None:
    """Raise `ValueError` naming the first missing or mis-shaped parameter."""
    for name, shape in expected_weight_shapes(args).items():
        if name not in weights:
            raise ValueError(f"missing weight {name!r} (expected shape {shape})")
        if tuple(weights[name].shape) != shape:
            raise ValueError(
                f"weight {name!r} has shape {tuple(weights[name].shape)}, expected {shape}"
            )


def _require(weights: Mapping[str, Weight], name: str) -> Weight:
    if name not in weights:
        raise ValueError(f"missing weight {name!r}")
    return weights[name]


@runtime_checkable
class AttendingCache(Protocol):
    """A cache that can compute attention itself: `attend(q [B, Hq, L, D], k, v [B, Hkv, L, D],
    scale)` stores the new keys and values and returns `[B, Hq, L, D]`, or None when it
    cannot now (then `update_and_fetch` and the layer's attention run instead)."""

    def attend(self, q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array | None: ...


def _norm_class(fused: bool) -> type:
    """RMSNorm, or its `mx.fast` kernel (week 2 day 3)."""
    if fused:
        from .fused import FusedRMSNorm

        return FusedRMSNorm
    return RMSNorm


class Qwen2MultiHeadAttention:
    """Grouped-query self-attention with RoPE; weights under `prefix` (`...self_attn.`).

    `fused` swaps the hand-written RoPE and attention for their `mx.fast` kernels."""

    def __init__(self, args: ModelArgs, weights: Mapping[str, Weight], prefix: str = "",
                 fused: bool = False):
        self.num_heads = args.num_attention_heads
        self.num_kv_heads = args.num_key_value_heads
        self.head_dim = args.head_dim
        self.scale = args.head_dim**-0.5
        get = weights.get
        self.wq, self.bq = _require(weights, prefix + "q_proj.weight"), get(prefix + "q_proj.bias")
        self.wk, self.bk = _require(weights, prefix + "k_proj.weight"), get(prefix + "k_proj.bias")
        self.wv, self.bv = _require(weights, prefix + "v_proj.weight"), get(prefix + "v_proj.bias")
        self.wo, self.bo = _require(weights, prefix + "o_proj.weight"), get(prefix + "o_proj.bias")
        # Qwen3: an RMSNorm over each head's features of the queries and keys; none before.
        self.q_norm = self.k_norm = None
        if args.qk_norm:
            norm = _norm_class(fused)
            self.q_norm = norm(_require(weights, prefix + "q_norm.weight"), args.rms_norm_eps)
            self.k_norm = norm(_require(weights, prefix + "k_norm.weight"), args.rms_norm_eps)
        rope, self.attention = RoPE, scaled_dot_product_attention_grouped
        if fused:
            from .fused import FusedRoPE, fused_attention

            rope, self.attention = FusedRoPE, fused_attention
        if rope_scaling_type(args.rope_scaling) != "default":
            self.rope = ScaledRoPE(args.head_dim, args.rope_theta, args.rope_traditional, args.rope_scaling, fused)
        else:
            self.rope = rope(args.head_dim, base=args.rope_theta, traditional=args.rope_traditional)

    def __call__(
        self,
        x: mx.array,
        mask: mx.array | str | None = None,
        offset: int | mx.array = 0,
        cache: KVCache | None = None,
    ) -> mx.array:
        """`x [B, L, E]` -> `[B, L, E]`; the tokens sit at positions `offset ..` (an int, or
        `[B]` per row). Attention goes through `self.attention`.

        With a `cache`, the new keys and values are appended to it and attention covers
        every stored position (`offset` is then `cache.rope_offset`).
        """
        # BEGIN SOLUTION week1-day3
        B, L, _ = x.shape
        Hq, Hkv, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        q = project(x, self.wq, self.bq).reshape(B, L, Hq, Dh)
        k = project(x, self.wk, self.bk).reshape(B, L, Hkv, Dh)
        v = project(x, self.wv, self.bv).reshape(B, L, Hkv, Dh)
        if self.q_norm is not None:  # Qwen3: every head's queries and keys normalised first
            q, k = self.q_norm(q), self.k_norm(k)
        q = self.rope(q, offset=offset).transpose(0, 2, 1, 3)  # B, Hq, L, Dh
        k = self.rope(k, offset=offset).transpose(0, 2, 1, 3)  # B, Hkv, L, Dh
        v = v.transpose(0, 2, 1, 3)  # B, Hkv, L, Dh
        # A paged cache may attend itself, reading keys and values in place (week 3 day 6).
        o = cache.attend(q, k, v, self.scale) if isinstance(cache, AttendingCache) else None
        if o is None:
            if cache is not None:
                k, v = cache.update_and_fetch(k, v)  # B, Hkv, S, Dh
            o = self.attention(q, k, v, scale=self.scale, mask=mask)
        o = o.transpose(0, 2, 1, 3).reshape(B, L, Hq * Dh)  # B, L, Hq * Dh
        return project(o, self.wo, self.bo)
        # END SOLUTION


class Qwen2MLP:
    """SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`; weights under `prefix` (`...mlp.`)."""

    def __init__(self, args: ModelArgs, weights: Mapping[str, Weight], prefix: str = ""):
        get = weights.get
        self.w_gate, self.b_gate = _require(weights, prefix + "gate_proj.weight"), get(prefix + "gate_proj.bias")
        self.w_up, self.b_up = _require(weights, prefix + "up_proj.weight"), get(prefix + "up_proj.bias")
        self.w_down, self.b_down = _require(weights, prefix + "down_proj.weight"), get(prefix + "down_proj.bias")

    def __call__(self, x: mx.array) -> mx.array:
        """`x [B, L, E]` -> `[B, L, E]` through a hidden layer of size `intermediate_size`."""
        # BEGIN SOLUTION week1-day4
        gate = silu(project(x, self.w_gate, self.b_gate))  # B, L, I
        return project(gate * project(x, self.w_up, self.b_up), self.w_down, self.b_down)
        # END SOLUTION


class Qwen2TransformerBlock:
    """Pre-norm decoder block: `h = x + attn(norm(x)); out = h + mlp(norm(h))`."""

    def __init__(self, args: ModelArgs, weights: Mapping[str, Weight], prefix: str = "",
                 fused: bool = False, layer: int = 0):
        eps = args.rms_norm_eps
        norm = _norm_class(fused)
        self.input_layernorm = norm(_require(weights, prefix + "input_layernorm.weight"), eps)
        self.post_attention_layernorm = norm(
            _require(weights, prefix + "post_attention_layernorm.weight"), eps
        )
        self.self_attn = Qwen2MultiHeadAttention(args, weights, prefix + "self_attn.", fused)
        if args.is_moe_layer(layer):
            from .moe import MoEBlock  # week 3 day 4: loads only for a sparse model

            shared = None
            if args.shared_expert_intermediate_size:
                shared = Qwen2MLP(args, weights, prefix + "mlp.shared_expert.")
            self.mlp = MoEBlock(weights, prefix + "mlp.", args.num_experts_per_tok, args.norm_topk_prob, shared)
        else:
            self.mlp = Qwen2MLP(args, weights, prefix + "mlp.")

    def __call__(
        self,
        x: mx.array,
        mask: mx.array | str | None = None,
        offset: int | mx.array = 0,
        cache: KVCache | None = None,
    ) -> mx.array:
        # BEGIN SOLUTION week1-day5
        h = x + self.self_attn(self.input_layernorm(x), mask=mask, offset=offset, cache=cache)
        return h + self.mlp(self.post_attention_layernorm(h))
        # END SOLUTION


class Qwen2Model:
    """The whole decoder: embedding, blocks, final norm and the output head.

    `weights` maps Hugging Face names to arrays, or to `QuantizedWeight`s for the
    projections and the embedding table; they are checked against `args` first.
    `fused=True` uses the `mx.fast` kernels for RMSNorm, RoPE and attention (week 2).
    """

    def __init__(self, args: ModelArgs, weights: Mapping[str, Weight], fused: bool = False):
        check_weights(args, weights)
        self.args = args
        self.fused = fused
        # The bytes of the weights this model holds (packed, as stored).
        self.weight_bytes = sum(a.nbytes for w in weights.values()
                                for a in (w.arrays() if isinstance(w, QuantizedWeight) else [w]))
        table = weights["model.embed_tokens.weight"]
        self.embed_tokens = QuantizedEmbedding(table) if isinstance(table, QuantizedWeight) else Embedding(table)
        self.layers = [
            Qwen2TransformerBlock(args, weights, f"model.layers.{i}.", fused, layer=i)
            for i in range(args.num_hidden_layers)
        ]
        self.norm = _norm_class(fused)(weights["model.norm.weight"], args.rms_norm_eps)
        self.lm_head = None if args.tie_word_embeddings else weights["lm_head.weight"]

    def make_cache(self) -> list[KVCache]:
        """One empty `KVCache` per layer, for `__call__(tokens, cache=...)`."""
        from .caches import make_prompt_cache

        return make_prompt_cache(self)

    def __call__(self, tokens: mx.array, cache: list[KVCache] | None = None) -> mx.array:
        """`tokens [B, L]` -> logits `[B, L, V]`.

        Without a cache the tokens are the whole sequence. With `cache` (from `make_cache`,
        or any list of per-layer caches) they continue what the cache holds, and the cache
        is extended by them; the cache gives the positions (`rope_offset`) and the mask.
        A one-token step runs fused where it can (week 2 day 7: one primitive per layer).
        """
        if cache and tokens.ndim == 2 and tokens.shape[1] == 1:
            from .fused_step import decode

            if (logits := decode(self, tokens, cache)) is not None:
                return logits
        # BEGIN SOLUTION week1-day5
        if cache is not None and len(cache) != len(self.layers):
            raise ValueError(f"cache has {len(cache)} layers, the model {len(self.layers)}")
        B, L = tokens.shape
        h = self.embed_tokens(tokens)  # B, L, E
        if cache:
            offset, mask = cache[0].rope_offset, cache[0].make_mask(L, h.dtype)
        else:
            offset, mask = 0, (causal_mask(L, L, h.dtype) if L > 1 else None)
        for i, layer in enumerate(self.layers):
            h = layer(h, mask=mask, offset=offset, cache=cache[i] if cache else None)
        h = self.norm(h)
        if self.lm_head is None:
            return self.embed_tokens.as_linear(h)  # B, L, V
        return project(h, self.lm_head)  # B, L, V
        # END SOLUTION
