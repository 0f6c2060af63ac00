"""`tiny-llm serve` against the official `openai` client and plain HTTP, on a live server on
127.0.0.1: a random-weight model with the default model's tokenizer and chat template (the
real model's turn is in test_serve_default.py). Outputs are compared with the engine run
in this process and with the model's own logits, never with fixed strings."""

import concurrent.futures
import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import jsonschema
import mlx.core as mx
import openai
import pytest
from serve_support import loopback, openai_client, running_server
from test_serve_text import TIME, WEATHER

import tiny_llm
from tiny_llm.batch import BatchGenerator
from tiny_llm.constrain.tokens import token_bytes
from tiny_llm.sampler import SamplingParams

pytestmark = pytest.mark.xdist_group("serve-tiny")

NAME = "tiny-served"
EOS = {"2": -100}  # ban the end-of-sequence token: replies run to max_tokens


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    with running_server("--max-batch-size", "16", model=str(tiny_dir)) as server:
        yield server


@pytest.fixture(scope="module")
def local(tiny_dir):
    """The same model loaded in this process: the reference."""
    return tiny_llm.load(str(tiny_dir))


@pytest.fixture(scope="module")
def client(tiny):
    return openai_client(tiny)


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def alone(local, prompt: list[int], max_tokens: int, params: SamplingParams):
    """(tokens, log-probabilities) of one request run by itself in this process."""
    model, tokenizer = local
    gen = BatchGenerator(model, tokenizer)
    gen.insert(prompt, max_tokens, params, logprobs=True)
    out = []
    while gen.has_work():
        out += [(r.token, r.logprobs) for r in gen.step() if r.token not in tokenizer.eos_token_ids]
    return out


def test_models_health_tokenize_and_detokenize(tiny, client, default_tokenizer):
    assert [m.id for m in client.models.list().data] == [NAME]
    assert client.models.retrieve(NAME).id == NAME
    health = tiny.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json()["engine"] == {"alive": True, "step_seconds": 0.0, "failures": 0, "running": 0, "queued": 0}
    assert health.headers["X-Request-Id"].startswith("req-")
    assert tiny.get("/health", headers={"X-Request-Id": "lb-7.probe"}).headers["X-Request-Id"] == "lb-7.probe"
    ids = default_tokenizer.encode("Hello world, again")
    assert tiny.post("/tokenize", {"prompt": "Hello world, again"}).json()["tokens"] == ids
    expected = default_tokenizer.encode(default_tokenizer.apply_chat_template(chat("Hi")))
    answer = tiny.post("/tokenize", {"messages": chat("Hi")}).json()
    assert (answer["tokens"], answer["count"], answer["max_model_len"]) == (expected, len(expected), 2048)
    assert tiny.post("/detokenize", {"tokens": ids}).json() == {"prompt": "Hello world, again"}
    page = tiny.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.text == (Path(tiny_llm.__file__).parent / "serve" / "static" / "chat.html").read_text()


def test_a_streamed_reply_equals_the_whole_one_and_usage_counts_tokens(client, default_tokenizer, local):
    messages = chat("Write about the sea.")
    kw = dict(model=NAME, messages=messages, max_tokens=12, temperature=0.8, seed=3, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    choice = whole.choices[0]
    assert text == choice.message.content and text
    assert [(e.token, e.logprob) for e in entries] == [(e.token, e.logprob) for e in choice.logprobs.content]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and all(c.usage is None for c in chunks[:-1])
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (whole.usage.prompt_tokens, whole.usage.completion_tokens)
    prompt = default_tokenizer.encode(default_tokenizer.apply_chat_template(messages))
    assert whole.usage.prompt_tokens == len(prompt)
    # The second time, the prefix cache holds the whole prompt: all but its last token (whose
    # logits are needed) come from there, and the reply is the same.
    assert usage.prompt_tokens_details.cached_tokens == len(prompt) - 1
    assert choice.finish_reason == "length" and whole.usage.completion_tokens == 12 == len(choice.logprobs.content)
    assert b"".join(bytes(e.bytes) for e in choice.logprobs.content).decode() == text
    # The same tokens and log-probabilities as the engine in this process.
    expected = alone(local, prompt, 12, SamplingParams(temperature=0.8, seed=3, logprobs=2))
    table = token_bytes(default_tokenizer)
    for entry, (token, lp) in zip(choice.logprobs.content, expected):
        assert bytes(entry.bytes) == table[token]
        assert entry.logprob == pytest.approx(lp.logprob, abs=1e-4)
        assert [bytes(t.bytes) for t in entry.top_logprobs] == [table[t] for t, _ in lp.top]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx([v for _, v in lp.top], abs=1e-4)


def test_completion_logprobs_are_the_models_log_softmax(client, local):
    """Teacher forcing: the model run once over prompt + reply gives every reported value."""
    model, tokenizer = local
    prompt = tokenizer.encode("Once upon a time")
    reply = client.completions.create(model=NAME, prompt=prompt, max_tokens=6, temperature=0.7, seed=9,
                                      logprobs=3, logit_bias=EOS)
    tokens = [t for t, _ in alone(local, prompt, 6, SamplingParams(temperature=0.7, seed=9, logit_bias={2: -1e9}))]
    assert tokenizer.decode(tokens) == reply.choices[0].text
    logits = model(mx.array([prompt + tokens[:-1]]))[0, len(prompt) - 1:].astype(mx.float32)
    logprobs = (logits - mx.logsumexp(logits, axis=-1, keepdims=True)).tolist()
    got = reply.choices[0].logprobs
    for i, token in enumerate(tokens):
        assert got.token_logprobs[i] == pytest.approx(logprobs[i][token], abs=1e-4)
        best = sorted(range(len(logprobs[i])), key=lambda t: -logprobs[i][t])[:3]
        assert list(got.top_logprobs[i].values()) == pytest.approx([logprobs[i][t] for t in best], abs=1e-4)
    assert got.text_offset[0] == 0 and got.text_offset == sorted(got.text_offset)


def test_stop_strings_split_across_tokens_end_the_reply(client, tiny):
    kw = dict(model=NAME, prompt="The history of", max_tokens=24, temperature=0.0, logit_bias=EOS)
    full = client.completions.create(logprobs=0, **kw).choices[0]
    offsets, text = full.logprobs.text_offset, full.text
    # A stop string of the last two characters of one token and the first two of the next.
    k = next(k for k in range(3, 20) if offsets[k] - offsets[k - 1] >= 2 and offsets[k + 1] - offsets[k] >= 2
             and text.find(text[offsets[k] - 2: offsets[k] + 2]) == offsets[k] - 2)
    stop = text[offsets[k] - 2: offsets[k] + 2]
    whole = client.completions.create(stop=["never appears §", stop], **kw)
    assert whole.choices[0].text == text[: offsets[k] - 2]
    assert whole.choices[0].finish_reason == "stop"
    assert whole.usage.completion_tokens == k + 1  # drawn up to the token that completed it
    chunks = list(client.completions.create(stop=stop, stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks) == text[: offsets[k] - 2]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert tiny.metric("tiny_llm_running_rows") == 0  # the row left when the stop string appeared


def test_n_choices_share_one_prefill_and_each_follows_its_seed(client, tiny):
    messages = chat("Name three rivers.")
    before = tiny.metric("tiny_llm_prefill_tokens_total")
    kw = dict(model=NAME, messages=messages, max_tokens=6, temperature=1.0, logit_bias=EOS)
    reply = client.chat.completions.create(n=3, seed=11, **kw)
    # The three choices prefill once; what earlier requests left in the prefix cache (the
    # chat template's start) is not prefilled at all.
    cached = reply.usage.prompt_tokens_details.cached_tokens
    assert tiny.metric("tiny_llm_prefill_tokens_total") - before == reply.usage.prompt_tokens - cached
    assert reply.usage.completion_tokens == 18
    texts = [c.message.content for c in sorted(reply.choices, key=lambda c: c.index)]
    for i, text in enumerate(texts):  # choice i draws as a request with seed 11 + i
        single = client.chat.completions.create(seed=11 + i, **kw)
        assert single.choices[0].message.content == text
    assert len(set(texts)) == 3


def test_sixteen_seeded_streams_at_once_equal_each_alone(client, tiny):
    """Sixteen clients stream together (with bad requests among them): every one completes,
    and each reply equals the same request sent alone."""
    topics = ["rain", "the moon over a quiet harbour", "bread", "old maps and the people who drew them",
              "bees", "a long train journey", "chess", "rivers", "snow in the mountains", "clocks",
              "the smell of paper", "owls", "tea", "lighthouses on a stormy coast", "salt", "kites"]

    def request(i: int) -> tuple[str, str]:
        stream = client.chat.completions.create(
            model=NAME, messages=chat(f"Tell me about {topics[i]}."), max_tokens=10 + i, temperature=0.9,
            top_p=0.95, seed=100 + i, stream=True)
        parts, finish = [], None
        for chunk in stream:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        return "".join(parts), finish

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(request, i) for i in range(16)]
        bad = [pool.submit(tiny.post, "/v1/chat/completions", {"messages": chat("x"), "top_p": 2})
               for _ in range(4)]
        together = [f.result(timeout=300) for f in futures]
        assert [f.result().status_code for f in bad] == [400] * 4
    for i in range(16):
        assert request(i) == together[i], i
    assert all(text for text, _ in together)


def test_forced_tool_calls_always_parse_and_validate(client):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    reply = client.chat.completions.create(
        model=NAME, messages=chat("What is the weather in Oslo?"), tools=[WEATHER, TIME], tool_choice="required",
        n=10, temperature=1.0, seed=0, max_tokens=300)
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls", choice.message.content
        (call,) = choice.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        assert call.id.startswith("call_") and call.type == "function"
    assert len({c.message.tool_calls[0].function.arguments for c in reply.choices}) > 1  # sampled
    # A named function, streamed: the call arrives as it is written, its id and name first,
    # then its arguments in pieces (one a token), which add up to valid arguments.
    chunks = list(client.chat.completions.create(
        model=NAME, messages=chat("Weather?"), tools=[WEATHER, TIME], seed=1, max_tokens=300, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    calls = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    first, pieces = calls[0], calls[1:]
    assert (first.index, first.function.name, first.function.arguments, first.type) == (0, "get_weather", "", "function")
    assert first.id.startswith("call_") and len(pieces) > 3
    assert all(p.index == 0 and p.id is None and p.function.name is None for p in pieces)
    jsonschema.validate(json.loads("".join(p.function.arguments for p in pieces)), schemas["get_weather"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


CALL_TEXT = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}\n</tool_call>'


def test_an_auto_tool_call_round_trip_with_a_tool_reply(client, tiny):
    """tool_choice "auto": a reply that holds a call (here made certain by a grammar) comes
    back as message.tool_calls; the call and a role "tool" result go back into the prompt."""
    gbnf = "root ::= " + json.dumps(CALL_TEXT)
    messages = chat("What is the weather in Oslo?")
    kw = dict(model=NAME, messages=messages, tools=[WEATHER], tool_choice="auto", max_tokens=200,
              extra_body={"grammar": gbnf})
    reply = client.chat.completions.create(**kw)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls" and message.content == "Checking."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", {"city": "Oslo", "days": 3})]
    chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert "<tool_call>" not in streamed and streamed.strip() == "Checking."
    # The call as written: its name first, then its arguments, which add up to the whole reply's.
    assert calls[0].function.name == "get_weather" and calls[0].id.startswith("call_")
    assert [c.function.name for c in calls[1:]] == [None] * (len(calls) - 1)
    assert "".join(c.function.arguments for c in calls) == message.tool_calls[0].function.arguments

    conversation = messages + [
        {"role": "assistant", "content": message.content, "tool_calls": [c.model_dump() for c in message.tool_calls]},
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "rain, 4 degrees"}]
    answer = client.chat.completions.create(model=NAME, messages=conversation, tools=[WEATHER], max_tokens=4,
                                            logit_bias=EOS)
    assert answer.choices[0].finish_reason == "length"
    sent = tiny.post("/tokenize", {"messages": conversation, "tools": [WEATHER]}).json()["tokens"]
    assert answer.usage.prompt_tokens == len(sent)
    prompt = tiny.post("/detokenize", {"tokens": sent}).json()["prompt"]
    assert "<tool_response>\nrain, 4 degrees\n</tool_response>" in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}\n</tool_call>' in prompt
    assert '"name": "get_weather"' in prompt.split("<|im_start|>user")[0]  # the definitions, in the system turn


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def test_errors_come_in_openais_shape(tiny, client):
    url = tiny.url + "/v1/chat/completions"
    malformed = loopback.post(url, content=b'{"messages": [', headers={"Content-Type": "application/json"})
    assert "not valid JSON" in error_of(malformed, 400)["message"]
    assert error_of(tiny.post("/v1/chat/completions", {"messages": chat("x"), "temperature": -1}), 400)["param"] \
        == "temperature"
    too_long = error_of(tiny.post("/v1/chat/completions", {"messages": chat("x"), "max_tokens": 5000}), 400)
    assert too_long["code"] == "context_length_exceeded" and "2048" in too_long["message"]
    assert error_of(tiny.post("/v1/completions", {"prompt": "x", "model": "gpt-9"}), 404)["code"] == "model_not_found"
    big = loopback.post(tiny.url + "/v1/completions", content=b'{"prompt": "' + b"a" * (5 << 20) + b'"}')
    assert error_of(big, 413)["code"] == "request_too_large"
    assert error_of(tiny.get("/v1/nothing"), 404)
    surrogate = loopback.post(url, content=b'{"messages": [{"role": "user", "content": "\\ud800"}]}')
    assert error_of(surrogate, 400)["param"] == "messages"
    deep = loopback.post(url, content=b"[" * 100_000 + b"]" * 100_000)
    assert "nested too deeply" in error_of(deep, 400)["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=chat("x"), extra_body={"top_k": -3})
    assert e.value.body["param"] == "top_k"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=chat("x"))
    assert tiny.metric('tiny_llm_requests_total{endpoint="chat",status="400"}') >= 3


@pytest.mark.parametrize("field, value", [("temperature", 1e-50), ("top_k", 2**31), ("logit_bias", ["5+1"])])
def test_a_bad_sampling_field_is_refused_in_sampling_params_words(tiny, field, value):
    """The server has no checks of its own for what SamplingParams checks (the float32 range,
    top_k, logit_bias' shape): its 400 says what the library says, with the field as param."""
    from tiny_llm.sampler.params import ParamError

    with pytest.raises(ParamError) as library:
        SamplingParams(**{field: value})
    error = error_of(tiny.post("/v1/completions", {"prompt": "x", "max_tokens": 2, field: value}), 400)
    assert (error["message"], error["param"]) == (str(library.value), field)


def test_a_request_that_fails_while_decoding_fails_alone(tiny, client, default_tokenizer):
    """A grammar whose only character is banned by logit_bias cannot draw a token: that
    request (both its choices) ends with a 400 (the request's own doing), the streams beside
    it go on unchanged."""
    banned = default_tokenizer.encode("x")[0]
    doomed = {"prompt": "a", "max_tokens": 5, "regex": "x", "logit_bias": {str(banned): -100}, "n": 2}
    kw = [dict(model=NAME, prompt=f"Story number {i}:", max_tokens=40, temperature=1.0, seed=i, logit_bias=EOS)
          for i in range(3)]

    def stream(k):
        return "".join(c.choices[0].text for c in client.completions.create(stream=True, **k))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        streams = [pool.submit(stream, k) for k in kw]
        time.sleep(0.2)  # the streams are running
        failed = tiny.post("/v1/completions", doomed)
        texts = [f.result(timeout=120) for f in streams]
    assert "the grammar allows has logit -inf" in error_of(failed, 400)["message"]
    assert texts == [client.completions.create(**k).choices[0].text for k in kw]
    assert tiny.metric("tiny_llm_running_rows") == 0


def test_a_client_that_disconnects_frees_its_row(tiny):
    cancelled = tiny.metric("tiny_llm_cancelled_requests_total")
    body = {"messages": chat("Go on forever."), "max_tokens": 2000, "stream": True, "logit_bias": EOS}
    with loopback.stream("POST", tiny.url + "/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert [next(lines) for _ in range(6)]  # a few tokens have come: the row is running
    deadline = time.monotonic() + 20
    while tiny.metric("tiny_llm_cancelled_requests_total") == cancelled or tiny.metric("tiny_llm_running_rows"):
        assert time.monotonic() < deadline, "the row was not freed"
        time.sleep(0.05)
    assert tiny.metric("tiny_llm_generation_tokens_total") < 2000 + 200  # it did not run to the end
    # A client of a whole (not streamed) reply that gives up: the same.
    cancelled = tiny.metric("tiny_llm_cancelled_requests_total")
    with pytest.raises(httpx.ReadTimeout):
        loopback.post(tiny.url + "/v1/chat/completions", json={**body, "stream": False}, timeout=1.0)
    deadline = time.monotonic() + 20
    while tiny.metric("tiny_llm_cancelled_requests_total") == cancelled or tiny.metric("tiny_llm_running_rows"):
        assert time.monotonic() < deadline, "the row was not freed"
        time.sleep(0.05)


def test_ctrl_c_ends_open_streams_with_an_error_and_done(tiny_dir):
    with running_server(model=str(tiny_dir)) as server:
        body = {"messages": chat("Go on."), "max_tokens": 2000, "stream": True, "logit_bias": EOS}
        with loopback.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            next(lines)
            os.killpg(server.process.pid, signal.SIGINT)
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][len("data: "):])["error"]["message"] == "the server is shutting down"
        assert server.process.wait(15) in (0, 130)  # 130: the status of a program ended by Ctrl-C
        assert "Traceback" not in server.log.read_text()


def test_api_key_queue_limit_and_prompt_limit(tiny_dir):
    with running_server("--api-key", "sekret", "--max-queue", "1", "--max-batch-size", "1",
                        "--max-prompt-tokens", "40", model=str(tiny_dir)) as server:
        body = {"messages": chat("Hi"), "max_tokens": 2}
        assert error_of(server.post("/v1/chat/completions", body), 401)["code"] == "invalid_api_key"
        wrong = server.post("/v1/chat/completions", body, headers={"Authorization": "Bearer sekreT"})
        assert error_of(wrong, 401)["code"] == "invalid_api_key"
        assert server.get("/health").status_code == 200  # open without the key
        key = {"Authorization": "Bearer sekret"}
        assert server.post("/v1/chat/completions", body, headers=key).status_code == 200
        long = server.post("/v1/chat/completions", {"messages": chat("word " * 50)}, headers=key)
        assert error_of(long, 400)["code"] == "context_length_exceeded"

        # One row decoding, one request waiting: the next one is turned away with 503.
        forever = {"messages": chat("Go on."), "max_tokens": 2000, "stream": True, "logit_bias": EOS}
        answers = []
        with loopback.stream("POST", server.url + "/v1/chat/completions", json=forever, headers=key,
                             timeout=60) as running:
            lines = running.iter_lines()
            while '"content": ""' in (line := next(lines)) or not line:  # until its first token
                pass
            waiting = threading.Thread(target=lambda: answers.append(
                server.post("/v1/chat/completions", body, headers=key)))
            waiting.start()
            deadline = time.monotonic() + 20
            while server.metric("tiny_llm_queue_length") < 1:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            busy = server.post("/v1/chat/completions", body, headers=key)
            assert error_of(busy, 503)["code"] == "queue_full" and busy.headers["Retry-After"] == "1"
        waiting.join(60)
        assert [a.status_code for a in answers] == [200]  # it ran once the stream's row was freed
        assert server.metric('tiny_llm_requests_total{endpoint="chat",status="200"}') == 3
