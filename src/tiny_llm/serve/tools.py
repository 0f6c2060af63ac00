"""Engine — tool calling for the server: tool definitions into the prompt, forced calls as a
grammar, and conversations that carry calls and their results back to the model.

The call format is the one Qwen2.5 and Hermes models are trained on: a JSON object
`{"name": …, "arguments": {…}}` between `<tool_call>` and `</tool_call>`, results in
`<tool_response>` blocks. A chat template that reads a `tools` variable renders the
definitions itself; for any other template the server adds them to the system message in
the format `TOOLS_PREAMBLE` describes, and writes earlier calls and results as text.
"""

import json
from collections.abc import Mapping, Sequence

from ..constrain import Grammar, json_schema_to_gbnf
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


class ToolError(ValueError):
    """A malformed `tools`, `tool_choice` or tool message; `param` names the field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def check_tools(tools) -> list[dict]:
    """OpenAI function definitions, checked: `[{"type": "function", "function": {"name",
    "description"?, "parameters"?}}]`."""
    if not isinstance(tools, list) or not tools:
        raise ToolError(f"tools must be a non-empty list of function definitions, got {tools!r}", "tools")
    names = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise ToolError(f'{where} must be {{"type": "function", "function": {{...}}}}, got {tool!r}', where)
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise ToolError(f"{where}.function.name must be a non-empty string of at most 64 characters, "
                            f"got {name!r}", f"{where}.function.name")
        if name in names:
            raise ToolError(f"{where}.function.name {name!r} is defined twice", f"{where}.function.name")
        names.add(name)
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict):
            raise ToolError(f"{where}.function.parameters must be a JSON schema object, got {parameters!r}",
                            f"{where}.function.parameters")
    return tools


def check_tool_choice(choice, tools: list[dict] | None) -> tuple[str, str | None]:
    """("none" | "auto" | "required", the function a named choice forces or None)."""
    if choice is None:
        return ("auto" if tools else "none"), None
    if choice in ("none", "auto", "required"):
        if choice != "none" and not tools:
            raise ToolError(f"tool_choice {choice!r} needs tools", "tool_choice")
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        known = [t["function"]["name"] for t in tools or []]
        if name not in known:
            raise ToolError(f"tool_choice names function {name!r}, which is not among the tools "
                            f"({', '.join(map(repr, known)) or 'none given'})", "tool_choice")
        return "required", name
    raise ToolError(f'tool_choice must be "none", "auto", "required" or {{"type": "function", "function": '
                    f'{{"name": ...}}}}, got {choice!r}', "tool_choice")


def tool_call_grammar(tools: list[dict], name: str | None = None) -> Grammar:
    """Exactly one call block whose JSON names one of `tools` (or `name`) and whose
    arguments validate against that function's `parameters` schema; JSON on one line."""
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    # Each function's parameters move under the document's $defs; their local references
    # ('#', '#/$defs/...', any '#/...') are rewritten to point where the schema now is.
    definitions = {f"tool-{i}": _moved(f.get("parameters", {"type": "object"}), f"#/$defs/tool-{i}")
                   for i, f in enumerate(chosen)}
    calls = [{
        "type": "object",
        "properties": {"name": {"const": f["name"]}, "arguments": {"$ref": f"#/$defs/tool-{i}"}},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    } for i, f in enumerate(chosen)]
    schema = {**(calls[0] if len(calls) == 1 else {"anyOf": calls}), "$defs": definitions}
    body = json_schema_to_gbnf(schema, compact=True)
    wrapper = "tool-call-block"
    while f"\n{wrapper} ::=" in f"\n{body}":
        wrapper += "-x"
    text = f"{body}\n{wrapper} ::= {json.dumps(TOOL_CALL_OPEN + chr(10))} root {json.dumps(chr(10) + TOOL_CALL_CLOSE)}\n"
    return Grammar(text, root=wrapper)


# Keywords whose values are data, not schemas: a "$ref" inside them is not a reference.
_DATA_KEYWORDS = ("const", "enum", "default", "examples")


def _moved(schema, base: str):
    """`schema` with every local `$ref` made relative to `base` (where it is moved to)."""
    if isinstance(schema, list):
        return [_moved(s, base) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = base + value[1:]
        elif key in _DATA_KEYWORDS:
            out[key] = value
        else:
            out[key] = _moved(value, base)
    return out


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
