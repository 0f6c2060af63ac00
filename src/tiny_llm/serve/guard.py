"""Engine — the way every HTTP request goes in and out of the server (an ASGI middleware
around the Starlette app): a request id, the count of requests in progress, the connection
limit, 503 while the server drains, the write deadline of a slow client, and one access-log
line per request.

Tests: tests/test_serve_faults.py, tests/test_serve.py
"""

import asyncio
import json
import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from ..defaults import ENGINE_DEADLINE, MAX_CONNECTIONS, WRITE_TIMEOUT
from .protocol import RequestError

REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Paths that answer while the server drains: a load balancer reads them to take it out.
DRAIN_OPEN = frozenset({"/health", "/metrics", "/openapi.json"})


@dataclass
class Limits:
    """What one request may take. `request_timeout`: seconds from arrival to the end (None:
    no limit); `write_timeout`: seconds a client may take none of a stream's data;
    `max_connections`: connections served at once; `engine_deadline`: seconds one engine
    step may take before /health calls the engine stuck; `max_body_bytes`: a request body."""

    request_timeout: float | None = None
    write_timeout: float = WRITE_TIMEOUT
    max_connections: int = MAX_CONNECTIONS
    engine_deadline: float = ENGINE_DEADLINE
    max_body_bytes: int = 4 << 20


@dataclass
class Exchange:
    """One request as the middleware and its handler share it (`scope["tiny_llm"]`)."""

    id: str
    started: float  # time.monotonic() at arrival
    deadline: float | None  # time.monotonic() past which the request is cut (--request-timeout)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token: float | None = None  # seconds from arrival to the first token
    cancel: Callable[[], None] | None = None  # takes the request's job out of the engine
    ended: str = ""  # how a response begun with 200 ended in an error: its status and type
    refused: str = ""  # why an error response was sent: its code (or type) and the field at fault
    body: dict | None = None  # the body the engine path reads, as the API's translate made it (for its reply)


class SlowClient(Exception):
    """A client took none of its response for `Limits.write_timeout` seconds."""


def request_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's own X-Request-Id when it is a plain token, else a new one."""
    for name, value in headers:
        if name.lower() == b"x-request-id":
            given = value.decode("latin-1")
            if REQUEST_ID.fullmatch(given):
                return given
    return f"req-{uuid.uuid4().hex[:24]}"


def refusal(error: RequestError, request_id: str) -> tuple[dict, dict]:
    """The two ASGI messages of an error answer with Retry-After that closes the connection."""
    body = json.dumps(error.to_openai()).encode()
    start = {"type": "http.response.start", "status": error.status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                         (b"retry-after", b"1"), (b"connection", b"close"), (b"x-request-id", request_id.encode())]}
    return start, {"type": "http.response.body", "body": body}


class Guard:
    """The ASGI middleware. `server` is the `app.Server` (its limits, metrics, engine and
    draining state); `connections` counts the open connections (uvicorn's)."""

    def __init__(self, app, server):
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        server, limits = self.server, self.server.limits
        now = time.monotonic()
        exchange = Exchange(request_id(scope.get("headers", [])), now,
                            now + limits.request_timeout if limits.request_timeout else None)
        scope["tiny_llm"] = exchange
        status = 0

        async def bounded_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"x-request-id", exchange.id.encode())]}
            try:
                await asyncio.wait_for(send(message), limits.write_timeout)
            except asyncio.TimeoutError:
                raise SlowClient(f"the client took none of the response for {limits.write_timeout:g} s "
                                 f"(--write-timeout)") from None

        path = scope.get("path", "")
        refused = None
        if server.draining and path not in DRAIN_OPEN:
            refused = RequestError("the server is shutting down; retry on another", status=503,
                                   type="server_error", code="shutting_down")
        elif (connections := server.connections()) > limits.max_connections:
            refused = RequestError(f"the server has {connections} open connections, the most it serves "
                                   f"(--max-connections {limits.max_connections}); retry later", status=503,
                                   type="server_error", code="too_many_connections")
        note = ""  # how the exchange ended, when not as its status says
        try:
            if refused is not None:
                status = refused.status
                for message in refusal(refused, exchange.id):
                    await send(message)
                return
            counted = path not in DRAIN_OPEN  # what a drain waits for; a probe is not
            if counted:
                server.open_requests += 1
                server.metrics.open_requests.inc()
            try:
                await self.app(scope, receive, bounded_send)
            finally:
                if counted:
                    server.open_requests -= 1
                    server.metrics.open_requests.dec()
        except SlowClient as e:
            # The response has begun and cannot end properly: the connection is closed.
            server.metrics.slow_clients.inc()
            note = f" cancelled: {e}"
            if exchange.cancel is not None:
                exchange.cancel()
        finally:
            if server.access_log:
                ttft = f"{exchange.first_token:.3f}" if exchange.first_token is not None else "-"
                client = scope.get("client") or ("-", 0)
                print(f"tiny-llm: access: id={exchange.id} {scope.get('method', '-')} {path} {status or '-'} "
                      f"prompt_tokens={exchange.prompt_tokens} completion_tokens={exchange.completion_tokens} "
                      f"ttft={ttft} time={time.monotonic() - exchange.started:.3f} "
                      f"client={client[0]}:{client[1]}{note or exchange.ended or exchange.refused}", file=sys.stderr,
                      flush=True)
