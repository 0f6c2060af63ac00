"""Engine — the server's text streams: stop strings found across token boundaries, and tool
calls (`<tool_call>{…}</tool_call>`) cut out of the reply as they complete.

Both hold back text that may be the start of what they look for, and release it once it
cannot be: a client never sees half a stop string or half a tool-call tag.
"""

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


def held_back(text: str, targets: Sequence[str]) -> int:
    """How many characters at the end of `text` begin one of `targets` (the longest such
    ending): they must wait for the next piece of text."""
    longest = 0
    for target in targets:
        for k in range(min(len(target) - 1, len(text)), longest, -1):
            if text.endswith(target[:k]):
                longest = k
                break
    return longest


class StopStrings:
    """Finds the first of `stops` in a stream of text pieces. `feed` returns the text that
    is safe to show and whether a stop string was found (the stop string and whatever
    follows it are dropped)."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        self.pending += text
        found = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if found:
            out, self.pending = self.pending[: min(found)], ""
            return out, True
        keep = held_back(self.pending, self.stops)
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


@dataclass(frozen=True)
class ToolCall:
    """One parsed call, in OpenAI's shape (`arguments` is JSON text)."""

    name: str
    arguments: str
    id: str

    def to_openai(self, index: int | None = None) -> dict:
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}

    def to_legacy(self) -> dict:
        """The deprecated `function_call` shape (no id)."""
        return {"name": self.name, "arguments": self.arguments}


def parse_tool_call(body: str) -> ToolCall | None:
    """The call in the text between the tags: a JSON object with a string `name` and an
    object `arguments` (or `parameters`); None when it is anything else."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False), f"call_{uuid.uuid4().hex[:24]}")


class ToolCallText:
    """Splits a reply into content and tool calls as it streams. `feed` returns the content
    to show now and the calls completed by this piece; `finish` what is left at the end. A
    block that does not parse is shown as content, tags and all: nothing is lost."""

    def __init__(self):
        self.pending = ""  # text not yet shown: a possible opening tag, or an open block
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self.pending += text
        content, calls = [], []
        while True:
            start = self.pending.find(TOOL_CALL_OPEN)
            if start < 0:
                cut = len(self.pending) - held_back(self.pending, [TOOL_CALL_OPEN])
                content.append(self.pending[:cut])
                self.pending = self.pending[cut:]
                break
            content.append(self.pending[:start])
            self.pending = self.pending[start:]
            end = self.pending.find(TOOL_CALL_CLOSE)
            if end < 0:
                break  # the block goes on in the next piece
            block = self.pending[: end + len(TOOL_CALL_CLOSE)]
            self.pending = self.pending[len(block):]
            call = parse_tool_call(block[len(TOOL_CALL_OPEN): -len(TOOL_CALL_CLOSE)])
            if call is None:
                content.append(block)
            else:
                calls.append(call)
        self.calls += calls
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """At the end of the reply: a block left open that still holds a whole call (the
        model ended before the closing tag) counts as a call; anything else is content."""
        rest, self.pending = self.pending, ""
        if rest.startswith(TOOL_CALL_OPEN):
            call = parse_tool_call(rest[len(TOOL_CALL_OPEN):])
            if call is not None:
                self.calls.append(call)
                return "", [call]
        return rest, []
