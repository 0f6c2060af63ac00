"""Engine — `tiny-llm serve`: the OpenAI-compatible HTTP server on uvicorn (rank 0 listens; the
other ranks of a tensor-parallel server follow it)."""

import argparse
import sys
from pathlib import Path

from .. import distributed
from ..defaults import MAX_QUEUE
from .common import UserError, load, prefix_cache_days_done
from .options import add_batch_size_option, add_cache_options, add_model_options, add_prefill_option, batch_settings


def add_parser(commands) -> argparse.ArgumentParser:
    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server (continuous batching)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)")
    serve.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    add_batch_size_option(serve)
    serve.add_argument("--max-queue", type=int, default=MAX_QUEUE,
                       help=f"most requests waiting for a row; beyond it the server answers 503 (default {MAX_QUEUE})")
    serve.add_argument("--api-key", default=None, metavar="KEY",
                       help="require 'Authorization: Bearer KEY' on the API (default: no key)")
    serve.add_argument("--max-prompt-tokens", type=int, default=None, metavar="N",
                       help="refuse prompts longer than N tokens (default: the model's context)")
    serve.add_argument("--served-model-name", default=None, metavar="NAME",
                       help="the model name clients send and /v1/models lists (default: 'default' or the "
                            "model directory's name)")
    add_model_options(serve, generation=False)
    add_prefill_option(serve)
    add_cache_options(serve)
    return serve


def run(args: argparse.Namespace) -> None:
    import socket

    for flag, value, low in (("--port", args.port, 0), ("--max-queue", args.max_queue, 1),
                             ("--max-prompt-tokens", args.max_prompt_tokens, 1)):
        if value is not None and (value < low or (flag == "--port" and value > 65535)):
            raise UserError(f"{flag} must be {'a port number from 0 to 65535' if flag == '--port' else f'an integer >= {low}'}"
                            f", got {value}")
    if args.api_key is not None and not args.api_key.strip():
        raise UserError("--api-key is empty")
    settings = batch_settings(args)
    if distributed.rank() != 0:  # another rank of a tensor-parallel server: rank 0 listens
        from ..serve.lockstep import follow

        prefix_cache_days_done(args)
        model, tokenizer = load(args)
        follow(distributed.group(), model, tokenizer)
        return
    try:  # a clear message now rather than uvicorn's log line after the model has loaded
        family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((args.host, args.port))
    except OSError as e:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    import uvicorn

    from ..serve import build, create_app

    prefix_cache_days_done(args)
    model, tokenizer = load(args)
    name = args.served_model_name or (args.model if args.model == "default" else Path(args.model).name or args.model)
    server = build(model, tokenizer, model_ids=tuple(dict.fromkeys([name, args.model])), settings=settings,
                   max_queue=args.max_queue, api_key=args.api_key, max_prompt_tokens=args.max_prompt_tokens,
                   group=distributed.group())
    print(f"tiny-llm serve: {name} on http://{args.host}:{args.port} (chat page at /, API at /v1; "
          f"up to {settings.max_batch_size} requests decode together); Ctrl-C stops", file=sys.stderr, flush=True)

    class Uvicorn(uvicorn.Server):
        def handle_exit(self, sig, frame):  # Ctrl-C: open requests end now, with a 503
            server.engine.close()
            super().handle_exit(sig, frame)

    Uvicorn(uvicorn.Config(create_app(server), host=args.host, port=args.port, log_level="warning",
                           timeout_graceful_shutdown=5)).run()
