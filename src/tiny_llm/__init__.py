"""Engine — tiny-llm: Qwen2 inference built from mlx.core primitives, and a complete sampler.

The public names are here, as in mlx-lm: `tiny_llm.load`, `tiny_llm.generate`,
`tiny_llm.SamplingParams`, `tiny_llm.batch_generate`, ... The package imports their modules
lazily (PEP 562): `import tiny_llm.basics` loads the week 1 building blocks alone, so a
mistake in a later day's module cannot break an earlier day.

Tests: tests/test_progress.py, tests/test_week3_day5.py, tests/test_layout.py
"""

import importlib
import sys
import types

__version__ = "0.1.0"

# Public name -> the module that defines it.
_EXPORTS = {
    "load": "loader",
    "generate": "generate",
    "generate_step": "generate",
    "stream_generate": "generate",
    "GenerationResponse": "generate",
    "Model": "model",
    "CachedModel": "model",
    "prefill": "model",
    "SamplingParams": "sampler",
    "Sampler": "sampler",
    "make_sampler": "sampler",
    "make_logits_processors": "sampler",
    "token_distribution": "sampler",
    "batch_generate": "batch",
    "BatchGenerator": "batch",
    "BatchResponse": "batch",
    "BatchResult": "batch",
    "speculative_generate_step": "speculative",
    "SpeculativeStats": "speculative",
}
__all__ = list(_EXPORTS)


def _export(name: str):
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = _export(name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


class _Package(types.ModuleType):
    """`tiny_llm.generate` names the function (as `mlx_lm.generate` does), although
    `generate` is also a submodule: importing a submodule sets the package's attribute of
    that name to the module, and this property keeps the public name on the function. So
    `import tiny_llm.generate as g` gives the function too; the module's own names come with
    `from tiny_llm.generate import ...`. No other public name shares a submodule's name."""

    @property
    def generate(self):
        return _export("generate")

    @generate.setter
    def generate(self, _module) -> None:
        pass


sys.modules[__name__].__class__ = _Package
