"""Course: week 3 day 4 — mixture of experts: a router sends each token to k of many MLPs.

A sparse layer holds `X` experts, each a SwiGLU MLP, stacked along a first axis
(`switch_mlp.gate_proj.weight [X, I, E]`, mlx-lm's layout). A linear router scores the
experts for every token; the token goes through its k best, and their outputs are summed,
weighted by the router's probabilities. Only k of the X experts' weights are read per token:
Qwen3-30B-A3B holds 30B parameters and computes with 3B.

Qwen2-MoE adds a shared expert that every token goes through, scaled by a sigmoid gate.

Tests: tests/test_week3_day4.py
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import mlx.core as mx

from .basics import silu
from .quantize import QuantizedWeight, Weight, project


def route(logits: mx.array, k: int, normalize: bool) -> tuple[mx.array, mx.array]:
    """Router logits `[..., X]` -> the chosen experts `[..., k]` (int32, best first) and their
    weights `[..., k]` (float32): the softmax probabilities of the k most probable experts,
    renormalised to sum to 1 when `normalize`. Among experts with equal probability the
    lower index is chosen first, so the choice is the same on every backend."""
    # BEGIN SOLUTION week3-day4
    X = logits.shape[-1]
    if not 0 < k <= X:
        raise ValueError(f"k must be between 1 and the number of experts {X}, got {k}")
    probs = mx.softmax(logits.astype(mx.float32), axis=-1)  # ..., X (float32: the weights sum to 1)
    # Each expert's rank: how many experts beat it (higher probability, or equal and a lower
    # index). Ranks are a permutation of 0..X-1, so sorting them has no ties to break.
    a, b = probs[..., :, None], probs[..., None, :]  # ..., X, 1 and ..., 1, X
    lower = mx.arange(X)[None, :] < mx.arange(X)[:, None]  # X, X: column j is below row i
    rank = mx.sum((b > a) | ((b == a) & lower), axis=-1)  # ..., X
    experts = mx.argsort(rank, axis=-1)[..., :k].astype(mx.int32)  # ..., k
    weights = mx.take_along_axis(probs, experts, axis=-1)  # ..., k
    if normalize:
        weights = weights / mx.sum(weights, axis=-1, keepdims=True)
    return experts, weights
    # END SOLUTION


def expert_linear(x: mx.array, w: Weight, experts: mx.array) -> mx.array:
    """`x [..., k or 1, 1, D_in]` (one row per slot, or one shared by all k) times the chosen
    experts' weights `w [X, D_out, D_in]` (stacked, maybe quantized), `experts [..., k]` ->
    `[..., k, 1, D_out]`: slot j of a token goes through expert `experts[..., j]`. Only the
    chosen experts' weights are read (`mx.gather_mm`)."""
    # BEGIN SOLUTION week3-day4
    if isinstance(w, QuantizedWeight):
        return mx.gather_qmm(x, w.weight, w.scales, w.biases, rhs_indices=experts, transpose=True,
                             group_size=w.group_size, bits=w.bits)
    if w.dtype != mx.float32 and mx.default_device() == mx.cpu:
        # MLX's CPU backend gathers float32 matrices only: multiply in float32, round back.
        return mx.gather_mm(x.astype(mx.float32), w.astype(mx.float32).swapaxes(-1, -2),
                            rhs_indices=experts).astype(x.dtype)
    return mx.gather_mm(x, w.swapaxes(-1, -2), rhs_indices=experts)
    # END SOLUTION


class Experts:
    """The stacked SwiGLU experts of one layer (`switch_mlp.` under the layer's `mlp.`)."""

    def __init__(self, weights: Mapping[str, Weight], prefix: str):
        self.w_gate = weights[prefix + "gate_proj.weight"]  # X, I, E
        self.w_up = weights[prefix + "up_proj.weight"]  # X, I, E
        self.w_down = weights[prefix + "down_proj.weight"]  # X, E, I

    def __call__(self, x: mx.array, experts: mx.array) -> mx.array:
        """`x [B, L, E]`, `experts [B, L, k]` -> `[B, L, k, E]`: each token through each of
        its k experts."""
        # BEGIN SOLUTION week3-day4
        x = x[..., None, None, :]  # B, L, 1, 1, E: one row, shared by the k slots
        h = silu(expert_linear(x, self.w_gate, experts)) * expert_linear(x, self.w_up, experts)  # B, L, k, 1, I
        return expert_linear(h, self.w_down, experts)[..., 0, :]  # B, L, k, E
        # END SOLUTION


class MoEBlock:
    """A sparse layer's feed-forward part, in place of the dense MLP: the router
    (`gate.weight [X, E]`) picks `k` experts per token (`normalize`: their weights renormalised),
    and `shared`, if given, is Qwen2-MoE's shared expert, scaled by a sigmoid gate
    (`shared_expert_gate.weight [1, E]`). `x [B, L, E]` -> `[B, L, E]`."""

    def __init__(self, weights: Mapping[str, Weight], prefix: str, k: int, normalize: bool,
                 shared: Callable[[mx.array], mx.array] | None = None):
        self.k, self.normalize = k, normalize
        self.router = weights[prefix + "gate.weight"]  # X, E
        self.experts = Experts(weights, prefix + "switch_mlp.")
        self.shared = shared
        self.shared_gate = weights[prefix + "shared_expert_gate.weight"] if shared else None  # 1, E

    def __call__(self, x: mx.array) -> mx.array:
        # BEGIN SOLUTION week3-day4
        experts, weights = route(project(x, self.router), self.k, self.normalize)  # B, L, k
        y = self.experts(x, experts)  # B, L, k, E
        y = mx.sum(y * weights[..., None], axis=-2).astype(x.dtype)  # B, L, E (weighted in float32)
        if self.shared is not None:
            y = y + mx.sigmoid(project(x, self.shared_gate)) * self.shared(x)
        return y
        # END SOLUTION
