"""Engine — token sampling: the week 1 day 7 `make_sampler` (`basic.py`), the mlx-lm facade
(`mlx_compat.py`) and the sampling engine (`SamplingParams`, `Sampler`).

`make_sampler` here is the course's; mlx-lm's, with its arguments and filter order, is
`mlx_compat.make_sampler`.

The engine's modules, from the bottom: `checks` (argument checks), `params` (the parameters),
`penalties`, `dry`, `filters` and `stages` (the chain, the reference), `rng` (counter-based
randomness), `draw` (the inverse-CDF draw), `fast` (the window path), `rows` (one row's state),
`chain` (the stages over a group of rows), `plans` (each group's path, chosen once from the
parameters), `grammar_rows` (the grammar's say) and `engine` (the `Sampler`: a list of rows and
its plan).

Tests: tests/test_sampler_engine.py, tests/test_sampler_facade.py
"""

from .basic import (MIN_EXPONENTIAL, exponential_noise, keep_top_k, keep_top_p, make_sampler, sample_exponential_race,
                    sample_gumbel_max)
from .basic import SamplerFunction
from .engine import SampleResult, Sampler, SamplerStats, token_distribution
from .mlx_compat import (
    LogitsProcessor,
    apply_min_p,
    apply_top_k,
    apply_top_p,
    apply_xtc,
    categorical_sampling,
    greedy_sampler,
    make_frequency_penalty,
    make_logits_processors,
    make_presence_penalty,
    make_repetition_penalty,
)

from .params import PRESETS, STAGES, SamplingParams

__all__ = [
    "SamplingParams", "Sampler", "SampleResult", "SamplerStats", "token_distribution",
    "PRESETS", "STAGES", "SamplerFunction", "LogitsProcessor", "make_sampler", "keep_top_k", "keep_top_p",
    "exponential_noise", "sample_exponential_race", "sample_gumbel_max", "MIN_EXPONENTIAL",
    "apply_top_k", "apply_top_p", "apply_min_p", "apply_xtc", "categorical_sampling",
    "greedy_sampler", "make_logits_processors", "make_repetition_penalty",
    "make_presence_penalty", "make_frequency_penalty",
]
