"""Engine — the defaults of generation, each written once: the library's signatures and the
command line's flags read them from here, so the two cannot disagree.

Tests: tests/test_layout.py, tests/test_request.py, tests/test_serve_engine.py
"""

from dataclasses import asdict, dataclass

MAX_TOKENS = 256  # new tokens per request when the caller does not say (mlx-lm's default)

# Prompt positions per prefill chunk (mlx-lm's default): bounds the attention scores' memory.
PREFILL_STEP_SIZE = 2048
# The command line's chunk on the CPU, where a token of prefill takes a tenth of a second or
# more: Ctrl-C and the progress line act between chunks.
CPU_PREFILL_STEP_SIZE = 16

NUM_DRAFT_TOKENS = 3  # tokens drafted per round of speculative decoding (mlx_lm.generate's flag)

MAX_BATCH_SIZE = 8  # requests that decode together in a BatchGenerator

# Generation without sampling parameters is greedy, as in mlx_lm.generate (a SamplingParams
# built with no arguments keeps llama.cpp's "off" values, temperature 1).
TEMPERATURE = 0.0

MAX_QUEUE = 64  # requests `tiny-llm serve` keeps waiting for a row before it answers 503
# The server's limits (tiny-llm serve): seconds a client may take none of a stream's data,
# open connections, seconds one engine step may take before /health calls the engine
# stuck, and seconds SIGTERM gives the requests in progress.
WRITE_TIMEOUT = 30.0
MAX_CONNECTIONS = 512
ENGINE_DEADLINE = 60.0
SHUTDOWN_TIMEOUT = 30.0

# Positions per page of the paged KV cache (week 3 day 2): vLLM's default block size.
PAGE_SIZE = 16
# Bytes of keys and values the prefix cache keeps for requests that have finished (week 3
# day 3); pages in use do not count. 0 turns the prefix cache off.
PREFIX_CACHE_BYTES = 1 << 30


@dataclass(frozen=True)
class BatchSettings:
    """How a batch runs, as `BatchGenerator` takes it (its keyword arguments, by the same
    names): rows that decode together, prompt positions per prefill chunk, positions per
    page, and the prefix cache's budget in bytes (None: `PREFIX_CACHE_BYTES` once its day
    is done; 0: off). The command line makes one from its flags; the server, its lockstep
    ranks and `BatchGenerator` take it whole. `BatchGenerator` checks the values."""

    max_batch_size: int = MAX_BATCH_SIZE
    prefill_step_size: int = PREFILL_STEP_SIZE
    page_size: int = PAGE_SIZE
    prefix_cache_bytes: int | None = None

    def kwargs(self) -> dict:
        """The settings as `BatchGenerator`'s keyword arguments."""
        return asdict(self)
