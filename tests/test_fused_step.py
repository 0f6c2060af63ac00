"""The fused decode step (week 2 day 7) on a page pool (week 3 day 2): rows of different
lengths, pages shared and copied on write, seeded rows alone and in a batch."""

import mlx.core as mx
import numpy as np
import pytest

from test_week2_day7 import build, unfused
from tiny_llm import fused_step
from tiny_llm.paged_cache import BlockTable, PagePool, paged_views

pytestmark = pytest.mark.usefixtures("kernels_on_the_cpu")


def test_fused_steps_on_pages_equal_mlx_ops(monkeypatch):
    """Three rows of different lengths on a page pool, one of them sharing its pages with a
    fourth row (copied on write): every row's logits are those of the layers on MLX ops,
    and a row's logits do not depend on the rows beside it."""
    model = build("qwen2-untied", 4, mx.float32)
    prompts = [[3, 17, 5, 9, 22], [8, 1], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47]]

    def run(rows, steps=5):
        pool = PagePool(page_size=4)
        tables = []
        for p in rows:
            table = BlockTable(pool)
            model(mx.array([p]), cache=paged_views(pool, len(model.layers), [table]))
            tables.append(table)
        tables.append(tables[0].fork())  # one more row on the first row's pages
        cache = paged_views(pool, len(model.layers), tables)
        firsts = [p[0] for p in rows] + [rows[0][0] + 1]
        out = []
        for step in range(steps):  # each row's own fixed tokens
            logits = model(mx.array([[(f + 3 * step) % 50] for f in firsts]), cache=cache)
            out.append(np.array(logits[:, 0].astype(mx.float32)))
        return np.stack(out, axis=1)

    fused = run(prompts)
    alone = run(prompts[1:2])
    assert (fused[1] == alone[0]).all()  # row 1 alone: the same bits
    assert not (fused[3] == fused[0]).all()  # the row on shared pages went its own way
    unfused(monkeypatch)
    np.testing.assert_allclose(fused, run(prompts), atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("fused", [True, False])
def test_a_seeded_row_draws_the_same_tokens_alone_and_in_a_batch(default_model, monkeypatch, fused):
    """Sampling at temperature 0.8 with seeds: each row's tokens are the same alone and beside
    others on pages, with the fused step and with the layers on MLX ops. (The two paths round
    differently, so a draw near a boundary of the distribution may differ between them.)"""
    from tiny_llm import SamplingParams, batch_generate

    if not fused:
        unfused(monkeypatch)
    calls = []
    step = fused_step.FusedDecodeStep.__call__
    monkeypatch.setattr(fused_step.FusedDecodeStep, "__call__", lambda self, *a: calls.append(1) or step(self, *a))
    model, tokenizer = default_model
    prompts = ["Tell me about cats.", "List three fruits:", "The weather today"]
    params = [SamplingParams(temperature=0.8, top_p=0.95, seed=11 + i) for i in range(3)]
    together = batch_generate(model, tokenizer, prompts, max_tokens=12, params=params, paged=True).texts
    alone = [batch_generate(model, tokenizer, [p], max_tokens=12, params=[s], paged=True).texts[0]
             for p, s in zip(prompts, params)]
    assert together == alone
    assert bool(calls) == fused
