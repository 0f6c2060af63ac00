"""Engine — tool calling for the server: tool definitions into the prompt, forced calls as a
grammar (or a call or a structured answer as one), and conversations that carry calls and
their results back to the model.

The call format is the one Qwen2.5 and Hermes models are trained on: a JSON object
`{"name": …, "arguments": {…}}` between `<tool_call>` and `</tool_call>`, results in
`<tool_response>` blocks. A chat template that reads a `tools` variable renders the
definitions itself; for any other template the server adds them to the system message in
the format `TOOLS_PREAMBLE` describes, and writes earlier calls and results as text.

The deprecated `functions` / `function_call` fields are the same tools spelled the old way:
`tools_of_functions` and `check_function_call` read them into the new shape.

Tests: tests/test_serve_text.py, tests/test_serve_agents.py
"""

import json
import re
from collections.abc import Mapping, Sequence

from ..constrain import Grammar
from ..request import FieldError, GrammarCache
from .text import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

TOOLS_PREAMBLE = """\
You may call these functions (JSON definitions between <tools> and </tools>):
<tools>
{definitions}
</tools>
To call one, reply with its name and arguments as JSON between <tool_call> and </tool_call>:
<tool_call>
{{"name": "<function name>", "arguments": {{<arguments>}}}}
</tool_call>
The results come back between <tool_response> and </tool_response>."""


NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # a function's name, as OpenAI's API allows it


class ToolFieldError(FieldError):
    """A malformed `tools`, `tool_choice`, `functions` or `function_call`; `field` names the
    field at fault."""


def _where(i: int, legacy: bool = False) -> str:
    """How a request names its i-th function: `tools[i].function`, or `functions[i]` in the
    deprecated spelling."""
    return f"functions[{i}]" if legacy else f"tools[{i}].function"


def parse_tools(tools) -> list[dict]:
    """OpenAI function definitions, checked: `[{"type": "function", "function": {"name",
    "description"?, "parameters"?}}]`."""
    if not isinstance(tools, list) or not tools:
        raise ToolFieldError(f"tools must be a non-empty list of function definitions, got {tools!r}", "tools")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise ToolFieldError(f'tools[{i}] must be {{"type": "function", "function": {{...}}}}, got {tool!r}',
                                 f"tools[{i}]")
    _check_functions([t["function"] for t in tools], legacy=False)
    return tools


def tools_of_functions(functions) -> list[dict]:
    """The deprecated `functions: [{"name", "description"?, "parameters"?}]`, checked, as
    `tools`."""
    if not isinstance(functions, list) or not functions:
        raise ToolFieldError(f"functions must be a non-empty list of function definitions, got {functions!r}",
                             "functions")
    for i, function in enumerate(functions):
        if not isinstance(function, dict):
            raise ToolFieldError(f'functions[{i}] must be {{"name": ..., "parameters": {{...}}}}, got {function!r}',
                                 f"functions[{i}]")
    _check_functions(functions, legacy=True)
    return [{"type": "function", "function": function} for function in functions]


def _check_functions(functions: list[dict], legacy: bool) -> None:
    names = set()
    for i, function in enumerate(functions):
        at = _where(i, legacy)
        problem = name_problem(function.get("name"), at, names)
        if problem:
            raise ToolFieldError(problem, f"{at}.name")
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict):
            raise ToolFieldError(f"{at}.parameters must be a JSON schema object, got {parameters!r}",
                                 f"{at}.parameters")


def name_problem(name, where: str, seen: set[str]) -> str | None:
    """Why `name` cannot name the function at `where` (None if it can, then it joins `seen`):
    the names OpenAI's and Anthropic's APIs allow, each once in a request."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        return (f"{where}.name must be 1 to 64 letters, digits, underscores or dashes (as OpenAI's and "
                f"Anthropic's APIs require), got {name!r}")[:300]
    if name in seen:
        return f"{where}.name {name!r} is defined twice"
    seen.add(name)
    return None


def check_tool_choice(choice, tools: list[dict] | None) -> tuple[str, str | None]:
    """("none" | "auto" | "required", the function a named choice forces or None)."""
    if choice is None:
        return ("auto" if tools else "none"), None
    if choice in ("none", "auto", "required"):
        if choice != "none" and not tools:
            raise ToolFieldError(f"tool_choice {choice!r} needs tools", "tool_choice")
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        return "required", _known(choice["function"].get("name"), tools, "tool_choice", "tools")
    raise ToolFieldError(f'tool_choice must be "none", "auto", "required" or {{"type": "function", "function": '
                         f'{{"name": ...}}}}, got {choice!r}', "tool_choice")


def check_function_call(choice, tools: list[dict] | None) -> tuple[str, str | None]:
    """The deprecated `function_call` ("none", "auto" or `{"name": ...}`) as `check_tool_choice`
    reads `tool_choice`; `tools` are the request's `functions`, as `tools_of_functions` gives them."""
    if choice is None:
        return ("auto" if tools else "none"), None
    if choice in ("none", "auto"):
        if choice == "auto" and not tools:
            raise ToolFieldError('function_call "auto" needs functions', "function_call")
        return choice, None
    if isinstance(choice, dict) and "name" in choice:
        return "required", _known(choice["name"], tools, "function_call", "functions")
    raise ToolFieldError(f'function_call must be "none", "auto" or {{"name": ...}}, got {choice!r}', "function_call")


def _known(name, tools: list[dict] | None, field: str, among: str) -> str:
    known = [t["function"]["name"] for t in tools or []]
    if name not in known:
        raise ToolFieldError(f"{field} names function {name!r}, which is not among the {among} "
                             f"({', '.join(map(repr, known)) or 'none given'})", field)
    return name


# A call's JSON, `{"name": ..., "arguments": ...}`, laid out as the schema compiler writes
# compact JSON (`Grammar.from_json_schema(..., compact=True)`): each token followed by at
# most one blank. The arguments' grammar ends with its own blank.
_BLANK = Grammar('root ::= | " "')


def _json_tokens(*tokens: str) -> Grammar:
    """`tokens` one after another, each followed by at most one blank."""
    return Grammar.concat(*(part for token in tokens for part in (Grammar.literal(token), _BLANK)))


_OPEN, _CLOSE = Grammar.literal(TOOL_CALL_OPEN + "\n"), Grammar.literal("\n" + TOOL_CALL_CLOSE)
_CALL_END = _json_tokens("}")


def tool_call_grammar(tools: list[dict], name: str | None = None, *, legacy: bool = False,
                      grammars: GrammarCache | None = None) -> Grammar:
    """Exactly one call block whose JSON names one of `tools` (or `name`) and whose arguments
    validate against that function's `parameters` schema, JSON on one line: the reply of a
    forced call. Each schema is compiled once through `grammars` (keyed by its canonical
    JSON); one that does not compile is a `ToolFieldError` naming the function's
    `parameters` (`legacy`: as the deprecated `functions` names them)."""
    grammars = GrammarCache() if grammars is None else grammars
    calls = []
    for i, tool in enumerate(tools):
        function = tool["function"]
        if name is not None and function["name"] != name:
            continue
        try:
            arguments = grammars.of_kind("json_schema", function.get("parameters", {"type": "object"}), compact=True)
        except (ValueError, RecursionError) as e:
            at = f"{_where(i, legacy)}.parameters"
            raise ToolFieldError(f"{at}: {e}", at) from None
        head = _json_tokens("{", '"name"', ":", json.dumps(function["name"]), ",", '"arguments"', ":")
        calls.append(Grammar.concat(head, arguments, _CALL_END))
    return Grammar.concat(_OPEN, Grammar.union(*calls), _CLOSE)


def call_or_answer_grammar(tools: list[dict], schema: dict | bool, *, legacy: bool = False,
                           grammars: GrammarCache | None = None) -> Grammar:
    """Either one call block, exactly as `tool_call_grammar` allows it, or JSON that validates
    against `schema` (as `response_format` alone allows it, the same grammar through
    `grammars`): the reply of a request with tools in "auto" mode and a structured
    `response_format`."""
    grammars = GrammarCache() if grammars is None else grammars
    calls = tool_call_grammar(tools, legacy=legacy, grammars=grammars)
    return Grammar.union(calls, grammars.of_kind("json_schema", schema))


def tools_preamble(tools: list[dict]) -> str:
    return TOOLS_PREAMBLE.format(definitions="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))


def conversation(messages: Sequence[Mapping], tools: list[dict] | None, template_takes_tools: bool) -> list[dict]:
    """The messages to render. A template that takes tools gets them as they are; for
    any other, the tool definitions join the system message, and assistant calls and tool
    results become text in the call format."""
    if template_takes_tools:
        return [dict(m) for m in messages]
    out = []
    for m in messages:
        m = dict(m)
        if m["role"] == "assistant" and m.get("tool_calls"):
            blocks = [f"{TOOL_CALL_OPEN}\n{_call_json(c)}\n{TOOL_CALL_CLOSE}" for c in m.pop("tool_calls")]
            m["content"] = "\n".join(([m["content"]] if m.get("content") else []) + blocks)
        elif m["role"] == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
        out.append(m)
    if tools:
        preamble = tools_preamble(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{preamble}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": preamble})
    return out


def _call_json(call: Mapping) -> str:
    function = call.get("function", {})
    arguments = function.get("arguments", "{}")
    try:
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        pass  # written back as the text the client sent
    return json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
