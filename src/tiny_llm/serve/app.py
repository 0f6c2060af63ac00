"""Engine — the server's HTTP layer: its endpoints on Starlette, served by uvicorn.

Handlers read and check requests (`protocol.parse`, no MLX), hand them to the engine
thread, and turn its events into each API's response shapes (`reply.py`): one JSON
answer, or Server-Sent Events with `stream: true`.

Tests: tests/test_serve_fuzz.py
"""

import asyncio
import hmac
import json
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import asynccontextmanager
from importlib import resources

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..batch import TokenLogprobs
from .anthropic import ANTHROPIC_MESSAGES, count_tokens
from .engine import Engine, EngineStopped, Handle, QueueFull
from .guard import Exchange, Guard, Limits
from .openapi import describe
from .protocol import Context, RequestError, encode, parse
from .reply import CHAT, COMPLETIONS, Api, Reply, error_response
from .responses import RESPONSES, ResponseStore, input_tokens


class Server:
    """The served model, its engine thread, the settings the handlers need, and the state
    of the HTTP side: requests in progress, whether it drains, its open connections."""

    def __init__(self, engine: Engine, ctx: Context, *, api_key: str | None = None, limits: Limits | None = None,
                 access_log: bool = False):
        self.engine, self.ctx, self.metrics = engine, ctx, engine.metrics
        self.api_key, self.limits, self.access_log = api_key, limits or Limits(), access_log
        self.created = int(time.time())
        self.token_bytes = engine.table.tokens  # each token's bytes (the engine's table holds them)
        self.open_requests = 0
        self.draining = False  # SIGTERM: new requests get 503 while those in progress finish
        self.connections: Callable[[], int] = lambda: 0  # open connections (uvicorn's, set by the CLI)
        self.metrics.open_connections.set_function(lambda: self.connections())
        self.responses = ResponseStore()  # finished responses of /v1/responses (previous_response_id, GET)

    def health(self) -> tuple[int, dict]:
        """/health's status and body: 503 while draining, once the engine thread has ended,
        or while one step has taken longer than the engine deadline."""
        engine = self.engine.health()
        if self.draining:
            status = "draining"
        elif not engine["alive"]:
            status = "dead"
        elif engine["step_seconds"] > self.limits.engine_deadline:
            status = "stuck"
        else:
            status = "ok"
        return (200 if status == "ok" else 503), {"status": status, "engine": engine}

    # ---- shapes ----------------------------------------------------------------------------

    def token_text(self, token: int) -> tuple[str, list[int]]:
        """A token's text and bytes as OpenAI reports them: a special token by its name, and
        a token that is not whole UTF-8 characters as "bytes:\\xNN..."."""
        data = self.token_bytes[token] if 0 <= token < len(self.token_bytes) else None
        if data is None:
            data = self.ctx.tokenizer.decode([token]).encode()
        try:
            return data.decode("utf-8"), list(data)
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in data), list(data)

    def chat_logprobs(self, token: int, lp: TokenLogprobs) -> dict:
        text, data = self.token_text(token)
        top = []
        for t, value in lp.top:
            t_text, t_data = self.token_text(t)
            top.append({"token": t_text, "logprob": value, "bytes": t_data})
        return {"token": text, "logprob": lp.logprob, "bytes": data, "top_logprobs": top}

    def completion_logprobs(self, entries: list[tuple[int, TokenLogprobs, int]]) -> dict:
        """OpenAI's legacy shape: parallel lists; `entries` are (token, logprobs, offset)."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token, lp, offset in entries:
            out["tokens"].append(self.token_text(token)[0])
            out["token_logprobs"].append(lp.logprob)
            out["top_logprobs"].append({self.token_text(t)[0]: v for t, v in lp.top})
            out["text_offset"].append(offset)
        return out


def timed_out(limits: Limits) -> RequestError:
    return RequestError(f"the request took longer than this server's limit of {limits.request_timeout:g} s "
                        f"(--request-timeout)", status=408, type="timeout_error", code="request_timeout")


def create_app(server: Server) -> Starlette:
    """The ASGI application. Its lifespan starts and stops the engine thread."""

    @asynccontextmanager
    async def lifespan(app):
        server.engine.start()
        try:
            yield
        finally:
            await run_in_threadpool(server.engine.stop)

    def endpoint(name: str, handler, *, auth: bool = True, error=error_response):
        async def handle(request: Request) -> Response:
            try:
                if auth and server.api_key is not None:
                    _check_key(request, server.api_key)
                response = await handler(request)
            except RequestError as e:
                response = error(e)
                if "tiny_llm" in request.scope:  # the access line says why
                    request.scope["tiny_llm"].refused = (f" error: {e.code or e.type}"
                                                         + (f" param={e.param}" if e.param else ""))
            except ClientDisconnect:  # the body broke off: nobody is left to answer
                response = Response(status_code=499)
            except Exception as e:  # a bug of ours: the client still gets OpenAI's error shape
                print(f"tiny-llm: error: id={request.scope['tiny_llm'].id} {request.method} {request.url.path}: "
                      f"internal error", file=sys.stderr, flush=True)
                traceback.print_exc()
                response = error(RequestError(f"internal error: {type(e).__name__}: {e}", status=500,
                                              type="server_error"))
            server.metrics.requests.labels(name, str(response.status_code)).inc()
            return response

        return handle

    async def page(request: Request) -> Response:
        return HTMLResponse(resources.files("tiny_llm.serve").joinpath("static/chat.html").read_text())

    async def health(request: Request) -> Response:
        status, body = server.health()
        return JSONResponse(body, status_code=status)

    async def openapi(request: Request) -> Response:
        return JSONResponse(describe(server))

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [_model_card(server)]})

    async def model(request: Request) -> Response:
        if request.path_params["model"] not in server.ctx.model_ids:
            raise RequestError(f"the model {request.path_params['model']!r} does not exist", "model", 404,
                               code="model_not_found")
        return JSONResponse(_model_card(server))

    async def metrics(request: Request) -> Response:
        return Response(server.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def tokenize(request: Request) -> Response:
        body = await _json_body(request, server.limits.max_body_bytes)
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        if "messages" in body:
            probe = {"messages": body["messages"], "max_tokens": 1}
            probe.update({k: body[k] for k in ("tools", "tool_choice", "functions", "function_call")
                          if body.get(k) is not None})
            tokens = (await run_in_threadpool(parse, probe, "chat", server.ctx)).prompt
        elif isinstance(body.get("prompt"), str):
            tokens = encode(server.ctx.tokenizer, body["prompt"], "prompt")
        else:
            raise RequestError('send "prompt" (text) or "messages"', "prompt")
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": server.ctx.context_length})

    async def detokenize(request: Request) -> Response:
        body = await _json_body(request, server.limits.max_body_bytes)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        vocab = server.ctx.vocab_size
        if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens):
            raise RequestError(f"tokens must be a list of token ids in [0, {vocab}), got {tokens!r}"[:300], "tokens")
        return JSONResponse({"prompt": server.ctx.tokenizer.decode(tokens)})

    async def response_input_tokens(request: Request) -> Response:
        body = await _json_body(request, server.limits.max_body_bytes)
        return JSONResponse(await run_in_threadpool(input_tokens, body, server))

    async def stored_response(request: Request) -> Response:
        return JSONResponse(server.responses.response(request.path_params["response_id"]))

    async def delete_response(request: Request) -> Response:
        return JSONResponse(server.responses.delete(request.path_params["response_id"]))

    async def message_tokens(request: Request) -> Response:
        body = await _json_body(request, server.limits.max_body_bytes)
        return JSONResponse(await run_in_threadpool(count_tokens, body, server))

    def generate(api: Api):
        async def handle(request: Request) -> Response:
            return await _generate(server, request, api)

        return endpoint(api.name, handle, error=api.error)

    routes = [
        Route("/", endpoint("page", page, auth=False)),
        Route("/health", endpoint("health", health, auth=False)),
        Route("/metrics", endpoint("metrics", metrics, auth=False)),
        Route("/openapi.json", endpoint("openapi", openapi, auth=False)),
        Route("/v1/models", endpoint("models", models)),
        Route("/v1/models/{model:path}", endpoint("models", model)),
        Route("/v1/chat/completions", generate(CHAT), methods=["POST"]),
        Route("/v1/completions", generate(COMPLETIONS), methods=["POST"]),
        Route("/v1/responses", generate(RESPONSES), methods=["POST"]),
        Route("/v1/responses/input_tokens", endpoint("responses", response_input_tokens, error=RESPONSES.error),
              methods=["POST"]),
        Route("/v1/responses/{response_id}", endpoint("responses", stored_response), methods=["GET"]),
        Route("/v1/responses/{response_id}", endpoint("responses", delete_response), methods=["DELETE"]),
        Route("/tokenize", endpoint("tokenize", tokenize), methods=["POST"]),
        Route("/detokenize", endpoint("detokenize", detokenize), methods=["POST"]),
        Route("/v1/messages", generate(ANTHROPIC_MESSAGES), methods=["POST"]),
        Route("/v1/messages/count_tokens", endpoint("messages", message_tokens, error=ANTHROPIC_MESSAGES.error),
              methods=["POST"]),
    ]

    async def not_found(request: Request, exc) -> Response:
        status = getattr(exc, "status_code", 404)
        message = "method not allowed" if status == 405 else f"no such endpoint: {request.url.path}"
        return error_response(RequestError(message, status=status, code="not_found" if status == 404 else None))

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    return Guard(app, server)


def _model_card(server: Server) -> dict:
    return {"id": server.ctx.model_ids[0], "object": "model", "created": server.created, "owned_by": "tiny-llm",
            "max_model_len": server.ctx.context_length}


def _check_key(request: Request, key: str) -> None:
    """The `Authorization: Bearer KEY` header (OpenAI's clients) or `x-api-key: KEY`
    (Anthropic's), compared in constant time."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    given = token.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key", "")
    if not hmac.compare_digest(given.encode(), key.encode()):
        raise RequestError("missing or wrong API key (send Authorization: Bearer <key>, or x-api-key: <key>)",
                           status=401, code="invalid_api_key")


async def _json_body(request: Request, limit: int):
    """The request's JSON body; 413 beyond `limit` bytes (read no further), 400 if malformed."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(f"the request body of {declared} bytes is over this server's limit of {limit}",
                           status=413, code="request_too_large")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise RequestError(f"the request body is over this server's limit of {limit} bytes", status=413,
                               code="request_too_large")
    try:
        return json.loads(data, parse_constant=_not_json)
    except RecursionError:
        raise RequestError("the request body is nested too deeply") from None
    except ValueError as e:  # malformed, not UTF-8, NaN or Infinity, an integer of over 4300 digits
        raise RequestError(f"the request body is not valid JSON: {e}") from None


def _not_json(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _remaining(exchange: Exchange) -> float | None:
    return None if exchange.deadline is None else max(0.0, exchange.deadline - time.monotonic())


async def _generate(server: Server, request: Request, api: Api) -> Response:
    exchange: Exchange = request.scope["tiny_llm"]
    body = await _json_body(request, server.limits.max_body_bytes)
    body, kind = await run_in_threadpool(api.translate, body, server)
    exchange.body = body
    job = await run_in_threadpool(parse, body, kind, server.ctx)
    exchange.prompt_tokens = len(job.prompt)
    try:
        handle = server.engine.submit(job, asyncio.get_running_loop(), exchange.id)
    except QueueFull as e:
        raise RequestError(f"the server is busy: {e}; retry later", status=503, type="server_error",
                           code="queue_full") from None
    except EngineStopped as e:
        raise RequestError(str(e), status=503, type="server_error", code="engine_stopped") from None
    exchange.cancel = lambda: server.engine.cancel(handle)
    try:
        first = await asyncio.wait_for(handle.queue.get(), _remaining(exchange))
    except asyncio.TimeoutError:
        server.engine.cancel(handle)
        server.metrics.timed_out.inc()
        raise timed_out(server.limits) from None
    except asyncio.CancelledError:
        server.engine.cancel(handle)
        raise
    if isinstance(first, RequestError):
        raise first
    reply = api.reply(server, job, exchange)
    if job.stream:
        return StreamingResponse(_stream(server, handle, reply), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        while not reply.done:
            event = asyncio.ensure_future(handle.queue.get())
            await asyncio.wait({event, gone}, timeout=_remaining(exchange), return_when=asyncio.FIRST_COMPLETED)
            if not event.done():  # the client went away, or the time is up: its rows leave the batch
                event.cancel()
                server.engine.cancel(handle)
                if gone.done():
                    return Response(status_code=499)
                server.metrics.timed_out.inc()
                raise timed_out(server.limits)
            reply.add(event.result())
    except asyncio.CancelledError:
        server.engine.cancel(handle)
        raise
    finally:
        gone.cancel()
    if reply.error:
        raise reply.request_error()
    return JSONResponse(reply.whole())


async def _disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _stream(server: Server, handle: Handle, reply: Reply):
    """Server-Sent Events in the API's shape: its opening events, events as the job's come,
    its closing events (or the error that ends the stream). The job is cancelled if the
    client goes away before the end."""
    try:
        for piece in reply.stream_opening():
            yield piece
        while not reply.done:
            try:
                event = await asyncio.wait_for(handle.queue.get(), _remaining(reply.exchange))
            except asyncio.TimeoutError:
                server.engine.cancel(handle)
                server.metrics.timed_out.inc()
                reply.error = "timed out"  # done: the job has left the engine
                for piece in reply.stream_failed(_ended(reply, timed_out(server.limits))):
                    yield piece
                return
            for piece in reply.stream_event(event):
                yield piece
        pieces = reply.stream_failed(_ended(reply, reply.request_error())) if reply.error else reply.stream_closing()
        for piece in pieces:
            yield piece
    finally:
        if not reply.done:
            server.engine.cancel(handle)


def _ended(reply: Reply, error: RequestError) -> RequestError:
    """The error that ends a stream; the access line says the stream ended so."""
    reply.exchange.ended = f" ended: {error.status} {error.code or error.type}"
    return error
