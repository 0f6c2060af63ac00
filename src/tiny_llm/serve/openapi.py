"""Engine — the server's OpenAPI 3.1 description (`GET /openapi.json`): every endpoint of
`app.create_app`, the request bodies `protocol` accepts, the answers, and OpenAI's error
object for every refusal.

The request schemas are built from protocol's own lists of fields (`CHAT`, `COMPLETION`,
`EXTENSIONS`, `IGNORED`) and limits (`ROLES`, `MAX_CHOICES`, `MAX_TOP_LOGPROBS`), and the
extension fields from `SamplingParams`' fields, their types and the bounds its checks
enforce (`PARAM_BOUNDS`). A field the server learns to take cannot be missing here: a
field without a schema is a `KeyError` when the description is built, and
tests/test_serve_fuzz.py compares the description with the app and fuzzes the server
against it.
"""

import types
import typing
from dataclasses import fields

from .. import __version__
from ..requests import MAX_STOP_STRINGS
from ..sampler import SamplingParams
from ..sampler.draw import DRAWS
from ..sampler.params import ALIASES, PRESETS, STAGES
from .protocol import (CHAT, COMPLETION, EXTENSIONS, FLOAT32_MAX, FLOAT32_TINY, FLOAT_PARAMS, IGNORED, LEGACY,
                       MAX_CHOICES, MAX_TEMPERATURE, MAX_TOP_K, MAX_TOP_LOGPROBS, ROLES)

# The bounds `SamplingParams.__post_init__` checks, field by field, in JSON Schema's words,
# and protocol's own (`MAX_TOP_K`). Every float field is also a float32 (`float32`).
PARAM_BOUNDS: dict[str, dict] = {
    "temperature": {"minimum": 0, "maximum": MAX_TEMPERATURE},
    "top_k": {"minimum": 0, "maximum": MAX_TOP_K},
    "top_p": {"minimum": 0, "maximum": 1},
    "min_p": {"minimum": 0, "maximum": 1},
    "typical_p": {"minimum": 0, "maximum": 1},
    "xtc_probability": {"minimum": 0, "maximum": 1},
    "xtc_threshold": {"minimum": 0, "maximum": 1},
    "dynatemp_range": {"minimum": 0},
    "dynatemp_exponent": {"minimum": 0},
    "repetition_penalty": {"exclusiveMinimum": 0},
    "penalty_last_n": {"minimum": -1},
    "dry_multiplier": {"minimum": 0},
    "dry_base": {"exclusiveMinimum": 1},
    "dry_allowed_length": {"minimum": 1},
    "dry_penalty_last_n": {"minimum": -1},
    "mirostat_tau": {"exclusiveMinimum": 0},
    "mirostat_eta": {"exclusiveMinimum": 0},
    "min_tokens": {"minimum": 0},
    "seed": {"minimum": 0, "maximum": 2**32 - 1},
}

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
        schema = {"type": _JSON_TYPES[named[0]], **PARAM_BOUNDS.get(name, {})}
        if name in FLOAT_PARAMS:
            schema = float32(schema)
    default = next(f.default for f in fields(SamplingParams) if f.name == name)
    described = {**schema, "description": f"SamplingParams.{name} (llama.cpp's meaning)"
                 + (f"; default {default!r}" if isinstance(default, int | float | str) else "")
                 + (f"; a float32: 0, or at least {FLOAT32_TINY!r} in magnitude" if "not" in schema else "")}
    return nullable(described)


def float32(schema: dict) -> dict:
    """`schema` (a number) narrowed to what protocol takes for the sampler's float32: at most
    FLOAT32_MAX in magnitude, and 0 or at least FLOAT32_TINY."""
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


def operation(op_id: str, summary: str, ok: dict, errors: tuple[int, ...], *, body: dict | None = None,
              auth: bool = True, security: list | None = None, parameters: list = ()) -> dict:
    """One operation: its answer, its refusals (each an `Error`; every operation may meet 405,
    500 and 503), its body and key (`auth`: the API key applies)."""
    responses = {"200": ok}
    for status in sorted({*errors, 405, 500, 503}):
        responses[str(status)] = _response(ERROR_STATUSES[status], _json(ref("Error")), retry=status == 503)
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
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "tiny-llm serve", "version": __version__,
                 "description": f"An OpenAI-compatible server of the model {model!r} "
                                f"(context {ctx.context_length or 'unbounded'} tokens, vocabulary "
                                f"{ctx.vocab_size}). Fields beyond OpenAI's are tiny-llm's sampling "
                                "extensions (llama.cpp's names) and constraints (grammar, regex, json_schema).",
                 "x-model": model},
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "the server's --api-key, if it has one"}},
            "headers": {
                "X-Request-Id": {"description": "the client's own X-Request-Id (1-128 of [A-Za-z0-9._:-]) "
                                                "or a new req-<24 hex>", "required": True,
                                 "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"}},
                "Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "string"}},
            },
        },
    }
