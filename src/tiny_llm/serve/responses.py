"""Engine — OpenAI's Responses API (`/v1/responses`) on the one engine path: a request read
into the chat body that `protocol.parse` checks (`translate`), its answer as a response
object or as the API's semantic Server-Sent Events (`ResponsesReply`), and the store of
finished responses that `previous_response_id` continues, GET returns and DELETE removes.

A request continued with `previous_response_id` is the whole conversation again (earlier
input and output, then the new input), rendered by the chat template as chat would render
it: its prompt begins with the earlier one, so the prefix cache serves that part.

What the server does not do is refused by name (`REFUSED`, and any field it does not know),
never dropped: built-in tools, reasoning, file and image input, background responses.

Tests: tests/test_serve_responses.py
"""

import copy
import json
import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass

from starlette.responses import JSONResponse

from ..request import check_max_tokens
from .engine import Event
from .guard import Exchange
from .protocol import EXTENSIONS, Job, RequestError, check_field, parse
from .reply import Api, Reply, error_response, sse
from .text import ToolCall, ToolCallDelta

# The store keeps finished responses (and the conversations they end) in memory: at most
# MAX_STORED_RESPONSES of them and MAX_STORED_BYTES of their JSON, the oldest evicted first.
# A conversation is re-sent whole on every turn, so a long agent session stores its history
# once per turn: the byte bound keeps that from growing without limit. A restart forgets all.
MAX_STORED_RESPONSES = 1024
MAX_STORED_BYTES = 64 << 20

# Request fields that go to the chat body as they are: OpenAI's temperature and top_p, and
# our extension fields, as a chat request takes them (`SamplingParams` names, constraints).
PASSED = EXTENSIONS | {"temperature", "top_p", "stop", "samplers", "order", "grammar", "regex", "json_schema"}
# OpenAI fields read here, or accepted and changing nothing (as chat accepts them).
READ = frozenset({"model", "input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", "stream",
                  "stream_options", "store", "previous_response_id", "metadata", "user", "parallel_tool_calls",
                  "service_tier", "prompt_cache_key", "safety_identifier"})
# OpenAI fields this server does not do: the values that ask for nothing (accepted), and why
# any other value is refused.
REFUSED: dict[str, tuple[tuple, str]] = {
    "reasoning": ((None,), "reasoning is not supported: the served model has no reasoning settings"),
    "include": ((None, []), "include is not supported: this server has nothing extra to include "
                            "(send [] or leave it out)"),
    "background": ((None, False), "background is not supported: a response runs while its request is open"),
    "conversation": ((None,), "conversation is not supported: continue a conversation with previous_response_id"),
    "prompt": ((None,), "prompt is not supported: this server keeps no prompt templates; send instructions and "
                        "input"),
    "truncation": ((None, "disabled"), 'truncation "auto" is not supported: a conversation longer than the '
                                       'context is refused, never cut (send "disabled" or leave it out)'),
    "top_logprobs": ((None, 0), "top_logprobs is not supported on /v1/responses: ask /v1/chat/completions for "
                                "log-probabilities"),
    "max_tool_calls": ((None,), "max_tool_calls is not supported: it limits built-in tools, and this server runs "
                                "none"),
    "context_management": ((None,), "context_management is not supported: a conversation longer than the context "
                                    "is refused, never compacted"),
    "prompt_cache_retention": ((None, "in_memory"), 'prompt_cache_retention is not supported: the prefix cache '
                                                    'keeps prompts in memory while it has room ("in_memory")'),
}
# The keys each input item and content part may have; the ids and statuses of earlier
# output sent back change nothing.
ITEM_KEYS = {"message": {"type", "role", "content", "id", "status", "phase"},
             "function_call": {"type", "call_id", "name", "arguments", "id", "status"},
             "function_call_output": {"type", "call_id", "output", "id", "status"}}
PART_KEYS = {"input_text": {"type", "text"}, "output_text": {"type", "text", "annotations", "logprobs"}}
ROLES = ("user", "assistant", "system", "developer")
TOOL_KEYS = {"type", "name", "description", "parameters", "strict"}
FORMAT_KEYS = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "name", "schema", "strict",
                                                                          "description"}}


@dataclass(frozen=True)
class Request:
    """A Responses request as read: the chat body `protocol.parse` checks; the conversation
    it continues as chat messages (earlier turns and this input, without the instructions,
    which do not carry over to the next response); the fields its response object repeats;
    whether to store the response."""

    chat: dict
    conversation: list[dict]
    echo: dict
    store: bool


class ChatBody(dict):
    """The chat body of a Responses request, carrying the request as read to its reply."""

    def __init__(self, request: Request):
        super().__init__(request.chat)
        self.request = request


def translate(body, server) -> tuple[ChatBody, str]:
    """A Responses request body -> its chat body (and the kind `protocol.parse` reads it as)."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    for name in sorted(body):
        if name in REFUSED:
            accepted, message = REFUSED[name]
            if not any(type(body[name]) is type(value) and body[name] == value for value in accepted):
                raise RequestError(message, name)
        elif name not in READ and name not in PASSED:
            raise RequestError(f"unknown field {name!r} in a responses request", name)
    chat = {name: body[name] for name in sorted(PASSED) if body.get(name) is not None}
    if body.get("model") is not None:
        chat["model"] = body["model"]
    stream = body.get("stream")
    if stream is not None:
        chat["stream"] = stream
    _check_stream_options(body.get("stream_options"), stream)
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = check_field("max_output_tokens", body["max_output_tokens"],
                                         lambda v: check_max_tokens(v, "max_output_tokens"))
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    choice = _tool_choice(body.get("tool_choice"))
    if choice is not None and (tools or choice not in ("auto", "none")):  # without tools "auto" is "none"
        chat["tool_choice"] = choice
    text = _text_format(body.get("text"))
    if text is not None:
        chat["response_format"] = text
    for name, kinds, what in (("store", bool, "true or false"), ("parallel_tool_calls", bool, "true or false"),
                              ("previous_response_id", str, "a string"), ("instructions", str, "a string"),
                              ("user", str, "a string"), ("metadata", dict, "an object")):
        if body.get(name) is not None and not isinstance(body[name], kinds):
            raise RequestError(f"{name} must be {what}, got {body[name]!r}"[:300], name)

    earlier = []
    if body.get("previous_response_id") is not None:
        earlier = server.responses.conversation(body["previous_response_id"])
    conversation = earlier + _messages(body.get("input"))
    instructions = body.get("instructions")
    chat["messages"] = ([{"role": "system", "content": instructions}] if instructions else []) + conversation
    fmt = (body.get("text") or {}).get("format") or {"type": "text"}
    echo = {"instructions": instructions, "tools": body.get("tools") or [],
            "tool_choice": body.get("tool_choice") or "auto", "text": {"format": fmt},
            "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "max_output_tokens": body.get("max_output_tokens"),
            "previous_response_id": body.get("previous_response_id"),
            "store": body.get("store") is not False, "metadata": body.get("metadata") or {},
            "truncation": "disabled", "background": False, "user": body.get("user")}
    return ChatBody(Request(chat, conversation, echo, echo["store"])), "chat"


def _check_stream_options(options, stream) -> None:
    if options is None:
        return
    if not isinstance(options, dict) or stream is not True or set(options) - {"include_obfuscation"}:
        raise RequestError('stream_options must be {"include_obfuscation": false}, and only with stream: true',
                           "stream_options")
    if options.get("include_obfuscation") is not None and options["include_obfuscation"] is not False:
        raise RequestError("stream_options.include_obfuscation is not supported: this server does not pad its "
                           "events (send false)", "stream_options.include_obfuscation")


def _tools(tools) -> list[dict]:
    """Function tools (`{"type": "function", "name", "description"?, "parameters"?, "strict"?}`)
    in the chat shape; any other kind is refused."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError(f"tools must be a list of function tools, got {tools!r}"[:300], "tools")
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise RequestError(f"tools[{i}] is a {kind!r} tool: only function tools are supported (this server runs "
                               f"no built-in tools)", f"tools[{i}]")
        extra = sorted(set(tool) - TOOL_KEYS)
        if extra:
            raise RequestError(f"tools[{i}].{extra[0]} is not supported", f"tools[{i}].{extra[0]}")
        if tool.get("strict") is not None and not isinstance(tool["strict"], bool):
            raise RequestError(f"tools[{i}].strict must be true or false, got {tool['strict']!r}"[:300],
                               f"tools[{i}].strict")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice):
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and set(choice) == {"type", "name"}:
        return {"type": "function", "function": {"name": choice["name"]}}
    raise RequestError(f'tool_choice must be "none", "auto", "required" or {{"type": "function", "name": ...}}, '
                       f"got {choice!r}"[:300], "tool_choice")


def _text_format(text) -> dict | None:
    """`text.format` as chat's `response_format`; None for plain text."""
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise RequestError(f'text must be {{"format": {{...}}}}, got {text!r}'[:300], "text")
    if text.get("verbosity") is not None:
        raise RequestError("text.verbosity is not supported: the served model has no verbosity setting",
                           "text.verbosity")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise RequestError(f'text.format must be {{"type": "text" | "json_object" | "json_schema"}}, got {fmt!r}'
                           [:300], "text.format")
    extra = sorted(set(fmt) - FORMAT_KEYS[fmt["type"]])
    if extra:
        raise RequestError(f"text.format.{extra[0]} is not supported in a {fmt['type']} format",
                           f"text.format.{extra[0]}")
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if not isinstance(fmt.get("schema"), dict):
        raise RequestError('text.format must be {"type": "json_schema", "name": ..., "schema": {...}}',
                           "text.format")
    spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
    return {"type": "json_schema", "json_schema": spec}


def _messages(input) -> list[dict]:
    """`input` (text, or a list of input items) as chat messages: a message item is a
    message, function calls join the assistant turn before them, a call's output is a
    "tool" message."""
    if isinstance(input, str):
        return [{"role": "user", "content": input}]
    if not isinstance(input, list) or not input:
        raise RequestError(f"input must be a string or a non-empty list of input items, got {input!r}"[:300], "input")
    messages = []
    for i, item in enumerate(input):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where} must be an input item (an object), got {item!r}"[:300], where)
        kind = item.get("type", "message")
        if kind not in ITEM_KEYS:
            raise RequestError(f"{where} is a {kind!r} item: only message, function_call and function_call_output "
                               f"items are supported", f"{where}.type")
        extra = sorted(set(item) - ITEM_KEYS[kind])
        if extra:
            raise RequestError(f"{where}.{extra[0]} is not supported in a {kind} item", f"{where}.{extra[0]}")
        if kind == "message":
            if item.get("role") not in ROLES:
                raise RequestError(f"{where}.role must be one of {', '.join(ROLES)}, got {item.get('role')!r}"[:300],
                                   f"{where}.role")
            messages.append({"role": item["role"], "content": _text(item.get("content"), f"{where}.content")})
            continue
        for name in ("call_id",) + (("name", "arguments") if kind == "function_call" else ()):
            if not isinstance(item.get(name), str):
                raise RequestError(f"{where}.{name} must be a string, got {item.get(name)!r}"[:300], f"{where}.{name}")
        if kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": ""})
            messages[-1].setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _text(item.get("output"), f"{where}.output")})
    return messages


def _text(content, where: str) -> str:
    """A message's content (or a call's output): a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where} must be a string or a list of text parts, got {content!r}"[:300], where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in PART_KEYS:
            raise RequestError(f"{where}[{j}] is a {kind!r} part: this server reads text only (input_text, "
                               f"output_text)", f"{where}[{j}]")
        extra = sorted(set(part) - PART_KEYS[kind])
        if extra or not isinstance(part.get("text"), str):
            raise RequestError(f'{where}[{j}] must be {{"type": "{kind}", "text": ...}}, got {part!r}'[:300],
                               f"{where}[{j}]")
        texts.append(part["text"])
    return "".join(texts)


# A chat body's fields, as a Responses request names them (the other names are the same).
_NAMES = {"messages": "input", "messages/prompt": "input", "max_tokens": "max_output_tokens",
          "response_format": "text.format"}
_TOOL_FIELD = re.compile(r"tools\[(\d+)\]\.function\b")


def responses_param(param: str | None) -> str | None:
    """The field at fault in a chat body (`protocol.parse` names it) as the Responses request
    names it: `messages…` is `input`, `tools[i].function.name` is `tools[i].name`."""
    if param is None:
        return None
    if param.startswith("messages["):
        return "input"
    return _NAMES.get(param) or _TOOL_FIELD.sub(r"tools[\1]", param)


def error(e: RequestError) -> JSONResponse:
    """OpenAI's error shape, the field at fault named as the Responses request names it."""
    return error_response(RequestError(e.message, responses_param(e.param), e.status, e.type, e.code))


def input_tokens(body, server) -> dict:
    """`/v1/responses/input_tokens`: the prompt length of a request, nothing generated."""
    chat, kind = translate(body, server)
    return {"object": "response.input_tokens", "input_tokens": len(parse(chat, kind, server.ctx).prompt)}


# ---- the answer ---------------------------------------------------------------------------


class ResponsesReply(Reply):
    """The response object of one job, built item by item from its events: a message item
    for text, a function_call item for each call. With `stream: true` each step is one of
    the API's events, numbered from 0: the response created and in progress; an item added,
    its content part added, text deltas, the text, part and item done; a call's item added,
    argument deltas, the arguments and item done; the response completed, incomplete (the
    token limit) or failed. The text equals its deltas joined; whitespace before a call is
    held back and dropped, as chat drops it."""

    def __init__(self, server, job: Job, exchange: Exchange):
        super().__init__(server, job, exchange, id=f"resp_{uuid.uuid4().hex}")
        self.request: Request = exchange.body.request
        self.output: list[dict] = []  # the output items so far
        self.status = "in_progress"
        self.sequence = 0  # the next event's sequence_number
        self.message: int | None = None  # the output index of the message item being written
        self.spaces = ""  # whitespace at the end of the text so far: shown once more text follows
        self.written: dict[int, int] = {}  # a call's index among those written piece by piece -> its item
        self.stored = False

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, **copy.deepcopy(fields), "sequence_number": self.sequence}
        self.sequence += 1
        return event

    def add(self, event: Event) -> list[dict]:
        """Record `event`; return its events in the Responses API's shape."""
        super().add(event)
        if event.finish_reason == "error":
            return []
        out = self._text(event.text) if event.text else []
        for delta in event.tool_call_deltas:
            out += self._delta(delta)
        for call in event.tool_calls:
            out += self._call(call)
        if event.finish_reason:
            out += self._finish(event.finish_reason)
        return out

    # ---- items ----------------------------------------------------------------------------

    def _text(self, text: str) -> list[dict]:
        text = self.spaces + text
        shown = text.rstrip()
        self.spaces = text[len(shown):]
        return self._write(shown) if shown else []

    def _write(self, text: str) -> list[dict]:
        out = self._open_message()
        item = self.output[self.message]
        item["content"][0]["text"] += text
        return out + [self._event("response.output_text.delta", item_id=item["id"], output_index=self.message,
                                  content_index=0, delta=text, logprobs=[])]

    def _open_message(self) -> list[dict]:
        if self.message is not None:
            return []
        self.message = len(self.output)
        item = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "status": "in_progress", "role": "assistant",
                "content": []}
        self.output.append(item)
        part = {"type": "output_text", "text": "", "annotations": []}
        out = [self._event("response.output_item.added", output_index=self.message, item=item),
               self._event("response.content_part.added", item_id=item["id"], output_index=self.message,
                           content_index=0, part=part)]
        item["content"].append(part)
        return out

    def _close_message(self, status: str = "completed") -> list[dict]:
        if self.message is None:
            return []
        at, self.message = self.message, None
        item = self.output[at]
        item["status"] = status
        part = item["content"][0]
        return [self._event("response.output_text.done", item_id=item["id"], output_index=at, content_index=0,
                            text=part["text"], logprobs=[]),
                self._event("response.content_part.done", item_id=item["id"], output_index=at, content_index=0,
                            part=part),
                self._event("response.output_item.done", output_index=at, item=item)]

    def _add_call(self, call_id: str, name: str) -> list[dict]:
        """A function_call item; the text before it ends (its trailing whitespace dropped)."""
        self.spaces = ""
        out = self._close_message()
        item = {"id": f"fc_{uuid.uuid4().hex}", "type": "function_call", "status": "in_progress", "call_id": call_id,
                "name": name, "arguments": ""}
        self.output.append(item)
        return out + [self._event("response.output_item.added", output_index=len(self.output) - 1, item=item)]

    def _arguments(self, at: int, piece: str) -> list[dict]:
        item = self.output[at]
        item["arguments"] += piece
        return [self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=at,
                            delta=piece)]

    def _call_at(self, call_id: str) -> int | None:
        return next((at for at, item in enumerate(self.output)
                     if item["type"] == "function_call" and item["call_id"] == call_id), None)

    def _delta(self, delta: ToolCallDelta) -> list[dict]:
        """A call as it is written: its first piece (id and name) adds its item, the others
        are pieces of its arguments."""
        out = []
        if delta.id is not None:
            out = self._add_call(delta.id, delta.name)
            self.written[delta.index] = len(self.output) - 1
        at = self.written.get(delta.index)
        if delta.arguments and at is not None:
            out += self._arguments(at, delta.arguments)
        return out

    def _call(self, call: ToolCall) -> list[dict]:
        """A whole call: it ends the item its pieces built, or (a call that came whole) is
        added, its arguments in one piece, and ended."""
        at = self._call_at(call.id) if call.streamed else None
        out = []
        if at is None:
            out = self._add_call(call.id, call.name)
            at = len(self.output) - 1
            out += self._arguments(at, call.arguments)
        return out + self._end_call(at, call.arguments, "completed")

    def _end_call(self, at: int, arguments: str, status: str) -> list[dict]:
        item = self.output[at]
        item["arguments"], item["status"] = arguments, status
        return [self._event("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                            arguments=arguments),
                self._event("response.output_item.done", output_index=at, item=item)]

    def _finish(self, reason: str) -> list[dict]:
        """The end: a reply without calls is a message (even an empty one), whose trailing
        whitespace is its own; items still open end incomplete."""
        status = "incomplete" if reason == "length" else "completed"
        out = []
        if any(item["type"] == "function_call" for item in self.output):
            self.spaces = ""
        else:
            out += self._open_message()
        if self.spaces:
            out += self._write(self.spaces)
            self.spaces = ""
        out += self._close_message(status)
        for at, item in enumerate(self.output):
            if item["type"] == "function_call" and item["status"] == "in_progress":
                out += self._end_call(at, item["arguments"], "incomplete")
        self.status = status
        return out

    # ---- the response object --------------------------------------------------------------

    def usage(self) -> dict:
        prompt, output = len(self.job.prompt), sum(self.tokens)
        # No explicit cache breakpoints here: the prefix cache keeps prompts on its own.
        return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": self.cached_tokens,
                                                                  "cache_write_tokens": 0},
                "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + output}

    def response(self, error: RequestError | None = None) -> dict:
        """The response object as it stands (with `error`: failed)."""
        status = "failed" if error is not None else self.status
        ended = status in ("completed", "incomplete")
        failure = None
        if error is not None:
            failure = {"code": error.code or ("server_error" if error.status >= 500 else "invalid_prompt"),
                       "message": error.message}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "completed_at": int(time.time()) if status == "completed" else None, "error": failure,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "model": self.job.model, "output": copy.deepcopy(self.output),
                "usage": self.usage() if ended else None, **self.request.echo}

    def _finished(self) -> dict:
        """The finished response, stored (once) when the request asked for it."""
        response = self.response()
        if self.request.store and not self.stored:
            self.stored = True
            text = "".join(part["text"] for item in self.output if item["type"] == "message"
                           for part in item["content"])
            turn = {"role": "assistant", "content": text}
            calls = [{"id": item["call_id"], "type": "function",
                      "function": {"name": item["name"], "arguments": item["arguments"]}}
                     for item in self.output if item["type"] == "function_call"]
            if calls:
                turn["tool_calls"] = calls
            self.server.responses.put(response, self.request.conversation + [turn])
        return response

    def whole(self) -> dict:
        return self._finished()

    def stream_opening(self) -> list[str]:
        return [self._sse(self._event(kind, response=self.response()))
                for kind in ("response.created", "response.in_progress")]

    def stream_event(self, event: Event) -> list[str]:
        return [self._sse(e) for e in self.add(event)]

    def stream_closing(self) -> list[str]:
        response = self._finished()
        return [self._sse(self._event(f"response.{response['status']}", response=response))]

    def stream_failed(self, error: RequestError) -> list[str]:
        return [self._sse(self._event("response.failed", response=self.response(error)))]

    @staticmethod
    def _sse(event: dict) -> str:
        return sse(event, event=event["type"])


# ---- the store ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    response: dict
    conversation: list[dict]  # chat messages: the conversation the response ends, its output last
    size: int  # bytes of their JSON


class ResponseStore:
    """Finished responses by id, with the conversations they end, for `previous_response_id`,
    GET and DELETE: at most `max_responses` and `max_bytes` of JSON, the oldest evicted
    first. Handlers on the event loop and in worker threads share it (a lock)."""

    def __init__(self, max_responses: int = MAX_STORED_RESPONSES, max_bytes: int = MAX_STORED_BYTES):
        for name, value in (("max_responses", max_responses), ("max_bytes", max_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self.bytes = 0
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response: dict, conversation: list[dict]) -> None:
        """Keep `response` (a response larger than the whole store is not kept)."""
        size = len(json.dumps(response, ensure_ascii=False)) + len(json.dumps(conversation, ensure_ascii=False))
        if size > self.max_bytes:
            return
        with self._lock:
            self._items[response["id"]] = Stored(response, conversation, size)
            self.bytes += size
            while len(self._items) > self.max_responses or self.bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self.bytes -= old.size

    def _get(self, id: str, param: str) -> Stored:
        with self._lock:
            stored = self._items.get(id)
        if stored is None:
            raise RequestError(f"no stored response {id!r}: it was never stored (store: false), was deleted, or was "
                               f"evicted (this server keeps the last {self.max_responses} responses, "
                               f"{self.max_bytes >> 20} MiB at most)"[:400], param, 404,
                               code="previous_response_not_found" if param == "previous_response_id" else "not_found")
        return stored

    def conversation(self, id: str) -> list[dict]:
        """The conversation response `id` ends (a copy), to continue; 404 if it is not stored."""
        return copy.deepcopy(self._get(id, "previous_response_id").conversation)

    def response(self, id: str) -> dict:
        return self._get(id, "response_id").response

    def delete(self, id: str) -> dict:
        self._get(id, "response_id")
        with self._lock:
            old = self._items.pop(id, None)
            if old is not None:
                self.bytes -= old.size
        return {"id": id, "object": "response.deleted", "deleted": True}


RESPONSES = Api("responses", translate, ResponsesReply, error)
