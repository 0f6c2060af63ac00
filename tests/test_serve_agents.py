"""The request shapes of agent frameworks against `tiny-llm serve`: a forced tool call beside a
`response_format`, tools in "auto" mode beside one (a call or a structured answer), the
deprecated `functions` / `function_call`, and openai-agents and pydantic-ai agents with a tool
and structured output run to their final output, on a live server on 127.0.0.1.

A random-weight model decides nothing sensibly: where a reply may be a call or an answer,
`logit_bias` on its first character (`<` of a call block, `{` of an answer) chooses, and the
grammars make whatever follows valid. Replies are checked against the schemas with
`jsonschema`, never against fixed strings."""

import asyncio
import json
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel
from serve_support import openai_client, running_server
from test_serve_text import TIME, WEATHER

from tiny_llm.constrain import Grammar
from tiny_llm.request import GrammarCache
from tiny_llm.serve.protocol import Context, RequestError, parse
from tiny_llm.serve.tools import call_or_answer_grammar, tool_call_grammar

pytestmark = pytest.mark.xdist_group("serve-agents")

NAME = "tiny-served"
VERDICT = {"type": "object", "additionalProperties": False, "required": ["verdict", "sure"],
           "properties": {"verdict": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT}}
WEATHER_ARGS = WEATHER["function"]["parameters"]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}\n</tool_call>'
BROKEN = {"type": "object", "properties": 3}  # not a schema: every compiler refuses it


def chat(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "Will it rain in Oslo?"}], **fields}


# ---- without a server: the grammars and the request checks ---------------------------------


def no_compiling(monkeypatch):
    """From here on, a grammar that is not in a cache yet cannot be compiled."""
    def refuse(*args, **kwargs):
        raise AssertionError("compiled a grammar again")

    monkeypatch.setattr(Grammar, "from_kind", refuse)


def test_the_call_grammars_take_their_parts_from_the_cache(monkeypatch):
    """Each tool's arguments and the answer's schema are compiled once, through the cache the
    server keeps (the answer's grammar is the one `response_format` alone gets)."""
    cache = GrammarCache()
    first = call_or_answer_grammar([WEATHER, TIME], VERDICT, grammars=cache)
    no_compiling(monkeypatch)
    again = call_or_answer_grammar([TIME, WEATHER], VERDICT, grammars=cache)
    forced = tool_call_grammar([WEATHER], grammars=cache)
    assert first.accepts(CALL) and again.accepts(CALL) and forced.accepts(CALL)
    assert cache.of_kind("json_schema", VERDICT).accepts('{"verdict": "no", "sure": false}')
    assert cache.of_kind("json_schema", WEATHER_ARGS, compact=True).accepts('{"city": "Oslo", "days": 3}')


def test_a_forced_calls_response_format_is_compiled_once_for_the_answer(default_tokenizer, monkeypatch):
    """The format beside a forced call is checked by compiling it into the server's cache, so
    the answer a later turn asks for in that format finds its grammar there."""
    fresh = Context(default_tokenizer, (NAME,), 2048, default_tokenizer.vocab_size)
    parse(chat(tools=[WEATHER], tool_choice="required", response_format=FORMAT), "chat", fresh)
    no_compiling(monkeypatch)
    answer = parse(chat(response_format=FORMAT), "chat", fresh).params[0].grammar
    assert answer.accepts('{"verdict": "yes", "sure": true}') and not answer.accepts(CALL)


def test_a_call_or_an_answer_and_nothing_else():
    """tools "auto" with a response_format: one call block exactly as the forced grammar has
    it, or one JSON value of the format; never both, never text around them."""
    grammar = call_or_answer_grammar([WEATHER, TIME], VERDICT)
    forced, alone = tool_call_grammar([WEATHER, TIME]), Grammar.from_json_schema(VERDICT)
    answers = ['{"verdict": "yes", "sure": true}', '{"verdict":"no","sure":false}',
               '{"verdict": "maybe", "sure": true}', '{"verdict": "yes"}', '[]']
    for answer in answers:
        valid = jsonschema.Draft202012Validator(VERDICT).is_valid(json.loads(answer))
        assert grammar.accepts(answer) == alone.accepts(answer) == valid, answer
    calls = [CALL, CALL.replace("Oslo", "Rome"), CALL.replace('"days": 3', '"days": 9'),
             '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
             '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>']
    for call in calls:
        assert grammar.accepts(call) == forced.accepts(call), call
    assert [grammar.accepts(c) for c in calls] == [True, False, False, True, False]
    for text in (CALL + answers[0], answers[0] + CALL, "Sure. " + CALL, "Sure. " + answers[0], CALL + "\n" + CALL):
        assert not grammar.accepts(text), text


@pytest.fixture(scope="module")
def ctx(default_tokenizer):
    return Context(default_tokenizer, (NAME,), 2048, default_tokenizer.vocab_size)


def test_a_forced_call_beside_a_response_format_is_decoded_as_a_call(ctx):
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        job = parse(chat(tools=[WEATHER, TIME], tool_choice=choice, response_format=FORMAT), "chat", ctx)
        grammar = job.params[0].grammar
        assert grammar.accepts(CALL) and not grammar.accepts('{"verdict": "yes", "sure": true}')
        assert job.tools and not job.legacy
    auto = parse(chat(tools=[WEATHER], response_format={"type": "json_object"}), "chat", ctx).params[0].grammar
    assert auto.accepts(CALL) and auto.accepts('{"anything": [1, 2]}') and not auto.accepts("[1, 2]")
    none = parse(chat(tools=[WEATHER], tool_choice="none", response_format=FORMAT), "chat", ctx).params[0].grammar
    assert not none.accepts(CALL) and none.accepts('{"verdict": "yes", "sure": true}')  # the format alone


def test_functions_are_the_old_spelling_of_tools(ctx, default_tokenizer):
    """The same prompt and grammar as `tools` / `tool_choice`; the old conversation shapes (an
    assistant `function_call`, a `role: "function"` result) render as the new ones do."""
    new = parse(chat(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}),
                "chat", ctx)
    old = parse(chat(functions=[WEATHER["function"], TIME["function"]], function_call={"name": "get_time"}),
                "chat", ctx)
    assert old.prompt == new.prompt and old.legacy and old.tools and not new.legacy
    assert old.params[0].grammar.gbnf == new.params[0].grammar.gbnf
    assert parse(chat(functions=[WEATHER["function"]], function_call="none"), "chat", ctx).tools is False
    arguments = '{"city": "Oslo", "days": 3}'
    turns = [{"role": "user", "content": "Weather?"}]
    new_turns = turns + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"}]
    old_turns = turns + [{"role": "assistant", "content": None,
                          "function_call": {"name": "get_weather", "arguments": arguments}},
                         {"role": "function", "name": "get_weather", "content": "rain"}]
    old = parse({"messages": old_turns, "functions": [WEATHER["function"]]}, "chat", ctx)
    assert old.prompt == parse({"messages": new_turns, "tools": [WEATHER]}, "chat", ctx).prompt
    text = default_tokenizer.decode(old.prompt)
    assert f'{{"name": "get_weather", "arguments": {arguments}}}' in text and "<tool_response>\nrain\n" in text


FUNCTION = WEATHER["function"]


@pytest.mark.parametrize("body, param", [
    (chat(functions=[FUNCTION], tools=[WEATHER]), "functions"),
    (chat(functions=[FUNCTION], tool_choice="auto"), "functions"),
    (chat(tools=[WEATHER], function_call="auto"), "function_call"),
    (chat(functions=[]), "functions"),
    (chat(functions=[FUNCTION, "get_time"]), "functions[1]"),
    (chat(functions=[{"description": "no name"}]), "functions[0].name"),
    (chat(functions=[FUNCTION, FUNCTION]), "functions[1].name"),
    (chat(functions=[{"name": "f", "parameters": [1]}]), "functions[0].parameters"),
    (chat(function_call="auto"), "function_call"),  # no functions
    (chat(functions=[FUNCTION], function_call={"name": "nope"}), "function_call"),
    (chat(functions=[FUNCTION], function_call="required"), "function_call"),  # not a value of the old field
    (chat(tools=[WEATHER], tool_choice="required", response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": BROKEN}}), "response_format"),  # checked though this reply is a call
    (chat(tools=[WEATHER], response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": BROKEN}}),
     "response_format"),
    (chat(tools=[WEATHER, {"type": "function", "function": {"name": "bad", "parameters": BROKEN}}],
          response_format=FORMAT), "tools[1].function.parameters"),
    (chat(tools=[{"type": "function", "function": {"name": "bad", "parameters": BROKEN}}], tool_choice="required"),
     "tools[0].function.parameters"),
    (chat(functions=[{"name": "bad", "parameters": BROKEN}], response_format=FORMAT), "functions[0].parameters"),
    ({"messages": [{"role": "assistant", "content": None, "function_call": "get_weather"}]},
     "messages[0].function_call"),
])
def test_bad_tool_fields_are_refused_by_name(ctx, body, param):
    with pytest.raises(RequestError) as e:
        parse(body, "chat", ctx)
    assert (e.value.param, e.value.status) == (param, 400), e.value.message
    assert param.split("[")[0] in e.value.message


def test_old_and_new_spellings_together_name_both(ctx):
    with pytest.raises(RequestError) as e:
        parse(chat(functions=[FUNCTION], function_call="auto", tools=[WEATHER]), "chat", ctx)
    assert e.value.message == ("functions is the deprecated spelling of tools: send tools and tool_choice, "
                               "or functions and function_call, not tools and functions")


# ---- a live server ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tiny_dir):
    with running_server("--max-batch-size", "4", model=str(tiny_dir)) as server:
        yield server


@pytest.fixture(scope="module")
def client(served):
    return openai_client(served)


@pytest.fixture(scope="module")
def bias(default_tokenizer) -> dict[str, dict[str, int]]:
    """`logit_bias` that makes a reply which may be a call or an answer begin as a call block
    ("call") or as an answer ("answer")."""
    (lt,), (brace,) = default_tokenizer.encode("<"), default_tokenizer.encode("{")
    return {"call": {str(lt): 100}, "answer": {str(brace): 100}}


def streamed(client, **kw) -> tuple[str, list[tuple[str, str]], str]:
    """(content, tool calls as (name, arguments) joined from their deltas as a client joins
    them, finish reason) of a streamed chat reply."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for piece in delta.tool_calls or []:
            name, arguments = calls.get(piece.index, ("", ""))
            calls[piece.index] = (name + (piece.function.name or ""), arguments + (piece.function.arguments or ""))
        finish = chunk.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def test_a_forced_call_beside_a_response_format(client):
    """OpenAI's reading: the forced call comes first, the format is for a later answer."""
    kw = dict(model=NAME, messages=chat()["messages"], tools=[WEATHER, TIME], response_format=FORMAT,
              temperature=1.0, max_tokens=200)
    reply = client.chat.completions.create(tool_choice="required", seed=0, n=2, **kw)
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        schema = {"get_weather": WEATHER_ARGS, "get_time": TIME["function"]["parameters"]}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), schema)
    content, calls, finish = streamed(client, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                      seed=1, **kw)
    assert (content, finish, [name for name, _ in calls]) == ("", "tool_calls", ["get_weather"])
    jsonschema.validate(json.loads(calls[0][1]), WEATHER_ARGS)


def test_auto_tools_beside_a_response_format_answer_or_call(client, bias):
    kw = dict(model=NAME, messages=chat()["messages"], tools=[WEATHER], response_format=FORMAT, temperature=0.0,
              max_tokens=200)
    answer = client.chat.completions.create(logit_bias=bias["answer"], tool_choice="auto", **kw).choices[0]
    assert answer.finish_reason == "stop" and answer.message.tool_calls is None
    jsonschema.validate(json.loads(answer.message.content), VERDICT)
    call = client.chat.completions.create(logit_bias=bias["call"], tool_choice="auto", **kw).choices[0]
    assert call.finish_reason == "tool_calls" and call.message.content is None
    (made,) = call.message.tool_calls
    assert made.function.name == "get_weather"
    jsonschema.validate(json.loads(made.function.arguments), WEATHER_ARGS)
    # Streamed, and with tool_choice left out ("auto" by default): the same replies (greedy),
    # the call's deltas adding up to the same call.
    assert streamed(client, logit_bias=bias["answer"], **kw) == (answer.message.content, [], "stop")
    content, calls, finish = streamed(client, logit_bias=bias["call"], **kw)
    assert (content, finish) == ("", "tool_calls")
    assert calls == [(made.function.name, made.function.arguments)]


def test_auto_tools_beside_json_object(client, bias, default_tokenizer):
    kw = dict(model=NAME, messages=chat()["messages"], tools=[WEATHER], response_format={"type": "json_object"},
              temperature=0.0, max_tokens=200)
    (close,) = default_tokenizer.encode("}")  # and the object ends at once: any object is allowed
    answer = client.chat.completions.create(logit_bias={**bias["answer"], str(close): 100}, **kw).choices[0]
    assert answer.finish_reason == "stop" and json.loads(answer.message.content) == {}
    call = client.chat.completions.create(logit_bias=bias["call"], **kw).choices[0]
    jsonschema.validate(json.loads(call.message.tool_calls[0].function.arguments), WEATHER_ARGS)


def test_deprecated_functions_get_the_deprecated_answer(client, served, bias):
    messages = chat()["messages"]
    kw = dict(model=NAME, messages=messages, functions=[WEATHER["function"]], temperature=0.0, max_tokens=200)
    forced = client.chat.completions.create(function_call={"name": "get_weather"}, response_format=FORMAT, **kw)
    choice = forced.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    assert choice.message.content is None and choice.message.function_call.name == "get_weather"
    jsonschema.validate(json.loads(choice.message.function_call.arguments), WEATHER_ARGS)
    raw = served.post("/v1/chat/completions", {**kw, "function_call": {"name": "get_weather"}}).json()
    assert set(raw["choices"][0]["message"]) == {"role", "content", "function_call"}  # no tool_calls at all
    assert raw["choices"][0]["message"]["function_call"] == choice.message.function_call.model_dump()

    chunks = list(client.chat.completions.create(function_call="auto", response_format=FORMAT, logit_bias=bias["call"],
                                                 stream=True, **kw))
    deltas = [c.choices[0].delta.function_call for c in chunks if c.choices[0].delta.function_call]
    assert [(d.name, d.arguments) for d in deltas] == [("get_weather", choice.message.function_call.arguments)]
    assert all(c.choices[0].delta.tool_calls is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "function_call"

    # The result goes back the old way: the assistant's function_call, then a "function" message.
    made = choice.message.function_call.model_dump()
    turn = messages + [{"role": "assistant", "content": None, "function_call": made},
                       {"role": "function", "name": "get_weather", "content": "rain, 4 degrees"}]
    answer = client.chat.completions.create(**{**kw, "messages": turn, "max_tokens": 3}, function_call="none",
                                            logit_bias={"2": -100})
    assert answer.choices[0].finish_reason == "length" and answer.choices[0].message.function_call is None
    prompt = served.post("/detokenize", {"tokens": served.post("/tokenize", {"messages": turn}).json()["tokens"]})
    assert "<tool_response>\nrain, 4 degrees\n</tool_response>" in prompt.json()["prompt"]


def test_the_errors_reach_the_client_by_name(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=chat()["messages"], tools=[WEATHER],
                                       functions=[WEATHER["function"]])
    assert e.value.body["param"] == "functions" and "deprecated spelling of tools" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=chat()["messages"], functions=[WEATHER["function"]],
                                       function_call={"name": "get_time"})
    assert e.value.body["param"] == "function_call"


# ---- agent frameworks -------------------------------------------------------------------------


class Forecast(BaseModel):
    city: Literal["Paris", "Oslo"]
    rain: bool


def recording_client(url: str, sent: list[dict]) -> openai.AsyncOpenAI:
    """An async client that keeps every request body it sends in `sent`."""

    async def record(request):
        sent.append(json.loads(request.content))

    http = openai.DefaultAsyncHttpxClient(event_hooks={"request": [record]}, timeout=120)
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, http_client=http)


def run_openai_agent(agent, client, stream: bool):
    """The final output of an openai-agents run of `agent` on the weather question (at most
    three turns, streamed or not), `client` closed afterwards."""
    from agents import RunConfig, Runner

    async def run():
        config = RunConfig(tracing_disabled=True)
        try:
            if not stream:
                return (await Runner.run(agent, "Will it rain in Oslo?", run_config=config, max_turns=3)).final_output
            result = Runner.run_streamed(agent, "Will it rain in Oslo?", run_config=config, max_turns=3)
            async for _ in result.stream_events():
                pass
            return result.final_output
        finally:
            await client.close()

    return asyncio.run(run())


def weather(calls: list):
    def get_weather(city: Literal["Paris", "Oslo"], days: Literal[1, 2, 3]) -> str:
        """The weather in a city for the next days."""
        calls.append({"city": city, "days": days})
        return f"rain in {city} for {days} days"

    return get_weather


def check_turns(sent: list[dict], calls: list[dict], first_choice) -> None:
    """Two requests: one with the tool and the format that got a call, one with its result
    that got the answer; the call's arguments validate against the parameters sent."""
    assert len(sent) == 2 and len(calls) == 1
    first, second = sent
    assert first.get("tool_choice") == first_choice and first["response_format"]["type"] == "json_schema"
    (tool,) = first["tools"]
    jsonschema.validate(calls[0], tool["function"]["parameters"])
    assert [m["role"] for m in second["messages"]][-2:] == ["assistant", "tool"]
    assert second["response_format"] == first["response_format"]


@pytest.mark.parametrize("stream", [False, True])
def test_an_openai_agents_agent_with_a_tool_and_an_output_type(served, bias, stream):
    """openai-agents sends tool_choice "required" with the output type's response_format, then
    (tool_choice reset) the tool's result with the same format: a call, then the answer."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, function_tool

    sent, calls = [], []
    client = recording_client(served.url, sent)
    # One bias for every turn: `{` opens the answer once tool_choice is reset; under the forced
    # call grammar the only `{` allowed are the call's own.
    agent = Agent(name="forecaster", instructions="Answer with the forecast.", output_type=Forecast,
                  tools=[function_tool(weather(calls))],
                  model=OpenAIChatCompletionsModel(model=NAME, openai_client=client),
                  model_settings=ModelSettings(tool_choice="required", temperature=0.0, max_tokens=200,
                                               extra_body={"logit_bias": bias["answer"]}))

    output = run_openai_agent(agent, client, stream)
    assert isinstance(output, Forecast)
    check_turns(sent, calls, "required")
    assert "tool_choice" not in sent[1] and all(body.get("stream", False) == stream for body in sent)
    jsonschema.validate(output.model_dump(), sent[1]["response_format"]["json_schema"]["schema"])


@pytest.mark.parametrize("stream", [False, True])
def test_a_pydantic_ai_agent_with_a_tool_and_native_output(served, bias, stream):
    """pydantic-ai sends its tools in "auto" mode with NativeOutput's response_format: the
    first reply (biased to a call block) calls the tool, the second (to an answer) is the
    output."""
    from pydantic_ai import Agent, NativeOutput, RunContext
    from pydantic_ai.messages import ToolReturnPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    def settings(ctx: RunContext) -> dict:
        answered = any(isinstance(part, ToolReturnPart) for m in ctx.messages for part in getattr(m, "parts", ()))
        return {"temperature": 0.0, "max_tokens": 200, "logit_bias": bias["answer" if answered else "call"]}

    sent, calls = [], []
    client = recording_client(served.url, sent)
    model = OpenAIChatModel(NAME, provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, output_type=NativeOutput(Forecast), model_settings=settings, tools=[weather(calls)])

    async def run():
        try:
            if not stream:
                return (await agent.run("Will it rain in Oslo?")).output
            async with agent.run_stream("Will it rain in Oslo?") as result:
                return await result.get_output()
        finally:
            await client.close()

    output = asyncio.run(run())
    assert isinstance(output, Forecast)
    check_turns(sent, calls, "auto")
    assert all(body.get("stream", False) == stream for body in sent)
    jsonschema.validate(output.model_dump(), sent[1]["response_format"]["json_schema"]["schema"])
