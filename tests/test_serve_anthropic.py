"""Anthropic's Messages API on `tiny-llm serve` (`/v1/messages`, `/v1/messages/count_tokens`),
driven by the official `anthropic` client and plain HTTP against a live server on 127.0.0.1
(a random-weight model with the default model's tokenizer and chat template) that wants a
key (`x-api-key`).

Replies are compared with the chat API's for the same conversation and seed, the streamed
ones with the whole ones; where the text must be known a grammar (our extension) fixes it."""

import json
import re
import threading
import time

import httpx
import jsonschema
import pytest
from serve_support import loopback, running_server
from test_serve_text import TIME, WEATHER

from tiny_llm.serve.anthropic import Blocks, matched_stop
from tiny_llm.serve.engine import Event
from tiny_llm.serve.text import ToolCall, ToolCallDelta

pytestmark = pytest.mark.xdist_group("serve-anthropic")

NAME = "tiny-served"
KEY = "sekret"
EOS = {"2": -100}  # ban the end-of-sequence token: replies run to max_tokens
SYSTEM = "You answer in one short sentence."
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
TOOLS = [{"name": "get_weather", "description": WEATHER["function"]["description"],
          "input_schema": WEATHER["function"]["parameters"]},
         {"name": "get_time", "input_schema": TIME["function"]["parameters"]}]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}
WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}\n</tool_call>'
# Its arguments first: the engine cannot stream it as it is written, it comes whole.
TIME_CALL = '<tool_call>\n{"arguments": {"zone": "CET"}, "name": "get_time"}\n</tool_call>'
# Anthropic's documented order of a streamed message.
ORDER = re.compile(r"message_start (content_block_start (content_block_delta )*content_block_stop )*"
                   r"message_delta message_stop ")


# ---- without a server: the content blocks and the stop sequence ----------------------------


CALLED = [  # a reply of text, a call written piece by piece, a call that came whole, text
    Event(0, "Checking.\n"),
    Event(0, tool_call_deltas=[ToolCallDelta(0, "", "call_1", "get_time")]),
    Event(0, tool_call_deltas=[ToolCallDelta(0, '{"zone": ')]),
    Event(0, tool_call_deltas=[ToolCallDelta(0, '"CET"}')],
          tool_calls=[ToolCall("get_time", '{"zone": "CET"}', "call_1", streamed=True)]),
    Event(0, "\n"),
    Event(0, tool_calls=[ToolCall("get_weather", '{"city": "Oslo", "days": 3}', "call_2")]),
    Event(0, "\n\nDone. "),
    Event(0, "\n", finish_reason="tool_calls"),
]


def test_blocks_follow_text_and_calls_in_the_order_they_come():
    """Whitespace next to a call is not written; a call written in pieces streams them, a
    call that came whole streams its input at once; both end with the parsed input."""
    streamed, whole = Blocks(follow=True), Blocks(follow=False)
    out = [e for event in CALLED for e in streamed.feed(event)]
    for event in CALLED:
        whole.feed(event)
    expected = [{"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {"zone": "CET"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Oslo", "days": 3}},
                {"type": "text", "text": "Done. \n"}]
    assert streamed.blocks == whole.blocks == expected
    assert [(e["type"], e["index"]) for e in out] == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_delta", 2), ("content_block_stop", 2),
        ("content_block_start", 3), ("content_block_delta", 3), ("content_block_delta", 3),
        ("content_block_stop", 3)]
    assert [e["content_block"] for e in out if e["type"] == "content_block_start"] == [
        {"type": "text", "text": ""}, {"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {}},
        {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}}, {"type": "text", "text": ""}]
    assert [e["delta"] for e in out if e["type"] == "content_block_delta"] == [
        {"type": "text_delta", "text": "Checking."},
        {"type": "input_json_delta", "partial_json": '{"zone": '},
        {"type": "input_json_delta", "partial_json": '"CET"}'},
        {"type": "input_json_delta", "partial_json": '{"city": "Oslo", "days": 3}'},
        {"type": "text_delta", "text": "Done."}, {"type": "text_delta", "text": " \n"}]
    # A reply of text alone keeps its whitespace, as chat's content does.
    alone = Blocks(follow=True)
    for piece in ("\n", " Hi", " ", "there \n"):
        alone.feed(Event(0, piece))
    alone.feed(Event(0, finish_reason="stop"))
    assert alone.blocks == [{"type": "text", "text": "\n Hi there \n"}]


def test_the_stop_sequence_is_the_first_that_ends_in_the_last_token():
    # "Hello STOP world" drawn as "Hello", " STOP": the text shown is "Hello ".
    assert matched_stop(["XYZ", "STOP"], "Hello ", " STOP") == "STOP"
    assert matched_stop(["ST", "STOP"], "Hello ", " STOP") == "ST"  # both fit: the first
    assert matched_stop(["OP", "STOP"], "Hello ", " STOP") == "STOP"  # "OP" would leave "Hello ST"
    assert matched_stop(["llo ST"], "He", " STOP") == "llo ST"  # begun tokens before
    assert matched_stop(["X"], "Hello ", " STOP") is None
    assert matched_stop([], "Hello", "!") is None


# ---- a live server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    # One row and one waiting request at most: the test of a busy server needs no more.
    with running_server("--api-key", KEY, "--max-batch-size", "1", "--max-queue", "1", model=str(tiny_dir)) as server:
        yield server


@pytest.fixture(scope="module")
def client(tiny):
    import anthropic  # imported here, not at collection: 2.4 s that only this file's worker needs

    return anthropic.Anthropic(api_key=KEY, base_url=tiny.url, max_retries=0, timeout=120)


def post(tiny, path: str, body, **kw) -> httpx.Response:
    return tiny.post(path, body, headers={"x-api-key": KEY}, **kw)


def events(tiny, body: dict) -> list[tuple[str, dict]]:
    """The Server-Sent Events of a streamed /v1/messages request: (event name, data)."""
    with loopback.stream("POST", tiny.url + "/v1/messages", json={**body, "stream": True},
                         headers={"x-api-key": KEY}, timeout=120) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        text = response.read().decode()
    out = []
    for chunk in text.strip().split("\n\n"):
        name, data = chunk.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), chunk
        out.append((name[len("event: "):], json.loads(data[len("data: "):])))
        assert out[-1][0] == out[-1][1]["type"]
    return out


def in_order(got: list[tuple[str, dict]]) -> bool:
    return ORDER.fullmatch("".join(name + " " for name, _ in got)) is not None


def blocks(message) -> list[dict]:
    """A message's content blocks, their ids left out (two replies never share them)."""
    return [{k: v for k, v in b.model_dump(exclude_none=True).items() if k != "id"} for b in message.content]


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return body["error"]


def test_a_message_is_the_chat_reply_for_the_same_conversation_and_seed(tiny, client):
    """The same system prompt, question and seed through /v1/chat/completions and
    /v1/messages: the same text and token counts, whole and streamed; count_tokens counts
    the prompt both built."""
    chat = post(tiny, "/v1/chat/completions", {
        "messages": [{"role": "system", "content": SYSTEM}, *ASK], "max_tokens": 12, "temperature": 0.9, "seed": 7,
        "logit_bias": EOS}).json()
    text, usage = chat["choices"][0]["message"]["content"], chat["usage"]
    kw = dict(model=NAME, system=SYSTEM, messages=ASK, max_tokens=12,
              extra_body={"temperature": 0.9, "seed": 7, "logit_bias": EOS})
    message = client.messages.create(**kw)
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == NAME and message.stop_reason == "max_tokens" and message.stop_sequence is None
    assert blocks(message) == [{"type": "text", "text": text}] and text
    assert message.usage.output_tokens == usage["completion_tokens"] == 12
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == usage["prompt_tokens"]
    assert message.usage.cache_creation_input_tokens == 0
    assert client.messages.count_tokens(model=NAME, system=SYSTEM, messages=ASK).input_tokens == usage["prompt_tokens"]

    with client.messages.stream(**kw) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text and blocks(final) == blocks(message)
    assert (final.stop_reason, final.stop_sequence, final.usage.output_tokens) == ("max_tokens", None, 12)
    # The third time, the prompt is in the prefix cache: Anthropic counts those tokens apart.
    assert final.usage.cache_read_input_tokens > 0
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == usage["prompt_tokens"]


def test_the_stream_is_anthropics_sequence_of_named_events(tiny):
    body = {"model": NAME, "messages": ASK, "max_tokens": 6, "seed": 1, "logit_bias": EOS}
    got = events(tiny, body)
    assert in_order(got)
    start = got[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["id"].startswith("msg_")
    assert got[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    deltas = [data["delta"] for name, data in got if name == "content_block_delta"]
    assert {d["type"] for d in deltas} == {"text_delta"}
    whole = post(tiny, "/v1/messages", body).json()
    assert "".join(d["text"] for d in deltas) == whole["content"][0]["text"]
    assert got[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert got[-2][1]["usage"]["output_tokens"] == whole["usage"]["output_tokens"] == 6
    assert got[-1][1] == {"type": "message_stop"}


def test_a_forced_tool_call_streams_its_input_and_its_result_goes_back(tiny, client):
    kw = dict(model=NAME, messages=ASK, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"},
              max_tokens=200, extra_body={"seed": 3})
    message = client.messages.create(**kw)
    (call,) = message.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, SCHEMAS["get_weather"])
    assert message.stop_reason == "tool_use"

    got = events(tiny, {**kw.pop("extra_body"), **kw})
    assert in_order(got)
    started = [data["content_block"] for name, data in got if name == "content_block_start"]
    assert [(b["type"], b["name"], b["input"]) for b in started] == [("tool_use", "get_weather", {})]
    partial = "".join(d["delta"]["partial_json"] for n, d in got if n == "content_block_delta")
    assert json.loads(partial) == call.input  # the same seed: the same call
    assert got[-2][1]["delta"]["stop_reason"] == "tool_use"
    with client.messages.stream(**kw, extra_body={"seed": 3}) as stream:
        assert blocks(stream.get_final_message()) == blocks(message)

    # The call and its result go back; the prompt is the one chat builds from the same turns.
    turns = ASK + [{"role": "assistant", "content": message.content},  # as Anthropic's guide sends it back
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                 "content": [{"type": "text", "text": "rain, 4 degrees"}]},
                                                {"type": "text", "text": "And tomorrow?"}]}]
    answer = client.messages.create(model=NAME, messages=turns, tools=TOOLS, max_tokens=4,
                                    extra_body={"logit_bias": EOS})
    assert answer.stop_reason == "max_tokens" and [b.type for b in answer.content] == ["text"]
    chat_turns = ASK + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": call.id, "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps(call.input)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "rain, 4 degrees"},
        {"role": "user", "content": "And tomorrow?"}]
    sent = post(tiny, "/tokenize", {"messages": chat_turns, "tools": [WEATHER, TIME]}).json()["tokens"]
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == len(sent)
    assert client.messages.count_tokens(model=NAME, messages=turns, tools=TOOLS).input_tokens == len(sent)
    prompt = post(tiny, "/detokenize", {"tokens": sent}).json()["prompt"]
    assert "<tool_response>\nrain, 4 degrees\n</tool_response>" in prompt
    assert f'{{"name": "get_weather", "arguments": {json.dumps(call.input)}}}' in prompt
    # A failed tool says so to the model.
    turns[-1]["content"][0]["is_error"] = True
    chat_turns[2]["content"] = "Error: rain, 4 degrees"
    failed = post(tiny, "/tokenize", {"messages": chat_turns, "tools": [WEATHER, TIME]}).json()["count"]
    assert client.messages.count_tokens(model=NAME, messages=turns, tools=TOOLS).input_tokens == failed > len(sent)


def test_text_and_two_calls_and_disable_parallel_tool_use(tiny, client):
    """tool_choice auto, a reply (fixed by a grammar) of text and two call blocks: a text
    block and two tool_use blocks, whole and streamed alike; with disable_parallel_tool_use
    the reply ends after the first call."""
    gbnf = "root ::= " + json.dumps(f"Checking.\n{WEATHER_CALL}\n{TIME_CALL}")
    kw = dict(model=NAME, messages=ASK, tools=TOOLS, max_tokens=200, extra_body={"grammar": gbnf})
    message = client.messages.create(**kw)
    expected = [{"type": "text", "text": "Checking."},
                {"type": "tool_use", "name": "get_weather", "input": {"city": "Oslo", "days": 3}},
                {"type": "tool_use", "name": "get_time", "input": {"zone": "CET"}}]
    assert blocks(message) == expected and message.stop_reason == "tool_use"
    assert len({b.id for b in message.content[1:]}) == 2
    with client.messages.stream(**kw) as stream:
        assert blocks(stream.get_final_message()) == expected
    got = events(tiny, {**kw.pop("extra_body"), **kw, "grammar": gbnf})
    assert in_order(got)
    assert [d["index"] for n, d in got if n == "content_block_start"] == [0, 1, 2]
    pieces = {i: [d["delta"].get("partial_json") for n, d in got if n == "content_block_delta" and d["index"] == i]
              for i in (1, 2)}
    assert len(pieces[1]) > 1 and json.loads("".join(pieces[1])) == expected[1]["input"]  # as it was written
    assert pieces[2] == ['{"zone": "CET"}']  # whole

    one = client.messages.create(**kw, tool_choice={"type": "auto", "disable_parallel_tool_use": True},
                                 extra_body={"grammar": gbnf})
    assert blocks(one) == expected[:2] and one.stop_reason == "tool_use"
    assert one.usage.output_tokens < message.usage.output_tokens


def test_stop_sequences_say_which_one_ended_the_reply(client):
    base = dict(model=NAME, messages=ASK, max_tokens=30, extra_body={"grammar": 'root ::= "Hello STOP world"'})
    cases = [(None, "Hello STOP world", "end_turn", None),
             (["XYZ", "STOP"], "Hello ", "stop_sequence", "STOP"),
             (["world", "XYZ"], "Hello STOP ", "stop_sequence", "world"),
             (["llo ST"], "He", "stop_sequence", "llo ST")]  # across tokens
    for stops, text, reason, sequence in cases:
        kw = {} if stops is None else {"stop_sequences": stops}
        message = client.messages.create(**base, **kw)
        assert (blocks(message), message.stop_reason, message.stop_sequence) == (
            [{"type": "text", "text": text}], reason, sequence), stops
        with client.messages.stream(**base, **kw) as stream:
            final = stream.get_final_message()
        assert (blocks(final), final.stop_reason, final.stop_sequence) == (blocks(message), reason, sequence)
    assert client.messages.create(**{**base, "max_tokens": 2}).stop_reason == "max_tokens"


BAD = [  # (a change to a good request, the field its 400 names)
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 5000}, "max_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "Look:"}, {
        "type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
     "messages[0].content[1]: 'image' blocks"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {
        "type": "text", "media_type": "text/plain", "data": "x"}}]}]}, "messages[0].content[0]: 'document' blocks"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "get_time", "input": {}}]}]},
     "messages[0].content[0]: 'tool_use' blocks are not supported in a user message"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"messages": []}, "messages"),
    ({"system": [{"type": "image", "source": {}}]}, "system[0]"),
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0] is a server tool"),
    ({"tools": [{**TOOLS[0], "input_examples": [{"city": "Oslo", "days": 1}]}]}, "tools[0].input_examples"),
    ({"tools": [{**TOOLS[0], "strict": True}]}, "tools[0].strict"),
    ({"tools": [{**TOOLS[0], "strict": 1}], "tool_choice": {"type": "any"}}, "tools[0].strict must be true or false"),
    ({"tools": [{**TOOLS[0], "name": "get weather"}]}, "tools[0].name"),
    ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"stop_sequences": "STOP"}, "stop_sequences"),
    ({"mcp_servers": [{"type": "url", "url": "https://example.com/sse", "name": "x"}]}, "mcp_servers"),
    ({"container": "container_1"}, "container"),
    ({"inference_geo": "us"}, "inference_geo"),
    ({"service_tier": "priority"}, "service_tier"),
    ({"speed": "fast"}, "speed"),
    ({"output_config": {"effort": "high"}}, "output_config.effort"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "output_config.format"),
    ({"frobnicate": 1}, "unknown field 'frobnicate'"),
]


def test_every_refused_field_is_one_400_that_names_it(tiny, client):
    good = {"model": NAME, "messages": ASK, "max_tokens": 2}
    for change, field in BAD:
        body = {k: v for k, v in {**good, **change}.items() if v is not None}
        error = error_of(post(tiny, "/v1/messages", body), 400)
        assert error["type"] == "invalid_request_error" and field in error["message"], (change, error)
    # What is accepted and changes nothing here.
    fine = dict(metadata={"user_id": "u-1"}, service_tier="standard_only", thinking={"type": "disabled"},
                cache_control={"type": "ephemeral"}, speed="standard", top_p=0.9, top_k=5, temperature=0)
    assert post(tiny, "/v1/messages", {**good, **fine}).json()["stop_reason"] in ("end_turn", "max_tokens")
    error = error_of(post(tiny, "/v1/messages/count_tokens", {"messages": ASK, "max_tokens": 3}), 400)
    assert error["message"] == "unknown field 'max_tokens' in a count_tokens request"
    assert client.messages.create(model=NAME, messages=ASK, max_tokens=3).usage.output_tokens >= 1


def test_errors_come_in_anthropics_shape_through_the_sdk(tiny, client, tiny_dir, default_tokenizer):
    import anthropic

    with pytest.raises(anthropic.BadRequestError, match="max_tokens is required"):
        client.messages.create(model=NAME, messages=ASK, max_tokens=anthropic.omit)
    with pytest.raises(anthropic.BadRequestError, match="temperature must be a number from 0 to 1"):
        client.messages.create(model=NAME, messages=ASK, max_tokens=2, extra_body={"temperature": 1.5})
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=NAME, max_tokens=2, messages=[{"role": "user", "content": [{
            "type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}])
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="claude-9", messages=ASK, max_tokens=2)
    assert e.value.body == {"type": "error", "error": {"type": "not_found_error", "message": e.value.body["error"][
        "message"]}} and "'claude-9' does not exist" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="claude-9", messages=ASK)
    stranger = anthropic.Anthropic(api_key="sekreT", base_url=tiny.url, max_retries=0)
    for call in (lambda: stranger.messages.create(model=NAME, messages=ASK, max_tokens=2),
                 lambda: stranger.messages.count_tokens(model=NAME, messages=ASK)):
        with pytest.raises(anthropic.AuthenticationError) as e:
            call()
        assert e.value.body["error"]["type"] == "authentication_error"
    big = loopback.post(tiny.url + "/v1/messages", content=b'{"messages": "' + b"a" * (5 << 20) + b'"}',
                        headers={"x-api-key": KEY})
    assert error_of(big, 413)["type"] == "request_too_large"

    # A request that fails while decoding (its grammar allows only a banned token): the
    # stream ends with an error event.
    doomed = {"model": NAME, "messages": ASK, "max_tokens": 5, "regex": "x",
              "logit_bias": {str(default_tokenizer.encode("x")[0]): -100}}
    (name, data), = events(tiny, doomed)
    assert name == "error" and data["error"]["type"] == "invalid_request_error"
    assert data["error"]["message"].endswith("nothing can be sampled")
    assert error_of(post(tiny, "/v1/messages", doomed), 400)["message"].endswith("nothing can be sampled")
    with pytest.raises(anthropic.APIStatusError, match="invalid_request_error"):
        with client.messages.stream(model=NAME, messages=ASK, max_tokens=5,
                                    extra_body={k: doomed[k] for k in ("regex", "logit_bias")}) as stream:
            stream.get_final_message()


def test_a_busy_server_is_overloaded(tiny):
    """One row decoding and one request waiting (the most this server takes): the next is
    a 503 overloaded_error that says when to retry."""
    forever = {"model": NAME, "messages": ASK, "max_tokens": 2000, "stream": True, "logit_bias": EOS}
    short = {"model": NAME, "messages": ASK, "max_tokens": 2}
    answers = []
    with loopback.stream("POST", tiny.url + "/v1/messages", json=forever, headers={"x-api-key": KEY},
                         timeout=60) as running:
        lines = running.iter_lines()
        while "content_block_delta" not in next(lines):  # until its first token
            pass
        waiting = threading.Thread(target=lambda: answers.append(post(tiny, "/v1/messages", short)))
        waiting.start()
        deadline = time.monotonic() + 20
        while tiny.metric("tiny_llm_queue_length") < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        busy = post(tiny, "/v1/messages", short)
        assert error_of(busy, 503)["type"] == "overloaded_error" and busy.headers["Retry-After"] == "1"
    waiting.join(60)
    assert [a.status_code for a in answers] == [200]
    assert tiny.metric('tiny_llm_requests_total{endpoint="messages",status="503"}') == 1
