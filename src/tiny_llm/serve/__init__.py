"""Engine — `tiny-llm serve`: an OpenAI-compatible HTTP server on the continuous-batching engine.

    tiny-llm serve --model default --port 8080
    curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
         -d '{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 32}'

`protocol` checks requests, `engine` runs the one engine thread, `app` is the HTTP layer
(Starlette on uvicorn), `text` finds stop strings and tool calls, `tools` puts tools in the
prompt and forces calls with a grammar, `metrics` counts for Prometheus.

Tests: tests/test_serve_fuzz.py, tests/test_serve_responses.py, tests/test_serve_text.py
"""

from ..defaults import BatchSettings
from .app import Server, create_app
from .engine import Engine
from .faults import Faults
from .guard import Limits
from .metrics import Metrics
from .protocol import Context


def build(model, tokenizer, *, model_ids: tuple[str, ...], settings: BatchSettings, max_queue: int,
          api_key: str | None = None, max_prompt_tokens: int | None = None, group=None,
          limits: Limits | None = None, access_log: bool = False, faults: Faults | None = None) -> Server:
    """A `Server` for a loaded model: its engine thread (not started yet) and settings.
    `group`: the ranks that hold the model's other shards (they `lockstep.follow`);
    `faults`: failures on purpose, for tests (`faults.Faults.from_env`)."""
    faults = faults or Faults()
    engine = Engine(model, tokenizer, settings, max_queue=max_queue, metrics=Metrics(), group=group, faults=faults)
    ctx = Context(faults.wrap(tokenizer), model_ids, model.args.max_position_embeddings or None,
                  model.args.vocab_size, max_prompt_tokens)
    return Server(engine, ctx, api_key=api_key, limits=limits, access_log=access_log)


__all__ = ["Context", "Engine", "Faults", "Limits", "Metrics", "Server", "build", "create_app"]
