#!/usr/bin/env python3
"""Soak test of `tiny-llm serve`: minutes of mixed traffic, then checks that every request got a
whole answer and that nothing leaked.

    python scripts/soak_serve.py [--minutes 5] [--requests N] [--model default] [--max-batch-size 4]
        [--max-tokens 16] [--seed 0] [--rss-growth-mb 96] [--base-url http://127.0.0.1:PORT]
        [--server-args "--max-queue 64"] [--strict] [--json out.json]

The script starts `tiny-llm serve --model MODEL --host 127.0.0.1 --port P --max-batch-size B
--prefix-cache-bytes 32M` on a free port (its output in a log file, which is kept when a check
fails) and stops it at the end (SIGTERM to its process group, SIGKILL after 10 s), also on error,
Ctrl-C or SIGTERM. With `--base-url` it talks to a running server instead; only loopback
addresses (127.0.0.1, localhost, ::1) are accepted. The run ends after --minutes or --requests,
whichever comes first; `--model` is a model name or directory (the tests pass a random-weight
model: `tests/serve_support.py: tiny_served_model`).

Traffic (one `random.Random(--seed)` draws every request, so a run sends the same sequence):
up to 2 x B clients at once, their number following a sine wave (period --period seconds);
chat and completions, streamed or not, some with seeds, n > 1, stop strings, top log-probs or
include_usage; `response_format` json_schema, a forced tool (`tool_choice` naming a function),
a GBNF `grammar` and a `regex`; long prompts that share one of a few system prompts or documents
(the prefix cache's work) and short ones; ~10 % malformed or invalid bodies, ~10 % streams the
client drops after a few chunks, some slow readers (a pause between chunks). Half the requests
send their own `X-Request-Id`, a few an invalid one. A 503 is retried after its `Retry-After`
(at most --max-retries times).

Checks (one PASS / FAIL line each; exit status 1 if any fails): complete answers (streams parse,
end with `data: [DONE]` and give every choice a finish_reason; errors are OpenAI error objects),
4xx for invalid bodies, 200 for valid ones, no 5xx but 503 with `Retry-After`, constrained
replies that match their constraint, seeded requests equal to the same request sent alone at
the end (--solo of them; --logprobs shows where a differing one parts), `/health` answering
200 within --health-limit (1 s; polled every 0.5 s), the server idle afterwards (no rows, no
queue, KV pages held only by the prefix cache, the prefix cache within its budget, no failed
engine step), resident memory less the prefix cache's idle bytes (which its budget bounds)
not growing beyond --rss-growth-mb after the warm-up (the first quarter of the run, and at
least until the client count first peaks), `X-Request-Id` on every response; when the script
started the server: one access-log line per answered request, no traceback in its log, exit
status 0 after SIGTERM. A check whose metric or feature the server does not have prints
MISSING (a failure with --strict).

At the end: requests by kind and outcome (ok / 4xx / 503-retried / disconnected / error) with
TTFT and latency percentiles, the server's memory and page counts over time, /health's
latency; --json writes the same numbers.
"""

import argparse
import asyncio
import json
import math
import random
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from bench_common import machine_info, write_json
from bench_serve import AUDIENCES, TOPICS, Server, fmt, free_port, percentile

LOOPBACK = ("127.0.0.1", "localhost", "::1")
HEALTH_LIMIT = 1.0  # seconds /health may take (--health-limit)
HEALTH_EVERY, SAMPLE_EVERY = 0.5, 2.0  # seconds between /health polls, between /metrics samples
WARMUP_FRACTION = 0.25  # of the traffic's time: resident memory is compared with its end
# MiB resident memory (less the prefix cache's idle bytes) may grow after the warm-up: twice the
# most measured in healthy runs (+48 MiB: the default model, 2 minutes; the random-weight
# model: +20 MiB in 3 minutes), where MLX's buffer cache keeps freed buffers of each new size.
# Leaked KV pages are caught exactly by the page counts; this catches what they do not count.
RSS_GROWTH_MB = 96.0
FINISH = {"stop", "length", "tool_calls", "function_call"}
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
NEW_REQUEST_ID = re.compile(r"req-[0-9a-f]{24}")
ACCESS = re.compile(r"tiny-llm: access: id=(\S+) (\S+) (\S+) (\d+) ")

# Metrics the checks read (names as /metrics shows them).
RUNNING, QUEUE, OPEN = "tiny_llm_running_rows", "tiny_llm_queue_length", "tiny_llm_open_requests"
PAGES, PREFIX_PAGES = "tiny_llm_kv_pages_in_use", "tiny_llm_prefix_cache_pages"
IDLE_BYTES, BUDGET_BYTES = "tiny_llm_prefix_cache_idle_bytes", "tiny_llm_prefix_cache_budget_bytes"
FAILURES, RSS = "tiny_llm_engine_failures_total", "process_resident_memory_bytes"

KINDS = ("chat", "completion", "json_schema", "tool", "grammar", "regex", "responses", "messages", "invalid",
         "disconnect")
WEIGHTS = (18, 14, 8, 8, 8, 8, 9, 9, 9, 9)  # percent of requests of each kind

# ---------------------------------------------------------------- what the requests hold

RULES = [
    "Answer in plain words and keep every answer short.", "Never invent a number you were not given.",
    "When a question is unclear, say what is missing.", "Prefer lists to long paragraphs.",
    "Name the units of every quantity.", "Do not repeat the question back.",
    "Say so when you do not know.", "Give the most likely answer first, then the others.",
    "Use the names people use locally.", "Write dates as day, month, year.",
    "Keep a friendly tone, without jokes.", "End with one sentence that sums up the answer.",
]
ROLES = ["the assistant of a small harbour office", "a museum guide in an old port town",
         "the help desk of a regional railway"]
# Long system prompts that many requests share: the prefix cache keeps their keys and values.
SYSTEMS = [f"You are {role}. " + " ".join(f"Rule {k + 1}: {rule}" for k, rule in enumerate(RULES[i:] + RULES[:i]))
           for i, role in enumerate(ROLES)]
DOCUMENTS = [f"Notes of {role}, page {i + 1}.\n" + "\n".join(f"- {topic}: see {RULES[(i + k) % len(RULES)].lower()}"
                                                              for k, topic in enumerate(TOPICS[:12]))
             for i, role in enumerate(ROLES)]
STOPS = [["\n\n"], [" the"], ["."], ["zz", "e "], [","]]

WEATHER = json.loads((Path(__file__).resolve().parent.parent / "examples" / "weather-tool.json").read_text())
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                           "score": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["answer", "score"], "additionalProperties": False}
GRAMMAR = 'root ::= word (", " word){0,3}\nword ::= "yes" | "no" | "maybe"'
GRAMMAR_MATCHES = re.compile(r"(yes|no|maybe)(, (yes|no|maybe)){0,3}")  # the language of GRAMMAR
REGEX = r"[A-Z][a-z]{2,8}( [a-z]{2,8}){0,3}\."

# Bodies the server must refuse: (what is wrong, endpoint, body (bytes: sent as they are), status).
INVALID = [
    ("malformed JSON", "chat", b'{"messages": [', 400),
    ("a JSON list", "completion", b'[1, 2]', 400),
    ("temperature not a number", "chat", {"messages": [{"role": "user", "content": "Hi"}], "temperature": "hot"}, 400),
    ("unknown model", "chat", {"messages": [{"role": "user", "content": "Hi"}], "model": "gpt-9"}, 404),
    ("max_tokens 0", "completion", {"prompt": "Once", "max_tokens": 0}, 400),
    ("no messages", "chat", {"messages": []}, 400),
    ("n 0", "chat", {"messages": [{"role": "user", "content": "Hi"}], "n": 0}, 400),
    ("top_p 2", "completion", {"prompt": "Once", "top_p": 2}, 400),
    ("unknown field", "chat", {"messages": [{"role": "user", "content": "Hi"}], "colour": "red"}, 400),
    ("prompt a number", "completion", {"prompt": 123}, 400),
    ("stream not a boolean", "chat", {"messages": [{"role": "user", "content": "Hi"}], "stream": "yes"}, 400),
    ("a regex that does not parse", "completion", {"prompt": "Once", "regex": "(ab"}, 400),
    ("role unknown", "chat", {"messages": [{"role": "wizard", "content": "Hi"}]}, 400),
]
INVALID += [
    ("responses: an unknown field", "responses", {"input": "Hi", "colour": "red"}, 400),
    ("responses: a built-in tool", "responses", {"input": "Hi", "tools": [{"type": "web_search"}]}, 400),
    ("messages: no max_tokens", "messages", {"messages": [{"role": "user", "content": "Hi"}]}, 400),
    ("messages: temperature 1.5", "messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                                                "temperature": 1.5}, 400),
]
PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions", "responses": "/v1/responses",
         "messages": "/v1/messages"}
# How the Responses API and Anthropic's Messages API say why a reply ended, in chat's words.
ENDED = {"completed": "stop", "incomplete": "length", "end_turn": "stop", "stop_sequence": "stop",
         "max_tokens": "length", "tool_use": "tool_calls"}


@dataclass
class Planned:
    """One request of the plan: what is sent and what must come back."""

    index: int
    kind: str  # one of KINDS
    endpoint: str  # "chat" or "completion"
    body: dict | bytes
    stream: bool = False
    n: int = 1
    seeded: bool = False
    expect: int = 200  # the status a correct server answers
    what: str = ""  # for an invalid body: what is wrong with it
    slow: float = 0.0  # seconds the reader pauses between chunks
    drop_after: int = 0  # a dropped stream: data lines read before the client goes away
    request_id: str | None = None  # the X-Request-Id sent ("soak-..." valid, others not)


@dataclass
class Result:
    """What one planned request got."""

    planned: Planned
    outcome: str = "error"  # "ok", "4xx", "503-retried", "disconnected" or "error"
    status: int | None = None
    retries: int = 0
    ttft: float | None = None
    latency: float | None = None
    problems: list[tuple[str, str]] = field(default_factory=list)  # (check, what went wrong)
    texts: list[str] = field(default_factory=list)  # per choice
    calls: list[list[tuple[str, str]]] = field(default_factory=list)  # per choice: (name, arguments)
    finishes: list[str | None] = field(default_factory=list)
    logprobs: list[list[tuple[str, float]]] = field(default_factory=list)  # per choice: (token, logprob), if asked
    responses: list[list] = field(default_factory=list)  # [X-Request-Id, status, path, dropped by the client]


def plan(rng: random.Random, index: int, max_tokens: int, model: str, logprobs: bool = False) -> Planned:
    """The `index`-th request: drawn from `rng` (call in index order for a reproducible run).
    `logprobs`: seeded requests ask for their tokens' log-probabilities (draws nothing more)."""
    kind = rng.choices(KINDS, WEIGHTS)[0]
    rid = None
    roll = rng.random()
    if roll < 0.5:
        rid = f"soak-{index}"
    elif roll < 0.55:
        rid = rng.choice(["has spaces", "x" * 129, "slash/inside"])  # the server makes a new one
    if kind == "invalid":
        what, endpoint, body, status = INVALID[rng.randrange(len(INVALID))]
        return Planned(index, kind, endpoint, body, expect=status, what=what, request_id=rid)
    endpoint = "completion" if kind == "completion" or (kind in ("grammar", "regex", "disconnect")
                                                        and rng.random() < 0.5) else "chat"
    if kind in ("responses", "messages"):
        return other_api(rng, index, kind, max_tokens, model, rid)
    long = rng.random() < 0.6
    topic, audience = rng.choice(TOPICS), rng.choice(AUDIENCES)
    if endpoint == "chat":
        messages = [{"role": "system", "content": rng.choice(SYSTEMS)}] if long else (
            [{"role": "system", "content": "Be brief."}] if rng.random() < 0.5 else [])
        if long and rng.random() < 0.3:  # an earlier exchange: a longer shared prefix
            messages += [{"role": "user", "content": f"{audience} asks about {TOPICS[0]}."},
                         {"role": "assistant", "content": "Gladly. What would you like to know?"}]
        messages.append({"role": "user", "content": f"{audience} asks about {topic}."})
        body = {"messages": messages}
    else:
        body = {"prompt": (rng.choice(DOCUMENTS) + f"\n\nQ: {audience} asks about {topic}.\nA:") if long
                else f"{topic.capitalize()} are"}
    body["max_tokens"] = rng.randint(1, max_tokens)
    body["temperature"] = rng.choice([0.0, 0.7, 1.0, 1.0])
    if rng.random() < 0.5:
        body["model"] = model
    if rng.random() < 0.15:
        body["top_p"] = 0.9
    p = Planned(index, kind, endpoint, body, request_id=rid)
    p.stream = kind == "disconnect" or rng.random() < 0.5
    p.n = rng.choice([1, 1, 1, 1, 2, 3])
    if p.n > 1:
        body["n"] = p.n
    p.seeded = kind != "disconnect" and rng.random() < 0.5
    if p.seeded:
        body["seed"] = rng.randrange(10_000)
    if kind in ("chat", "completion") and rng.random() < 0.25:
        body["stop"] = rng.choice(STOPS)
    if kind == "chat" and rng.random() < 0.1:
        body.update(logprobs=True, top_logprobs=2)
    if kind == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}
        body["max_tokens"] = max(max_tokens, 24)
    elif kind == "tool":
        body.update(tools=TOOLS, tool_choice={"type": "function", "function": {"name": rng.choice(["get_weather",
                                                                                                    "get_time"])}})
        body["max_tokens"] = max(max_tokens, 48)  # a call takes ~30 tokens
    elif kind == "grammar":
        body["grammar"] = GRAMMAR
    elif kind == "regex":
        body["regex"] = REGEX
    elif kind == "disconnect":
        body["max_tokens"] = 4 * max_tokens
        p.drop_after = rng.randint(1, 3)
    if p.stream:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
        if rng.random() < 0.2:
            p.slow = rng.uniform(0.05, 0.25)
    if logprobs and p.seeded and "logprobs" not in body:
        body["logprobs"] = True if endpoint == "chat" else 0
    return p


def other_api(rng: random.Random, index: int, kind: str, max_tokens: int, model: str, rid: str | None) -> Planned:
    """A chat request as the Responses API or Anthropic's Messages API spells it: a shared
    system prompt (as instructions / system), the question, one choice, maybe streamed,
    seeded, with stop sequences or a forced tool call."""
    topic, audience = rng.choice(TOPICS), rng.choice(AUDIENCES)
    system, question = rng.choice(SYSTEMS), f"{audience} asks about {topic}."
    body: dict = {"model": model} if rng.random() < 0.5 else {}
    tool = rng.random() < 0.2
    limit = max(max_tokens, 48) if tool else rng.randint(1, max_tokens)
    if kind == "responses":
        body.update(instructions=system, input=[{"role": "user", "content": question}] if rng.random() < 0.5
                    else question, max_output_tokens=limit)
        if tool:
            name = rng.choice(["get_weather", "get_time"])
            body.update(tools=[{"type": "function", **t["function"]} for t in TOOLS],
                        tool_choice={"type": "function", "name": name})
    else:
        body.update(system=system, messages=[{"role": "user", "content": question}], max_tokens=limit)
        if tool:
            name = rng.choice(["get_weather", "get_time"])
            body.update(tools=[{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
                               for t in TOOLS], tool_choice={"type": "tool", "name": name})
        elif rng.random() < 0.25:
            body["stop_sequences"] = rng.choice(STOPS)
    body["temperature"] = rng.choice([0.0, 0.7, 1.0])
    p = Planned(index, kind, kind, body, request_id=rid)
    p.stream = rng.random() < 0.5
    p.seeded = rng.random() < 0.5
    if p.seeded:
        body["seed"] = rng.randrange(10_000)
    if p.stream:
        body["stream"] = True
        if rng.random() < 0.2:
            p.slow = rng.uniform(0.05, 0.25)
    return p


def forced_tool(p: Planned) -> str | None:
    """The function a request forces, whichever API spells it."""
    choice = p.body.get("tool_choice") if isinstance(p.body, dict) else None
    if not isinstance(choice, dict):
        return None
    return (choice.get("function") or {}).get("name") or choice.get("name")


# ---------------------------------------------------------------- answers and their shapes

def error_problem(data, endpoint: str = "chat") -> str | None:
    """Why `data` is not the endpoint's error object (None if it is one): OpenAI's, or on
    /v1/messages Anthropic's (`{"type": "error", "error": {...}}`)."""
    error = data.get("error") if isinstance(data, dict) else None
    if endpoint == "messages" and (not isinstance(data, dict) or data.get("type") != "error"):
        return f"not an Anthropic error object: {json.dumps(data)[:200]}"
    if not isinstance(error, dict):
        return f"not an OpenAI error object: {json.dumps(data)[:200]}"
    if not isinstance(error.get("message"), str) or not error["message"] or not isinstance(error.get("type"), str):
        return f"an error object without message or type: {json.dumps(data)[:200]}"
    return None


def token_logprobs(endpoint: str, logprobs) -> list[tuple[str, float]]:
    """(token, logprob) pairs of a choice's `logprobs` (the chat or the completions shape)."""
    if not isinstance(logprobs, dict):
        return []
    if endpoint == "chat":
        return [(e.get("token"), e.get("logprob")) for e in logprobs.get("content") or [] if isinstance(e, dict)]
    return list(zip(logprobs.get("tokens") or [], logprobs.get("token_logprobs") or []))


def read_whole(p: Planned, data) -> tuple[list[str], list[list[tuple[str, str]]], list[str | None], list[list],
                                          list[str]]:
    """Texts, tool calls, finish reasons and token log-probabilities per choice of a whole (not
    streamed) answer, and what is wrong with its shape."""
    texts, calls, finishes, wrong = [""] * p.n, [[] for _ in range(p.n)], [None] * p.n, []
    logprobs = [[] for _ in range(p.n)]
    if p.endpoint in ("responses", "messages"):
        texts[0], calls[0], finishes[0], wrong = read_other(p.endpoint, data)
        return texts, calls, finishes, logprobs, wrong
    kind = "chat.completion" if p.endpoint == "chat" else "text_completion"
    if not isinstance(data, dict) or data.get("object") != kind or not isinstance(data.get("choices"), list):
        return texts, calls, finishes, logprobs, [f"not a {kind}: {json.dumps(data)[:200]}"]
    if sorted(c.get("index") for c in data["choices"] if isinstance(c, dict)) != list(range(p.n)):
        wrong.append(f"choices {[c.get('index') for c in data['choices']]} for n={p.n}")
    for c in data["choices"]:
        i = c.get("index") if isinstance(c, dict) else None
        if not isinstance(i, int) or not 0 <= i < p.n:
            continue
        finishes[i] = c.get("finish_reason")
        logprobs[i] = token_logprobs(p.endpoint, c.get("logprobs"))
        if p.endpoint == "chat":
            message = c.get("message") or {}
            texts[i] = message.get("content") or ""
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {} if isinstance(call, dict) else {}
                calls[i].append((function.get("name"), function.get("arguments")))
        else:
            texts[i] = c.get("text")
            if not isinstance(texts[i], str):
                wrong.append(f"choice {i}: text is {texts[i]!r}")
    if not isinstance(data.get("usage"), dict):
        wrong.append("no usage")
    return texts, calls, finishes, logprobs, wrong


def read_other(endpoint: str, data) -> tuple[str, list[tuple[str, str]], str | None, list[str]]:
    """Text, tool calls (name, arguments JSON), finish (in chat's words) and what is wrong, of
    a whole Responses object or Anthropic message."""
    text, calls = "", []
    if endpoint == "responses":
        if not isinstance(data, dict) or data.get("object") != "response" or not isinstance(data.get("output"), list):
            return text, calls, None, [f"not a response: {json.dumps(data)[:200]}"]
        for item in data["output"]:
            if item.get("type") == "message":
                text += "".join(part.get("text", "") for part in item.get("content") or [])
            elif item.get("type") == "function_call":
                calls.append((item.get("name"), item.get("arguments")))
        finish = "tool_calls" if calls and data.get("status") == "completed" else ENDED.get(data.get("status"))
        wrong = [] if isinstance(data.get("usage"), dict) else ["no usage"]
        return text, calls, finish, wrong
    if not isinstance(data, dict) or data.get("type") != "message" or not isinstance(data.get("content"), list):
        return text, calls, None, [f"not a message: {json.dumps(data)[:200]}"]
    for block in data["content"]:
        if block.get("type") == "text":
            text += block.get("text", "")
        elif block.get("type") == "tool_use":
            calls.append((block.get("name"), json.dumps(block.get("input"))))
    wrong = [] if isinstance(data.get("usage"), dict) else ["no usage"]
    return text, calls, ENDED.get(data.get("stop_reason"), data.get("stop_reason")), wrong


class EventReader:
    """One streamed answer of the Responses API or Anthropic's Messages API, event by event
    (`event: NAME` then `data: JSON`): its text, tool calls and end, what is wrong (an event
    out of its API's order, sequence numbers that do not grow, an error event), and when the
    first token came. The same interface as `StreamReader`."""

    def __init__(self, p: Planned):
        self.p = p
        self.texts, self.finishes, self.logprobs = [""], [None], [[]]
        self.calls: list[dict[int, list[str]]] = [{}]
        self.wrong: list[str] = []
        self.done, self.data_lines, self.first_token = False, 0, None
        self.sequence, self.name = -1, None

    def feed(self, line: str) -> None:
        if line.startswith("event:"):
            self.name = line[6:].strip()
            return
        if not line.startswith("data:"):
            return
        self.data_lines += 1
        try:
            event = json.loads(line[5:].strip())
        except json.JSONDecodeError:
            self.wrong.append(f"an event that is not JSON: {line[:100]}")
            return
        kind = event.get("type") if isinstance(event, dict) else None
        if kind != self.name:
            self.wrong.append(f"event {self.name!r} holds type {kind!r}")
        if self.done:
            self.wrong.append(f"an event after the last: {kind}")
            return
        got = (self.responses_event if self.p.endpoint == "responses" else self.messages_event)(event, kind)
        if got and self.first_token is None:
            self.first_token = time.perf_counter()

    def responses_event(self, event: dict, kind: str) -> bool:
        number = event.get("sequence_number")
        if not isinstance(number, int) or number != self.sequence + 1:
            self.wrong.append(f"sequence_number {number!r} after {self.sequence}")
        self.sequence = number if isinstance(number, int) else self.sequence
        if kind == "response.output_text.delta":
            self.texts[0] += event.get("delta", "")
            return True
        if kind == "response.output_item.added" and (event.get("item") or {}).get("type") == "function_call":
            self.calls[0][event.get("output_index", 0)] = [event["item"].get("name", ""), ""]
            return True
        if kind == "response.function_call_arguments.delta":
            self.calls[0].setdefault(event.get("output_index", 0), ["", ""])[1] += event.get("delta", "")
        elif kind in ("response.completed", "response.incomplete"):
            response = event.get("response") or {}
            status = response.get("status")
            self.finishes[0] = "tool_calls" if self.calls[0] and status == "completed" else ENDED.get(status)
            self.done = True
        elif kind in ("response.failed", "error"):
            self.wrong.append(f"the stream failed: {json.dumps(event)[:200]}")
            self.done = True
        return False

    def messages_event(self, event: dict, kind: str) -> bool:
        if kind == "content_block_start" and (event.get("content_block") or {}).get("type") == "tool_use":
            self.calls[0][event.get("index", 0)] = [event["content_block"].get("name", ""), ""]
            return True
        if kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                self.texts[0] += delta.get("text", "")
                return True
            if delta.get("type") == "input_json_delta":
                self.calls[0].setdefault(event.get("index", 0), ["", ""])[1] += delta.get("partial_json", "")
        elif kind == "message_delta":
            reason = (event.get("delta") or {}).get("stop_reason")
            self.finishes[0] = ENDED.get(reason, reason)
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            self.wrong.append(f"an error event: {json.dumps(event)[:200]}")
            self.done = True
        return False

    def finish(self) -> list[str]:
        wrong = list(self.wrong)
        if not self.done:
            wrong.append("the stream ended without its last event")
        if self.finishes[0] is None and not self.wrong:
            wrong.append("no end reason")
        return wrong


class StreamReader:
    """The state of one streamed answer, chunk by chunk: per choice its text, tool calls
    and finish reason; what is wrong; when the first token came."""

    def __init__(self, p: Planned):
        self.p = p
        self.texts, self.finishes = [""] * p.n, [None] * p.n
        self.logprobs: list[list[tuple[str, float]]] = [[] for _ in range(p.n)]
        self.calls: list[dict[int, list[str]]] = [{} for _ in range(p.n)]  # per choice: index -> [name, arguments]
        self.wrong: list[str] = []
        self.done, self.usage, self.data_lines, self.first_token = False, None, 0, None

    def feed(self, line: str) -> None:
        if not line.startswith("data:"):
            return  # blank lines and SSE comments
        self.data_lines += 1
        data = line[5:].strip()
        if self.done:
            self.wrong.append(f"data after [DONE]: {data[:100]}")
            return
        if data == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            self.wrong.append(f"a chunk that is not JSON: {data[:100]}")
            return
        if isinstance(chunk, dict) and "error" in chunk:
            self.wrong.append(f"an error chunk: {json.dumps(chunk)[:200]}")
            return
        kind = "chat.completion.chunk" if self.p.endpoint == "chat" else "text_completion"
        if not isinstance(chunk, dict) or chunk.get("object") != kind or not isinstance(chunk.get("choices"), list):
            self.wrong.append(f"not a {kind}: {data[:200]}")
            return
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for c in chunk["choices"]:
            i = c.get("index")
            if not isinstance(i, int) or not 0 <= i < self.p.n:
                self.wrong.append(f"choice index {i!r} for n={self.p.n}")
                continue
            if self.p.endpoint == "chat":
                delta = c.get("delta") or {}
                text = delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    entry = self.calls[i].setdefault(call.get("index", 0), ["", ""])
                    function = call.get("function") or {}
                    entry[0] += function.get("name") or ""
                    entry[1] += function.get("arguments") or ""
                got = bool(text or delta.get("tool_calls"))
            else:
                text = c.get("text") or ""
                got = bool(text)
            self.texts[i] += text
            self.logprobs[i] += token_logprobs(self.p.endpoint, c.get("logprobs"))
            if got and self.first_token is None:
                self.first_token = time.perf_counter()
            if c.get("finish_reason"):
                if self.finishes[i]:
                    self.wrong.append(f"choice {i} finished twice")
                self.finishes[i] = c["finish_reason"]

    def finish(self) -> list[str]:
        """What is wrong with the stream as a whole (it has ended)."""
        wrong = list(self.wrong)
        if not self.done:
            wrong.append("the stream ended without data: [DONE]")
        if None in self.finishes:
            wrong.append(f"choices without a finish_reason: {[i for i, f in enumerate(self.finishes) if not f]}")
        if (self.p.body.get("stream_options") or {}).get("include_usage") and not self.usage and not self.wrong:
            wrong.append("include_usage asked, no usage chunk")
        return wrong


def constraint_problem(p: Planned, text: str, calls: list[tuple[str, str]], finish: str | None) -> str | None:
    """Why a choice that finished does not follow its request's constraint (None if it does).
    A choice cut by max_tokens ("length") is only a prefix and is not checked."""
    if finish == "length":
        return None
    try:
        if p.kind == "json_schema":
            value = json.loads(text)
            ok = (isinstance(value, dict) and set(value) == {"answer", "score"} and value["answer"] in ("yes", "no")
                  and isinstance(value["score"], int) and 0 <= value["score"] <= 9)
        elif p.kind == "tool" or (p.kind in ("responses", "messages") and forced_tool(p)):
            forced = forced_tool(p)
            ok = finish == "tool_calls" and [name for name, _ in calls] == [forced]
            arguments = json.loads(calls[0][1]) if ok else None
            ok = ok and isinstance(arguments, dict) and set(arguments) == set(
                (WEATHER if forced == "get_weather" else TIME)["function"]["parameters"]["required"])
        elif p.kind == "grammar":
            ok = GRAMMAR_MATCHES.fullmatch(text) is not None
        elif p.kind == "regex":
            ok = re.fullmatch(REGEX, text) is not None
        else:
            return None
    except (json.JSONDecodeError, IndexError):
        ok = False
    return None if ok else f"{p.kind}: finish {finish!r}, reply {text!r} calls {calls!r} does not follow it"


# ---------------------------------------------------------------- sending

def headers_for(p: Planned, attempt: int) -> dict:
    h = {"Content-Type": "application/json"}
    if p.request_id is not None:
        h["X-Request-Id"] = p.request_id + (f".{attempt}" if attempt and p.request_id.startswith("soak-") else "")
    return h


def check_request_id(r: Result, sent: str | None, got: str | None) -> None:
    if got is None:
        r.problems.append(("X-Request-Id on every response", f"request {r.planned.index}: no X-Request-Id"))
    elif sent is not None and REQUEST_ID.fullmatch(sent) and got != sent:
        r.problems.append(("X-Request-Id on every response", f"sent {sent!r}, got back {got!r}"))
    elif (sent is None or not REQUEST_ID.fullmatch(sent)) and not NEW_REQUEST_ID.fullmatch(got):
        r.problems.append(("X-Request-Id on every response", f"sent {sent!r}, got {got!r}, not req-<24 hex>"))


async def send(client: httpx.AsyncClient, base: str, p: Planned, max_retries: int) -> Result:
    """Send `p` (again after each 503, at most `max_retries` times) and judge the answer."""
    r = Result(p)
    path = PATHS[p.endpoint]
    content = p.body if isinstance(p.body, bytes) else json.dumps(p.body).encode()
    start = time.perf_counter()
    for attempt in range(max_retries + 1):
        headers = headers_for(p, attempt)
        reader = (StreamReader if p.endpoint in ("chat", "completion") else EventReader)(p) if p.stream else None
        dropped = False
        try:
            async with client.stream("POST", base + path, content=content, headers=headers) as response:
                r.status = response.status_code
                rid = response.headers.get("x-request-id")
                r.responses.append([rid, r.status, path, False])
                check_request_id(r, headers.get("X-Request-Id"), rid)
                if r.status == 200 and reader is not None:
                    async for line in response.aiter_lines():
                        reader.feed(line)
                        if p.drop_after and reader.data_lines >= p.drop_after and not reader.done:
                            dropped = r.responses[-1][3] = True
                            break  # leaving the block closes the connection mid-stream
                        if p.slow:
                            await asyncio.sleep(p.slow)
                    raw = b""
                else:
                    raw = await response.aread()
                retry_after = response.headers.get("retry-after")
        except httpx.HTTPError as e:
            r.problems.append(("responses complete", f"request {p.index} ({p.kind}): {type(e).__name__}: {e}"))
            r.latency = time.perf_counter() - start
            return r
        r.latency = time.perf_counter() - start
        if r.status == 503 and attempt < max_retries:
            try:
                delay = float(retry_after)
            except (TypeError, ValueError):
                r.problems.append(("no 5xx but 503 with Retry-After",
                                   f"request {p.index}: 503 with Retry-After {retry_after!r} (seconds expected)"))
                return r
            r.retries += 1
            await asyncio.sleep(min(max(delay, 0.0), 10.0))
            continue
        break
    judge(r, reader, raw, dropped)
    if reader is not None and reader.first_token is not None:
        r.ttft = reader.first_token - start
    return r


def judge(r: Result, reader: StreamReader | None, raw: bytes, dropped: bool) -> None:
    """Sort the final answer into an outcome and note every problem with it."""
    p = r.planned
    if r.status != 200:
        try:
            problem = error_problem(json.loads(raw), p.endpoint)
        except (json.JSONDecodeError, UnicodeDecodeError):
            problem = f"a body that is not JSON: {raw[:200]!r}"
        if problem:
            r.problems.append(("responses complete", f"request {p.index} ({p.kind}) status {r.status}: {problem}"))
        if r.status >= 500:
            detail = "retries exhausted" if r.status == 503 else raw[:200].decode(errors="replace")
            r.problems.append(("no 5xx but 503 with Retry-After", f"request {p.index} ({p.kind}): {r.status} {detail}"))
        if p.kind == "invalid":
            if r.status != p.expect:
                r.problems.append(("invalid bodies get 4xx", f"{p.what}: expected {p.expect}, got {r.status}"))
            else:
                r.outcome = "4xx"
        else:
            r.problems.append(("valid bodies get 200", f"request {p.index} ({p.kind}) got {r.status}: "
                               f"{raw[:200].decode(errors='replace')}"))
        return
    if p.kind == "invalid":
        r.problems.append(("invalid bodies get 4xx", f"{p.what}: expected {p.expect}, got 200"))
        return
    if reader is not None:
        if dropped:
            r.outcome = "disconnected"
            return
        wrong = reader.finish()
        r.texts, r.finishes, r.logprobs = reader.texts, reader.finishes, reader.logprobs
        r.calls = [[tuple(c[k]) for k in sorted(c)] for c in reader.calls]
    else:
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            data = raw[:200]
        r.texts, r.calls, r.finishes, r.logprobs, wrong = read_whole(p, data)
    bad_finish = [f for f in r.finishes if f is not None and f not in FINISH]
    if bad_finish:
        wrong.append(f"finish_reason {bad_finish[0]!r}")
    how = "stream" if p.stream else "whole"
    for w in wrong:
        r.problems.append(("responses complete", f"request {p.index} ({p.kind}, {how}): {w}"))
    if not wrong:
        for i in range(p.n):
            problem = constraint_problem(p, r.texts[i], r.calls[i], r.finishes[i])
            if problem:
                r.problems.append(("constrained replies match", f"request {p.index} choice {i}: {problem}"))
        r.outcome = "503-retried" if r.retries else "ok"


# ---------------------------------------------------------------- watching the server

def parse_metrics(text: str) -> dict[str, float]:
    """Every sample line of a Prometheus text page, by its name with labels."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            pass
    return out


def proc_rss(pid: int) -> float | None:
    """VmRSS of process `pid` in bytes, from /proc (None when unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class Monitor(threading.Thread):
    """A thread of its own (so the traffic's event loop does not delay it): `GET /health`
    every HEALTH_EVERY seconds, with its latency; `GET /metrics` and resident memory every
    SAMPLE_EVERY seconds."""

    def __init__(self, base: str, pid: int | None, done_count):
        super().__init__(name="soak-monitor", daemon=True)
        self.base, self.pid, self.done_count = base, pid, done_count
        self.client = httpx.Client(timeout=10)
        self.stop = threading.Event()
        self.health: list[tuple[float, float, int | None]] = []  # (t, seconds, status or None: no answer)
        self.samples: list[dict] = []
        self.responses: list[list] = []  # as Result.responses
        self.lock = threading.Lock()  # one request of ours at a time (the main thread samples too)
        self.t0 = time.perf_counter()

    def get(self, path: str) -> httpx.Response:
        response = self.timed_get(path)[0]
        if response is None:
            raise httpx.TransportError(f"no answer to GET {path}")
        return response

    def timed_get(self, path: str) -> tuple[httpx.Response | None, float, float]:
        """The response (None: no answer), when it was sent and the seconds it took (the
        wait for the lock left out)."""
        with self.lock:
            sent = time.perf_counter()
            try:
                response = self.client.get(self.base + path)
            except httpx.HTTPError:
                response = None
            seconds = time.perf_counter() - sent
        if response is not None:
            self.responses.append([response.headers.get("x-request-id"), response.status_code, path, False])
        return response, sent, seconds

    def poll_health(self) -> None:
        response, sent, seconds = self.timed_get("/health")
        self.health.append((sent - self.t0, seconds, response.status_code if response is not None else None))

    def metrics(self) -> dict[str, float]:
        try:
            response = self.get("/metrics")
        except httpx.HTTPError:
            return {}
        return parse_metrics(response.text) if response.status_code == 200 else {}

    def sample(self) -> dict:
        m = self.metrics()
        rss, source = m.get(RSS), "metrics"
        if rss is None and self.pid is not None:
            rss, source = proc_rss(self.pid), "/proc"
        s = {"t": time.perf_counter() - self.t0, "requests": self.done_count(), "rss": rss,
             "rss_source": source if rss is not None else None, "metrics": m}
        self.samples.append(s)
        return s

    def run(self) -> None:
        next_sample = 0.0
        while not self.stop.is_set():
            self.poll_health()
            if time.perf_counter() - self.t0 >= next_sample:
                self.sample()
                next_sample += SAMPLE_EVERY
            self.stop.wait(HEALTH_EVERY)


# ---------------------------------------------------------------- the run

def concurrency_at(t: float, most: int, period: float) -> int:
    """Clients allowed at second `t`: from 1 up to `most` and back, a sine wave of `period` s."""
    return 1 + round((most - 1) * (1 - math.cos(2 * math.pi * t / period)) / 2)


async def traffic(args, base: str, model: str, results: list[Result]) -> tuple[float, float]:
    """Send the plan until --minutes or --requests is reached; when it started
    (`time.perf_counter()`) and the seconds it took."""
    rng = random.Random(args.seed)
    most = args.concurrency
    limits = httpx.Limits(max_connections=most + 4, max_keepalive_connections=most + 4)
    start = time.perf_counter()
    deadline = start + args.minutes * 60
    sent = 0

    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout, connect=10), limits=limits) as client:
        async def worker(k: int):
            nonlocal sent
            while True:
                now = time.perf_counter()
                if now >= deadline or (args.requests is not None and sent >= args.requests):
                    return
                if k >= concurrency_at(now - start, most, args.period):
                    await asyncio.sleep(0.2)
                    continue
                p = plan(rng, sent, args.max_tokens, model, args.logprobs)
                sent += 1
                results.append(await send(client, base, p, args.max_retries))

        await asyncio.gather(*(worker(k) for k in range(most)))
    return start, time.perf_counter() - start


def pick_solo(results: list[Result], count: int) -> list[Result]:
    """Up to `count` seeded requests that were answered whole: round robin over kinds, each
    kind's spread over the run."""
    by_kind = defaultdict(list)
    for r in results:
        if r.planned.seeded and r.outcome in ("ok", "503-retried") and not r.problems:
            by_kind[r.planned.kind].append(r)
    per = math.ceil(count / max(1, len(by_kind)))
    queues = {k: [v[j * len(v) // min(per, len(v))] for j in range(min(per, len(v)))] for k, v in by_kind.items()}
    out = []
    while len(out) < count and any(queues.values()):
        for k in sorted(queues):
            if queues[k] and len(out) < count:
                out.append(queues[k].pop(0))
    return out


async def solo_runs(args, base: str, picked: list[Result]) -> list[tuple[Result, Result]]:
    """Each picked request sent again, one at a time (the server has nothing else to do)."""
    out = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout, connect=10)) as client:
        for r in picked:
            p = Planned(**{**r.planned.__dict__, "request_id": None, "slow": 0.0})
            out.append((r, await send(client, base, p, args.max_retries)))
    return out


def settle(monitor: Monitor, seconds: float) -> dict:
    """Wait (at most `seconds`) until the server is idle: no rows, no queue, no open request,
    pages held only by the prefix cache. The last /metrics sample."""
    deadline = time.perf_counter() + seconds
    while True:
        s = monitor.sample()
        m = s["metrics"]
        idle = (m and m.get(RUNNING, 0) == 0 and m.get(QUEUE, 0) == 0 and m.get(OPEN, 0) <= 1
                and m.get(PAGES, 0) == m.get(PREFIX_PAGES, 0))  # OPEN <= 1: a server may count this scrape
        if idle or time.perf_counter() > deadline:
            return s
        time.sleep(0.5)


# ---------------------------------------------------------------- checks

@dataclass
class Check:
    name: str
    status: str  # "PASS", "FAIL", "MISSING" (the server lacks what it needs) or "N/A"
    detail: str

    def line(self) -> str:
        return f"{self.status:7s} {self.name}: {self.detail}"


def first_difference(r: Result, again: Result) -> str:
    """Where two answers' token log-probabilities part (with --logprobs), as a note."""
    for i, (a, b) in enumerate(zip(r.logprobs, again.logprobs)):
        for k, (x, y) in enumerate(zip(a, b)):
            if x != y:
                before = max((abs(u[1] - v[1]) for u, v in zip(a[:k], b[:k])), default=0.0)
                return (f" [choice {i} token {k}: under load {x}, alone {y}; the {k} tokens before it equal, "
                        f"their logprobs differ by at most {before:.2e}]")
    return ""


def problem_check(name: str, results: list[Result], ok_detail: str) -> Check:
    problems = [msg for r in results for check, msg in r.problems if check == name]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        return Check(name, "FAIL", f"{len(problems)} problems: " + "; ".join(problems[:3]) + more)
    return Check(name, "PASS", ok_detail)


def checks(args, results, solo, monitor, final, warmup_end, server, log_text, exit_code) -> list[Check]:
    out = []
    answered = [r for r in results if r.status is not None]
    invalid = [r for r in results if r.planned.kind == "invalid"]
    valid = [r for r in results if r.planned.kind != "invalid"]
    out.append(problem_check("responses complete", results, f"{len(answered)} answers well formed "
                             f"({sum(r.planned.stream for r in answered)} streams)"))
    out.append(problem_check("invalid bodies get 4xx", results, f"{len(invalid)} invalid bodies refused"))
    out.append(problem_check("valid bodies get 200", results, f"{len(valid)} valid requests answered 200"))
    retried = sum(r.retries > 0 for r in results)
    out.append(problem_check("no 5xx but 503 with Retry-After", results,
                             f"no 5xx; {retried} requests retried after a 503"))
    constrained = sum(r.planned.kind in ("json_schema", "tool", "grammar", "regex") and r.outcome != "error"
                      for r in results)
    out.append(problem_check("constrained replies match", results, f"{constrained} constrained replies checked"))

    name = "seeded requests equal solo runs"
    if not solo:
        out.append(Check(name, "MISSING", "no seeded request was answered whole, nothing to compare"))
    else:
        differ = []
        for r, again in solo:
            if (r.texts, r.calls, r.finishes) != (again.texts, again.calls, again.finishes):
                differ.append(f"request {r.planned.index} ({r.planned.kind}, n={r.planned.n}, "
                              f"{'stream' if r.planned.stream else 'whole'}): under load {r.texts!r} {r.calls!r} "
                              f"{r.finishes}, alone {again.texts!r} {again.calls!r} {again.finishes} "
                              f"(status {again.status})" + first_difference(r, again))
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(Counter(r.planned.kind for r, _ in solo).items()))
        out.append(Check(name, "FAIL", f"{len(differ)} of {len(solo)} differ: " + "; ".join(differ[:2]))
                   if differ else Check(name, "PASS", f"{len(solo)} equal ({kinds})"))

    name = f"health answers within {args.health_limit:g} s"
    latencies = [s for _, s, _ in monitor.health]
    bad = [(t, s, st) for t, s, st in monitor.health if st != 200 or s > args.health_limit]
    detail = (f"{len(latencies)} polls, max {max(latencies):.3f} s, p50 {percentile(latencies, 50):.3f} s"
              if latencies else "no polls")
    out.append(Check(name, "FAIL" if bad or not latencies else "PASS",
                     detail + (f"; {len(bad)} slow or not 200, first at {bad[0][0]:.1f} s: "
                               f"{bad[0][1]:.3f} s status {bad[0][2]}" if bad else "")))

    m = final.get("metrics") or {}

    def metric_check(name: str, needed: tuple[str, ...], test, detail) -> Check:
        if not m:
            return Check(name, "MISSING", "no /metrics answer")
        missing = [k for k in needed if k not in m]
        if missing:
            return Check(name, "MISSING", f"the server has no {', '.join(missing)} in /metrics")
        return Check(name, "PASS" if test() else "FAIL", detail())

    out.append(metric_check("idle: no rows, no queue", (RUNNING, QUEUE),
                            lambda: m[RUNNING] == 0 and m[QUEUE] == 0 and m.get(OPEN, 0) <= 1,
                            lambda: f"{RUNNING} {m[RUNNING]:g}, {QUEUE} {m[QUEUE]:g}"
                            + (f", {OPEN} {m[OPEN]:g}" if OPEN in m else "")))
    out.append(metric_check("idle: pages only in the prefix cache", (PAGES, PREFIX_PAGES),
                            lambda: m[PAGES] == m[PREFIX_PAGES],
                            lambda: f"{PAGES} {m[PAGES]:g}, {PREFIX_PAGES} {m[PREFIX_PAGES]:g}"))
    out.append(metric_check("idle: prefix cache within budget", (IDLE_BYTES, BUDGET_BYTES),
                            lambda: m[IDLE_BYTES] <= m[BUDGET_BYTES],
                            lambda: f"{IDLE_BYTES} {m[IDLE_BYTES] / 2**20:.1f} MiB, "
                                    f"{BUDGET_BYTES} {m[BUDGET_BYTES] / 2**20:.1f} MiB"))
    out.append(metric_check("no engine failures", (FAILURES,), lambda: m[FAILURES] == 0,
                            lambda: f"{FAILURES} {m[FAILURES]:g}"))

    name = "resident memory growth"
    # The prefix cache may fill up to its budget (checked above): its idle bytes are left out.
    net = [(s["t"], s["rss"] - s["metrics"].get(IDLE_BYTES, 0.0)) for s in monitor.samples if s["rss"] is not None]
    before = [v for t, v in net if t <= warmup_end]
    after = [v for t, v in net if t > warmup_end]
    if not net:
        out.append(Check(name, "MISSING", f"no {RSS} in /metrics" + ("" if server else " (and --base-url: no /proc)")))
    elif not before or not after:
        out.append(Check(name, "MISSING", f"too few samples ({len(net)})"))
    else:
        growth = (max(after) - max(before)) / 2**20
        raw = [s["rss"] for s in monitor.samples if s["rss"] is not None]
        less = f" less {IDLE_BYTES}" if any(IDLE_BYTES in s["metrics"] for s in monitor.samples) else ""
        out.append(Check(name, "PASS" if growth <= args.rss_growth_mb else "FAIL",
                         f"{growth:+.1f} MiB after the warm-up (RSS{less}: max {max(after) / 2**20:.1f} MiB after, "
                         f"{max(before) / 2**20:.1f} MiB in the first {warmup_end:.0f} s; bound "
                         f"{args.rss_growth_mb:g} MiB; RSS {raw[0] / 2**20:.1f} MiB at the start, "
                         f"{max(raw) / 2**20:.1f} MiB at most, from {monitor.samples[-1]['rss_source']})"))

    name = "X-Request-Id on every response"
    responses = [x for r in results + [a for _, a in solo] for x in r.responses] + monitor.responses
    with_id = sum(rid is not None for rid, *_ in responses)
    if with_id == 0 and responses:
        out.append(Check(name, "MISSING", f"none of {len(responses)} responses has an X-Request-Id"))
    else:
        mon_missing = len(monitor.responses) - sum(rid is not None for rid, *_ in monitor.responses)
        c = problem_check(name, results + [a for _, a in solo], f"{with_id} responses, each with its id "
                          f"(the client's own when valid, else req-<24 hex>)")
        if mon_missing:
            c = Check(name, "FAIL", f"{mon_missing} /health or /metrics responses without an id; " + c.detail)
        out.append(c)

    name = "access log: one line per request"
    if server is None:
        out.append(Check(name, "N/A", "not our server (--base-url)"))
    else:
        lines = [ACCESS.match(line) for line in log_text.splitlines()]
        lines = [x for x in lines if x]
        if not lines:
            out.append(Check(name, "MISSING", "no 'tiny-llm: access:' line in the server's log"))
        else:
            logged = Counter(x[1] for x in lines)
            status = {x[1]: int(x[4]) for x in lines}
            wrong = []
            for rid, st, path, dropped in responses:
                if rid is None:
                    continue
                if logged[rid] != 1:
                    wrong.append(f"{path} id={rid}: {logged[rid]} lines")
                elif status[rid] != st and not dropped:
                    wrong.append(f"{path} id={rid}: logged status {status[rid]}, answered {st}")
            api = [x for x in lines if x[3].startswith("/v1/")]
            api_answered = sum(path.startswith("/v1/") for _, _, path, _ in responses)
            if len(api) != api_answered:
                wrong.append(f"{len(api)} lines for /v1/ paths, {api_answered} answers")
            out.append(Check(name, "FAIL", f"{len(wrong)} problems: " + "; ".join(wrong[:3])) if wrong else
                       Check(name, "PASS", f"{len(lines)} lines, each answered request once"))
    if server is not None:
        trace = log_text.count("Traceback")
        out.append(Check("server log has no traceback", "FAIL" if trace else "PASS",
                         f"{trace} tracebacks" if trace else "none"))
        out.append(Check("server exits 0 on SIGTERM", "PASS" if exit_code == 0 else "FAIL",
                         f"exit status {exit_code}"))
    return out


# ---------------------------------------------------------------- report

def outcome_table(results: list[Result]) -> str:
    lines = ["| kind | sent | streamed | ok | 4xx | 503-retried | disconnected | error | TTFT p50 (s) | TTFT p99 (s) "
             "| latency p50 (s) | latency p99 (s) |", "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for kind in (*KINDS, "all"):
        rs = [r for r in results if kind in ("all", r.planned.kind)]
        c = Counter(r.outcome for r in rs)
        ttft = [r.ttft for r in rs if r.ttft is not None and r.outcome in ("ok", "503-retried")]
        lat = [r.latency for r in rs if r.latency is not None and r.outcome in ("ok", "503-retried")]
        lines.append(f"| {kind} | {len(rs)} | {sum(r.planned.stream for r in rs)} | {c['ok']} | {c['4xx']} "
                     f"| {c['503-retried']} | {c['disconnected']} | {c['error']} "
                     f"| {fmt(percentile(ttft, 50), '.3f')} | {fmt(percentile(ttft, 99), '.3f')} "
                     f"| {fmt(percentile(lat, 50), '.3f')} | {fmt(percentile(lat, 99), '.3f')} |")
    return "\n".join(lines)


def sample_table(samples: list[dict], rows: int = 8) -> str:
    lines = ["| t (s) | requests done | RSS (MiB) | running rows | queue | KV pages in use | prefix cache pages "
             "| prefix idle (MiB) | open requests |", "|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    if not samples:
        return "\n".join(lines)
    picked = sorted({round(j * (len(samples) - 1) / (rows - 1)) for j in range(rows)})
    for s in (samples[i] for i in picked):
        m = s["metrics"]
        mib = lambda v: fmt(None if v is None else v / 2**20, ".1f")  # noqa: E731
        lines.append(f"| {s['t']:.0f} | {s['requests']} | {mib(s['rss'])} | {fmt(m.get(RUNNING), 'g')} "
                     f"| {fmt(m.get(QUEUE), 'g')} | {fmt(m.get(PAGES), 'g')} | {fmt(m.get(PREFIX_PAGES), 'g')} "
                     f"| {mib(m.get(IDLE_BYTES))} | {fmt(m.get(OPEN), 'g')} |")
    return "\n".join(lines)


def summary(results: list[Result]) -> dict:
    out = {}
    for kind in (*KINDS, "all"):
        rs = [r for r in results if kind in ("all", r.planned.kind)]
        good = [r for r in rs if r.outcome in ("ok", "503-retried")]
        ttft = [r.ttft for r in good if r.ttft is not None]
        lat = [r.latency for r in good if r.latency is not None]
        out[kind] = dict(sent=len(rs), streamed=sum(r.planned.stream for r in rs),
                         **{o: sum(r.outcome == o for r in rs) for o in ("ok", "4xx", "503-retried", "disconnected",
                                                                        "error")},
                         ttft_p50=percentile(ttft, 50), ttft_p99=percentile(ttft, 99),
                         latency_p50=percentile(lat, 50), latency_p99=percentile(lat, 99))
    return out


# ---------------------------------------------------------------- main

def loopback_url(url: str) -> str:
    """`url` without a trailing slash, if its host is a loopback address; else ValueError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or parts.hostname not in LOOPBACK:
        raise ValueError(f"--base-url must be http://127.0.0.1:PORT, http://localhost:PORT or http://[::1]:PORT "
                         f"(this script talks to this machine only), got {url!r}")
    return url.rstrip("/")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Soak test of tiny-llm serve: mixed traffic, then checks.")
    parser.add_argument("--minutes", type=float, default=5.0, help="how long the traffic runs (default 5)")
    parser.add_argument("--requests", type=int, default=None, help="stop after this many requests (default: none)")
    parser.add_argument("--model", default="default", help="model name or directory for tiny-llm serve (default "
                                                            "'default')")
    parser.add_argument("--base-url", default=None, help="a running server on this machine instead of starting one")
    parser.add_argument("--max-batch-size", type=int, default=4, help="the server's --max-batch-size B (default 4)")
    parser.add_argument("--concurrency", type=int, default=None, help="most clients at once (default 2 x B)")
    parser.add_argument("--period", type=float, default=40.0, help="seconds of one cycle of the client count "
                                                                   "(default 40)")
    parser.add_argument("--max-tokens", type=int, default=16, help="most tokens a plain request asks for (default 16; "
                                                                   "forced tools ask 48, dropped streams 4x)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the request plan (default 0)")
    parser.add_argument("--prefix-cache-bytes", default="32M",
                        help="the started server's prefix cache budget (default 32M: small, so that it fills and "
                             "evicts during the run)")
    parser.add_argument("--server-args", default="", help="more arguments for tiny-llm serve (one string)")
    parser.add_argument("--rss-growth-mb", type=float, default=RSS_GROWTH_MB,
                        help="most resident memory (MiB), less the prefix cache's idle bytes, may grow after the "
                             f"warm-up (default {RSS_GROWTH_MB:g}; see RSS_GROWTH_MB)")
    parser.add_argument("--solo", type=int, default=16, help="seeded requests sent again alone (default 16)")
    parser.add_argument("--logprobs", action="store_true",
                        help="seeded requests ask for log-probabilities: a solo run that differs shows where and "
                             "by how much (the plan is otherwise the same)")
    parser.add_argument("--health-limit", type=float, default=HEALTH_LIMIT,
                        help=f"seconds GET /health may take (default {HEALTH_LIMIT:g})")
    parser.add_argument("--max-retries", type=int, default=5, help="retries of a request answered 503 (default 5)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request (default 120)")
    parser.add_argument("--settle", type=float, default=15.0,
                        help="seconds to wait for the server to be idle after the traffic (default 15)")
    parser.add_argument("--start-timeout", type=float, default=120.0, help="seconds for the server to start")
    parser.add_argument("--server-log", default=None, help="keep the started server's log at this path")
    parser.add_argument("--strict", action="store_true", help="a MISSING check (metric or feature absent) fails")
    parser.add_argument("--json", default=None, help="write the numbers and checks to this file")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or (args.requests is not None and args.requests < 1) or args.max_tokens < 1:
        parser.error("need --minutes > 0, --requests >= 1 and --max-tokens >= 1")
    args.concurrency = args.concurrency or 2 * args.max_batch_size
    if args.concurrency < 1 or args.max_batch_size < 1:
        parser.error("need --max-batch-size >= 1 and --concurrency >= 1")
    if args.base_url:
        try:
            args.base_url = loopback_url(args.base_url)
        except ValueError as e:
            parser.error(str(e))

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    server = log_dir = None
    if not args.base_url:
        log_dir = Path(tempfile.mkdtemp(prefix="soak-serve-"))
        port = free_port()
        cmd = [str(Path(sys.executable).parent / "tiny-llm"), "serve", "--model", args.model, "--host", "127.0.0.1",
               "--port", str(port), "--max-batch-size", str(args.max_batch_size),
               "--prefix-cache-bytes", args.prefix_cache_bytes, *shlex.split(args.server_args)]
        server = Server("tiny", cmd, port, log_dir)
    base = server.url if server else args.base_url
    results: list[Result] = []
    monitor = None
    exit_code, log_text = None, ""
    solo, final, warmup_end, info = [], {}, 0.0, {}
    finished = False
    try:
        if server:
            server.start()
            why = server.wait_ready(args.start_timeout)
            if why:
                print(f"FAIL    server starts: {why}; last lines of its output:\n{server.tail()}", file=sys.stderr)
                return 1
        else:
            try:
                httpx.get(base + "/health", timeout=10)
            except httpx.HTTPError as e:
                print(f"FAIL    server answers: GET {base}/health: {type(e).__name__}: {e}", file=sys.stderr)
                return 1
        monitor = Monitor(base, server.proc.pid if server else None, lambda: len(results))
        try:
            model = monitor.get("/v1/models").json()["data"][0]["id"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            model = args.model
        info = machine_info(model=args.model, minutes=args.minutes, requests=args.requests,
                            max_batch_size=args.max_batch_size, concurrency=args.concurrency,
                            max_tokens=args.max_tokens, seed=args.seed,
                            command_server=" ".join(server.cmd) if server else args.base_url)
        print(f"{info['processor']}, {info['cpu_count']} CPUs; MLX {info['mlx']} ({info['device']})")
        print(f"server: {' '.join(server.cmd) if server else base} (model {model!r})")
        print(f"traffic: {args.minutes:g} min" + (f" or {args.requests} requests" if args.requests else "")
              + f", 1 to {args.concurrency} clients (sine, period {args.period:g} s), max_tokens {args.max_tokens}, "
                f"seed {args.seed}; resident memory may grow {args.rss_growth_mb:g} MiB after the warm-up (the "
                f"first {WARMUP_FRACTION:.0%}, at least {args.period / 2:g} s)", flush=True)

        monitor.start()
        start, elapsed = asyncio.run(traffic(args, base, model, results))
        # On the monitor's clock: a quarter of the run, and at least until the client count has peaked.
        warmup_end = start - monitor.t0 + min(elapsed, max(elapsed * WARMUP_FRACTION, args.period / 2))
        print(f"traffic done: {len(results)} requests in {elapsed:.1f} s; waiting for the server to be idle",
              flush=True)
        settle(monitor, args.settle)
        picked = pick_solo(results, args.solo)
        solo = asyncio.run(solo_runs(args, base, picked))
        final = settle(monitor, args.settle)
        monitor.stop.set()
        monitor.join(5)
        if server:
            alive = server.alive()
            server.stop()
            exit_code = server.proc.returncode if alive else f"{server.proc.returncode} (it died during the run)"
            log_text = server.log_path.read_text(errors="replace")
        finished = True
    except KeyboardInterrupt:
        print("soak_serve: interrupted", file=sys.stderr)
        return 130
    finally:
        if monitor is not None:
            monitor.stop.set()
        if server:
            server.stop()
            if not finished:
                shutil.rmtree(log_dir, ignore_errors=True)

    result = checks(args, results, solo, monitor, final, warmup_end, server, log_text, exit_code)
    health = [s for _, s, _ in monitor.health]
    print("\nrequests by kind and outcome (TTFT: streams only, to the first text or tool call, which comes whole; "
          "latency: requests answered whole, retries included):\n")
    print(outcome_table(results))
    print("\nserver over time (/metrics; RSS from "
          f"{monitor.samples[-1]['rss_source'] if monitor.samples and monitor.samples[-1]['rss'] else '-'}):\n")
    print(sample_table(monitor.samples))
    print(f"\n/health: {len(health)} polls, max {fmt(max(health) if health else None, '.3f')} s, "
          f"p99 {fmt(percentile(health, 99), '.3f')} s, not 200: {sum(st != 200 for _, _, st in monitor.health)}")
    print()
    for c in result:
        print(c.line())
    failed = [c for c in result if c.status == "FAIL" or (args.strict and c.status == "MISSING")]
    if server:  # the log is kept when asked for or when a check failed
        if args.server_log:
            Path(args.server_log).write_text(log_text)
        if args.server_log or failed:
            print(f"server log: {args.server_log or server.log_path}")
        if not failed or args.server_log:
            shutil.rmtree(log_dir, ignore_errors=True)
    missing = sum(c.status == "MISSING" for c in result)
    print(f"\n{len(failed)} checks failed" if failed else
          f"\nall checks passed{f' ({missing} MISSING)' if missing else ''}")
    write_json(args.json, info=info, summary=summary(results), health=dict(
        polls=len(health), max_s=max(health) if health else None, p99_s=percentile(health, 99)),
               samples=[{k: v for k, v in s.items() if k != "metrics"} | {
                   k: s["metrics"].get(k) for k in (RUNNING, QUEUE, PAGES, PREFIX_PAGES, IDLE_BYTES, OPEN)}
                        for s in monitor.samples],
               checks=[c.__dict__ for c in result])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
