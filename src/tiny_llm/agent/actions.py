"""Course: week 4 day 1 — actions: one JSON schema for every tool call, enforced while decoding.

    schema = action_schema(workspace.tools)        # {"oneOf": [one branch per tool, finish last]}
    grammar = Grammar.from_json_schema(schema)     # the engine can only write valid actions
    action = parse_action(text, workspace.tools)   # Action("edit", {...}), or ValueError(why)

An action is `{"tool": NAME, "args": {...}}`. The schema is a tagged union: each branch fixes
`tool` to one name with `const` and gives `args` that tool's parameter schema, so the branches
are disjoint and `tiny_llm.constrain` compiles the union exactly. A model decoding under its
grammar cannot write anything else; `parse_action` is for every other source (an endpoint
that does not enforce schemas, a script) and says what is wrong in one line.

Tests: tests/test_week4_day1.py, tests/test_week4_day2.py
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence

from .core import Action, Tool

__all__ = ["FINISH", "action_schema", "action_text", "check_value", "describe_tools", "parse_action"]

FINISH = Tool(
    "finish",
    "End the run with a summary of what was done.",
    {"type": "object", "properties": {"summary": {"type": "string", "maxLength": 500}}, "required": ["summary"],
     "additionalProperties": False},
)

# The keywords a tool's parameter schema may use: `check_value` checks each of them, so an
# action that parses has arguments that truly validate. Annotations are allowed and ignored.
CHECKED = {"type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
           "maxItems", "enum", "const", "minLength", "maxLength", "pattern", "minimum", "maximum",
           "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf"}
ANNOTATIONS = {"description", "title", "default", "examples", "$comment"}
TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def check_tools(tools: Sequence[Tool]) -> tuple[Tool, ...]:
    """`tools` plus FINISH, after checking that names are unique, `finish` is not taken, and
    every parameter schema keeps to the keywords `check_value` checks."""
    tools = tuple(tools)
    names = [t.name for t in tools]
    for tool in tools:
        if not isinstance(tool, Tool):
            raise ValueError(f"tools must be Tool objects, got {type(tool).__name__}")
        if not isinstance(tool.name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", tool.name):
            raise ValueError(f"a tool's name must be a word (letters, digits, _ and -), got {tool.name!r}")
        if tool.name == FINISH.name:
            raise ValueError("the tool name 'finish' is reserved: every run ends with the FINISH action")
        if names.count(tool.name) > 1:
            raise ValueError(f"two tools are named {tool.name!r}: names must be unique")
        _check_schema(tool.parameters, f"tool {tool.name!r} parameters")
    return (*tools, FINISH)


def _check_schema(schema, where: str) -> None:
    if not isinstance(schema, dict):
        raise ValueError(f"{where}: a schema must be an object, got {schema!r}")
    unknown = sorted(set(schema) - CHECKED - ANNOTATIONS)
    if unknown:
        raise ValueError(f"{where}: keyword {unknown[0]!r} is not supported in tool parameters "
                         f"(supported: {', '.join(sorted(CHECKED))})")
    for name, sub in schema.get("properties", {}).items():
        _check_schema(sub, f"{where}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            _check_schema(schema[key], f"{where} {key}")
    for key in ("anyOf", "oneOf", "prefixItems"):
        for i, sub in enumerate(schema.get(key, [])):
            _check_schema(sub, f"{where} {key}[{i}]")


def action_schema(tools: Sequence[Tool]) -> dict:
    """The JSON schema of one action over `tools` (FINISH is added last): a `oneOf` with one
    branch per tool, `{"type": "object", "properties": {"tool": {"const": NAME}, "args":
    PARAMETERS}, "required": ["tool", "args"], "additionalProperties": False}`."""
    tools = check_tools(tools)
    # BEGIN SOLUTION week4-day1
    return {"oneOf": [
        {"type": "object", "properties": {"tool": {"const": t.name}, "args": t.parameters},
         "required": ["tool", "args"], "additionalProperties": False}
        for t in tools
    ]}
    # END SOLUTION


def parse_action(text: str, tools: Sequence[Tool]) -> Action:
    """The action `text` writes, checked against `tools` (FINISH included): ValueError with
    the reason when it is not JSON, not an object of exactly `tool` and `args`, names no
    known tool, or has arguments its tool's schema refuses."""
    tools = check_tools(tools)
    # BEGIN SOLUTION week4-day1
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(data, dict) or set(data) != {"tool", "args"}:
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ValueError(f'an action is an object with exactly "tool" and "args", got {keys}')
    by_name = {t.name: t for t in tools}
    tool = by_name.get(data["tool"])
    if tool is None:
        raise ValueError(f"unknown tool {data['tool']!r} (tools: {', '.join(by_name)})")
    check_value(data["args"], tool.parameters, f"{tool.name} args")
    return Action(tool.name, data["args"])
    # END SOLUTION


def _no_constant(name: str):
    raise ValueError(f"not JSON: {name} is not a JSON number")


def check_value(value, schema: dict, where: str = "value") -> None:
    """ValueError naming `where` (a path such as `edit args.path`) unless `value` validates
    against `schema`, within the keywords of CHECKED. The one check of a tool call's
    arguments: `parse_action` runs it on what a model wrote, the workspace before it acts.
    Values compare as JSON Schema compares them (`const`, `enum`): 1 equals 1.0, true is not 1.
    When no branch of an `anyOf` or `oneOf` fits, the reason is that of the branch whose
    properties share the most keys with `value` (the first, on a tie)."""
    # The constrain package loads numpy; the agent's modules load without it until here.
    from ..constrain.json_schema import json_equal

    if "const" in schema and not json_equal(value, schema["const"]):
        raise ValueError(f"{where} must be {json.dumps(schema['const'])}, got {json.dumps(value)}")
    if "enum" in schema and not any(json_equal(value, v) for v in schema["enum"]):
        raise ValueError(f"{where} must be one of {json.dumps(schema['enum'])}, got {json.dumps(value)}")
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is(value, t) for t in types):
            raise ValueError(f"{where} must be {' or '.join(types)}, got {json.dumps(value)}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", math.inf):
            raise ValueError(f"{where} must have {schema.get('minLength', 0)} to "
                             f"{schema.get('maxLength', 'any number of')} characters, got {len(value)}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            raise ValueError(f"{where} must match {schema['pattern']!r}, got {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        for key, ok in (("minimum", value >= schema.get("minimum", -math.inf)),
                        ("maximum", value <= schema.get("maximum", math.inf)),
                        ("exclusiveMinimum", value > schema.get("exclusiveMinimum", -math.inf)),
                        ("exclusiveMaximum", value < schema.get("exclusiveMaximum", math.inf))):
            if not ok:
                raise ValueError(f"{where} must respect {key} {schema[key]}, got {value}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", math.inf):
            raise ValueError(f"{where} must have {schema.get('minItems', 0)} to "
                             f"{schema.get('maxItems', 'any number of')} items, got {len(value)}")
        prefix = schema.get("prefixItems", [])
        for i, item in enumerate(value):
            if i < len(prefix):
                check_value(item, prefix[i], f"{where}[{i}]")
            elif isinstance(schema.get("items"), dict):
                check_value(item, schema["items"], f"{where}[{i}]")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                raise ValueError(f"{where} is missing {name!r}")
        for name, item in value.items():
            if name in properties:
                check_value(item, properties[name], f"{where}.{name}")
            elif schema.get("additionalProperties", True) is False:
                raise ValueError(f"{where} has an unknown key {name!r} (allowed: {', '.join(properties) or 'none'})")
            elif isinstance(schema.get("additionalProperties"), dict):
                check_value(item, schema["additionalProperties"], f"{where}.{name}")
    for key in ("anyOf", "oneOf"):
        if key in schema:
            reasons = [_why_not(value, sub, where) for sub in schema[key]]
            matched = reasons.count(None)
            if matched == 0:
                keys = set(value) if isinstance(value, dict) else set()
                shared = [len(keys & set(sub.get("properties", {}))) for sub in schema[key]]
                raise ValueError(reasons[shared.index(max(shared))])
            if key == "oneOf" and matched > 1:
                raise ValueError(f"{where} matches {matched} of the {key} branches, got {json.dumps(value)}")


def _why_not(value, schema: dict, where: str) -> str | None:
    """Why `value` does not validate against `schema`, or None if it does."""
    try:
        check_value(value, schema, where)
    except ValueError as e:
        return str(e)
    return None


def _is(value, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, TYPES.get(kind, ()))


def action_text(action: Action) -> str:
    """The JSON text of `action`, as a model would write it."""
    return json.dumps({"tool": action.tool, "args": action.args}, ensure_ascii=False)


def describe_tools(tools: Sequence[Tool]) -> str:
    """The tools as the model reads them in the system message: one paragraph each, its
    name, what it does and the JSON schema of its arguments (FINISH last)."""
    return "\n".join(f"- {t.name}: {t.description}\n  args: {json.dumps(t.parameters, ensure_ascii=False)}"
                     for t in check_tools(tools))
