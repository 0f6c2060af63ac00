"""Engine — the server's requests: OpenAI request bodies checked and turned into a `Job`
(token ids, one `SamplingParams` per choice, stop strings, tools), without touching MLX.

Every mistake is a `RequestError` that names the field: the HTTP layer answers it with
OpenAI's error shape and status 400 (404 for an unknown model).

Tests: tests/test_cli.py, tests/test_serve_agents.py, tests/test_serve_engine.py
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from ..defaults import MAX_TOKENS
from ..request import FieldError, GrammarCache, build_request, check_max_tokens, compile_constraint, seeded
from ..sampler import SamplingParams
from ..sampler.checks import check_int
from ..tokenizer import Tokenizer
from .tools import (ToolFieldError, call_or_answer_grammar, check_function_call, check_tool_choice, conversation,
                    parse_tools, tool_call_grammar, tools_of_functions)

MAX_CHOICES = 128
MAX_TOP_LOGPROBS = 20
# OpenAI's range, narrower than SamplingParams', so that a client that works here works there
# (the CLI takes more).
MAX_TEMPERATURE = 2

# OpenAI fields that change nothing here; accepted so that clients which send them work.
IGNORED = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls", "modalities",
                     "reasoning_effort", "prompt_cache_key", "safety_identifier", "stream_options"})
# SamplingParams fields a request may set by name (our extensions); the rest are set by the
# server (`logprobs`, `grammar`, `eos_token_ids`) or have an OpenAI name.
EXTENSIONS = frozenset(f.name for f in fields(SamplingParams)) - {"logprobs", "grammar", "eos_token_ids", "order"}
COMMON = frozenset({"model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty",
                    "frequency_penalty", "logit_bias", "stream", "samplers", "order", "grammar", "regex",
                    "json_schema", "response_format"})
# The deprecated spelling of `tools` / `tool_choice`, field by field.
LEGACY = {"functions": "tools", "function_call": "tool_choice"}
CHAT = COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice"} | set(LEGACY)
COMPLETION = COMMON | {"prompt", "logprobs", "echo", "best_of", "suffix"}
ROLES = ("system", "developer", "user", "assistant", "tool", "function")  # "function": the deprecated "tool"


class RequestError(ValueError):
    """A request the server refuses: `status`, OpenAI's error `type`, the `param` at fault."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code

    def to_openai(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class Job:
    """One checked request: what the engine thread needs and how to shape the answer."""

    kind: str  # "chat" or "completion"
    model: str
    prompt: list[int]
    max_tokens: int
    params: list[SamplingParams]  # one per choice
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None  # None: no log-probabilities; k: the top k with each token
    stream: bool = False
    include_usage: bool = False
    tools: bool = False  # parse tool calls out of the reply
    legacy: bool = False  # answer a call in the deprecated shape: `function_call`, not `tool_calls`


@dataclass
class Context:
    """What checking a request needs to know about the served model."""

    tokenizer: Tokenizer
    model_ids: tuple[str, ...]  # the first is the name the server reports
    context_length: int | None
    vocab_size: int
    max_prompt_tokens: int | None = None
    grammars: "GrammarCache" = None

    def __post_init__(self):
        self.grammars = self.grammars or GrammarCache()


@dataclass(frozen=True)
class Tools:
    """A chat request's tools: the definitions (in the `tools` shape), the `tool_choice` mode
    ("none" | "auto" | "required"), the one function a named choice forces, and whether the
    request spelled them the deprecated way (`functions` / `function_call`)."""

    definitions: list[dict] | None = None
    mode: str = "none"
    forced: str | None = None
    legacy: bool = False

    @property
    def offered(self) -> list[dict] | None:
        """The tools the model is shown and may call (none in mode "none")."""
        return self.definitions if self.mode != "none" else None


def parse(body, kind: str, ctx: Context) -> Job:
    """Check an OpenAI request body of `kind` ("chat" or "completion") and build its `Job`."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    allowed = CHAT if kind == "chat" else COMPLETION
    unknown = sorted(k for k in body if k not in allowed and k not in EXTENSIONS and k not in IGNORED)
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r} in a {kind} request", unknown[0])
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(f"model must be a string, got {model!r}"[:300], "model")
    if model is not None and model not in ctx.model_ids:
        raise RequestError(f"the model {model!r} does not exist; this server has {ctx.model_ids[0]!r}",
                           "model", status=404, code="model_not_found")
    best_of, echo = body.get("best_of"), body.get("echo")
    for name, supported in (("echo", echo is None or echo is False), ("suffix", body.get("suffix") is None),
                            ("best_of", best_of is None or (type(best_of) is int and best_of == 1))):
        if not supported:
            raise RequestError(f"{name} is not supported (only its default)", name)
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise RequestError("stream_options must be an object, and only with stream: true", "stream_options")
    include_usage = bool(options and _flag(options, "include_usage", "stream_options.include_usage"))

    tools = Tools()
    if kind == "chat":
        tools = _tools(body)
        prompt = _chat_prompt(body.get("messages"), tools.offered, ctx)
    else:
        prompt = _completion_prompt(body.get("prompt"), ctx)

    max_tokens = _max_tokens(body, kind, len(prompt), ctx)
    logprobs = _logprobs(body, kind)
    n = body.get("n")
    n = 1 if n is None else check_field("n", n, lambda v: check_int("n", v, minimum=1, maximum=MAX_CHOICES))
    request = _request(body, logprobs, _constraints(body, tools, ctx.grammars), ctx)
    choices = [seeded(request.params, i) for i in range(n)]  # choice i draws with seed + i: they differ
    return Job(kind, ctx.model_ids[0], prompt, max_tokens, choices, list(request.stop), logprobs, stream,
               include_usage, tools=tools.offered is not None, legacy=tools.legacy)


def _tools(body: dict) -> Tools:
    old = [name for name in LEGACY if body.get(name) is not None]
    new = [name for name in LEGACY.values() if body.get(name) is not None]
    if old and new:
        raise RequestError(f"{old[0]} is the deprecated spelling of {LEGACY[old[0]]}: send tools and tool_choice, "
                           f"or functions and function_call, not {new[0]} and {old[0]}", old[0])
    try:
        if old:
            definitions = tools_of_functions(body["functions"]) if body.get("functions") is not None else None
            mode, forced = check_function_call(body.get("function_call"), definitions)
        else:
            definitions = parse_tools(body["tools"]) if body.get("tools") is not None else None
            mode, forced = check_tool_choice(body.get("tool_choice"), definitions)
    except ToolFieldError as e:
        raise RequestError(str(e), e.field) from None
    return Tools(definitions, mode, forced, legacy=bool(old))


def check_field(name: str, value, check: Callable):
    """`check(value)`, its `ValueError` turned into a `RequestError` naming `name`."""
    try:
        return check(value)
    except ValueError as e:
        raise RequestError(str(e), name) from None


def _flag(body: dict, name: str, param: str | None = None) -> bool:
    """A true/false field; null (as OpenAI's clients may send) is its default, false."""
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"{param or name} must be true or false, got {value!r}", param or name)
    return value


def encode(tokenizer: Tokenizer, text: str, param: str) -> list[int]:
    """`text`'s token ids; text that is not Unicode (a lone surrogate, which JSON's \\ud800
    escapes can carry) is a `RequestError` naming `param`."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(f"{param} is not valid Unicode text: {e.reason} at character {e.start}", param) from None
    return tokenizer.encode(text)


def _text_content(content, where: str) -> str:
    """A message's content: a string, or a list of `{"type": "text", "text": ...}` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"{where} may hold only text parts ({{\"type\": \"text\", \"text\": ...}}), "
                                   f"got {part!r}", where)
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"{where} must be a string or a list of text parts, got {content!r}", where)


def _chat_prompt(messages, tools: list[dict] | None, ctx: Context) -> list[int]:
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {\"role\", \"content\"} objects", "messages")
    checked = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise RequestError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", f"{where}.role")
        role = {"developer": "system", "function": "tool"}.get(m["role"], m["role"])
        message = {"role": role, "content": _text_content(m.get("content"), f"{where}.content")}
        if m["role"] == "assistant" and m.get("tool_calls") is not None:
            calls = m["tool_calls"]
            if not isinstance(calls, list) or not all(
                    isinstance(c, dict) and isinstance(c.get("function"), dict)
                    and isinstance(c["function"].get("name"), str) for c in calls):
                raise RequestError(f"{where}.tool_calls must be a list of {{\"id\", \"type\": \"function\", "
                                   f"\"function\": {{\"name\", \"arguments\"}}}}", f"{where}.tool_calls")
            message["tool_calls"] = [_template_call(c) for c in calls]
        elif m["role"] == "assistant" and m.get("function_call") is not None:  # the deprecated shape of one call
            call = m["function_call"]
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise RequestError(f"{where}.function_call must be {{\"name\", \"arguments\"}}, got {call!r}"[:300],
                                   f"{where}.function_call")
            message["tool_calls"] = [_template_call({"function": call})]
        if m["role"] == "tool" and m.get("tool_call_id") is not None:
            message["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            message["name"] = m["name"]
        checked.append(message)
    tokenizer = ctx.tokenizer
    if not tokenizer.chat_template:
        raise RequestError("this model has no chat template: use /v1/completions", "messages")
    takes_tools = tokenizer.template_takes_tools
    try:
        text = tokenizer.apply_chat_template(conversation(checked, tools, takes_tools),
                                             tools=tools if takes_tools else None)
    except Exception as e:  # the template's own raise_exception, or a Jinja error
        raise RequestError(f"the chat template cannot render these messages: {e}", "messages") from None
    return _checked_prompt(encode(tokenizer, text, "messages"), ctx)


def _template_call(call: dict) -> dict:
    """An assistant's tool call as chat templates expect it: arguments as an object."""
    function = dict(call["function"])
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    return {**call, "type": "function", "function": function}


def _completion_prompt(prompt, ctx: Context) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a list of one prompt
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("prompt is empty", "prompt")
        return _checked_prompt(encode(ctx.tokenizer, prompt, "prompt"), ctx)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        outside = [t for t in prompt if not 0 <= t < ctx.vocab_size]
        if outside:
            raise RequestError(f"prompt holds token id {outside[0]}, outside the vocabulary [0, {ctx.vocab_size})",
                               "prompt")
        return _checked_prompt(list(prompt), ctx)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str | list) for p in prompt):
        raise RequestError("one prompt per request: send several requests (they are batched together)", "prompt")
    raise RequestError(f"prompt must be a string or a non-empty list of token ids, got {prompt!r}"[:300], "prompt")


def _checked_prompt(tokens: list[int], ctx: Context) -> list[int]:
    if not tokens:
        raise RequestError("the prompt encodes to no tokens", "prompt")
    if ctx.max_prompt_tokens is not None and len(tokens) > ctx.max_prompt_tokens:
        raise RequestError(f"the prompt has {len(tokens)} tokens; this server takes at most "
                           f"{ctx.max_prompt_tokens} (--max-prompt-tokens)", "messages/prompt",
                           code="context_length_exceeded")
    return tokens


def _max_tokens(body: dict, kind: str, prompt_tokens: int, ctx: Context) -> int:
    names = [n for n in ("max_tokens", "max_completion_tokens") if body.get(n) is not None]
    if kind == "chat" and len(names) == 2 and body["max_tokens"] != body["max_completion_tokens"]:
        raise RequestError("max_tokens and max_completion_tokens disagree; send one", "max_completion_tokens")
    name = names[-1] if names else None
    room = None if ctx.context_length is None else ctx.context_length - prompt_tokens
    if room is not None and room <= 0:
        raise RequestError(f"the prompt of {prompt_tokens} tokens leaves no room in the model's context of "
                           f"{ctx.context_length} tokens", "messages" if kind == "chat" else "prompt",
                           code="context_length_exceeded")
    if name is None:
        return MAX_TOKENS if room is None else min(MAX_TOKENS, room)
    value = check_field(name, body[name], lambda v: check_max_tokens(v, name))
    if room is not None and value > room:
        raise RequestError(f"the prompt of {prompt_tokens} tokens plus {name}={value} exceeds the model's "
                           f"context of {ctx.context_length} tokens", name, code="context_length_exceeded")
    return value


def _logprobs(body: dict, kind: str) -> int | None:
    if kind == "completion":
        value = body.get("logprobs")
        if value is None:
            return None
        return check_field("logprobs", value, lambda v: check_int("logprobs", v, minimum=0, maximum=MAX_TOP_LOGPROBS))
    want = _flag(body, "logprobs")
    top = body.get("top_logprobs")
    if top is None:
        return 0 if want else None
    top = check_field("top_logprobs", top,
                      lambda v: check_int("top_logprobs", v, minimum=0, maximum=MAX_TOP_LOGPROBS))
    if not want:
        raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
    return top


def _constraints(body: dict, tools: Tools, grammars: GrammarCache) -> list[tuple]:
    """The sources of a grammar besides the `grammar` / `regex` / `json_schema` extensions:
    `response_format` and the tools, compiled through `grammars`. A forced call is decoded
    under the call grammar alone (the format is for a later answer, as OpenAI has it); with
    tools in "auto" mode, the reply is a call or an answer in the format."""
    schema = _response_schema(body.get("response_format"))
    choice = "function_call" if tools.legacy else "tool_choice"
    if tools.mode == "required":
        if schema is not None:  # compiled now, though this reply is a call: kept for the answer that follows
            try:
                compile_constraint([("response_format", "json_schema", schema)], grammars=grammars)
            except FieldError as e:
                raise RequestError(str(e), e.field) from None
        build = lambda: tool_call_grammar(tools.definitions, tools.forced, legacy=tools.legacy,  # noqa: E731
                                          grammars=grammars)
        return [(choice, build, [tools.definitions, tools.forced])]
    if schema is None:
        return []
    if tools.mode == "auto":
        build = lambda: call_or_answer_grammar(tools.definitions, schema, legacy=tools.legacy,  # noqa: E731
                                               grammars=grammars)
        return [("response_format", build, [tools.definitions, schema])]
    return [("response_format", "json_schema", schema)]


def _response_schema(fmt) -> dict | bool | None:
    """The schema a `response_format` asks for; None for plain text."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise RequestError(f'response_format must be {{"type": "text" | "json_object" | "json_schema"}}, '
                           f"got {fmt!r}", "response_format")
    if fmt["type"] == "json_object":
        return {"type": "object"}
    if fmt["type"] == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict | bool):
            raise RequestError('response_format json_schema must be {"name": ..., "schema": {...}}',
                               "response_format")
        return spec.get("schema", {})
    return None


def _request(body: dict, logprobs: int | None, constraints: list[tuple], ctx: Context):
    """The request's sampling parameters, grammar and stop strings (`tiny_llm.request`)."""
    given = {name: body[name] for name in EXTENSIONS if body.get(name) is not None}
    temperature = given.get("temperature")  # SamplingParams checks the rest of it, as every other field
    if isinstance(temperature, int | float) and not isinstance(temperature, bool) and temperature > MAX_TEMPERATURE:
        raise RequestError(f"temperature must be between 0 and {MAX_TEMPERATURE}, as OpenAI's API allows, "
                           f"got {temperature!r}"[:300], "temperature")
    given.setdefault("temperature", 1.0)  # OpenAI's default
    for name in ("samplers", "order", "logit_bias", "stop", "grammar", "regex", "json_schema"):
        if body.get(name) is not None:
            given[name] = body[name]
    given["logprobs"] = logprobs or 0
    spell = {"order": "samplers" if "samplers" in body else "order"}.get
    try:
        return build_request(given, ctx.tokenizer, spell=lambda name: spell(name, name), vocab_size=ctx.vocab_size,
                             constraints=constraints, grammars=ctx.grammars, openai_bias=True, verb="send",
                             also=("response_format",))
    except FieldError as e:
        raise RequestError(str(e), e.field) from None
