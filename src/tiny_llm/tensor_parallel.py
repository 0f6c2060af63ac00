"""Course: week 3 day 5 — tensor parallelism: every layer split across ranks, one sum per sub-layer.

Megatron's recipe, on MLX's own distributed layer (`mx.distributed`, processes started by
`mlx.launch`). Each rank holds a contiguous share of every layer:

- attention: a run of key/value heads and the query heads that read them. q/k/v are
  *column-parallel* (each rank keeps the rows of W that make its heads), o is
  *row-parallel* (each rank keeps the columns that read its heads): the rank's o output is
  a partial sum of the full one;
- the MLP (and each expert, and the shared expert): a run of the hidden features, gate and
  up column-parallel, down row-parallel;
- the rest (embedding, norms, output head, router) is replicated.

So a sub-layer's output is the sum over ranks of what each rank computes: one `all_sum`
after the attention and one after the MLP. Every rank then holds the same activations and
the same logits, and samples the same token.

Tests: tests/test_week3_day5.py
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import mlx.core as mx

from .quantize import QuantizedWeight, Weight

if TYPE_CHECKING:
    from .qwen2 import ModelArgs

ROWS, COLUMNS = -2, -1  # the axis a weight is cut along: output features, input features


@dataclass(frozen=True)
class Slice:
    """Part of a weight a rank keeps: `[start, stop)` of `axis` (ROWS or COLUMNS, counted in
    the weight's logical shape, whether it is stored quantized or not). `first_rank_only`:
    the whole weight on rank 0 and zeros elsewhere (a row-parallel layer's bias, which must
    be added once, not once per rank)."""

    axis: int
    start: int
    stop: int
    first_rank_only: bool = False


def split(n: int, world: int, rank: int, unit: int = 1, what: str = "n") -> tuple[int, int]:
    """`rank`'s contiguous share `[start, stop)` of `n` items (`what`, for errors), cut into
    `world` parts as evenly as whole `unit`s allow (the first parts one unit larger when
    they do not divide). `ValueError` when a part would be empty."""
    # BEGIN SOLUTION week3-day5
    if n % unit or n // unit < world:
        groups = f" in whole quantization groups of {unit}" if unit > 1 else ""
        raise ValueError(f"{what}={n} cannot be split over {world} ranks{groups}: each rank needs a part")
    units, extra = divmod(n // unit, world)
    start = rank * units + min(rank, extra)
    return unit * start, unit * (start + units + (rank < extra))
    # END SOLUTION


def plan(args: ModelArgs, rank: int, world: int, unit: int = 1) -> tuple[ModelArgs, dict[str, Slice]]:
    """How rank `rank` of `world` shards the model of `args`: its own `ModelArgs` (the heads
    and hidden sizes it holds) and, for every weight it cuts, the `Slice` it keeps (weights
    not named are replicated). Hidden features are cut in whole `unit`s (a quantized
    checkpoint's group size, so that row-parallel weights split on group boundaries)."""
    # BEGIN SOLUTION week3-day5
    Hq, Hkv, Dh = args.num_attention_heads, args.num_key_value_heads, args.head_dim
    if Hkv < world:
        raise ValueError(f"num_key_value_heads={Hkv} cannot be split over {world} ranks: "
                         f"each rank needs at least one key/value head")
    group = Hq // Hkv  # query heads per key/value head: they stay on one rank
    k0, k1 = split(Hkv, world, rank)
    q0, q1 = k0 * group, k1 * group
    if unit > 1 and (q0 * Dh) % unit:
        raise ValueError(f"o_proj's columns cannot be split at head {q0} (column {q0 * Dh}) on "
                         f"quantization groups of {unit}")
    slices: dict[str, Slice] = {}

    def column_parallel(name: str, lo: int, hi: int, bias: bool) -> None:
        slices[name + ".weight"] = Slice(ROWS, lo, hi)
        if bias:
            slices[name + ".bias"] = Slice(COLUMNS, lo, hi)  # a bias is 1-D: its only axis

    def row_parallel(name: str, lo: int, hi: int, bias: bool) -> None:
        slices[name + ".weight"] = Slice(COLUMNS, lo, hi)
        if bias:
            slices[name + ".bias"] = Slice(COLUMNS, 0, 0, first_rank_only=True)

    sizes = {"num_attention_heads": q1 - q0, "num_key_value_heads": k1 - k0, "head_dim": Dh}
    if not all(args.is_moe_layer(i) for i in range(args.num_hidden_layers)):  # some layer is dense
        i0, i1 = split(args.intermediate_size, world, rank, unit, "intermediate_size")
        sizes["intermediate_size"] = i1 - i0
    if args.num_experts:
        m0, m1 = split(args.moe_intermediate_size, world, rank, unit, "moe_intermediate_size")
        sizes["moe_intermediate_size"] = m1 - m0
    if args.shared_expert_intermediate_size:
        s0, s1 = split(args.shared_expert_intermediate_size, world, rank, unit, "shared_expert_intermediate_size")
        sizes["shared_expert_intermediate_size"] = s1 - s0
    for i in range(args.num_hidden_layers):
        p = f"model.layers.{i}."
        column_parallel(p + "self_attn.q_proj", q0 * Dh, q1 * Dh, args.attention_bias)
        column_parallel(p + "self_attn.k_proj", k0 * Dh, k1 * Dh, args.attention_bias)
        column_parallel(p + "self_attn.v_proj", k0 * Dh, k1 * Dh, args.attention_bias)
        row_parallel(p + "self_attn.o_proj", q0 * Dh, q1 * Dh, args.o_bias)
        if args.is_moe_layer(i):
            for name in ("gate_proj", "up_proj"):
                column_parallel(p + "mlp.switch_mlp." + name, m0, m1, False)
            row_parallel(p + "mlp.switch_mlp.down_proj", m0, m1, False)
            if args.shared_expert_intermediate_size:
                column_parallel(p + "mlp.shared_expert.gate_proj", s0, s1, False)
                column_parallel(p + "mlp.shared_expert.up_proj", s0, s1, False)
                row_parallel(p + "mlp.shared_expert.down_proj", s0, s1, False)
        else:
            column_parallel(p + "mlp.gate_proj", i0, i1, args.mlp_bias)
            column_parallel(p + "mlp.up_proj", i0, i1, args.mlp_bias)
            row_parallel(p + "mlp.down_proj", i0, i1, args.mlp_bias)
    return dataclasses.replace(args, **sizes), slices
    # END SOLUTION


def shard(w: Weight, s: Slice, rank: int) -> Weight:
    """The part of `w` that `s` keeps (a copy, or for `first_rank_only` the whole of `w` on
    rank 0 and zeros elsewhere). A `QuantizedWeight` is cut in its packed layout: rows are
    rows of all three arrays; columns must fall on group boundaries (a group's scale and
    bias go with it)."""
    # BEGIN SOLUTION week3-day5
    if s.first_rank_only:
        return w if rank == 0 else mx.zeros_like(w)

    def cut(a: mx.array, lo: int, hi: int) -> mx.array:
        index = [slice(None)] * a.ndim
        index[s.axis] = slice(lo, hi)
        return mx.contiguous(a[tuple(index)])

    if not isinstance(w, QuantizedWeight):
        return cut(w, s.start, s.stop)
    if s.axis == ROWS:
        return QuantizedWeight(*(cut(a, s.start, s.stop) for a in w.arrays()), w.group_size, w.bits)
    if s.start % w.group_size or s.stop % w.group_size:
        raise ValueError(f"columns [{s.start}, {s.stop}) do not fall on quantization groups of {w.group_size}")
    per_word = 32 // w.bits
    g0, g1 = s.start // w.group_size, s.stop // w.group_size
    return QuantizedWeight(cut(w.weight, s.start // per_word, s.stop // per_word), cut(w.scales, g0, g1),
                           cut(w.biases, g0, g1), w.group_size, w.bits)
    # END SOLUTION


class AllSum:
    """A sub-layer whose output each rank holds a part of: calls it, then sums the parts over
    the ranks of `group`, so that every rank gets the whole output."""

    def __init__(self, inner: Callable[..., mx.array], group: mx.distributed.Group):
        self.inner, self.group = inner, group

    def __call__(self, *args, **kwargs) -> mx.array:
        # BEGIN SOLUTION week3-day5
        return mx.distributed.all_sum(self.inner(*args, **kwargs), group=self.group)
        # END SOLUTION


def shard_weights(args: ModelArgs, weights: Mapping[str, Weight], rank: int, world: int,
                  unit: int = 1) -> tuple[ModelArgs, dict[str, Weight]]:
    """The local `ModelArgs` and weights of `rank`, cut from the whole model's `weights`."""
    local, slices = plan(args, rank, world, unit)
    return local, {name: shard(w, slices[name], rank) if name in slices else w for name, w in weights.items()}


def parallel(model, group: mx.distributed.Group, whole: ModelArgs):
    """`model` (a `Qwen2Model` built from one rank's weights) with an `AllSum` after every
    attention and every MLP: one rank of the tensor-parallel model of `whole`."""
    model.whole_args = whole  # what caches are sized against (`model.heads_share`)
    for layer in model.layers:
        layer.self_attn = AllSum(layer.self_attn, group)
        layer.mlp = AllSum(layer.mlp, group)
    return model
