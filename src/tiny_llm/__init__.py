"""tiny-llm: Qwen2 inference built from mlx.core primitives, and a complete sampler."""

from .generate import GenerationResponse, generate, generate_step, stream_generate
from .loader import load

__all__ = ["load", "generate", "generate_step", "stream_generate", "GenerationResponse"]
__version__ = "0.1.0"
