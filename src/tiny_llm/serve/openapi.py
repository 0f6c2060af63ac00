"""Engine — the server's OpenAPI 3.1 description (`GET /openapi.json`): every endpoint of
`app.create_app`, the request bodies `protocol` accepts (and those the Responses and the
Messages API translate for it), the answers, and the error object of each API for every
refusal.

The request schemas are built from protocol's own lists of fields (`CHAT`, `COMPLETION`,
`EXTENSIONS`, `IGNORED`) and limits (`ROLES`, `MAX_CHOICES`, `MAX_TOP_LOGPROBS`), and the
extension fields from `SamplingParams`' fields, their types and their ranges
(`sampler.params.BOUNDS`, narrowed by protocol's own `MAX_TEMPERATURE`). A field the server learns to take cannot be missing here: a
field without a schema is a `KeyError` when the description is built, and
tests/test_serve_fuzz.py compares the description with the app and fuzzes the server
against it.

It is long because it is data: three APIs' requests, answers, events and errors, one
section each (chat and completions, `responses_schemas`, `messages_schemas`); splitting it
would spread one document's shared pieces (`obj`, `ref`, `operation`) over several.

Tests: tests/test_serve_fuzz.py
"""

import types
import typing
from dataclasses import fields

from .. import __version__
from ..request import MAX_STOP_STRINGS
from ..sampler import SamplingParams
from ..sampler.draw import DRAWS
from ..sampler.params import ALIASES, BOUNDS, FLOAT32_MAX, FLOAT32_TINY, PRESETS, STAGES
from . import anthropic
from .protocol import (CHAT, COMPLETION, EXTENSIONS, IGNORED, LEGACY, MAX_CHOICES, MAX_TEMPERATURE, MAX_TOP_LOGPROBS,
                       ROLES)
from .responses import FORMAT_KEYS, ITEM_KEYS, PART_KEYS, PASSED, READ, REFUSED, TOOL_KEYS
from .responses import ROLES as RESPONSE_ROLES

# Protocol's own limits, narrower than `SamplingParams`' ranges (`BOUNDS`).
NARROWER: dict[str, dict] = {"temperature": {"maximum": MAX_TEMPERATURE}}

_JSON_TYPES = {float: "number", int: "integer", bool: "boolean", str: "string"}
ERROR_STATUSES = {400: "The request is malformed or asks for something the server does not do",
                  401: "Missing or wrong API key (`--api-key`)",
                  404: "No such model (or endpoint)",
                  405: "The path does not take this method",
                  408: "The request ran longer than `--request-timeout`",
                  413: "The request body is over the server's limit",
                  500: "The model step or the server failed for this request",
                  503: "The server is draining, has too many connections, or its queue is full"}


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: dict) -> dict:
    """`schema` or null: the server reads a null field as an absent one."""
    if set(schema) <= {"type", "minimum", "maximum", "exclusiveMinimum", "minLength", "description"} \
            and isinstance(schema.get("type"), str):
        return {**schema, "type": [schema["type"], "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def obj(properties: dict, required: tuple[str, ...] = (), *, closed: bool = False, **extra) -> dict:
    """An object schema; `closed`: no other properties."""
    schema = {"type": "object", "properties": properties, **extra}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


def integer(minimum: int | None = None, maximum: int | None = None) -> dict:
    """An integer, within [minimum, maximum] where given."""
    schema = {"type": "integer"}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


# ---- request fields ---------------------------------------------------------------------------


def param_schema(name: str, vocab_size: int) -> dict:
    """The schema of the `SamplingParams` field `name` as a request sends it (null: its default)."""
    special = {
        "mirostat": {"enum": [0, 1, 2]},
        "draw": {"enum": list(DRAWS)},
        "logit_bias": logit_bias_schema(vocab_size),
        "dry_sequence_breakers": {"type": "array", "items": {"anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "items": integer(0, vocab_size - 1)}]}},
    }
    if name in special:
        schema = special[name]
    else:
        annotation = next(f.type for f in fields(SamplingParams) if f.name == name)
        args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
        named = [a for a in args if a is not type(None)]
        if len(named) != 1 or named[0] not in _JSON_TYPES:
            raise TypeError(f"SamplingParams.{name} ({annotation}) has no JSON schema: add it to param_schema")
        schema = bound_schema(name) if name in BOUNDS else {"type": _JSON_TYPES[named[0]]}
    default = next(f.default for f in fields(SamplingParams) if f.name == name)
    described = {**schema, "description": f"SamplingParams.{name} (llama.cpp's meaning)"
                 + (f"; default {default!r}" if isinstance(default, int | float | str) else "")
                 + (f"; a float32: 0, or at least {FLOAT32_TINY!r} in magnitude" if "not" in schema else "")}
    return nullable(described)


def bound_schema(name: str) -> dict:
    """The range of the `SamplingParams` field `name` (`BOUNDS`) in JSON Schema's words, with
    protocol's narrower limits (`NARROWER`); a number that is not an integer is a float32."""
    bound = BOUNDS[name]
    schema = {"type": "integer" if bound.integer else "number"}
    if bound.minimum is not None:
        schema["exclusiveMinimum" if bound.above else "minimum"] = bound.minimum
    if bound.maximum is not None:
        schema["maximum"] = bound.maximum
    schema.update(NARROWER.get(name, {}))
    return schema if bound.integer else float32(schema)


def float32(schema: dict) -> dict:
    """`schema` (a number) narrowed to a float32, as `SamplingParams` takes the sampler's
    numbers: at most FLOAT32_MAX in magnitude, and 0 or at least FLOAT32_TINY."""
    out = dict(schema)
    if out.get("exclusiveMinimum") == 0:  # above 0: the smallest float32 is the least value
        del out["exclusiveMinimum"]
        out["minimum"] = FLOAT32_TINY
    if "exclusiveMinimum" not in out:
        out["minimum"] = max(out.get("minimum", -FLOAT32_MAX), -FLOAT32_MAX)
    out["maximum"] = min(out.get("maximum", FLOAT32_MAX), FLOAT32_MAX)
    if out.get("minimum", FLOAT32_TINY) < FLOAT32_TINY:  # the numbers between 0 and the smallest float32
        out["not"] = {"exclusiveMinimum": -FLOAT32_TINY, "exclusiveMaximum": FLOAT32_TINY, "not": {"const": 0}}
    return out


def logit_bias_schema(vocab_size: int) -> dict:
    """OpenAI's logit_bias: token ids (as JSON keys) to a bias in [-100, 100]."""
    return {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
            "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
            "description": f"token id (below {vocab_size}) to a bias added to its logit; -100 bans the token"}


def order_schema() -> dict:
    """`samplers` / `order`: a preset, or stage names (`sampler.params`' names and aliases)."""
    names = sorted({*STAGES, *ALIASES})
    return nullable({"anyOf": [
        {"type": "string", "description": f"a preset ({', '.join(PRESETS)}) or stage names separated by ';'"},
        {"type": "array", "items": {"enum": names}, "description": "stage names, each once, in the order they run"},
    ], "description": "the order of the sampling stages (`samplers` and `order` are one field; send one)"})


def message_schemas() -> dict:
    """The chat message shapes: an assistant message may carry calls; the others text."""
    content = {"anyOf": [{"type": "string"}, {"type": "null"},
                         {"type": "array", "items": ref("TextPart")}]}
    call = obj({"id": {}, "type": {}, "function": obj({"name": {"type": "string"}, "arguments": {}}, ("name",))},
               ("function",))
    return {
        "TextPart": obj({"type": {"const": "text"}, "text": {"type": "string"}}, ("type", "text")),
        # Its calls: `tool_calls`, or else the deprecated `function_call` (read only without them).
        "AssistantMessage": obj({"role": {"const": "assistant"}, "content": content, "name": {}}, ("role",), anyOf=[
            obj({"tool_calls": {"type": "array", "items": call}}, ("tool_calls",)),
            obj({"tool_calls": {"type": "null"},
                 "function_call": nullable(obj({"name": {"type": "string"}, "arguments": {}}, ("name",)))}),
        ]),
        "Message": obj({"role": {"enum": [r for r in ROLES if r != "assistant"]}, "content": content,
                        "name": {}, "tool_call_id": {}}, ("role",)),
        "Messages": {"type": "array", "minItems": 1,
                     "items": {"anyOf": [ref("Message"), ref("AssistantMessage")]}},
    }


def tool_schemas() -> dict:
    """Tools and the choice among them, in the current and the deprecated spelling."""
    function = obj({"name": {"type": "string", "minLength": 1, "maxLength": 64}, "description": {},
                    "parameters": {"type": "object", "description": "a JSON schema of the arguments"}},
                   ("name",))
    named = obj({"name": {"type": "string"}}, ("name",))
    return {
        "Function": function,
        "Tool": obj({"type": {"const": "function"}, "function": ref("Function")}, ("type", "function")),
        "Tools": {"type": "array", "minItems": 1, "items": ref("Tool"),
                  "description": "function definitions; names unique"},
        "ToolChoice": {"anyOf": [{"enum": ["none", "auto", "required"]},
                                 obj({"type": {"const": "function"}, "function": named}, ("type", "function"))]},
        "Functions": {"type": "array", "minItems": 1, "items": ref("Function"),
                      "description": "deprecated spelling of tools"},
        "FunctionCall": {"anyOf": [{"enum": ["none", "auto"]}, named],
                         "description": "deprecated spelling of tool_choice"},
    }


def request_fields(kind: str, ctx) -> dict:
    """The schema of every field a request of `kind` ("chat" or "completion") may send, by name."""
    max_tokens = nullable(integer(1, ctx.context_length - 1 if ctx.context_length else None))
    token = integer(0, ctx.vocab_size - 1)
    text = nullable({"type": "string"})
    out = {
        "model": {"enum": [*ctx.model_ids, None], "description": "the served model (optional)"},
        "max_tokens": max_tokens,
        "max_completion_tokens": {**max_tokens, "description": "max_tokens' newer name (chat)"},
        "n": nullable(integer(1, MAX_CHOICES)),
        "stop": nullable({"anyOf": [{"type": "string", "minLength": 1},
                                    {"type": "array", "maxItems": MAX_STOP_STRINGS,
                                     "items": {"type": "string", "minLength": 1}}]}),
        "stream": nullable({"type": "boolean"}),
        "stream_options": nullable(obj({"include_usage": nullable({"type": "boolean"})},
                                       description="only with stream: true")),
        "samplers": order_schema(),
        "order": order_schema(),
        "grammar": {**text, "description": "GBNF text the reply follows"},
        "regex": {**text, "description": "a regular expression the reply matches"},
        "json_schema": nullable({"type": ["object", "boolean", "string"],
                                 "description": "a JSON schema the reply is valid under (or its JSON text)"}),
        "response_format": nullable({"anyOf": [
            obj({"type": {"enum": ["text", "json_object"]}}, ("type",)),
            obj({"type": {"const": "json_schema"}, "json_schema": obj(
                {"name": {}, "schema": {"type": ["object", "boolean"]}, "strict": {}})}, ("type", "json_schema")),
        ]}),
        "messages": ref("Messages"),
        "logprobs": nullable({"type": "boolean", "description": "log-probabilities of the tokens"}
                             if kind == "chat" else {**integer(0, MAX_TOP_LOGPROBS),
                                                     "description": "how many top log-probabilities"}),
        "top_logprobs": nullable(integer(0, MAX_TOP_LOGPROBS)),
        "tools": nullable(ref("Tools")),
        "tool_choice": nullable(ref("ToolChoice")),
        "functions": nullable(ref("Functions")),
        "function_call": nullable(ref("FunctionCall")),
        "prompt": {"anyOf": [{"type": "string", "minLength": 1},
                             {"type": "array", "minItems": 1, "items": token},
                             {"type": "array", "minItems": 1, "maxItems": 1,
                              "items": {"anyOf": [{"type": "string", "minLength": 1},
                                                  {"type": "array", "minItems": 1, "items": token}]}}],
                   "description": "text, token ids, or a list of one of them"},
        "echo": {"enum": [False, None], "description": "not supported: only its default"},
        "suffix": {"type": "null", "description": "not supported: only its default"},
        "best_of": {"enum": [1, None], "description": "not supported: only its default"},
    }
    for name in EXTENSIONS:
        out[name] = param_schema(name, ctx.vocab_size)
    for name in IGNORED - {"stream_options"}:
        out[name] = {"description": "accepted and ignored (OpenAI field without effect here)"}
    return out


def request_schema(kind: str, ctx) -> dict:
    """The body of a chat (`kind` "chat") or completion request: exactly the fields protocol takes."""
    every = request_fields(kind, ctx)
    names = (CHAT if kind == "chat" else COMPLETION) | EXTENSIONS | IGNORED
    properties = {name: every[name] for name in sorted(names)}
    required = ("messages",) if kind == "chat" else ("prompt",)
    # Fields that need another: stream_options (an object) needs stream: true, and the chat's
    # top_logprobs needs logprobs: true.
    needs = [({"stream_options": {"type": "object"}}, {"stream": {"const": True}})]
    if kind == "chat":
        needs.append(({"top_logprobs": {"type": "integer"}}, {"logprobs": {"const": True}}))
    return obj(properties, required, closed=True, allOf=[
        {"if": obj(given, tuple(given)), "then": obj(needed, tuple(needed))} for given, needed in needs])


# ---- answers ----------------------------------------------------------------------------------


def response_schemas() -> dict:
    """The answers' shapes, as app.py's `Reply` and handlers build them, and the error object."""
    number, string, count = {"type": "number"}, {"type": "string"}, integer(0)
    call = obj({"id": string, "type": {"const": "function"},
                "function": obj({"name": string, "arguments": string}, ("name", "arguments"))},
               ("id", "type", "function"))
    legacy_call = obj({"name": string, "arguments": string}, ("name", "arguments"))
    top = obj({"token": string, "logprob": number, "bytes": {"type": "array", "items": integer(0, 255)}},
              ("token", "logprob", "bytes"))
    chat_logprobs = nullable(obj({"content": {"type": "array", "items": obj(
        {**top["properties"], "top_logprobs": {"type": "array", "items": top}},
        ("token", "logprob", "bytes", "top_logprobs"))}}, ("content",)))
    completion_logprobs = nullable(obj({
        "tokens": {"type": "array", "items": string}, "token_logprobs": {"type": "array", "items": number},
        "top_logprobs": {"type": "array", "items": {"type": "object", "additionalProperties": number}},
        "text_offset": {"type": "array", "items": count}}, ("tokens", "token_logprobs", "top_logprobs", "text_offset")))
    chat_finish = {"enum": ["stop", "length", "tool_calls", "function_call"]}
    text_finish = {"enum": ["stop", "length"]}
    head = {"id": string, "created": integer(0), "model": string}

    def answer(kind: str, choice: dict, chunk: bool) -> dict:
        """A whole answer (with its usage) or a stream's chunk (usage: null, or the last chunk's
        with stream_options.include_usage)."""
        usage = nullable(ref("Usage")) if chunk else ref("Usage")
        return obj({**head, "object": {"const": kind}, "choices": {"type": "array", "items": choice},
                    "usage": usage}, ("id", "object", "created", "model", "choices", *(() if chunk else ("usage",))))

    return {
        "Error": obj({"error": obj({"message": string, "type": string, "param": nullable(string),
                                    "code": nullable(string)}, ("message", "type", "param", "code"), closed=True)},
                     ("error",), closed=True),
        "Usage": obj({"prompt_tokens": count, "completion_tokens": count, "total_tokens": count,
                      "prompt_tokens_details": obj({"cached_tokens": count}, ("cached_tokens",))},
                     ("prompt_tokens", "completion_tokens", "total_tokens")),
        "ChatCompletion": answer("chat.completion", obj({
            "index": count, "logprobs": chat_logprobs, "finish_reason": chat_finish,
            "message": obj({"role": {"const": "assistant"}, "content": nullable(string),
                            "tool_calls": {"type": "array", "items": call}, "function_call": legacy_call},
                           ("role", "content"))}, ("index", "message", "logprobs", "finish_reason")), chunk=False),
        "ChatCompletionChunk": answer("chat.completion.chunk", obj({
            "index": count, "logprobs": chat_logprobs, "finish_reason": nullable(chat_finish),
            "delta": obj({"role": {"const": "assistant"}, "content": string,
                          "tool_calls": {"type": "array", "items": obj({"index": count, **call["properties"]},
                                                                         ("index", *call["required"]))},
                          "function_call": legacy_call})}, ("index", "delta", "logprobs", "finish_reason")),
            chunk=True),
        "Completion": answer("text_completion", obj({
            "index": count, "text": string, "logprobs": completion_logprobs, "finish_reason": text_finish},
            ("index", "text", "logprobs", "finish_reason")), chunk=False),
        "CompletionChunk": answer("text_completion", obj({
            "index": count, "text": string, "logprobs": completion_logprobs, "finish_reason": nullable(text_finish)},
            ("index", "text", "logprobs", "finish_reason")), chunk=True),
        "Model": obj({"id": string, "object": {"const": "model"}, "created": integer(0), "owned_by": string,
                      "max_model_len": nullable(integer(1))}, ("id", "object", "created", "owned_by")),
        "ModelList": obj({"object": {"const": "list"}, "data": {"type": "array", "items": ref("Model")}},
                         ("object", "data")),
        "Tokenized": obj({"tokens": {"type": "array", "items": count}, "count": count,
                          "max_model_len": nullable(integer(1))}, ("tokens", "count", "max_model_len")),
        "Detokenized": obj({"prompt": string}, ("prompt",)),
        "Health": obj({"status": {"enum": ["ok", "draining", "dead", "stuck"]}, "engine": obj({
            "alive": {"type": "boolean"}, "step_seconds": {"type": "number", "minimum": 0,
                                                           "description": "time in the current step; 0 when idle"},
            "failures": count, "running": count, "queued": count},
            ("alive", "step_seconds", "failures", "running", "queued"))}, ("status", "engine")),
    }


def responses_schemas(ctx, chat: dict) -> dict:
    """The Responses API's request (exactly the fields `responses.translate` reads: `READ`,
    `PASSED` as chat takes them, and `REFUSED` at the values that ask for nothing), its
    response object, input token count and stream events (`responses.py`)."""
    string, anything, flag = {"type": "string"}, {}, nullable({"type": "boolean"})

    def closed(keys, required: tuple[str, ...], **known) -> dict:
        """An object of exactly `keys` (responses.py's lists), those not in `known` of any value."""
        return obj({key: known.get(key, anything) for key in sorted(keys)}, required, closed=True)

    parts = [closed(PART_KEYS[kind], ("type", "text"), type={"const": kind}, text=string) for kind in PART_KEYS]
    content = {"anyOf": [string, {"type": "array", "items": {"anyOf": parts}}]}
    items = [closed(ITEM_KEYS["message"], ("role", "content"), type={"const": "message"}, content=content,
                    role={"enum": list(RESPONSE_ROLES)}),
             closed(ITEM_KEYS["function_call"], ("type", "call_id", "name", "arguments"),
                    type={"const": "function_call"}, call_id=string, name=string, arguments=string),
             closed(ITEM_KEYS["function_call_output"], ("type", "call_id", "output"),
                    type={"const": "function_call_output"}, call_id=string, output=content)]
    tool = closed(TOOL_KEYS, ("type", "name"), type={"const": "function"}, strict=flag,
                  name={"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                  parameters=nullable({"type": "object"}))
    formats = {"anyOf": [closed(FORMAT_KEYS["text"], ("type",), type={"enum": ["text", "json_object"]}),
                         closed(FORMAT_KEYS["json_schema"], ("type", "schema"), type={"const": "json_schema"},
                                schema={"type": "object"})]}
    refused = {"reasoning": {"type": "null"}, "include": nullable({"type": "array", "maxItems": 0}),
               "background": {"enum": [False, None]}, "conversation": {"type": "null"}, "prompt": {"type": "null"},
               "truncation": {"enum": ["disabled", None]}, "top_logprobs": {"enum": [0, None]},
               "max_tool_calls": {"type": "null"}, "context_management": {"type": "null"},
               "prompt_cache_retention": {"enum": ["in_memory", None]}}
    ignored = {"description": "accepted and ignored (OpenAI field without effect here)"}
    fields = {
        **{name: chat[name] for name in PASSED | {"model", "stream"}},
        **{name: {**schema, "description": f"not supported: {REFUSED[name][1].split(': ', 1)[1]}"}
           for name, schema in refused.items()},
        "input": {"anyOf": [string, {"type": "array", "minItems": 1, "items": {"anyOf": items}}]},
        "instructions": nullable(string), "previous_response_id": nullable(string), "user": nullable(string),
        "tools": nullable({"type": "array", "items": tool}),
        "tool_choice": nullable({"anyOf": [{"enum": ["none", "auto", "required"]},
                                           obj({"type": {"const": "function"}, "name": string}, ("type", "name"),
                                               closed=True)]}),
        "text": nullable(obj({"format": nullable(formats), "verbosity": {"type": "null"}}, closed=True)),
        "max_output_tokens": chat["max_tokens"],
        "stream_options": nullable(obj({"include_obfuscation": {"enum": [False, None]}}, closed=True,
                                       description="only with stream: true")),
        "store": flag, "parallel_tool_calls": flag, "metadata": nullable({"type": "object"}),
        "service_tier": ignored, "prompt_cache_key": ignored, "safety_identifier": ignored,
    }
    names = sorted(READ | PASSED | set(REFUSED))  # a field without a schema here is a KeyError
    request = obj({name: fields[name] for name in names}, ("input",), closed=True, allOf=[
        {"if": obj({"stream_options": {"type": "object"}}, ("stream_options",)),
         "then": obj({"stream": {"const": True}}, ("stream",))}])

    count = integer(0)
    output = {"anyOf": [
        obj({"id": string, "type": {"const": "message"}, "role": {"const": "assistant"},
             "status": {"enum": ["in_progress", "completed", "incomplete"]},
             "content": {"type": "array", "items": obj({"type": {"const": "output_text"}, "text": string,
                                                        "annotations": {"type": "array"}},
                                                       ("type", "text", "annotations"))}},
            ("id", "type", "role", "status", "content")),
        obj({"id": string, "type": {"const": "function_call"}, "call_id": string, "name": string, "arguments": string,
             "status": {"enum": ["in_progress", "completed", "incomplete"]}},
            ("id", "type", "call_id", "name", "arguments", "status"))]}
    usage = obj({"input_tokens": count, "output_tokens": count, "total_tokens": count,
                 "input_tokens_details": obj({"cached_tokens": count, "cache_write_tokens": count},
                                             ("cached_tokens", "cache_write_tokens")),
                 "output_tokens_details": obj({"reasoning_tokens": count}, ("reasoning_tokens",))},
                ("input_tokens", "output_tokens", "total_tokens", "input_tokens_details", "output_tokens_details"))
    response = obj({"id": string, "object": {"const": "response"}, "created_at": integer(0),
                    "status": {"enum": ["in_progress", "completed", "incomplete", "failed"]},
                    "model": string, "output": {"type": "array", "items": output}, "usage": nullable(usage),
                    "error": nullable(obj({"code": string, "message": string}, ("code", "message"))),
                    "incomplete_details": nullable(obj({"reason": string}, ("reason",))),
                    "tools": {"type": "array"}, "parallel_tool_calls": {"type": "boolean"}, "tool_choice": anything},
                   ("id", "object", "created_at", "status", "model", "output", "tools", "tool_choice",
                    "parallel_tool_calls"))
    return {
        "ResponseRequest": request,
        "Response": response,
        "ResponseEvent": obj({"type": string, "sequence_number": count}, ("type", "sequence_number")),
        "ResponseInputTokens": obj({"object": {"const": "response.input_tokens"}, "input_tokens": count},
                                   ("object", "input_tokens"), closed=True),
        "ResponseDeleted": obj({"id": string, "object": {"const": "response.deleted"}, "deleted": {"const": True}},
                               ("id", "object", "deleted"), closed=True),
    }


def responses_paths(generation: tuple[int, ...], security: list) -> dict:
    """`/v1/responses` and its stored responses (app.py's routes of `responses.py`)."""
    events = obj({"event": {"type": "string"}, "data": {
        "type": "string", "contentMediaType": "application/json", "contentSchema": ref("ResponseEvent")}},
        ("event", "data"), description="Server-Sent Events: `event: <type>` and `data: <event>`, numbered from 0 "
                                       "by sequence_number; no [DONE]")
    response_id = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"},
                    "example": "resp_0"}]
    return {
        "/v1/responses": {"post": operation(
            "createResponse", "A response (OpenAI's Responses API)", _response(
                "The response (with stream: true, its events)",
                {**_json(ref("Response")), "text/event-stream": {"schema": events}}),
            generation, body=ref("ResponseRequest"), security=security)},
        "/v1/responses/input_tokens": {"post": operation(
            "countResponseInputTokens", "The input tokens of a Responses request, nothing generated",
            _response("The count", _json(ref("ResponseInputTokens"))), (400, 401, 404, 413),
            body=ref("ResponseRequest"), security=security)},
        "/v1/responses/{response_id}": {
            "get": operation("retrieveResponse", "A stored response", _response("The response", _json(
                ref("Response"))), (401, 404), security=security, parameters=response_id),
            "delete": operation("deleteResponse", "Forget a stored response", _response("Deleted", _json(
                ref("ResponseDeleted"))), (401, 404), security=security, parameters=response_id)},
    }


def messages_schemas(chat: dict) -> dict:
    """Anthropic's Messages API (`anthropic.py`): the request of exactly the fields
    `anthropic.chat_body` reads (`MESSAGES`; count_tokens: `PROMPT`), those of `PASSED` as
    chat takes them and `REFUSED` at null; the message, its stream events, the count and
    Anthropic's error object."""
    string, anything, flag, count = {"type": "string"}, {}, nullable({"type": "boolean"}), integer(0)

    def checked(keys, required: tuple[str, ...], **known) -> dict:
        """An object as `anthropic._object` reads it: `keys`, those not in `known` of any
        value, and any other key only at null (a key set to null is as absent)."""
        return obj({key: known.get(key, anything) for key in sorted(keys)}, required,
                   additionalProperties={"type": "null"})

    # anthropic.py names the keys of a text block and a tool (TEXT_KEYS, TOOL_KEYS); those of
    # the other objects are spelled out in its checks, and here again.
    blocks = {
        "text": checked(anthropic.TEXT_KEYS, ("type", "text"), type={"const": "text"}, text=string),
        "tool_use": checked({"type", "id", "name", "input", "cache_control"}, ("type", "id", "name", "input"),
                            type={"const": "tool_use"}, id=string, name=string, input={"type": "object"}),
    }

    def content(place: str) -> dict:
        """What `anthropic._content` takes in `place`: text, or a list of its kinds of block."""
        return {"anyOf": [string, {"type": "array", "items": {"anyOf": [blocks[k] for k in anthropic.KINDS[place]]}}]}

    blocks["tool_result"] = checked({"type", "tool_use_id", "content", "is_error", "cache_control"},
                                    ("type", "tool_use_id"), type={"const": "tool_result"}, tool_use_id=string,
                                    content=nullable(content("tool_result")), is_error=flag)
    messages = {"type": "array", "minItems": 1, "items": {"anyOf": [
        checked({"role", "content"}, ("role", "content"), role={"const": role}, content=content(role))
        for role in anthropic.ROLES]}}
    tool = checked(anthropic.TOOL_KEYS, ("name", "input_schema"), type={"enum": ["custom", None]},
                   name={"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"}, description=nullable(string),
                   input_schema={"type": "object", "description": "a JSON schema of the input"}, strict=flag)
    choice_keys = {"type", "name", "disable_parallel_tool_use"}
    tool_choice = {"anyOf": [
        checked(choice_keys, ("type",), type={"enum": ["auto", "any", "none"]}, name={"type": "null"},
                disable_parallel_tool_use=flag),
        checked(choice_keys, ("type", "name"), type={"const": "tool"}, name={"type": "string", "description": (
            "one of the tools' names")}, disable_parallel_tool_use=flag)]}
    temperature = float32({"type": "number", "minimum": 0, "maximum": anthropic.MAX_TEMPERATURE})
    fields = {
        **{name: chat[name] for name in anthropic.PASSED | {"model", "stream"}},
        **{name: {"type": "null", "description": f"not supported: {why}"} for name, why in anthropic.REFUSED.items()},
        "max_tokens": {**chat["max_tokens"], "type": "integer", "description": "required: the reply's most tokens"},
        "temperature": nullable({**temperature, "description": "0 to 1 (Anthropic's range)"}),
        "messages": messages,
        "system": nullable(content("system")),
        "tools": nullable({"type": "array", "items": tool, "description": "names unique"}),
        "tool_choice": nullable(tool_choice),
        "stop_sequences": nullable({"type": "array", "maxItems": MAX_STOP_STRINGS,
                                    "items": {"type": "string", "minLength": 1}}),
        "metadata": nullable(checked({"user_id"}, ())),
        "thinking": nullable(obj({"type": {"const": "disabled"}}, ("type",), closed=True,
                                 description="not supported but for its default: the model does not think")),
        "output_config": nullable(obj({"effort": {"type": "null"}, "format": {"type": "null"}},
                                      additionalProperties={"type": "null"},
                                      description="not supported: effort sets thinking; send a schema as "
                                                  "json_schema")),
        "speed": {"enum": ["standard", None], "description": "one speed"},
        "service_tier": {"enum": ["auto", "standard_only", None], "description": "one tier"},
        "cache_control": {"description": "accepted and ignored: the prefix cache needs no marks"},
    }

    def kind(*kinds: str) -> dict:  # a tool_choice of one of `kinds`
        return obj({"tool_choice": obj({"type": {"enum": list(kinds)}}, ("type",))}, ("tool_choice",))

    # Fields that need another: a tool_choice other than none needs tools, a strict tool a
    # forced call, and disable_parallel_tool_use (auto) one stop string of its own.
    strict = obj({"tools": {"type": "array", "contains": obj({"strict": {"const": True}}, ("strict",))}}, ("tools",))
    needs = [{"if": kind("auto", "any", "tool"), "then": obj({"tools": {"type": "array", "minItems": 1}}, ("tools",))},
             {"if": strict, "then": kind("any", "tool")}]
    parallel = obj({"tool_choice": obj({"type": {"const": "auto"}, "disable_parallel_tool_use": {"const": True}},
                                       ("type", "disable_parallel_tool_use"))}, ("tool_choice",))
    one_call = {"if": parallel, "then": obj({"stop_sequences": {"maxItems": MAX_STOP_STRINGS - 1}})}

    def request(names, required: tuple[str, ...], conditions: list) -> dict:
        names = sorted(names | set(anthropic.REFUSED))  # a field without a schema here is a KeyError
        return obj({name: fields[name] for name in names}, required, closed=True, allOf=conditions)

    usage = obj({"input_tokens": count, "output_tokens": count, "cache_creation_input_tokens": count,
                 "cache_read_input_tokens": count},
                ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"),
                closed=True)
    stop = {"stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use", None]},
            "stop_sequence": nullable(string)}
    text = obj({"type": {"const": "text"}, "text": string}, ("type", "text"), closed=True)
    call = obj({"type": {"const": "tool_use"}, "id": {"type": "string", "pattern": "^toolu_"}, "name": string,
                "input": {"type": "object"}}, ("type", "id", "name", "input"), closed=True)
    index = {"index": count}
    events = {
        "message_start": {"message": ref("AnthropicMessage")},
        "content_block_start": {**index, "content_block": {"anyOf": [text, call]}},
        "content_block_delta": {**index, "delta": {"anyOf": [
            obj({"type": {"const": "text_delta"}, "text": string}, ("type", "text"), closed=True),
            obj({"type": {"const": "input_json_delta"}, "partial_json": string}, ("type", "partial_json"),
                closed=True)]}},
        "content_block_stop": index,
        "message_delta": {"delta": obj(stop, tuple(stop), closed=True), "usage": usage},
        "message_stop": {},
    }
    return {
        "MessagesRequest": request(anthropic.MESSAGES, ("messages", "max_tokens"), [*needs, one_call]),
        "MessageTokensRequest": request(anthropic.PROMPT, ("messages",), needs),
        "AnthropicMessage": obj({"id": {"type": "string", "pattern": "^msg_"}, "type": {"const": "message"},
                                 "role": {"const": "assistant"}, "model": string,
                                 "content": {"type": "array", "items": {"anyOf": [text, call]}}, **stop,
                                 "usage": usage},
                                ("id", "type", "role", "model", "content", *stop, "usage"), closed=True),
        "MessageEvent": {"anyOf": [
            *(obj({"type": {"const": name}, **body}, ("type", *body), closed=True) for name, body in events.items()),
            ref("AnthropicError")], "description": "a stream's event; an error ends it"},
        "MessageTokens": obj({"input_tokens": count}, ("input_tokens",), closed=True),
        "AnthropicError": obj({"type": {"const": "error"}, "error": obj(
            {"type": {"enum": sorted({*anthropic.ERROR_TYPES.values(), "invalid_request_error", "api_error"})},
             "message": string}, ("type", "message"), closed=True)}, ("type", "error"), closed=True),
    }


def messages_paths(generation: tuple[int, ...], security: list) -> dict:
    """`/v1/messages` and `/v1/messages/count_tokens` (app.py's routes of `anthropic.py`):
    refusals in Anthropic's shape, the key also as Anthropic's clients send it (`x-api-key`)."""
    events = obj({"event": {"type": "string", "description": "the type of its data"}, "data": {
        "type": "string", "contentMediaType": "application/json", "contentSchema": ref("MessageEvent")}},
        ("event", "data"), description="Server-Sent Events: `event: <type>` and `data: <event>` of that type; "
                                       "no [DONE]")
    security = [*security, {"x-api-key": []}]
    return {
        "/v1/messages": {"post": operation(
            "createMessage", "A message (Anthropic's Messages API)", _response(
                "The message (with stream: true, its events)",
                {**_json(ref("AnthropicMessage")), "text/event-stream": {"schema": events}}),
            generation, body=ref("MessagesRequest"), security=security, error="AnthropicError")},
        "/v1/messages/count_tokens": {"post": operation(
            "countMessageTokens", "The input tokens of a Messages request, nothing generated",
            _response("The count", _json(ref("MessageTokens"))), (400, 401, 404, 413),
            body=ref("MessageTokensRequest"), security=security, error="AnthropicError")},
    }


# ---- operations -------------------------------------------------------------------------------


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _response(description: str, content: dict | None = None, *, retry: bool = False) -> dict:
    headers = {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}}
    if retry:
        headers["Retry-After"] = {"$ref": "#/components/headers/Retry-After"}
    out = {"description": description, "headers": headers}
    if content is not None:
        out["content"] = content
    return out


def refusal(error: str, status: int) -> dict:
    """The schema of a refusal of `status` by an operation whose API answers with `error`
    (the name of its error schema). A 405 comes from the router, before any route, and a
    503 may come from the middleware (guard.py: draining, too many connections) before it:
    those are OpenAI's `Error` whatever the API."""
    if status == 405 or error == "Error":
        return ref("Error")
    return {"anyOf": [ref(error), ref("Error")]} if status == 503 else ref(error)


def operation(op_id: str, summary: str, ok: dict, errors: tuple[int, ...], *, body: dict | None = None,
              auth: bool = True, security: list | None = None, parameters: list = (), error: str = "Error") -> dict:
    """One operation: its answer, its refusals (each an `error`, `refusal`'s; every operation
    may meet 405, 500 and 503), its body and key (`auth`: the API key applies)."""
    responses = {"200": ok}
    for status in sorted({*errors, 405, 500, 503}):
        responses[str(status)] = _response(ERROR_STATUSES[status], _json(refusal(error, status)), retry=status == 503)
    out = {"operationId": op_id, "summary": summary, "responses": responses}
    if parameters:
        out["parameters"] = list(parameters)
    if body is not None:
        out["requestBody"] = {"required": True, "content": _json(body)}
    out["security"] = security if auth else []
    return out


def event(chunk: str) -> dict:
    """One Server-Sent Event of a stream (under OpenAPI 3.1 the schema of a text/event-stream
    is that of each event, as `itemSchema` is in 3.2): its `data` is a chunk, an Error object
    when the request fails midway, or the closing `[DONE]`."""
    payload = {"type": "string", "contentMediaType": "application/json",
               "contentSchema": {"anyOf": [ref(chunk), ref("Error")]}}
    return obj({"data": {"anyOf": [{"const": "[DONE]"}, payload]}, "event": {"type": "string"},
                "id": {"type": "string"}, "retry": {"type": "integer"}}, ("data",),
               description="Server-Sent Events: `data: <chunk>` per event, then `data: [DONE]`")


def describe(server) -> dict:
    """The OpenAPI 3.1 description of `server` (an `app.Server`): its model, its key, its endpoints."""
    ctx = server.ctx
    model = ctx.model_ids[0]
    security = [{"bearer": []}] if server.api_key is not None else [{}, {"bearer": []}]
    generation = (400, 401, 404, 408, 413)
    body_errors = (400, 401, 408, 413)

    def generate(op_id, summary, request, answer, chunk):
        ok = _response(f"{answer} (with stream: true, {chunk} events)",
                       {**_json(ref(answer)), "text/event-stream": {"schema": event(chunk)}})
        return {"post": operation(op_id, summary, ok, generation, body=ref(request), security=security)}

    paths = {
        "/": {"get": operation("page", "The chat page (HTML)", _response(
            "The chat page", {"text/html": {"schema": {"type": "string"}}}), (), auth=False)},
        "/health": {"get": operation("health", "Whether the server takes requests", _response(
            "Serving", _json(ref("Health"))), (), auth=False)},
        "/metrics": {"get": operation("metrics", "Prometheus metrics", _response(
            "The metrics in Prometheus' text format", {"text/plain": {"schema": {"type": "string"}}}), (),
            auth=False)},
        "/openapi.json": {"get": operation("openapi", "This description", _response(
            "The OpenAPI description", _json({"type": "object"})), (), auth=False)},
        "/v1/models": {"get": operation("listModels", "The served model", _response(
            "The model list", _json(ref("ModelList"))), (401,), security=security)},
        "/v1/models/{model}": {"get": operation(
            "retrieveModel", "One model by name", _response("The model", _json(ref("Model"))), (401, 404),
            security=security, parameters=[{"name": "model", "in": "path", "required": True,
                                            "schema": {"type": "string"}, "example": model}])},
        "/v1/chat/completions": generate("createChatCompletion", "A chat reply", "ChatRequest", "ChatCompletion",
                                         "ChatCompletionChunk"),
        "/v1/completions": generate("createCompletion", "A text completion", "CompletionRequest", "Completion",
                                    "CompletionChunk"),
        "/tokenize": {"post": operation("tokenize", "A prompt's token ids", _response(
            "The tokens", _json(ref("Tokenized"))), body_errors, body=ref("TokenizeRequest"), security=security)},
        "/detokenize": {"post": operation("detokenize", "The text of token ids", _response(
            "The text", _json(ref("Detokenized"))), body_errors, body=ref("DetokenizeRequest"), security=security)},
    }
    paths.update(responses_paths(generation, security))
    paths.update(messages_paths(generation, security))
    # /health answers 503 with the same body while it drains or its engine is dead or stuck.
    paths["/health"]["get"]["responses"]["503"] = _response(
        "Draining, or the engine thread is dead or stuck", _json(ref("Health")))

    chat = request_fields("chat", ctx)
    tool_fields = {name: chat[name] for name in ("tools", "tool_choice", *LEGACY)}
    schemas = {
        "ChatRequest": request_schema("chat", ctx),
        "CompletionRequest": request_schema("completion", ctx),
        "TokenizeRequest": {"anyOf": [
            obj({"messages": ref("Messages"), **tool_fields}, ("messages",),
                description="the chat prompt of these messages (and tools)"),
            obj({"prompt": {"type": "string"}}, ("prompt",), **{"not": {"required": ["messages"]}},
                description="text"),
        ]},
        "DetokenizeRequest": obj({"tokens": {"type": "array", "items": integer(0, ctx.vocab_size - 1)}},
                                 ("tokens",)),
        **message_schemas(),
        **tool_schemas(),
        **response_schemas(),
        **responses_schemas(ctx, chat),
        **messages_schemas(chat),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "tiny-llm serve", "version": __version__,
                 "description": f"An OpenAI-compatible server of the model {model!r} "
                                f"(context {ctx.context_length or 'unbounded'} tokens, vocabulary "
                                f"{ctx.vocab_size}), with Anthropic's Messages API too. Fields beyond "
                                "OpenAI's (and Anthropic's) are tiny-llm's sampling extensions (llama.cpp's "
                                "names) and constraints (grammar, regex, json_schema).",
                 "x-model": model},
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "the server's --api-key, if it has one"},
                                "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key",
                                              "description": "the same key as Anthropic's clients send it"}},
            "headers": {
                "X-Request-Id": {"description": "the client's own X-Request-Id (1-128 of [A-Za-z0-9._:-]) "
                                                "or a new req-<24 hex>", "required": True,
                                 "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"}},
                "Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "string"}},
            },
        },
    }
