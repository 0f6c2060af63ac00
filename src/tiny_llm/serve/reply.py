"""Engine — the answers of the server's APIs, built from the engine's events.

An `Api` says how one HTTP API speaks to the one engine path: `translate` turns its request
body into the chat (or completion) body that `protocol.parse` checks and builds a job from,
so every API gets the same checks, grammars, prefix cache and limits; `reply` makes the
object that turns the job's events into the API's answer — one JSON body, or Server-Sent
Events — and `error` its error shape. `Reply` is OpenAI's chat and completion answer; the
Responses API (`responses.py`) and Anthropic's Messages API (`anthropic.py`) build on it.

Tests: tests/test_serve_fuzz.py, tests/test_serve_responses.py, tests/test_serve_text.py
"""

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from starlette.responses import JSONResponse

from .engine import Event
from .guard import Exchange
from .protocol import Job, RequestError


def sse(data: dict, event: str | None = None) -> str:
    """One Server-Sent Event: `data: JSON`, after `event: NAME` for APIs that name their events."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


def error_response(error: RequestError) -> JSONResponse:
    """OpenAI's error shape; a 503 (busy, shutting down) says when to retry."""
    return JSONResponse(error.to_openai(), status_code=error.status,
                        headers={"Retry-After": "1"} if error.status == 503 else None)


@dataclass(frozen=True)
class Api:
    """One HTTP API on the engine. `name`: the metrics label; `translate(body, server)`: the
    request in the API's shape -> (the body `protocol.parse` reads, its kind: "chat" or
    "completion"); `reply(server, job, exchange)`: the answer's builder (a `Reply`; the body
    translate made is `exchange.body`); `error(RequestError)`: the error response in the
    API's shape."""

    name: str
    translate: Callable[[Any, Any], tuple[dict, str]]
    reply: Callable[..., "Reply"]
    error: Callable[[RequestError], JSONResponse] = error_response


class Reply:
    """The answer to one job, built from its events: each choice's text, tool calls,
    log-probabilities, finish reason and token count; and the stream chunks of each event.

    A job that spelled its tools the deprecated way (`functions`) gets its call in the
    deprecated shape: `function_call` (one call, the first the reply holds) and
    `finish_reason: "function_call"`, no `tool_calls`."""

    def __init__(self, server, job: Job, exchange: Exchange, id: str | None = None):
        self.server, self.job, self.exchange = server, job, exchange
        self.id = id or f"{'chatcmpl' if job.kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
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
            if self.job.legacy:  # the deprecated shape: the one call, whole
                if event.tool_calls and first_call == 0:
                    delta["function_call"] = event.tool_calls[0].to_legacy()
            else:
                # A call as it is written: its id and name, then pieces of its arguments; a
                # call that came whole (not written as a call block's usual start) goes whole.
                pieces = [{"index": d.index, "id": d.id, "type": "function",
                           "function": {"name": d.name, "arguments": d.arguments}} if d.id is not None
                          else {"index": d.index, "function": {"arguments": d.arguments}}
                          for d in event.tool_call_deltas]
                pieces += [c.to_openai(first_call + k) for k, c in enumerate(event.tool_calls) if not c.streamed]
                if pieces:
                    delta["tool_calls"] = pieces
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

    # ---- Server-Sent Events ---------------------------------------------------------------

    def stream_opening(self) -> list[str]:
        return [sse(c) for c in self.opening()]

    def stream_event(self, event: Event) -> list[str]:
        return [sse(c) for c in self.add(event)]

    def stream_closing(self) -> list[str]:
        """After the last event: the usage chunk when asked for, then `[DONE]`."""
        return ([sse(self.usage_chunk())] if self.job.include_usage else []) + ["data: [DONE]\n\n"]

    def stream_failed(self, error: RequestError) -> list[str]:
        """The error chunk that ends a stream early, then `[DONE]`."""
        return [sse(error.to_openai()), "data: [DONE]\n\n"]


CHAT = Api("chat", lambda body, server: (body, "chat"), Reply)
COMPLETIONS = Api("completions", lambda body, server: (body, "completion"), Reply)
