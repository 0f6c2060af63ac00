"""Engine — `tiny-llm serve`: the OpenAI-compatible HTTP server on uvicorn (rank 0 listens; the
other ranks of a tensor-parallel server follow it).

Tests: tests/test_cli.py, tests/test_progress.py, tests/test_request.py
"""

import argparse
import asyncio
import ipaddress
import logging
import signal
import sys
import time
from pathlib import Path

from .. import distributed
from ..defaults import ENGINE_DEADLINE, MAX_CONNECTIONS, MAX_QUEUE, SHUTDOWN_TIMEOUT, WRITE_TIMEOUT
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
    limits = serve.add_argument_group("limits and shutdown")
    limits.add_argument("--request-timeout", type=float, default=None, metavar="S",
                        help="end a request that runs longer than S seconds with 408 (default: no limit)")
    limits.add_argument("--write-timeout", type=float, default=WRITE_TIMEOUT, metavar="S",
                        help="cancel a stream whose client takes none of its data for S seconds "
                             f"(default {WRITE_TIMEOUT:g})")
    limits.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS, metavar="N",
                        help=f"beyond N open connections answer 503 (default {MAX_CONNECTIONS})")
    limits.add_argument("--shutdown-timeout", type=float, default=SHUTDOWN_TIMEOUT, metavar="S",
                        help="on SIGTERM, stop taking requests and give those in progress S seconds to "
                             f"finish (default {SHUTDOWN_TIMEOUT:g}); a second SIGTERM or Ctrl-C ends at once")
    limits.add_argument("--engine-deadline", type=float, default=ENGINE_DEADLINE, metavar="S",
                        help="/health fails while one engine step has taken longer than S seconds "
                             f"(default {ENGINE_DEADLINE:g})")
    limits.add_argument("--no-access-log", dest="access_log", action="store_false",
                        help="no line per request on stderr (default: one line with id, status, tokens, times)")
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
    if args.max_connections < 1:
        raise UserError(f"--max-connections must be an integer >= 1, got {args.max_connections}")
    for flag, value in (("--request-timeout", args.request_timeout), ("--write-timeout", args.write_timeout),
                        ("--shutdown-timeout", args.shutdown_timeout), ("--engine-deadline", args.engine_deadline)):
        if value is not None and not (value > 0 and value != float("inf")):
            raise UserError(f"{flag} must be a number of seconds > 0, got {value}")
    from ..serve.faults import Faults

    try:  # a test's failures on purpose, read before the model loads
        faults = Faults.from_env()
    except ValueError as e:
        raise UserError(str(e)) from None
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
    if not _loopback(args.host) and args.api_key is None:
        print(f"tiny-llm serve: warning: listening on {args.host} without --api-key: anyone who can reach this "
              f"machine can use the model and its compute; set --api-key KEY or listen on 127.0.0.1",
              file=sys.stderr, flush=True)
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from ..serve import build, create_app

    prefix_cache_days_done(args)
    model, tokenizer = load(args)
    name = args.served_model_name or (args.model if args.model == "default" else Path(args.model).name or args.model)
    from ..serve.guard import Limits

    limits = Limits(request_timeout=args.request_timeout, write_timeout=args.write_timeout,
                    max_connections=args.max_connections, engine_deadline=args.engine_deadline)
    server = build(model, tokenizer, model_ids=tuple(dict.fromkeys([name, args.model])), settings=settings,
                   max_queue=args.max_queue, api_key=args.api_key, max_prompt_tokens=args.max_prompt_tokens,
                   group=distributed.group(), limits=limits, access_log=args.access_log, faults=faults)
    if faults:
        print(f"tiny-llm serve: failures on purpose are on ({Faults.__module__}): {faults}", file=sys.stderr)
    print(f"tiny-llm serve: {name} on http://{args.host}:{args.port} (chat page at /, API at /v1; "
          f"up to {settings.max_batch_size} requests decode together); Ctrl-C stops", file=sys.stderr, flush=True)

    class Uvicorn(uvicorn.Server):
        """SIGTERM drains: new requests get 503 and /health fails while those in progress get
        --shutdown-timeout seconds to finish; the rest then end with a 503. Ctrl-C, or a
        second signal, ends open requests at once with a 503."""

        drain: asyncio.Task | None = None

        async def serve(self, sockets=None):
            self.loop = asyncio.get_running_loop()
            await super().serve(sockets)

        def handle_exit(self, sig, frame):
            if sig == signal.SIGTERM and self.drain is None and not self.should_exit:
                self.loop.call_soon_threadsafe(self._begin_drain)
                return
            server.engine.close()
            super().handle_exit(sig, frame)

        def _begin_drain(self):
            self.drain = self.loop.create_task(self._drain())

        async def _drain(self):
            server.draining = True
            print(f"tiny-llm serve: SIGTERM: no new requests; {server.open_requests} in progress get up to "
                  f"{args.shutdown_timeout:g} s to finish", file=sys.stderr, flush=True)
            deadline = time.monotonic() + args.shutdown_timeout
            while server.open_requests and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if server.open_requests:
                print(f"tiny-llm serve: {server.open_requests} requests still in progress after "
                      f"{args.shutdown_timeout:g} s: they end with an error", file=sys.stderr, flush=True)
            server.engine.close()
            deadline = time.monotonic() + 5.0  # their error events go out
            while server.open_requests and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            super().handle_exit(signal.SIGTERM, None)

    class Connection(H11Protocol):
        """uvicorn's HTTP/1.1 connection with a fixed kernel send buffer: a client that stops
        reading stalls the server's writes after SEND_BUFFER bytes (not the several MiB
        Linux's autotuning would hold for it), so the write timeout finds it."""

        def connection_made(self, transport):
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            super().connection_made(transport)

    # A stream cut by the write timeout is already in the access log; uvicorn would add an
    # error line for the response it did not see end.
    logging.getLogger("uvicorn.error").addFilter(
        lambda record: record.getMessage() != "ASGI callable returned without completing response.")
    app = create_app(server)
    # Our own limit answers 503 in OpenAI's shape; uvicorn's, a little above it, bounds the
    # connections that never send a whole request.
    uv = Uvicorn(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5,
                                limit_concurrency=args.max_connections + 64,
                                http=Connection))
    server.connections = lambda: len(uv.server_state.connections)
    # uvicorn raises the signal that stopped it again once it has shut down: after a drain,
    # that ends the program with status 0.
    signal.signal(signal.SIGTERM, lambda sig, frame: sys.exit(0))
    uv.run()


SEND_BUFFER = 128 << 10  # bytes of a response the kernel holds for a client (Linux doubles it)


def _loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return False
