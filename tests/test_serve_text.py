"""The server's text handling and request checks, without a server: stop strings and tool
calls cut out of streamed text at every possible split, tools in the prompt, and every
field a request can get wrong."""

import json
import random
from pathlib import Path

import jsonschema
import pytest

from tiny_llm.constrain import Grammar
from tiny_llm.constrain.pushdown import Automaton
from tiny_llm.serve.protocol import Context, RequestError, parse
from tiny_llm.serve.text import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, StopStrings, ToolCallText, parse_tool_call
from tiny_llm.serve.tools import conversation, tool_call_grammar

# An OpenAI tool definition, as a client sends it (also the soak's, scripts/soak_serve.py).
WEATHER = json.loads((Path(__file__).resolve().parent.parent / "examples" / "weather-tool.json").read_text())
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "additionalProperties": False}}}


def splits(text: str):
    """`text` cut into pieces at every pair of positions."""
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            yield [text[:i], text[i:j], text[j:]]


def run_stops(pieces, stops):
    matcher, out = StopStrings(stops), ""
    for piece in pieces:
        text, found = matcher.feed(piece)
        out += text
        if found:
            return out, True
    return out + matcher.flush(), False


@pytest.mark.parametrize("stops", [["END"], ["EN", "xyz"], ["ENDING", "D o"]])
def test_a_stop_string_is_found_however_the_text_is_split(stops):
    text = "Hello wor\nld ENDING more"
    expected_at = min(i for i in (text.find(s) for s in stops) if i >= 0)
    for pieces in splits(text):
        out, found = run_stops(pieces, stops)
        assert found and out == text[:expected_at], pieces


def test_text_that_only_begins_a_stop_string_is_held_then_released():
    matcher = StopStrings(["</end>"])
    assert matcher.feed("a </e") == ("a ", False)  # "</e" may begin the stop string
    assert matcher.feed("x") == ("</ex", False)  # it did not
    assert matcher.feed("</en") == ("", False)
    assert matcher.flush() == "</en"  # the reply ended: nothing is lost


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'


def run_tools(pieces):
    stream, content, calls = ToolCallText(), "", []
    for piece in pieces:
        text, new = stream.feed(piece)
        content, calls = content + text, calls + new
    text, new = stream.finish()
    return content + text, calls + new


def test_tool_calls_are_cut_out_however_the_text_is_split():
    text = f"Let me check.\n{CALL}\n{CALL.replace('Paris', 'Oslo')} done"
    for pieces in splits(text):
        content, calls = run_tools(pieces)
        assert content == "Let me check.\n\n done", pieces
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [
            ("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "Oslo", "days": 2})]


@pytest.mark.parametrize("block", [
    "<tool_call>\nnot json\n</tool_call>",
    '<tool_call>{"arguments": {}}</tool_call>',  # no name
    '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',  # arguments not an object
    '<tool_call>{"name": "f", "arguments": {"a": 1}',  # cut off: no closing brace
])
def test_a_malformed_tool_call_stays_in_the_content(block):
    content, calls = run_tools(["before ", block])
    assert calls == [] and content == "before " + block


def test_a_call_left_open_at_the_end_still_counts():
    content, calls = run_tools(['<tool_call>\n{"name": "get_time", "arguments": {}}'])
    assert content == "" and [c.name for c in calls] == ["get_time"]
    assert parse_tool_call('{"name": "f", "arguments": "{\\"x\\": 1}"}').arguments == '{"x": 1}'


def test_the_forced_call_grammar_takes_exactly_the_valid_calls():
    grammar = tool_call_grammar([WEATHER, TIME])
    assert grammar.accepts(CALL)
    assert grammar.accepts('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert not grammar.accepts(CALL.replace("Paris", "Rome"))  # not in the enum
    assert not grammar.accepts(CALL.replace('"days": 2', '"days": 9'))  # above the maximum
    assert not grammar.accepts(CALL + "\n" + CALL)  # one call
    named = tool_call_grammar([WEATHER, TIME], "get_time")
    assert not named.accepts(CALL) and named.accepts('<tool_call>\n{"name":"get_time","arguments":{}}\n</tool_call>')


def same_language(a: Grammar, b: Grammar, walks: int, seed: int = 0) -> None:
    """`a` and `b` allow the same next bytes (and end alike) all along random walks: the same
    token masks, so the same tokens under the same seed."""
    rng = random.Random(seed)
    for _ in range(walks):
        s, t, text = a.automaton.start, b.automaton.start, b""
        while True:
            allowed = [x for x in range(256) if a.automaton.step(s, x) != Automaton.DEAD]
            assert allowed == [x for x in range(256) if b.automaton.step(t, x) != Automaton.DEAD], text
            assert a.automaton.accepting(s) == b.automaton.accepting(t), text
            if not allowed:
                break
            x = rng.choice(allowed)
            s, t, text = a.automaton.step(s, x), b.automaton.step(t, x), text + bytes([x])


def test_the_call_grammar_writes_a_call_as_the_schema_compiler_writes_its_json():
    """A call block is the compact JSON of `{"name": <the name>, "arguments": <the schema>}`,
    both required, nothing else, as `Grammar.from_json_schema` has it."""
    def call(tool: dict) -> Grammar:
        function = tool["function"]
        return Grammar.from_json_schema({
            "type": "object", "properties": {"name": {"const": function["name"]}, "arguments": function["parameters"]},
            "required": ["name", "arguments"], "additionalProperties": False}, compact=True)

    block = Grammar.concat(Grammar.literal(TOOL_CALL_OPEN + "\n"), Grammar.union(call(WEATHER), call(TIME)),
                           Grammar.literal("\n" + TOOL_CALL_CLOSE))
    same_language(tool_call_grammar([WEATHER, TIME]), block, walks=20)


def test_tools_and_their_results_become_text_for_a_template_without_tools():
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 1}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "rain"}]
    out = conversation(messages, [WEATHER], template_takes_tools=False)
    assert out[0]["role"] == "system" and json.dumps(WEATHER) in out[0]["content"]
    assert out[2]["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}\n</tool_call>'
    assert out[3] == {"role": "user", "content": "<tool_response>\nrain\n</tool_response>"}
    assert conversation(messages, [WEATHER], template_takes_tools=True) == messages


@pytest.fixture(scope="module")
def ctx(default_tokenizer):
    return Context(default_tokenizer, ("default",), 1000, default_tokenizer.vocab_size, max_prompt_tokens=300)


def chat(**fields):
    return {"messages": [{"role": "user", "content": "Hi"}], **fields}


def test_a_good_request_becomes_a_job(ctx, default_tokenizer):
    job = parse(chat(max_tokens=5, temperature=0.5, top_k=3, seed=7, n=2, stop="x", logprobs=True,
                     top_logprobs=2, samplers="vllm", logit_bias={"5": -100, "6": 2}), "chat", ctx)
    assert job.prompt == default_tokenizer.encode(default_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}]))
    assert (job.max_tokens, job.stop, job.logprobs) == (5, ["x"], 2)
    assert [p.seed for p in job.params] == [7, 8]  # choice i draws with seed + i
    p = job.params[0]
    assert (p.temperature, p.top_k, p.logprobs, p.order[:2]) == (0.5, 3, 2, ("penalties", "temperature"))
    assert p.logit_bias == {5: float("-inf"), 6: 2.0}
    assert parse({"prompt": [1, 2, 3]}, "completion", ctx).prompt == [1, 2, 3]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    job = parse(chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}),
                "chat", ctx)
    assert job.params[0].grammar.accepts('{"a": 1}') and not job.params[0].grammar.accepts('{"b": 1}')
    assert job.max_tokens == 256  # the default


@pytest.mark.parametrize("body, param, status", [
    (chat(temperature=-1), "temperature", 400),
    (chat(temperature=2.5), "temperature", 400),  # OpenAI's range is 0 to 2
    (chat(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools[0].function.name", 400),
    (chat(tools=[{"type": "function", "function": {"name": "x" * 65}}]), "tools[0].function.name", 400),
    (chat(temperature="hot"), "temperature", 400),
    (chat(top_k=1.5), "top_k", 400),
    (chat(n=0), "n", 400),
    (chat(max_tokens=0), "max_tokens", 400),
    (chat(max_tokens=990), "max_tokens", 400),  # beyond the context of 1000
    (chat(max_tokens=3, max_completion_tokens=4), "max_completion_tokens", 400),
    (chat(stop=["a", ""]), "stop", 400),
    (chat(logit_bias={"x": 1}), "logit_bias", 400),
    (chat(logit_bias={"1": 101}), "logit_bias", 400),
    (chat(logit_bias={"99999": 1}), "logit_bias", 400),  # outside the vocabulary
    (chat(top_logprobs=2), "top_logprobs", 400),
    (chat(logprobs=True, top_logprobs=21), "top_logprobs", 400),
    (chat(samplers="nonsense"), "samplers", 400),
    (chat(stream_options={"include_usage": True}), "stream_options", 400),
    (chat(response_format={"type": "xml"}), "response_format", 400),
    (chat(grammar="root ::= ", regex="a"), "regex", 400),
    (chat(grammar="root ::= [a"), "grammar", 400),
    (chat(json_schema={"type": "object", "properties": 3}), "json_schema", 400),
    (chat(tools=[{"type": "function"}]), "tools[0]", 400),
    (chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice", 400),
    (chat(tool_choice="required"), "tool_choice", 400),
    (chat(frobnicate=1), "frobnicate", 400),
    (chat(regex="yes|no", mirostat=2), "regex", 400),  # named as the request names it
    (chat(model="gpt-4"), "model", 404),
    (chat(model=5), "model", 400),
    (chat(logit_bias={" 1 ": 1}), "logit_bias", 400),
    (chat(stream=True, stream_options={"include_usage": 1}), "stream_options.include_usage", 400),
    ({"messages": [{"role": "user", "content": "a \ud800 b"}]}, "messages", 400),  # a lone surrogate
    ({"messages": []}, "messages", 400),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", 400),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content", 400),
    ({"messages": [{"role": "user", "content": "word " * 400}]}, "messages/prompt", 400),  # --max-prompt-tokens
    ("not an object", None, 400),
])
def test_every_bad_field_is_refused_by_name(ctx, body, param, status):
    with pytest.raises(RequestError) as e:
        parse(body, "chat", ctx)
    assert (e.value.param, e.value.status) == (param, status), e.value.message
    shape = e.value.to_openai()["error"]
    assert set(shape) == {"message", "type", "param", "code"} and shape["message"]


@pytest.mark.parametrize("body, param", [
    ({"prompt": ""}, "prompt"), ({"prompt": [1, -2]}, "prompt"), ({"prompt": [49152]}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "logprobs": 30}, "logprobs"), ({"prompt": "x", "tools": []}, "tools"),
    ({"prompt": "\udc80"}, "prompt"),
])
def test_bad_completion_requests_are_refused_by_name(ctx, body, param):
    with pytest.raises(RequestError) as e:
        parse(body, "completion", ctx)
    assert e.value.param == param, e.value.message


def test_forced_call_grammar_outputs_validate_against_the_schema():
    """The arguments a forced-call grammar accepts are the ones the schema validates."""
    grammar = tool_call_grammar([WEATHER])
    schema = WEATHER["function"]["parameters"]
    for city in ("Paris", "Oslo", "Rome"):
        for days in (0, 1, 7, 8):
            text = f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}", "days": {days}}}}}\n</tool_call>'
            valid = jsonschema.Draft202012Validator(schema).is_valid({"city": city, "days": days})
            assert grammar.accepts(text) == valid, text


def test_a_template_that_reads_tools_renders_them_itself(default_tokenizer):
    """Tools reach a template that takes them as the `tools` variable; calls and results stay
    messages (the template formats them); no preamble is added."""
    from tiny_llm.tokenizer import Tokenizer

    template = ("{% for t in tools or [] %}[tool {{ t.function.name }}]{% endfor %}"
                "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                "{% for c in m.tool_calls or [] %}[call {{ c.function.name }} {{ c.function.arguments.city }}]"
                "{% endfor %}{% endfor %}<assistant>")
    tokenizer = Tokenizer(default_tokenizer.backend, eos_tokens=["<|im_end|>"], chat_template=template)
    assert tokenizer.template_takes_tools and not default_tokenizer.template_takes_tools
    ctx = Context(tokenizer, ("m",), None, tokenizer.vocab_size)
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 1}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "rain"}]
    job = parse({"messages": messages, "tools": [WEATHER, TIME]}, "chat", ctx)
    assert tokenizer.decode(job.prompt) == (
        "[tool get_weather][tool get_time]<user>Weather?<assistant>[call get_weather Oslo]<tool>rain<assistant>")
    none = parse({"messages": messages[:1], "tools": [WEATHER], "tool_choice": "none"}, "chat", ctx)
    assert tokenizer.decode(none.prompt) == "<user>Weather?<assistant>"  # "none": the model is not shown tools


def test_forced_calls_follow_parameters_with_references():
    """Parameter schemas with $defs and '#' references (what pydantic writes) keep their
    meaning inside the call grammar, and the JSON is on one line."""
    city = {"type": "object", "properties": {"name": {"enum": ["Oslo", "Paris"]}}, "required": ["name"],
            "additionalProperties": False}
    tool = {"type": "function", "function": {"name": "trip", "parameters": {
        "$defs": {"City": city}, "type": "object", "additionalProperties": False, "required": ["to"],
        "properties": {"to": {"$ref": "#/$defs/City"}, "then": {"$ref": "#"}}}}}
    grammar = tool_call_grammar([tool, WEATHER])

    def call(arguments: str) -> str:
        return f'<tool_call>\n{{"name": "trip", "arguments": {arguments}}}\n</tool_call>'

    assert grammar.accepts(call('{"to": {"name": "Oslo"}}'))
    assert grammar.accepts(call('{"to": {"name": "Oslo"}, "then": {"to": {"name": "Paris"}}}'))
    assert not grammar.accepts(call('{"to": {"name": "Rome"}}'))
    assert not grammar.accepts(call('{"to": {"name": "Oslo"}, "then": {"to": "Paris"}}'))
    assert not grammar.accepts(call('{"to":\n{"name": "Oslo"}}'))  # no newlines inside the call


def test_two_constraints_are_refused_naming_every_source(ctx):
    """The server's message lists each field that can carry a grammar, as the request names them."""
    with pytest.raises(RequestError) as e:
        parse(chat(regex="a", grammar='root ::= "a"'), "chat", ctx)
    assert e.value.message == "send one of response_format, grammar, regex and json_schema, not grammar and regex"
    assert e.value.param == "regex"


def test_a_call_streams_its_name_then_its_arguments_as_written():
    """Fed a few characters at a time, a call block gives its id and name as soon as they are
    written, then its arguments in pieces; the whole call has the same id and, as arguments,
    exactly the pieces joined. Content around the block is untouched."""
    from tiny_llm.serve.text import ToolCallText

    text = ('Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris}", "n": {"a": 1}}}\n'
            '</tool_call> then <tool_call>\n{"name": "t", "arguments": {}}\n</tool_call>')
    split = ToolCallText()
    content, calls, deltas = "", [], []
    for i in range(0, len(text), 3):
        c, done = split.feed(text[i:i + 3])
        content, calls, deltas = content + c, calls + done, deltas + split.deltas()
        if done == [] and deltas and not calls:
            assert deltas[0].name == "get_weather"  # known before the block closes
    c, done = split.finish()
    content, calls = content + c, calls + done
    assert content == "Sure.  then "
    starts = [d for d in deltas if d.id is not None]
    assert [(d.index, d.name, d.arguments) for d in starts] == [(0, "get_weather", ""), (1, "t", "")]
    assert [c.id for c in calls] == [d.id for d in starts] and all(c.streamed for c in calls)
    for k, call in enumerate(calls):
        assert "".join(d.arguments for d in deltas if d.index == k) == call.arguments
    assert calls[0].arguments == '{"city": "Pa\\"ris}", "n": {"a": 1}}' and calls[1].arguments == "{}"
    assert len([d for d in deltas if d.index == 0]) > 5  # in pieces, not at once


def test_a_block_that_starts_otherwise_comes_whole_and_a_broken_one_as_text():
    from tiny_llm.serve.text import ToolCallText

    split = ToolCallText()
    out = split.feed('<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call><tool_call>{"name": "g", '
                     '"arguments": {"y": </tool_call>')
    assert split.deltas()[0].name == "g"  # the broken block began as a call
    assert out == ('<tool_call>{"name": "g", "arguments": {"y": </tool_call>', [out[1][0]])
    (call,) = out[1]
    assert (call.name, call.arguments, call.streamed) == ("f", '{"x": 1}', False)
