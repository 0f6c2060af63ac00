"""Engine — the server's text streams: stop strings found across token boundaries, and tool
calls (`<tool_call>{…}</tool_call>`) cut out of the reply as they complete.

Both hold back text that may be the start of what they look for, and release it once it
cannot be: a client never sees half a stop string or half a tool-call tag.

Tests: tests/test_serve_text.py, tests/test_serve_anthropic.py, tests/test_serve_engine.py
"""

import json
import re
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
    """One parsed call, in OpenAI's shape (`arguments` is JSON text). `streamed`: its name
    and arguments went out before as `ToolCallDelta`s (so a stream does not send it again)."""

    name: str
    arguments: str
    id: str
    streamed: bool = False

    def to_openai(self, index: int | None = None) -> dict:
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}

    def to_legacy(self) -> dict:
        """The deprecated `function_call` shape (no id)."""
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a call as the model writes it: the first of a call carries its `id` and
    `name` (as soon as the name is known), the others more of its `arguments` JSON text.
    `index`: which call of the choice it belongs to (from 0). The pieces of a call's
    arguments joined are the `arguments` of its `ToolCall`."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


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


# The start of a call block as models write it: the name, then the arguments object.
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')


class _ObjectEnd:
    """Where a JSON object written piece by piece ends: braces counted outside strings, each
    character read once however many pieces the object comes in."""

    def __init__(self):
        self.depth, self.in_string, self.escaped, self.read = 0, False, False, 0
        self.end: int | None = None  # the index after the closing brace, once written

    def feed(self, text: str) -> int | None:
        """`text`: the object's text so far (it only grows)."""
        while self.end is None and self.read < len(text):
            c = text[self.read]
            self.read += 1
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c == "{":
                self.depth += 1
            elif c == "}":
                self.depth -= 1
                if self.depth == 0:
                    self.end = self.read
        return self.end


class _OpenCall:
    """A call block being written: its id and name once known, and how much of its
    arguments text has gone out as deltas."""

    def __init__(self, index: int):
        self.index, self.id, self.name = index, f"call_{uuid.uuid4().hex[:24]}", None
        self.arguments_at: int | None = None  # where the arguments object starts in the block's body
        self.sent = 0  # characters of the arguments sent
        self.arguments_end = _ObjectEnd()


class ToolCallText:
    """Splits a reply into content and tool calls as it streams. `feed` returns the content
    to show now and the calls completed by this piece; `finish` what is left at the end. A
    block that does not parse is shown as content, tags and all: nothing is lost.

    While a block is written, `deltas()` gives the call as it grows: its id and name as soon
    as `{"name": "...", "arguments": ` is there, then its arguments text piece by piece. The
    whole call that follows has the same id and, as its arguments, the very text those
    pieces add up to (`streamed=True`). A block whose pieces went out but which does not
    parse in the end is still shown as content."""

    def __init__(self):
        self.pending = ""  # text not yet shown: a possible opening tag, or an open block
        self.calls: list[ToolCall] = []
        self._open: _OpenCall | None = None
        self._deltas: list[ToolCallDelta] = []
        self._started = 0  # calls whose pieces began (the next call's index)

    def deltas(self) -> list[ToolCallDelta]:
        """The pieces of calls written since the last time asked."""
        out, self._deltas = self._deltas, []
        return out

    def _grow(self, block: str) -> None:
        """The pieces of the open call block `block` (its text so far, from the opening tag)
        that are new since the last look."""
        if self._open is None:
            self._open = _OpenCall(self._started)
        call, body = self._open, block[len(TOOL_CALL_OPEN):]
        if call.arguments_at is None:
            head = _CALL_HEAD.match(body)
            if head is None:
                return
            try:
                call.name = json.loads(head[1])
            except json.JSONDecodeError:
                return
            call.arguments_at = head.end()
            self._started += 1
            self._deltas.append(ToolCallDelta(call.index, "", call.id, call.name))
        arguments = body[call.arguments_at:]
        ready = arguments[:call.arguments_end.feed(arguments)]
        if len(ready) > call.sent:
            self._deltas.append(ToolCallDelta(call.index, ready[call.sent:]))
            call.sent = len(ready)

    def _close(self, block: str) -> ToolCall | None:
        """The call of a finished block (its text from the opening tag, without the closing
        one), with the id and the arguments text its pieces had; None if it is no call."""
        self._grow(block)
        opened, self._open = self._open, None
        body = block[len(TOOL_CALL_OPEN):]
        call = parse_tool_call(body)
        if call is None or opened.arguments_at is None or opened.name != call.name:
            return call
        text = body[opened.arguments_at:]
        return ToolCall(call.name, text[:opened.arguments_end.end], opened.id, streamed=True)

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
                self._grow(self.pending)
                break  # the block goes on in the next piece
            block = self.pending[: end + len(TOOL_CALL_CLOSE)]
            self.pending = self.pending[len(block):]
            call = self._close(block[: -len(TOOL_CALL_CLOSE)])
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
            call = self._close(rest)
            if call is not None:
                self.calls.append(call)
                return "", [call]
        return rest, []
