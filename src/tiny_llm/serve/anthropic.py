"""Engine — Anthropic's Messages API on the one engine path: `POST /v1/messages`, whole or
streamed, and `POST /v1/messages/count_tokens`.

A request in Anthropic's shape is checked here, with Anthropic's field names, and translated
into the chat body `protocol.parse` checks and builds a job from: `system` becomes a system
message, `tool_use` blocks an assistant's tool calls, `tool_result` blocks tool messages,
`tools` function tools, `stop_sequences` stop strings. What this server cannot do (images,
documents, thinking, server tools, containers, ...) is refused by name with a 400, never
dropped. The answer (`MessageReply`) is a message of text and `tool_use` content blocks,
whole or as Anthropic's named Server-Sent Events; errors come in Anthropic's shape.

Tests: tests/test_serve_anthropic.py, tests/test_serve_fuzz.py
"""

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.responses import JSONResponse

from ..request import MAX_STOP_STRINGS, FieldError, parse_stop
from .engine import Event
from .protocol import EXTENSIONS, RequestError, parse
from .reply import Api, Reply, sse
from .text import TOOL_CALL_CLOSE, ToolCall, ToolCallDelta
from .tools import name_problem

# Our own fields, read by `protocol.parse` under the names a chat request gives them: the
# sampling engine's parameters (`seed`, `min_p`, `logit_bias`, ...) and one constraint.
PASSED = EXTENSIONS | {"grammar", "regex", "json_schema", "samplers", "order"}
# What makes the prompt: all that count_tokens reads.
PROMPT = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config", "speed",
                    "cache_control"})
MESSAGES = PROMPT | PASSED | {"max_tokens", "stop_sequences", "stream", "temperature", "top_p", "top_k", "metadata",
                              "service_tier"}
# Anthropic's fields for what this server does not have; null is accepted (nothing is asked).
REFUSED = {
    "container": "this server runs no code-execution container",
    "mcp_servers": "this server connects to no MCP server; give the tools the model may call in tools",
    "diagnostics": "this server explains no prompt-cache misses",
    "inference_geo": "the model runs on this server",
    "user_profile_id": "this server has no user profiles",
    "workspace_id": "this server has no workspaces",
}
MAX_TEMPERATURE = 1  # Anthropic's range
# The content blocks each place takes.
KINDS = {"user": ("text", "tool_result"), "assistant": ("text", "tool_use"), "system": ("text",),
         "tool_result": ("text",)}
PLACES = {"user": "a user message", "assistant": "an assistant message", "system": "a system prompt",
          "tool_result": "a tool_result's content"}
ROLES = ("user", "assistant", "system")
TEXT_KEYS = frozenset({"type", "text", "cache_control"})  # cache_control: the prefix cache needs no marks
TOOL_KEYS = frozenset({"type", "name", "description", "input_schema", "cache_control", "strict",
                       "eager_input_streaming"})
# Anthropic's error type of each HTTP status; other statuses: api_error from 500 on.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error"}


# ---- the request ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class ToolUse:
    id: str
    name: str
    input: dict


@dataclass(frozen=True)
class ToolResult:
    tool_use_id: str
    text: str
    is_error: bool


Block = Text | ToolUse | ToolResult


def translate(body, server=None) -> tuple[dict, str]:
    """`Api.translate`: a Messages request -> the chat body `protocol.parse` reads."""
    return chat_body(body, counting=False), "chat"


def count_tokens(body, server) -> dict:
    """`/v1/messages/count_tokens`: the length of the prompt `/v1/messages` would build."""
    job = parse({**chat_body(body, counting=True), "max_tokens": 1}, "chat", server.ctx)
    return {"input_tokens": len(job.prompt)}


def chat_body(body, counting: bool) -> dict:
    """The chat body of a Messages request (`counting`: of a count_tokens request, which
    holds only what makes the prompt)."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    allowed, what = (PROMPT, "count_tokens") if counting else (MESSAGES, "messages")
    for key, value in body.items():
        if key in REFUSED:
            if value is not None:
                raise RequestError(f"{key} is not supported: {REFUSED[key]}", key)
        elif key not in allowed:
            raise RequestError(f"unknown field {key!r} in a {what} request", key)
    if not counting and body.get("max_tokens") is None:
        raise RequestError("max_tokens is required: the most tokens the reply may have", "max_tokens")
    _check_settings(body)
    kind = _choice_kind(body.get("tool_choice"))
    tools = _tools(body.get("tools"), forced=kind in ("any", "tool"))
    choice = _tool_choice(body.get("tool_choice"), kind, tools)
    chat = {"messages": _messages(body.get("system"), body.get("messages"))}
    for name, value in (("model", body.get("model")), ("tools", tools), ("tool_choice", choice)):
        if value is not None:
            chat[name] = value
    if counting:
        return chat
    _check_temperature(body.get("temperature"))
    stops = _stops(body.get("stop_sequences"))
    if kind == "auto" and body["tool_choice"].get("disable_parallel_tool_use"):
        # One call at most: the reply ends where the first call block closes (the engine
        # reads a block left open at the end as a call).
        if len(stops) == MAX_STOP_STRINGS:
            raise RequestError(f"stop_sequences may hold at most {MAX_STOP_STRINGS - 1} strings with "
                               f"disable_parallel_tool_use, which takes one more", "stop_sequences")
        stops.append(TOOL_CALL_CLOSE)
    if stops:
        chat["stop"] = stops
    for name in sorted(PASSED | {"max_tokens", "stream"}):
        if body.get(name) is not None:
            chat[name] = body[name]
    return chat


def _object(value, where: str, keys: frozenset[str]) -> dict:
    """`value`, a JSON object whose keys are among `keys` (a key set to null is as absent)."""
    if not isinstance(value, dict):
        raise RequestError(f"{where} must be an object, got {value!r}"[:300], where)
    for key, item in value.items():
        if key not in keys and item is not None:
            raise RequestError(f"{where}.{key} is not supported (this server reads {', '.join(sorted(keys))})",
                               f"{where}.{key}")
    return value


def _string(value, where: str) -> str:
    if not isinstance(value, str):
        raise RequestError(f"{where} must be a string, got {value!r}"[:300], where)
    return value


def _check_settings(body: dict) -> None:
    """The fields that ask for a way of answering: what this server does is accepted (no
    thinking, one tier, one speed), anything else refused."""
    thinking = body.get("thinking")
    if thinking is not None and thinking != {"type": "disabled"}:
        raise RequestError('thinking is not supported: this model answers without thinking first (leave thinking '
                           'out, or send {"type": "disabled"})', "thinking")
    config = body.get("output_config")
    if config is not None:
        config = _object(config, "output_config", frozenset({"effort", "format"}))
        if config.get("effort") is not None:
            raise RequestError("output_config.effort is not supported: it sets how much the model thinks, and "
                               "this model does not think", "output_config.effort")
        if config.get("format") is not None:
            raise RequestError("output_config.format is not supported: send the schema as json_schema, this "
                               "server's extension field", "output_config.format")
    if body.get("speed") not in (None, "standard"):
        raise RequestError(f'speed must be "standard" (this server has one speed), got {body["speed"]!r}'[:300],
                           "speed")
    if body.get("service_tier") not in (None, "auto", "standard_only"):
        raise RequestError(f'service_tier must be "auto" or "standard_only" (this server has one tier), '
                           f'got {body["service_tier"]!r}'[:300], "service_tier")
    if body.get("metadata") is not None:
        _object(body["metadata"], "metadata", frozenset({"user_id"}))


def _check_temperature(value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_TEMPERATURE:
        raise RequestError(f"temperature must be a number from 0 to {MAX_TEMPERATURE} (Anthropic's range), "
                           f"got {value!r}"[:300], "temperature")


def _stops(value) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError(f"stop_sequences must be a list of strings, got {value!r}"[:300], "stop_sequences")
    try:
        return list(parse_stop(value, "stop_sequences"))
    except FieldError as e:
        raise RequestError(str(e), e.field) from None


# -- messages


def _messages(system, messages) -> list[dict]:
    """The chat messages: the system prompt first, then each message's blocks. An assistant
    message is one chat message (its text, its tool_use blocks as tool calls); in a user
    message each tool_result is a tool message and each run of text a user message."""
    out = [] if system is None else [{"role": "system", "content": _joined(_content(system, "system", "system"))}]
    if not isinstance(messages, list) or not messages:
        raise RequestError('messages must be a non-empty list of {"role", "content"} objects', "messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        message = _object(message, where, frozenset({"role", "content"}))
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role must be user, assistant or system, got {role!r}"[:300], f"{where}.role")
        blocks = _content(message.get("content"), f"{where}.content", role)
        if role == "assistant":
            calls = [b for b in blocks if isinstance(b, ToolUse)]
            turn = {"role": role, "content": _joined(blocks)}
            if calls:
                turn["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                    "name": c.name, "arguments": json.dumps(c.input, ensure_ascii=False)}} for c in calls]
            out.append(turn)
            continue
        run, made = [], False
        for block in blocks + [None]:  # None: the end of the message
            if isinstance(block, Text):
                run.append(block)
                continue
            if run or (block is None and not made):
                out.append({"role": role, "content": _joined(run)})
                run, made = [], True
            if isinstance(block, ToolResult):
                out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                            "content": f"Error: {block.text}" if block.is_error else block.text})
                made = True
    return out


def _joined(blocks: Sequence[Block]) -> str:
    """The text of a message's text blocks, joined as chat joins text parts: as they are."""
    return "".join(b.text for b in blocks if isinstance(b, Text))


def _content(content, where: str, role: str) -> list[Block]:
    if isinstance(content, str):
        return [Text(content)]
    if not isinstance(content, list):
        raise RequestError(f"{where} must be a string or a list of content blocks, got {content!r}"[:300], where)
    return [_block(block, f"{where}[{j}]", role) for j, block in enumerate(content)]


def _block(block, where: str, role: str) -> Block:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise RequestError(f'{where} must be a content block {{"type": ...}}, got {block!r}'[:300], where)
    kind = block["type"]
    if kind not in KINDS[role]:
        raise RequestError(f"{where}: {kind!r} blocks are not supported in {PLACES[role]} (this server takes "
                           f"{' and '.join(KINDS[role])} blocks there)"[:300], where)
    if kind == "text":
        return Text(_string(_object(block, where, TEXT_KEYS).get("text"), f"{where}.text"))
    if kind == "tool_use":
        block = _object(block, where, frozenset({"type", "id", "name", "input", "cache_control"}))
        arguments = block.get("input")
        if not isinstance(arguments, dict):
            raise RequestError(f"{where}.input must be an object, got {arguments!r}"[:300], f"{where}.input")
        return ToolUse(_string(block.get("id"), f"{where}.id"), _string(block.get("name"), f"{where}.name"),
                       arguments)
    block = _object(block, where, frozenset({"type", "tool_use_id", "content", "is_error", "cache_control"}))
    result = block.get("content")
    texts = [] if result is None else [Text(result)] if isinstance(result, str) else None
    if texts is None:  # a list of blocks: text only
        if not isinstance(result, list):
            raise RequestError(f"{where}.content must be a string or a list of text blocks, got {result!r}"[:300],
                               f"{where}.content")
        texts = [_block(b, f"{where}.content[{k}]", "tool_result") for k, b in enumerate(result)]
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise RequestError(f"{where}.is_error must be true or false, got {is_error!r}"[:300], f"{where}.is_error")
    return ToolResult(_string(block.get("tool_use_id"), f"{where}.tool_use_id"), _joined(texts), bool(is_error))


# -- tools


def _tools(tools, forced: bool) -> list[dict] | None:
    """Anthropic's tool definitions as chat function tools. `forced`: the tool_choice forces
    a call, which is decoded under its schema (what `strict` asks for)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RequestError(f"tools must be a list of tool definitions, got {tools!r}"[:300], "tools")
    out, names = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if isinstance(tool, dict) and tool.get("type") not in (None, "custom"):
            raise RequestError(f"{where} is a server tool ({tool['type']!r}), which this server does not run: "
                               f'define the tools the client runs, {{"name", "description", "input_schema"}}'[:300],
                               where)
        tool = _object(tool, where, TOOL_KEYS)
        name = tool.get("name")
        problem = name_problem(name, where, names)
        if problem:
            raise RequestError(problem, f"{where}.name")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise RequestError(f"{where}.input_schema must be a JSON schema object, got {schema!r}"[:300],
                               f"{where}.input_schema")
        if tool.get("strict") is not None and not isinstance(tool["strict"], bool):  # 1 == True, but not a boolean
            raise RequestError(f"{where}.strict must be true or false, got {tool['strict']!r}"[:300], f"{where}.strict")
        if tool.get("strict") and not forced:
            raise RequestError(f"{where}.strict needs a tool_choice that forces a call (any or tool): only a "
                               f"forced call is decoded under its schema", f"{where}.strict")
        function = {"name": name}  # in the order OpenAI's definitions have: the prompt shows them as JSON
        if tool.get("description") is not None:
            function["description"] = _string(tool["description"], f"{where}.description")
        out.append({"type": "function", "function": {**function, "parameters": schema}})
    return out or None


def _choice_kind(choice) -> str | None:
    if choice is None:
        return None
    choice = _object(choice, "tool_choice", frozenset({"type", "name", "disable_parallel_tool_use"}))
    if choice.get("type") not in ("auto", "any", "tool", "none"):
        raise RequestError(f'tool_choice.type must be "auto", "any", "tool" or "none", '
                           f'got {choice.get("type")!r}'[:300], "tool_choice.type")
    flag = choice.get("disable_parallel_tool_use")
    if flag is not None and not isinstance(flag, bool):
        raise RequestError(f"tool_choice.disable_parallel_tool_use must be true or false, got {flag!r}"[:300],
                           "tool_choice.disable_parallel_tool_use")
    return choice["type"]


def _tool_choice(choice, kind: str | None, tools: list[dict] | None) -> str | dict | None:
    """The chat tool_choice: "auto", "required" (any), a named function (tool) or "none".
    A forced call is one call: disable_parallel_tool_use holds by itself there."""
    if kind is None:
        return None
    if kind != "none" and not tools:
        raise RequestError(f'tool_choice {{"type": "{kind}"}} needs tools', "tool_choice")
    if kind != "tool":
        if choice.get("name") is not None:
            raise RequestError(f'tool_choice.name goes with {{"type": "tool"}} only, not {kind!r}', "tool_choice.name")
        return {"auto": "auto", "any": "required", "none": "none"}[kind]
    known = [t["function"]["name"] for t in tools]
    if choice.get("name") not in known:
        raise RequestError(f"tool_choice names tool {choice.get('name')!r}, which is not among the tools "
                           f"({', '.join(map(repr, known))})"[:300], "tool_choice.name")
    return {"type": "function", "function": {"name": choice["name"]}}


# ---- the answer ----------------------------------------------------------------------------


def tool_use_id(call_id: str) -> str:
    """A call's id as Anthropic spells ids (`toolu_...`); the same call always gets the same."""
    return "toolu_" + call_id.removeprefix("call_")


def matched_stop(stops: Sequence[str], text: str, last: str) -> str | None:
    """Which of `stops` ended a reply whose text (without the stop string) is `text` and
    whose last token's text is `last`: the first whose occurrence right after `text` ends
    inside `last` (a stop string is found on the token that completes it). None if none
    fits. Two stops can fit the same end ("ab" and "b" after "a"); the first is reported."""
    for stop in stops:
        written = text + stop
        if any(written.endswith(last[:k]) for k in range(1, len(last) + 1)):
            return stop
    return None


class Blocks:
    """A message's content blocks as the reply is written, text and `tool_use` in the order
    they come, and the stream events that write them (`content_block_start`, `_delta`,
    `_stop`). A call comes as pieces (its id and name, then its arguments text bit by bit)
    or whole; its block holds the parsed `input` once it is complete. Whitespace next to a
    call is not written (chat strips a reply's text when it holds calls): it waits until
    text follows it."""

    def __init__(self, follow: bool):
        self.follow = follow  # follow calls as they are written (a stream); else take them whole
        self.blocks: list[dict] = []
        self.open = False  # the last block is still being written
        self.space = ""  # whitespace held back
        self.calls: dict[str, int] = {}  # a call's id -> its block
        self.written: dict[int, int] = {}  # a call's index among the pieces -> its block

    def feed(self, event: Event) -> list[dict]:
        """The stream events of `event` (its text first, then its calls, as chat has them)."""
        out = self._text(event.text) if event.text else []
        for piece in event.tool_call_deltas if self.follow else []:
            out += self._piece(piece)
        for call in event.tool_calls:
            out += self._call(call)
        if event.finish_reason:
            if self.space and not self._after_call():
                out += self._write(self.space)
            self.space = ""
            out += self._close()
        return out

    def _after_call(self) -> bool:
        return bool(self.blocks) and self.blocks[-1]["type"] == "tool_use"

    def _text(self, piece: str) -> list[dict]:
        text = self.space + piece
        body = text.rstrip()
        self.space = text[len(body):]
        if not body:
            return []
        return self._write(body.lstrip() if self._after_call() else body)

    def _write(self, text: str) -> list[dict]:
        out = []
        if not (self.open and self.blocks[-1]["type"] == "text"):
            out += self._start({"type": "text", "text": ""})
        self.blocks[-1]["text"] += text
        return out + [_delta(len(self.blocks) - 1, {"type": "text_delta", "text": text})]

    def _piece(self, piece: ToolCallDelta) -> list[dict]:
        out = []
        if piece.id is not None:  # a call's first piece: its id and name
            self.space = ""
            out += self._start({"type": "tool_use", "id": tool_use_id(piece.id), "name": piece.name, "input": {}})
            self.written[piece.index] = self.calls[piece.id] = len(self.blocks) - 1
        if piece.arguments and piece.index in self.written:
            out.append(_delta(self.written[piece.index], {"type": "input_json_delta", "partial_json": piece.arguments}))
        return out

    def _call(self, call: ToolCall) -> list[dict]:
        out = []
        index = self.calls.get(call.id) if call.streamed else None
        if index is None:  # it came whole: no piece of it went out
            self.space = ""
            out += self._start({"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": {}})
            index = len(self.blocks) - 1
            out.append(_delta(index, {"type": "input_json_delta", "partial_json": call.arguments}))
        self.blocks[index]["input"] = json.loads(call.arguments)
        if self.open and index == len(self.blocks) - 1:
            out += self._close()
        return out

    def _start(self, block: dict) -> list[dict]:
        out = self._close()
        self.blocks.append(block)
        self.open = True
        return out + [{"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": dict(block)}]

    def _close(self) -> list[dict]:
        if not self.open:
            return []
        self.open = False
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]


def _delta(index: int, delta: dict) -> dict:
    return {"type": "content_block_delta", "index": index, "delta": delta}


class MessageReply(Reply):
    """The answer in Anthropic's shape: a message of content blocks (`Blocks`), its stop
    reason and usage; streamed, `message_start` (with the first event: the usage is known
    then), the blocks' events, `message_delta` and `message_stop`."""

    def __init__(self, server, job, exchange):
        super().__init__(server, job, exchange, id=f"msg_{uuid.uuid4().hex}")
        self.content = Blocks(follow=job.stream)
        self.last_token: int | None = None  # of the last event; None: the end-of-sequence token
        self.started = False  # message_start has gone out

    def add(self, event: Event) -> list[dict]:
        """Record `event`; return its stream events."""
        super().add(event)  # text, tokens, finish, error: as chat records them (its chunks are not ours)
        if event.finish_reason == "error":
            return []
        self.last_token = event.token
        return self.content.feed(event)

    def stop(self) -> tuple[str | None, str | None]:
        """(stop_reason, stop_sequence). The engine says "stop" both for the end-of-sequence
        token (its event has no token) and for a stop string, whose string is found again
        from the reply's text and its last token (`matched_stop`)."""
        finish = self.finish[0]
        if finish in (None, "tool_calls", "length"):
            return {None: None, "tool_calls": "tool_use", "length": "max_tokens"}[finish], None
        if self.last_token is not None:
            last = self.server.ctx.tokenizer.decode([self.last_token])
            matched = matched_stop(self.job.stop, self.texts[0], last)
            if matched is not None:
                return "stop_sequence", matched
        return "end_turn", None

    def usage(self) -> dict:
        """Anthropic counts the prompt's tokens read from the cache apart from the others."""
        return {"input_tokens": len(self.job.prompt) - self.cached_tokens, "output_tokens": sum(self.tokens),
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": self.cached_tokens}

    def message(self, content: list[dict], stop: tuple[str | None, str | None]) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.job.model, "content": content,
                "stop_reason": stop[0], "stop_sequence": stop[1], "usage": self.usage()}

    def whole(self) -> dict:
        return self.message(self.content.blocks, self.stop())

    def stream_opening(self) -> list[str]:
        return []

    def stream_event(self, event: Event) -> list[str]:
        events = self.add(event)
        if self.error is not None:
            return []
        if not self.started:
            self.started = True
            events.insert(0, {"type": "message_start", "message": self.message([], (None, None))})
        return [sse(e, event=e["type"]) for e in events]

    def stream_closing(self) -> list[str]:
        reason, sequence = self.stop()
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                 "usage": self.usage()}
        return [sse(delta, event="message_delta"), sse({"type": "message_stop"}, event="message_stop")]

    def stream_failed(self, error: RequestError) -> list[str]:
        return [sse(error_body(error), event="error")]


def error_body(error: RequestError) -> dict:
    kind = ERROR_TYPES.get(error.status) or ("api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def error_response(error: RequestError) -> JSONResponse:
    """Anthropic's error shape; a 503 (busy, shutting down) says when to retry."""
    return JSONResponse(error_body(error), status_code=error.status,
                        headers={"Retry-After": "1"} if error.status == 503 else None)


ANTHROPIC_MESSAGES = Api("messages", translate, MessageReply, error_response)
