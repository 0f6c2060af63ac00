"""Engine — the server's HTTP layer: OpenAI's endpoints on Starlette, served by uvicorn.

Handlers read and check requests (`protocol.parse`, no MLX), hand them to the engine
thread, and turn its events into OpenAI's response shapes: one JSON answer, or
Server-Sent Events with `stream: true`.
"""

import asyncio
import hmac
import json
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from contextlib import asynccontextmanager
from importlib import resources

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..batch import TokenLogprobs
from .engine import Engine, EngineStopped, Event, Handle, QueueFull
from .guard import Exchange, Guard, Limits
from .openapi import describe
from .protocol import Context, Job, RequestError, encode, parse


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


def error_response(error: RequestError) -> JSONResponse:
    """OpenAI's error shape; a 503 (busy, shutting down) says when to retry."""
    return JSONResponse(error.to_openai(), status_code=error.status,
                        headers={"Retry-After": "1"} if error.status == 503 else None)


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

    def endpoint(name: str, handler, *, auth: bool = True):
        async def handle(request: Request) -> Response:
            try:
                if auth and server.api_key is not None:
                    _check_key(request, server.api_key)
                response = await handler(request)
            except RequestError as e:
                response = error_response(e)
            except ClientDisconnect:  # the body broke off: nobody is left to answer
                response = Response(status_code=499)
            except Exception as e:  # a bug of ours: the client still gets OpenAI's error shape
                print(f"tiny-llm: error: id={request.scope['tiny_llm'].id} {request.method} {request.url.path}: "
                      f"internal error", file=sys.stderr, flush=True)
                traceback.print_exc()
                response = error_response(RequestError(f"internal error: {type(e).__name__}: {e}", status=500,
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

    async def chat(request: Request) -> Response:
        return await _generate(server, request, "chat")

    async def completions(request: Request) -> Response:
        return await _generate(server, request, "completion")

    routes = [
        Route("/", endpoint("page", page, auth=False)),
        Route("/health", endpoint("health", health, auth=False)),
        Route("/metrics", endpoint("metrics", metrics, auth=False)),
        Route("/openapi.json", endpoint("openapi", openapi, auth=False)),
        Route("/v1/models", endpoint("models", models)),
        Route("/v1/models/{model:path}", endpoint("models", model)),
        Route("/v1/chat/completions", endpoint("chat", chat), methods=["POST"]),
        Route("/v1/completions", endpoint("completions", completions), methods=["POST"]),
        Route("/tokenize", endpoint("tokenize", tokenize), methods=["POST"]),
        Route("/detokenize", endpoint("detokenize", detokenize), methods=["POST"]),
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
    """The `Authorization: Bearer KEY` header, compared in constant time."""
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise RequestError("missing or wrong API key (send Authorization: Bearer <key>)", status=401,
                           code="invalid_api_key")


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


async def _generate(server: Server, request: Request, kind: str) -> Response:
    exchange: Exchange = request.scope["tiny_llm"]
    body = await _json_body(request, server.limits.max_body_bytes)
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
    reply = Reply(server, job, f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}", exchange)
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


async def _stream(server: Server, handle: Handle, reply: "Reply"):
    """Server-Sent Events: a chunk per event, then usage (when asked) and `[DONE]`. The job
    is cancelled if the client goes away before the end."""
    try:
        for chunk in reply.opening():
            yield _sse(chunk)
        while not reply.done:
            try:
                event = await asyncio.wait_for(handle.queue.get(), _remaining(reply.exchange))
            except asyncio.TimeoutError:
                server.engine.cancel(handle)
                server.metrics.timed_out.inc()
                reply.error = "timed out"  # done: the job has left the engine
                yield _sse(_ended(reply, timed_out(server.limits)))
                yield "data: [DONE]\n\n"
                return
            for chunk in reply.add(event):
                yield _sse(chunk)
        if reply.error:
            yield _sse(_ended(reply, reply.request_error()))
        elif reply.job.include_usage:
            yield _sse(reply.usage_chunk())
        yield "data: [DONE]\n\n"
    finally:
        if not reply.done:
            server.engine.cancel(handle)


def _ended(reply: "Reply", error: RequestError) -> dict:
    """The error chunk that ends a stream; the access line says the stream ended so."""
    reply.exchange.ended = f" ended: {error.status} {error.code or error.type}"
    return error.to_openai()


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class Reply:
    """The answer to one job, built from its events: each choice's text, tool calls,
    log-probabilities, finish reason and token count; and the stream chunks of each event.

    A job that spelled its tools the deprecated way (`functions`) gets its call in the
    deprecated shape: `function_call` (one call, the first the reply holds) and
    `finish_reason: "function_call"`, no `tool_calls`."""

    def __init__(self, server: Server, job: Job, id: str, exchange: Exchange):
        self.server, self.job, self.id, self.exchange = server, job, id, exchange
        self.created = int(time.time())
        n = len(job.params)
        self.texts, self.calls = [""] * n, [[] for _ in range(n)]
        self.logprobs: list[list] = [[] for _ in range(n)]
        self.finish: list[str | None] = [None] * n
        self.tokens = [0] * n
        self.cached_tokens = 0  # of the prompt, found in the prefix cache
        self.error: str | None = None
        self.error_status = 500

    def request_error(self) -> RequestError:
        """The error that ended the job: the request's own fault below 500, the server's above."""
        kind = "invalid_request_error" if self.error_status < 500 else "server_error"
        return RequestError(self.error, status=self.error_status, type=kind)

    @property
    def done(self) -> bool:
        return self.error is not None or all(self.finish)

    def _chunk(self, choices: list[dict]) -> dict:
        chunk = {"id": self.id, "object": "chat.completion.chunk" if self.job.kind == "chat" else "text_completion",
                 "created": self.created, "model": self.job.model, "choices": choices}
        if self.job.include_usage:
            chunk["usage"] = None
        return chunk

    def _reason(self, finish: str | None) -> str | None:
        return "function_call" if self.job.legacy and finish == "tool_calls" else finish

    def opening(self) -> list[dict]:
        if self.job.kind != "chat":
            return []
        return [self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None} for i in range(len(self.job.params))])]

    def add(self, event: Event) -> list[dict]:
        """Record `event`; return its stream chunks."""
        i = event.index
        if event.finish_reason == "error":
            self.error, self.error_status = event.error, event.status
            return []
        if self.exchange.first_token is None:
            self.exchange.first_token = time.monotonic() - self.exchange.started
        offset = len(self.texts[i])
        self.texts[i] += event.text
        self.tokens[i] = max(self.tokens[i], event.tokens)
        self.exchange.completion_tokens = sum(self.tokens)
        self.cached_tokens = max(self.cached_tokens, event.cached_tokens)
        self.finish[i] = event.finish_reason
        first_call = len(self.calls[i])
        self.calls[i] += event.tool_calls
        entry = None
        if event.logprobs is not None and event.token is not None:
            if self.job.kind == "chat":
                entry = self.server.chat_logprobs(event.token, event.logprobs)
            else:
                entry = (event.token, event.logprobs, offset)
            self.logprobs[i].append(entry)
        if not self.job.stream:
            return []
        if self.job.kind == "chat":
            delta = {"content": event.text} if event.text else {}
            if event.tool_calls and self.job.legacy:
                if first_call == 0:
                    delta["function_call"] = event.tool_calls[0].to_legacy()
            elif event.tool_calls:
                delta["tool_calls"] = [c.to_openai(first_call + k) for k, c in enumerate(event.tool_calls)]
            logprobs = {"content": [entry]} if entry is not None else None
            choice = {"index": i, "delta": delta, "logprobs": logprobs,
                      "finish_reason": self._reason(event.finish_reason)}
        else:
            logprobs = self.server.completion_logprobs([entry]) if entry is not None else None
            choice = {"index": i, "text": event.text, "logprobs": logprobs, "finish_reason": event.finish_reason}
        return [self._chunk([choice])]

    def usage(self) -> dict:
        prompt, completion = len(self.job.prompt), sum(self.tokens)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def usage_chunk(self) -> dict:
        return {**self._chunk([]), "usage": self.usage()}

    def whole(self) -> dict:
        choices = []
        for i in range(len(self.job.params)):
            if self.job.kind == "chat":
                text = self.texts[i].strip() if self.calls[i] else self.texts[i]
                message = {"role": "assistant", "content": text or (None if self.calls[i] else "")}
                if self.calls[i] and self.job.legacy:
                    message["function_call"] = self.calls[i][0].to_legacy()
                elif self.calls[i]:
                    message["tool_calls"] = [c.to_openai() for c in self.calls[i]]
                logprobs = {"content": self.logprobs[i]} if self.job.logprobs is not None else None
                choices.append({"index": i, "message": message, "logprobs": logprobs,
                                "finish_reason": self._reason(self.finish[i])})
            else:
                logprobs = self.server.completion_logprobs(self.logprobs[i]) if self.job.logprobs is not None else None
                choices.append({"index": i, "text": self.texts[i], "logprobs": logprobs,
                                "finish_reason": self.finish[i]})
        return {"id": self.id, "object": "chat.completion" if self.job.kind == "chat" else "text_completion",
                "created": self.created, "model": self.job.model, "choices": choices, "usage": self.usage()}
