"""tiny-llm: Qwen2 inference built from mlx.core primitives, and a complete sampler."""

from .loader import load

__all__ = ["load"]
__version__ = "0.1.0"
