"""Course: week 2 day 7 — the step's overhead: count a decode step's primitives, then run each decoder layer as one.

A decode step of a small model does little arithmetic: SmolLM2-135M reads ~98 MB of weights
per token, ~8 ms at a CPU's copy bandwidth. Yet built from MLX ops it is ~3,000 primitives,
and each costs ~10 us to build and dispatch, more than the arithmetic itself. `count_primitives`
shows the count; `FusedDecodeStep` runs the step as one primitive per decoder layer
(`kernels/ops.cpp`'s `decode_layer`, made of `kernels/step.cpp`'s loops and the products and
attention of week 2 day 6 and week 3 day 6), reading the cache and writing its new keys and
values in place.

    counts = count_primitives(lambda: model(tokens, cache=cache))   # Counter by primitive name
    logits = decode(model, tokens, cache)    # None where the fused step does not apply

`Qwen2Model.__call__` tries `decode` first: a one-token step of a model that fits (dense MLP,
no per-head norms, RoPE over the whole head, float or 4/8-bit weights), with a `KVCache` or a
paged cache, on a CPU with the kernels built and this day done. Everything else, and
`--no-kernels`, runs on MLX ops as before.

Tests: tests/test_week2_day7.py, tests/test_fused_step.py, tests/test_week3_day6.py
"""

from __future__ import annotations

import collections
import os
import re
import tempfile
from collections.abc import Callable

import mlx.core as mx

from . import kernels
from .kv_cache import KVCache
from .model import Model, in_prompt_chunks  # Model: a `qwen2.Qwen2Model`: its args, layers, embed_tokens, norm and lm_head
from .quantize import QuantizedWeight, project


def count_primitives(step: Callable[[], mx.array | tuple]) -> collections.Counter:
    """How many primitives of each kind the graph of `step()`'s outputs holds, not yet
    evaluated (constants, such as weights, are not primitives). `step` builds the graph;
    nothing is evaluated here."""
    # BEGIN SOLUTION week2-day7
    outputs = step()
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "step.dot")
        mx.export_to_dot(path, *outputs)
        text = open(path).read()
    # A primitive is a node drawn as a rectangle, labelled with its name; arrays are ovals.
    names = re.findall(r'label\s*=\s*"([^"]+)",\s*shape\s*=\s*rectangle', text)
    return collections.Counter(names)
    # END SOLUTION


def unfit_reason(model: Model) -> str | None:
    """Why the fused step cannot run `model`'s layers, or None when it can."""
    args = model.args
    if args.qk_norm:
        return "per-head query and key norms (Qwen3)"
    if any(args.is_moe_layer(i) for i in range(args.num_hidden_layers)):
        return "a mixture of experts"
    for layer in model.layers:
        attn = layer.self_attn
        if not hasattr(attn, "wq") or not hasattr(layer.mlp, "w_gate"):
            return "sub-layers wrapped or replaced (tensor parallelism)"
        if getattr(attn.rope, "dims", None) != args.head_dim:
            return "RoPE over part of a head"
        for w in (attn.wq, attn.wk, attn.wv, attn.wo, layer.mlp.w_gate, layer.mlp.w_up, layer.mlp.w_down):
            if isinstance(w, QuantizedWeight):
                if w.weight.ndim != 2 or w.bits not in kernels.BITS or w.group_size not in kernels.GROUP_SIZES:
                    return f"{w.bits}-bit weights in groups of {w.group_size}"
            elif w.ndim != 2 or w.dtype not in kernels.FLOATS:
                return f"{w.dtype} weights"
    return None


class FusedDecodeStep:
    """A model's decode step as one `decode_layer` primitive per decoder layer: what each
    layer needs is gathered once here (its weights in order, its spec), and RoPE's angles are
    one table of positions for the whole model, grown as positions grow."""

    def __init__(self, model: Model):
        args = model.args
        self.model = model
        self.rope = model.layers[0].self_attn.rope
        self.cos = self.sin = None
        self.layers = []
        last = len(model.layers) - 1
        for i, layer in enumerate(model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            projections = [(attn.wq, attn.bq), (attn.wk, attn.bk), (attn.wv, attn.bv), (attn.wo, attn.bo),
                           (mlp.w_gate, mlp.b_gate), (mlp.w_up, mlp.b_up), (mlp.w_down, mlp.b_down)]
            norm = lambda n: n.weight.astype(mx.float32)  # noqa: E731 — the kernel reads float norms
            weights = [norm(layer.input_layernorm), norm(layer.post_attention_layernorm)]
            for w, b in projections:
                weights += w.arrays() if isinstance(w, QuantizedWeight) else [w]
                weights += [] if b is None else [b]
            if i == last:  # the model's final norm is applied in the last layer's primitive
                weights.append(norm(model.norm))
            mx.eval(weights)
            quantized = [isinstance(w, QuantizedWeight) for w, _ in projections]
            spec = kernels.extension().layer_spec(
                args.hidden_size, args.intermediate_size, args.num_attention_heads, args.num_key_value_heads,
                args.head_dim, float(args.rms_norm_eps), float(attn.scale), bool(self.rope.traditional),
                [w.bits if q else 0 for (w, _), q in zip(projections, quantized)],
                [w.group_size if q else 0 for (w, _), q in zip(projections, quantized)],
                [b is not None for _, b in projections], i == last, float(args.rms_norm_eps))
            self.layers.append((weights, spec))

    def angles(self, end: int) -> tuple[mx.array, mx.array]:
        """RoPE's cos and sin `[P, D / 2]` for positions 0 .. P - 1, P >= end (doubled as needed)."""
        if self.cos is None or self.cos.shape[0] < end:
            P = max(1024, 1 << (end - 1).bit_length())
            theta = mx.arange(P, dtype=mx.float32)[:, None] * self.rope.inverse_frequencies()[None, :]
            self.cos, self.sin = mx.cos(theta), mx.sin(theta)
            mx.eval(self.cos, self.sin)
        return self.cos, self.sin

    def __call__(self, tokens: mx.array, cache: list) -> mx.array:
        """Logits `[B, 1, V]` for `tokens [B, 1]`; each layer's cache gains the new position."""
        ext = kernels.extension()
        first = cache[0]
        paged = not isinstance(first, KVCache)
        if paged:
            positions = list(first.lengths)
            for table, start in zip(first.tables, positions):
                table.reserve(start, start + 1)  # a shared page is copied first (copy-on-write)
            n = max(len(t.pages) for t in first.tables)
            pages = mx.array([t.pages + [0] * (n - len(t.pages)) for t in first.tables], dtype=mx.int32)
            page_size = first.pool.page_size
            for table, start in zip(first.tables, positions):
                table.length = start + 1
        else:
            positions, pages, page_size = [first.offset] * tokens.shape[0], None, 1
        cos, sin = self.angles(max(positions) + 1)
        where = mx.array(positions, dtype=mx.int32)
        h = self.model.embed_tokens(tokens)  # B, 1, E
        for c, (weights, spec) in zip(cache, self.layers):
            keys, values = (c.pool.keys[c.layer], c.pool.values[c.layer]) if paged else (c.keys, c.values)
            h, keys, values = ext.decode_layer(h, keys, values, pages, where, cos, sin, weights, spec, page_size)
            # keys/values: the same memory with the new position written (no copy)
            if paged:
                c.pool.keys[c.layer], c.pool.values[c.layer] = keys, values
                c.lengths = [p + 1 for p in positions]
            else:
                c.keys, c.values, c.offset = keys, values, c.offset + 1
        model = self.model
        return model.embed_tokens.as_linear(h) if model.lm_head is None else project(h, model.lm_head)


def applies(model: Model, tokens: mx.array, cache: list | None) -> bool:
    """Whether `decode` runs this step fused: one new token per row (not a chunk of a prompt:
    `model.prompt_chunks`), every layer's cache a
    `KVCache` with room for it or a paged view with its pool's storage made, the kernels on
    a CPU with this day and week 2 day 6 (its products) done, and a model that fits."""
    if cache is None or tokens.ndim != 2 or tokens.shape[1] != 1 or not cache or in_prompt_chunks():
        return False
    first = cache[0]
    if type(first) is KVCache:
        if first.keys is None or first.offset + 1 > first.keys.shape[2] or first.keys.shape[0] != tokens.shape[0]:
            return False  # the cache grows on the MLX-op path
        kinds_ok = all(type(c) is KVCache and c.offset == first.offset for c in cache)
    else:
        from .paged_cache import PagedKVCache

        if type(first) is not PagedKVCache or len(first.tables) != tokens.shape[0]:
            return False
        kinds_ok = all(type(c) is PagedKVCache and c.layer in c.pool.keys and c.lengths == first.lengths
                       for c in cache)
    if not kinds_ok or not kernels.active("week2-day7") or not kernels.active("week2-day6"):
        return False
    if (reason := getattr(model, "_fused_unfit", 0)) == 0:
        reason = model._fused_unfit = unfit_reason(model)
    return reason is None


def decode(model: Model, tokens: mx.array, cache: list | None) -> mx.array | None:
    """The logits of a decode step run fused, or None where it does not apply (then the
    model's layers run on MLX ops)."""
    if not applies(model, tokens, cache):
        return None
    step = getattr(model, "_fused_step", None)
    if step is None:
        step = model._fused_step = FusedDecodeStep(model)
    return step(tokens, cache)
