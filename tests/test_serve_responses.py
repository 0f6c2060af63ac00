"""OpenAI's Responses API on `tiny-llm serve`: requests read into the chat body (compared with
the chat request they mean), the semantic events of a reply built from engine events (each
validated against the `openai` package's own types), the store's bounds, and a live server
on 127.0.0.1 driven by the official client, openai-agents' default model class and
langchain's ChatOpenAI.

The live server runs the random-weight "tiny-served" model: where a reply must be a call or
an answer, a grammar or `logit_bias` decides, and replies are checked against the schemas and
against chat's answer to the same conversation, never against fixed strings."""

import json
import time
from types import SimpleNamespace

import httpx
import jsonschema
import openai
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from serve_support import loopback, openai_client, running_server
from test_serve_agents import Forecast, recording_client, run_openai_agent, weather
from test_serve_text import WEATHER

from tiny_llm.sampler import SamplingParams
from tiny_llm.serve.engine import Event
from tiny_llm.serve.guard import Exchange
from tiny_llm.serve.protocol import Context, Job, RequestError, parse
from tiny_llm.serve.responses import (REFUSED, ResponsesReply, ResponseStore, responses_param, translate)
from tiny_llm.serve.text import ToolCall, ToolCallDelta

pytestmark = pytest.mark.xdist_group("serve-responses")

NAME = "tiny-served"
EOS = {"2": -100}  # ban the end-of-sequence token: replies run to max_output_tokens
TOOL = {"type": "function", **WEATHER["function"]}  # the Responses API's shape of a function tool
ARGS = WEATHER["function"]["parameters"]

CREATED, PROGRESS, COMPLETED, INCOMPLETE, FAILED = (f"response.{s}" for s in (
    "created", "in_progress", "completed", "incomplete", "failed"))
ADDED, DONE = "response.output_item.added", "response.output_item.done"
PART_ADDED, PART_DONE = "response.content_part.added", "response.content_part.done"
TEXT_DELTA, TEXT_DONE = "response.output_text.delta", "response.output_text.done"
ARGS_DELTA, ARGS_DONE = "response.function_call_arguments.delta", "response.function_call_arguments.done"
MESSAGE = [ADDED, PART_ADDED, TEXT_DELTA, TEXT_DONE, PART_DONE, DONE]  # a message item, its deltas as one
CALL = [ADDED, ARGS_DELTA, ARGS_DONE, DONE]


def collapsed(types: list[str]) -> list[str]:
    """Event types with each run of deltas as one."""
    return [t for k, t in enumerate(types) if not (t.endswith(".delta") and k and types[k - 1] == t)]


def check_stream(events: list[dict]) -> Response:
    """Every event valid under the `openai` package's types, numbered 0, 1, 2, ...; each
    item's text and arguments the sum of their deltas; the last event's response returned."""
    for event in events:
        pydantic.TypeAdapter(ResponseStreamEvent).validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = Response.model_validate(events[-1]["response"])
    for at, item in enumerate(final.output):
        deltas = "".join(e["delta"] for e in events if e["type"].endswith(".delta") and e["output_index"] == at)
        if item.type == "message":
            assert deltas == item.content[0].text
            assert [e["text"] for e in events if e["type"] == TEXT_DONE and e["output_index"] == at] == [deltas]
        else:
            assert deltas == item.arguments
            assert [e["arguments"] for e in events if e["type"] == ARGS_DONE and e["output_index"] == at] == [deltas]
    return final


# ---- without a server: reading requests ----------------------------------------------------


@pytest.fixture(scope="module")
def ctx(default_tokenizer):
    return Context(default_tokenizer, (NAME,), 2048, default_tokenizer.vocab_size)


@pytest.fixture
def server():
    return SimpleNamespace(responses=ResponseStore())


def chat_of(body: dict, server) -> dict:
    chat, kind = translate(body, server)
    assert kind == "chat"
    return dict(chat)


def test_a_request_reads_as_the_chat_request_it_means(ctx, server):
    """Instructions, message items with text parts, a call and its output, function tools, a
    named tool_choice, text.format, max_output_tokens and extension fields: the same chat
    body, prompt and grammar as the chat request written by hand."""
    body = {"model": NAME, "instructions": "Be brief.", "max_output_tokens": 50, "temperature": 0.5, "top_k": 7,
            "seed": 3, "tools": [TOOL], "tool_choice": {"type": "function", "name": "get_weather"},
            "text": {"format": {"type": "json_schema", "name": "verdict", "strict": True,
                                "schema": {"type": "object", "properties": {"yes": {"type": "boolean"}}}}},
            "metadata": {"k": "v"}, "user": "u", "parallel_tool_calls": True, "truncation": "disabled",
            "include": [], "store": False,
            "input": [{"role": "user", "content": "Weather?"},
                      {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                       "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
                      {"type": "function_call", "call_id": "c1", "name": "get_weather", "id": "fc_1",
                       "arguments": '{"city": "Oslo", "days": 1}', "status": "completed"},
                      {"type": "function_call_output", "call_id": "c1", "output": "rain"},
                      {"role": "user", "content": [{"type": "input_text", "text": "And "},
                                                   {"type": "input_text", "text": "tomorrow?"}]}]}
    chat = {"model": NAME, "max_tokens": 50, "temperature": 0.5, "top_k": 7, "seed": 3, "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "verdict", "strict": True, "schema": body["text"]["format"]["schema"]}},
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
                         {"role": "assistant", "content": "Checking.", "tool_calls": [
                             {"id": "c1", "type": "function",
                              "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 1}'}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "rain"},
                         {"role": "user", "content": "And tomorrow?"}]}
    assert chat_of(body, server) == chat
    ours, theirs = parse(translate(body, server)[0], "chat", ctx), parse(chat, "chat", ctx)
    assert ours.prompt == theirs.prompt and ours.params == theirs.params and ours.max_tokens == 50
    assert chat_of({"input": "Hi"}, server) == {"messages": [{"role": "user", "content": "Hi"}]}
    # Without tools, "auto" (and "none") mean no tools; an empty tools list is none.
    assert chat_of({"input": "Hi", "tools": [], "tool_choice": "auto"}, server) == chat_of({"input": "Hi"}, server)


def test_previous_response_id_puts_the_stored_conversation_first(server):
    earlier = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    server.responses.put({"id": "resp_1", "object": "response"}, earlier)
    chat = chat_of({"previous_response_id": "resp_1", "instructions": "New rules.", "input": "More?"}, server)
    assert chat["messages"] == [{"role": "system", "content": "New rules."}, *earlier,
                                {"role": "user", "content": "More?"}]
    chat["messages"][1]["content"] = "changed"  # the stored conversation is not the request's to change
    assert server.responses.conversation("resp_1") == earlier
    with pytest.raises(RequestError) as e:
        translate({"previous_response_id": "resp_2", "input": "x"}, server)
    assert (e.value.status, e.value.param, e.value.code) == (404, "previous_response_id", "previous_response_not_found")
    assert "'resp_2'" in e.value.message


INPUT = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize("body, param, message", [
    *[({name: value}, name, REFUSED[name][1]) for name, value in [
        ("reasoning", {"effort": "low"}), ("include", ["message.output_text.logprobs"]), ("background", True),
        ("conversation", "conv_1"), ("prompt", {"id": "pmpt_1"}), ("truncation", "auto"), ("top_logprobs", 3),
        ("max_tool_calls", 2), ("context_management", [{"type": "compaction"}]),
        ("prompt_cache_retention", "24h")]],
    ({"frobnicate": 1}, "frobnicate", "unknown field 'frobnicate' in a responses request"),
    ({"tools": [TOOL, {"type": "web_search"}]}, "tools[1]",
     "tools[1] is a 'web_search' tool: only function tools are supported (this server runs no built-in tools)"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[0]", "'file_search' tool"),
    ({"tools": [{**TOOL, "defer_loading": True}]}, "tools[0].defer_loading", "tools[0].defer_loading is not supported"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice", 'tool_choice must be "none", "auto", "required"'),
    ({"text": {"format": {"type": "text"}, "verbosity": "low"}}, "text.verbosity",
     "text.verbosity is not supported: the served model has no verbosity setting"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format", "text.format must be"),
    ({"stream": True, "stream_options": {"include_obfuscation": True}}, "stream_options.include_obfuscation",
     "stream_options.include_obfuscation is not supported: this server does not pad its events (send false)"),
    ({"max_output_tokens": 0}, "max_output_tokens", "max_output_tokens must be a positive integer, got 0"),
    ({"store": "yes"}, "store", "store must be true or false, got 'yes'"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0]", "input[0].content[0] is a 'input_image' part: this server reads text only"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file", "file_id": "f"}]}]},
     "input[0].output[0]", "'input_file' part"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type",
     "input[0] is a 'item_reference' item: only message, function_call and function_call_output items"),
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input[0].type", "'reasoning' item"),
    ({"input": [{"role": "critic", "content": "x"}]}, "input[0].role", "input[0].role must be one of"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments",
     "input[0].arguments must be a string, got None"),
    ({"input": [{"role": "user", "content": "x", "cache_control": {}}]}, "input[0].cache_control",
     "input[0].cache_control is not supported in a message item"),
    ({"input": []}, "input", "input must be a string or a non-empty list of input items"),
])
def test_what_is_not_supported_is_refused_by_name(server, body, param, message):
    with pytest.raises(RequestError) as e:
        translate({"input": INPUT, **body}, server)
    assert (e.value.param, e.value.status) == (param, 400)
    assert message in e.value.message


def test_the_values_that_ask_for_nothing_are_accepted(server):
    plain = chat_of({"input": "x"}, server)
    for name, (accepted, _) in REFUSED.items():
        for value in accepted:
            assert chat_of({"input": "x", name: value}, server) == plain, (name, value)


def test_chat_field_names_are_given_back_as_the_request_named_them(ctx, server):
    assert [responses_param(p) for p in ("messages", "messages[3].content", "max_tokens", "response_format",
                                         "tools[2].function.parameters", "tools[0]", "tool_choice", "top_k", None)] \
        == ["input", "input", "max_output_tokens", "text.format", "tools[2].parameters", "tools[0]", "tool_choice",
            "top_k", None]
    bad = {**TOOL, "parameters": {"type": "object", "properties": 3}}
    with pytest.raises(RequestError) as e:
        parse(translate({"input": "x", "tools": [bad], "tool_choice": "required"}, server)[0], "chat", ctx)
    assert responses_param(e.value.param) == "tools[0].parameters"


def test_the_store_keeps_the_newest_within_its_bounds():
    store = ResponseStore(max_responses=3, max_bytes=1000)
    for k in range(5):
        store.put({"id": f"r{k}"}, [{"role": "user", "content": "x"}])
    assert len(store) == 3 and [store.response(f"r{k}")["id"] for k in (2, 3, 4)] == ["r2", "r3", "r4"]
    with pytest.raises(RequestError) as e:
        store.response("r1")
    assert (e.value.status, e.value.param, e.value.code) == (404, "response_id", "not_found")
    store.put({"id": "big", "pad": "y" * 900}, [])  # 926 bytes: the bytes bound evicts r3
    assert len(store) == 2 and store.bytes <= 1000 and store.response("r4")
    store.put({"id": "huge", "pad": "y" * 2000}, [])  # larger than the whole store: not kept
    assert len(store) == 2 and store.response("big")["pad"]
    assert store.delete("big") == {"id": "big", "object": "response.deleted", "deleted": True}
    with pytest.raises(RequestError):
        store.delete("big")
    with pytest.raises(ValueError, match="max_bytes must be a positive integer, got 0"):
        ResponseStore(max_bytes=0)


# ---- without a server: the answer built from engine events ---------------------------------


def replay(events: list[Event], body: dict | None = None, store: ResponseStore | None = None):
    """The SSE events (as dicts, their names checked) and the whole response of a reply fed
    `events`, as two replies of one request would give them."""
    server = SimpleNamespace(responses=store if store is not None else ResponseStore())
    chat, _ = translate(body or {"input": "Weather?", "tools": [TOOL]}, server)
    job = Job("chat", NAME, [1, 2, 3], 100, [SamplingParams()], stream=True, tools=True)

    def reply():
        exchange = Exchange("req-1", time.monotonic(), None)
        exchange.body = chat
        return ResponsesReply(server, job, exchange)

    streamed, whole = reply(), reply()
    pieces = streamed.stream_opening() + [p for e in events for p in streamed.stream_event(e)]
    pieces += streamed.stream_closing()
    out = []
    for piece in pieces:
        head, data, rest = piece.split("\n", 2)
        out.append(json.loads(data.removeprefix("data: ")))
        assert head == f"event: {out[-1]['type']}" and rest == "\n"
    for event in events:
        whole.add(event)
    return out, Response.model_validate(whole.whole())


def test_a_text_reply_in_events():
    """Whitespace waits for the text after it; at the end, a reply without calls keeps it."""
    events, whole = replay([Event(0, "Hello", tokens=1), Event(0, " world  ", tokens=2),
                            Event(0, "", finish_reason="stop", tokens=3, cached_tokens=2)])
    assert collapsed([e["type"] for e in events]) == [CREATED, PROGRESS, *MESSAGE, COMPLETED]
    assert [e["delta"] for e in events if e["type"] == TEXT_DELTA] == ["Hello", " world", "  "]
    final = check_stream(events)
    assert final.output_text == whole.output_text == "Hello world  " and final.status == whole.status == "completed"
    assert final.usage.model_dump() == whole.usage.model_dump() == {
        "input_tokens": 3, "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0,
                                                    "cache_write_tokens_details": None},
        "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 6}
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    # Cut by the token limit: incomplete, and the message item says so.
    events, whole = replay([Event(0, "Hel", tokens=1), Event(0, "lo", finish_reason="length", tokens=2)])
    assert collapsed([e["type"] for e in events])[-1] == INCOMPLETE
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output[0].status == "incomplete" and check_stream(events).output_text == "Hello"
    # An empty reply is an empty message.
    events, whole = replay([Event(0, "", finish_reason="stop", tokens=1)])
    assert collapsed([e["type"] for e in events]) == [CREATED, PROGRESS, *MESSAGE[:2], *MESSAGE[3:], COMPLETED]
    assert whole.output_text == "" and len(whole.output) == 1


WRITTEN = [Event(0, "Checking.\n", tokens=3),
           Event(0, tool_call_deltas=[ToolCallDelta(0, "", "call_1", "get_weather")], tokens=9),
           Event(0, tool_call_deltas=[ToolCallDelta(0, '{"city": ')], tokens=12),
           Event(0, tool_call_deltas=[ToolCallDelta(0, '"Oslo", "days": 3}')], tokens=18,
                 tool_calls=[ToolCall("get_weather", '{"city": "Oslo", "days": 3}', "call_1", streamed=True)]),
           Event(0, tool_call_deltas=[ToolCallDelta(1, "", "call_2", "get_weather"),
                                      ToolCallDelta(1, '{"city": "Paris", "days": 1}')], tokens=30,
                 tool_calls=[ToolCall("get_weather", '{"city": "Paris", "days": 1}', "call_2", streamed=True)]),
           Event(0, finish_reason="tool_calls", tokens=31)]
WHOLE = [Event(0, "Checking.\n", tokens=3),
         Event(0, tool_calls=[ToolCall("get_weather", '{"city": "Oslo", "days": 3}', "call_1")], tokens=18),
         Event(0, tool_calls=[ToolCall("get_weather", '{"city": "Paris", "days": 1}', "call_2")], tokens=30),
         Event(0, finish_reason="tool_calls", tokens=31)]


@pytest.mark.parametrize("events", [WRITTEN, WHOLE], ids=["written", "whole"])
def test_calls_in_events_as_they_are_written_or_whole(events):
    """A call written piece by piece and a call that comes whole give the same items; the
    whole one has one arguments delta. The text before a call loses its trailing whitespace,
    and both calls go back into the stored conversation."""
    store = ResponseStore()
    out, whole = replay(events, store=store)
    assert collapsed([e["type"] for e in out]) == [CREATED, PROGRESS, *MESSAGE, *CALL, *CALL, COMPLETED]
    final = check_stream(out)
    assert [item.type for item in final.output] == ["message", "function_call", "function_call"]
    assert final.output_text == whole.output_text == "Checking."
    calls = [(c.call_id, c.name, c.arguments, c.status) for c in final.output[1:]]
    assert calls == [(c.call_id, c.name, c.arguments, c.status) for c in whole.output[1:]] == [
        ("call_1", "get_weather", '{"city": "Oslo", "days": 3}', "completed"),
        ("call_2", "get_weather", '{"city": "Paris", "days": 1}', "completed")]
    pieces = [e["delta"] for e in out if e["type"] == ARGS_DELTA]
    assert len(pieces) == (3 if events is WRITTEN else 2)
    stored = store.conversation(final.id)
    assert store.conversation(whole.id) == stored and stored[0] == {"role": "user", "content": "Weather?"}
    assert stored[-1] == {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": calls[0][2]}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": calls[1][2]}}]}


def test_a_call_left_open_at_the_end_is_incomplete():
    events, _ = replay([Event(0, tool_call_deltas=[ToolCallDelta(0, '{"ci', "call_1", "get_weather")]),
                        Event(0, finish_reason="length", tokens=40)])
    final = check_stream(events)
    assert final.status == "incomplete" and final.output[0].status == "incomplete"
    assert final.output[0].arguments == '{"ci'


# ---- a live server ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    with running_server("--max-batch-size", "8", model=str(tiny_dir)) as server:
        yield server


@pytest.fixture(scope="module")
def client(tiny):
    return openai_client(tiny)


def raw_events(tiny, body: dict) -> list[dict]:
    """A streamed answer read as plain Server-Sent Events: `event: TYPE` then `data: JSON`
    whose type is TYPE, each block alone; no `[DONE]`."""
    with loopback.stream("POST", tiny.url + "/v1/responses", json={**body, "stream": True}, timeout=120) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        text = answer.read().decode()
    assert "[DONE]" not in text and text.endswith("\n\n")
    events = []
    for block in text.removesuffix("\n\n").split("\n\n"):
        head, data = block.split("\n")
        events.append(json.loads(data.removeprefix("data: ")))
        assert head == f"event: {events[-1]['type']}"
    return events


def test_a_streamed_response_is_the_whole_one_in_the_documented_order(client, tiny):
    kw = dict(model=NAME, input="Tell me about the sea.", instructions="Be brief.", max_output_tokens=12,
              temperature=1.0, extra_body={"seed": 3, "logit_bias": EOS})
    whole = client.responses.create(**kw)
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.output_tokens == 12 and whole.output_text and whole.instructions == "Be brief."
    events = raw_events(tiny, {**{k: v for k, v in kw.items() if k != "extra_body"}, **kw["extra_body"]})
    assert collapsed([e["type"] for e in events]) == [CREATED, PROGRESS, *MESSAGE, INCOMPLETE]
    final = check_stream(events)
    assert final.output_text == whole.output_text and final.usage.output_tokens == 12
    # The client's stream helper builds the same response from the events.
    with client.responses.stream(**kw) as stream:
        texts = [e.delta for e in stream if e.type == TEXT_DELTA]
    assert "".join(texts) == whole.output_text


def test_chat_and_responses_draw_the_same_tokens(client, tiny):
    """One conversation (instructions, an earlier exchange, a question) through both APIs
    with one seed: the same prompt, the same tokens; input_tokens counts that prompt."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello! How can I help?"},
                {"role": "user", "content": "Tell me a joke."}]
    items = [{"role": "user", "content": "Hi"},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "Hello! How can I help?", "annotations": []}]},
             {"role": "user", "content": [{"type": "input_text", "text": "Tell me a joke."}]}]
    sampling = {"seed": 11, "logit_bias": EOS, "top_k": 50}
    chat = client.chat.completions.create(model=NAME, messages=messages, max_tokens=16, temperature=0.9,
                                          extra_body=sampling)
    answer = client.responses.create(model=NAME, instructions="Be brief.", input=items, max_output_tokens=16,
                                     temperature=0.9, extra_body=sampling)
    assert answer.output_text == chat.choices[0].message.content
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (chat.usage.prompt_tokens,
                                                                       chat.usage.completion_tokens)
    count = client.responses.input_tokens.count(model=NAME, instructions="Be brief.", input=items)
    assert count.object == "response.input_tokens" and count.input_tokens == chat.usage.prompt_tokens
    assert count.input_tokens == tiny.post("/tokenize", {"messages": messages}).json()["count"]


def test_a_tool_round_trip_through_previous_response_id(client, tiny):
    """A forced call streams as it is written; its result goes back with previous_response_id
    and a function_call_output item: the prompt is the whole conversation (the prefix cache
    holds the first turn), as chat renders it and as the items sent back in full give it."""
    tools = [{**TOOL, "strict": True}]
    with client.responses.stream(model=NAME, input="Weather in Oslo?", tools=tools, max_output_tokens=200,
                                 tool_choice={"type": "function", "name": "get_weather"},
                                 extra_body={"seed": 1}) as stream:
        kinds = [e.type for e in stream]
        first = stream.get_final_response()
    assert collapsed(kinds) == [CREATED, PROGRESS, *CALL, COMPLETED] and kinds.count(ARGS_DELTA) > 1
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), ARGS)
    assert call.parsed_arguments == json.loads(call.arguments)  # the client's own reading of the strict tool

    second = client.responses.create(model=NAME, previous_response_id=first.id, tools=tools, max_output_tokens=4,
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "rain, 4 degrees"}], extra_body={"logit_bias": EOS})
    assert second.previous_response_id == first.id and second.status == "incomplete"
    conversation = [{"role": "user", "content": "Weather in Oslo?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": call.call_id, "type": "function",
                         "function": {"name": "get_weather", "arguments": call.arguments}}]},
                    {"role": "tool", "tool_call_id": call.call_id, "content": "rain, 4 degrees"}]
    chat_tools = [{"type": "function", "function": {**WEATHER["function"], "strict": True}}]
    sent = tiny.post("/tokenize", {"messages": conversation, "tools": chat_tools}).json()["tokens"]
    assert second.usage.input_tokens == len(sent)
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    prompt = tiny.post("/detokenize", {"tokens": sent}).json()["prompt"]
    assert "<tool_response>\nrain, 4 degrees\n</tool_response>" in prompt
    # The same turn with every item sent back, as a client without the store does.
    made = client.responses.retrieve(first.id).output[0].model_dump(exclude_none=True)
    items = [{"role": "user", "content": "Weather in Oslo?"}, made,
             {"type": "function_call_output", "call_id": call.call_id, "output": "rain, 4 degrees"}]
    assert client.responses.input_tokens.count(model=NAME, tools=tools, input=items).input_tokens == len(sent)


CALL_TEXT = 'Checking.\n<tool_call>\n{"arguments": {"city": "Oslo", "days": 3}, "name": "get_weather"}\n</tool_call>'


def test_a_call_that_comes_whole_is_one_arguments_delta(tiny):
    """A call block whose name follows its arguments is not written piece by piece: its
    item comes with the arguments in one delta, after the message before it."""
    events = raw_events(tiny, {"model": NAME, "input": "Weather?", "tools": [TOOL], "max_output_tokens": 200,
                               "grammar": "root ::= " + json.dumps(CALL_TEXT)})
    assert collapsed([e["type"] for e in events]) == [CREATED, PROGRESS, *MESSAGE, *CALL, COMPLETED]
    assert [e["delta"] for e in events if e["type"] == ARGS_DELTA] == ['{"city": "Oslo", "days": 3}']
    final = check_stream(events)
    assert final.output_text == "Checking." and final.output[1].name == "get_weather"


def test_structured_output_with_the_clients_parse(client):
    parsed = client.responses.parse(model=NAME, input="Will it rain in Oslo?", text_format=Forecast,
                                    max_output_tokens=100, temperature=1.0, extra_body={"seed": 5})
    assert isinstance(parsed.output_parsed, Forecast) and parsed.status == "completed"
    assert parsed.text.format.type == "json_schema"
    with client.responses.stream(model=NAME, input="Rain?", text_format=Forecast, max_output_tokens=100,
                                 extra_body={"seed": 6}) as stream:
        for _ in stream:
            pass
        assert isinstance(stream.get_final_response().output_parsed, Forecast)


def test_a_failure_while_decoding_ends_the_stream_with_response_failed(tiny, default_tokenizer):
    """A grammar whose only character logit_bias bans cannot draw a token."""
    banned = default_tokenizer.encode("x")[0]
    body = {"model": NAME, "input": "a", "max_output_tokens": 5, "regex": "x", "logit_bias": {str(banned): -100}}
    events = raw_events(tiny, body)
    assert [e["type"] for e in events] == [CREATED, PROGRESS, FAILED]
    failed = Response.model_validate(events[-1]["response"])
    assert failed.status == "failed" and failed.error.code == "invalid_prompt" and failed.error.message
    refused = tiny.post("/v1/responses", body)
    assert refused.status_code == 400
    assert failed.error.message.split(": ", 1)[1] == refused.json()["error"]["message"].split(": ", 1)[1]


def test_stored_responses_and_404s(client, tiny):
    kw = dict(model=NAME, input="Hi", max_output_tokens=3)
    kept = client.responses.create(**kw)
    again = client.responses.retrieve(kept.id)
    assert again.model_dump() == kept.model_dump() and again.store is True
    assert loopback.delete(tiny.url + f"/v1/responses/{kept.id}").json() == {
        "id": kept.id, "object": "response.deleted", "deleted": True}
    unkept = client.responses.create(store=False, **kw)
    for gone in (kept.id, unkept.id, "resp_nothing"):
        with pytest.raises(openai.NotFoundError) as e:
            client.responses.retrieve(gone)
        assert e.value.body["param"] == "response_id" and gone in e.value.body["message"]
        with pytest.raises(openai.NotFoundError):
            client.responses.delete(gone)
        with pytest.raises(openai.NotFoundError) as e:
            client.responses.create(previous_response_id=gone, **kw)
        assert e.value.body["param"] == "previous_response_id" and e.value.body["code"] == "previous_response_not_found"
        with pytest.raises(openai.NotFoundError):
            client.responses.input_tokens.count(model=NAME, previous_response_id=gone, input="x")


def test_every_refused_field_is_one_400_by_name(tiny, client):
    refused = [{name: value} for name, value in [
        ("reasoning", {"effort": "low"}), ("include", ["reasoning.encrypted_content"]), ("background", True),
        ("conversation", "conv_1"), ("prompt", {"id": "pmpt_1"}), ("truncation", "auto"), ("top_logprobs", 2),
        ("max_tool_calls", 1), ("context_management", [{"type": "compaction"}]), ("prompt_cache_retention", "24h"),
        ("tools", [{"type": "web_search"}]), ("text", {"verbosity": "high"}), ("frobnicate", True),
        ("input", [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}])]]
    params = []
    for body in refused:
        answer = tiny.post("/v1/responses", {"model": NAME, "input": "x", **body})
        assert answer.status_code == 400, answer.text
        params.append(answer.json()["error"]["param"])
        assert answer.json()["error"]["type"] == "invalid_request_error"
    assert params == ["reasoning", "include", "background", "conversation", "prompt", "truncation", "top_logprobs",
                      "max_tool_calls", "context_management", "prompt_cache_retention", "tools[0]", "text.verbosity",
                      "frobnicate", "input[0].content[0]"]
    # Chat's checks name the field as the Responses request names it.
    too_long = tiny.post("/v1/responses", {"input": "x", "max_output_tokens": 5000}).json()["error"]
    assert too_long["param"] == "max_output_tokens" and too_long["code"] == "context_length_exceeded"
    assert tiny.post("/v1/responses/input_tokens", {"input": "x", "text": {"format": {"type": "json_schema"}}}).json()[
        "error"]["param"] == "text.format"
    assert client.responses.create(model=NAME, input="still here?", max_output_tokens=2).status == "incomplete"
    assert tiny.metric('tiny_llm_requests_total{endpoint="responses",status="400"}') >= len(refused)


# ---- clients --------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_an_openai_agents_agent_on_its_default_model_class(tiny, default_tokenizer, stream):
    """openai-agents' Responses model: tool_choice "required" with the output type's
    text.format gets a call; the tool's result goes back as items (the call, its output)
    with the same format, and `{` (logit_bias) opens the answer."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, function_tool

    sent, calls = [], []
    client = recording_client(tiny.url, sent)
    (brace,) = default_tokenizer.encode("{")
    agent = Agent(name="forecaster", instructions="Answer with the forecast.", output_type=Forecast,
                  tools=[function_tool(weather(calls))], model=OpenAIResponsesModel(model=NAME, openai_client=client),
                  model_settings=ModelSettings(tool_choice="required", temperature=0.0, max_tokens=200,
                                               extra_body={"logit_bias": {str(brace): 100}}))

    output = run_openai_agent(agent, client, stream)
    assert isinstance(output, Forecast) and len(sent) == 2 and len(calls) == 1
    first, second = sent
    assert first["tool_choice"] == "required" and first["text"]["format"]["type"] == "json_schema"
    jsonschema.validate(calls[0], first["tools"][0]["parameters"])
    assert [item.get("type") for item in second["input"]][-2:] == ["function_call", "function_call_output"]
    assert second["text"] == first["text"] and all(body.get("stream", False) == stream for body in sent)
    jsonschema.validate(output.model_dump(), second["text"]["format"]["schema"])


def test_langchain_chat_openai_on_the_responses_api(tiny):
    """ChatOpenAI(use_responses_api=True): invoke, stream, and a bound tool whose call and
    result go back as items."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    def llm(**kw):
        return ChatOpenAI(model=NAME, base_url=tiny.url + "/v1", api_key="unused", use_responses_api=True,
                          max_retries=0, **kw)

    answer = llm(max_tokens=8, temperature=0.0).invoke("Hello")
    assert answer.usage_metadata["output_tokens"] == 8 and answer.text
    assert answer.response_metadata["status"] == "incomplete"
    streamed = list(llm(max_tokens=8, temperature=0.0).stream("Hello"))
    assert "".join(chunk.text for chunk in streamed) == answer.text

    get_weather = weather([])
    question = HumanMessage("Weather in Oslo?")
    call = llm(max_tokens=200).bind_tools([get_weather], tool_choice="get_weather").invoke([question])
    (made,) = call.tool_calls
    assert made["name"] == "get_weather" and made["args"]["city"] in ("Paris", "Oslo")
    assert made["args"]["days"] in (1, 2, 3)
    after = llm(max_tokens=3).bind_tools([get_weather]).invoke(
        [question, call, ToolMessage("rain, 4 degrees", tool_call_id=made["id"])])
    assert after.usage_metadata["output_tokens"] <= 3 and not after.tool_calls
