"""`tiny-llm serve` with the real default model (SmolLM2-135M-Instruct): a chat turn through
the official `openai` client, whole and streamed, and structured output that always
validates. Each token costs a fifth of a second here, so the replies are short."""

import json

import jsonschema
import pytest
from serve_support import openai_client, running_server

pytestmark = pytest.mark.xdist_group("serve-default")

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 16},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}


@pytest.fixture(scope="module")
def client():
    with running_server("--max-batch-size", "10") as server:
        yield openai_client(server, timeout=300)


def test_a_chat_turn_whole_and_streamed(client, default_tokenizer):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    kw = dict(model="default", messages=messages, max_tokens=10, temperature=0.0)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = whole.choices[0].message.content
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert "Paris" in text  # the real model's greedy answer
    prompt = default_tokenizer.encode(default_tokenizer.apply_chat_template(messages))
    assert whole.usage.prompt_tokens == len(prompt) == chunks[-1].usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == len(prompt) - 1  # the prefix cache
    finish = whole.choices[0].finish_reason
    assert (finish, whole.usage.completion_tokens) == ("length", 10) or (
        finish == "stop" and whole.usage.completion_tokens <= 10)


def test_six_of_six_json_schema_replies_validate(client):
    """response_format json_schema: six sampled choices (one prefill), each a whole JSON value
    that validates, ended by the model's own end-of-sequence token."""
    reply = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Describe a person as JSON with a name and an age."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        n=6, temperature=0.8, seed=0, max_tokens=80)
    assert len(reply.choices) == 6
    for choice in reply.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    assert len({c.message.content for c in reply.choices}) > 3  # sampled, not one reply six times
