"""`tiny-llm serve` under fuzzing, on a live server on 127.0.0.1 (the random-weight model of
`serve_support.tiny_served_model`):

- Schemathesis drives every operation of the server's own OpenAPI description
  (`GET /openapi.json`, `tiny_llm.serve.openapi`) with requests valid and invalid under it.
  Every answer is a 2xx or a 4xx, never a 5xx; every refusal is OpenAI's error object; a 2xx
  body (JSON, or each event of a stream) is valid under the described schema; and a request
  the description calls invalid is refused (the description forbids nothing protocol takes).
- Raw HTTP on plain sockets: malformed request lines, huge headers, truncated and
  non-UTF-8 bodies, JSON nested 100 000 deep, bodies that are not objects.
- The description itself: it covers every route of `create_app` and exactly the fields
  protocol accepts, its bounds are protocol's, and it is valid OpenAPI 3.1.

Afterwards the engine is alive: /health answers 200, a seeded chat request answers as a
second identical one does, and /metrics counted no 5xx. `test_fuzz_every_operation` prints
the counts of the fuzzing (requests per operation and mode, answers by status; `pytest -rP`
shows them). Defects the fuzzing found outside protocol.py have their own tests at the end.
"""

import json
import math
import re
import socket
import time
from collections import Counter
from types import SimpleNamespace

import jsonschema
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                               response_headers_conformance, response_schema_conformance,
                                               status_code_conformance)
from conftest import examples
from serve_support import running_server

from tiny_llm.sampler.params import MAX_TOP_K
from tiny_llm.serve import anthropic
from tiny_llm.serve.app import create_app
from tiny_llm.serve.openapi import describe
from tiny_llm.serve.protocol import (CHAT, COMPLETION, EXTENSIONS, IGNORED, MAX_CHOICES, MAX_TOP_LOGPROBS, Context,
                                     RequestError, parse)

pytestmark = pytest.mark.xdist_group("serve-fuzz")

NAME = "tiny-served"  # the name of conftest's tiny_dir
SEED = 20_321  # hypothesis' seed: the same requests on every run
TIMEOUT = 30  # seconds for any one request: a hang fails the test instead of stalling it
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance, negative_data_rejection]

# Every operation of the description, with how many requests the fuzzer sends in each mode
# (positive: valid under the description; negative: invalid in at least one place). An
# operation without parameters or body has one valid request and no invalid one; a path
# parameter typed "string" cannot be made invalid. The numbers are a full run's (a quick run
# sends a fifth, at least one: conftest.examples); they keep a full run of the file near
# 40 s on two cores: the bodies of the chat request are the slowest to generate.
EXAMPLES = {
    ("GET", "/"): {"positive": 1},
    ("GET", "/health"): {"positive": 1},
    ("GET", "/metrics"): {"positive": 1},
    ("GET", "/openapi.json"): {"positive": 1},
    ("GET", "/v1/models"): {"positive": 1},
    ("GET", "/v1/models/{model}"): {"positive": 10},
    ("POST", "/v1/chat/completions"): {"positive": 30, "negative": 20},
    ("POST", "/v1/completions"): {"positive": 30, "negative": 20},
    ("POST", "/v1/responses"): {"positive": 20, "negative": 15},
    ("POST", "/v1/responses/input_tokens"): {"positive": 10, "negative": 10},
    ("GET", "/v1/responses/{response_id}"): {"positive": 3},
    ("DELETE", "/v1/responses/{response_id}"): {"positive": 3},
    ("POST", "/v1/messages"): {"positive": 20, "negative": 15},
    ("POST", "/v1/messages/count_tokens"): {"positive": 10, "negative": 10},
    ("POST", "/tokenize"): {"positive": 15, "negative": 15},
    ("POST", "/detokenize"): {"positive": 15, "negative": 15},
}
FUZZED = [(method, path, mode) for (method, path), modes in EXAMPLES.items() for mode in modes]



@pytest.fixture(scope="module")
def served(tiny_dir):
    with running_server("--max-batch-size", "8", model=str(tiny_dir)) as server:
        yield server


@pytest.fixture(scope="module")
def description(served) -> dict:
    answer = served.get("/openapi.json")
    assert answer.status_code == 200
    return answer.json()


@pytest.fixture(scope="module")
def api(description):
    return schemathesis.openapi.from_dict(description)


@pytest.fixture(scope="module")
def error_schema(description) -> dict:
    return {**description["components"]["schemas"]["Error"], "components": description["components"]}


def cheaper(body, context_length: int, path: str) -> None:
    """Make a generated body (of a request to `path`) cheaper to answer, in place, without
    changing whether it is valid: values that cost model time and lie inside the described
    bounds move to the low end of them (max_tokens <= 4, n <= 2, top log-probabilities <= 3;
    as integers),
    and a request without max_tokens (or max_output_tokens) gets 4 (its default is 256
    tokens) — but for Anthropic's (/v1/messages...), where max_tokens is required (and not
    counted). Values outside the bounds stay as they are, so that an invalid request stays
    invalid and the check that it is refused holds."""
    if not isinstance(body, dict):
        return
    for name, low, high in (("max_tokens", 4, context_length - 1), ("max_completion_tokens", 4, context_length - 1),
                            ("max_output_tokens", 4, context_length - 1),
                            ("n", 2, MAX_CHOICES), ("top_logprobs", 3, MAX_TOP_LOGPROBS),
                            ("logprobs", 3, MAX_TOP_LOGPROBS), ("min_tokens", 4, None)):
        value = body.get(name)  # the generator writes some integers as 909.0, which protocol refuses
        if type(value) in (int, float) and value % 1 == 0 and low < value <= (high if high is not None else value):
            body[name] = low
    if path.startswith("/v1/messages"):
        return
    if ("messages" in body or "prompt" in body) and "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = 4
    if "input" in body and "max_output_tokens" not in body:  # a Responses request
        body["max_output_tokens"] = 4


class Tally:
    """What the fuzzing sent and got: requests by operation, mode and status; the reasons
    valid requests were refused."""

    def __init__(self):
        self.counts: Counter = Counter()  # (METHOD path, mode, status) -> requests
        self.refused: Counter = Counter()  # (METHOD path, the start of the message) -> requests

    def report(self) -> str:
        lines = [f"{'operation':28} {'mode':9} {'requests':>8}  statuses"]
        for method, path, mode in FUZZED:
            label = f"{method} {path}"
            statuses = {status: n for (op, m, status), n in self.counts.items() if op == label and m == mode}
            lines.append(f"{label:28} {mode:9} {sum(statuses.values()):8}  "
                         + ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items())))
        by_status = Counter()
        for (_, _, status), n in self.counts.items():
            by_status[status] += n
        lines.append(f"{'all':28} {'':9} {sum(by_status.values()):8}  "
                     + ", ".join(f"{s}: {n}" for s, n in sorted(by_status.items())))
        lines.append("valid requests refused, the most frequent reasons:")
        lines += [f"  {n:4} {op}: {reason}" for (op, reason), n in self.refused.most_common(12)]
        return "\n".join(lines)


def fuzz(operation, mode: str, served, description: dict, context_length: int, tally: Tally) -> None:
    """Schemathesis' requests for one operation in one mode, each answer checked (a refusal
    against the error schema the description gives its status)."""
    label = f"{operation.method.upper()} {operation.path}"
    described = description["paths"][operation.path][operation.method.lower()]["responses"]

    @seed(SEED)
    @settings(max_examples=examples(EXAMPLES[operation.method.upper(), operation.path][mode]), database=None,
              deadline=None, phases=[Phase.explicit, Phase.generate],  # no shrinking: the first failure as it is
              suppress_health_check=list(HealthCheck))
    @given(operation.as_strategy(generation_mode=GenerationMode(mode)))
    def run(case):
        cheaper(case.body, context_length, operation.path)
        response = case.call(base_url=served.url, timeout=TIMEOUT)
        tally.counts[label, mode, response.status_code] += 1
        if response.status_code >= 400:
            error = response.json()
            schema = described[str(response.status_code)]["content"]["application/json"]["schema"]
            jsonschema.validate(error, {**schema, "components": description["components"]})
            if mode == "positive":
                tally.refused[label, re.sub(r"\d+(\.\d+)?", "N", error["error"]["message"])[:60]] += 1
        case.validate_response(response, checks=CHECKS)

    run()


def test_fuzz_every_operation(api, served, description):
    """Every operation, with valid and invalid requests: a 2xx or a 4xx each, refusals in the
    error shape, answers as described, invalid requests refused. Afterwards the engine is
    alive and answers a seeded request as before, and /metrics counted no 5xx. One test, so that the counts it prints are of one server, whatever the
    order or the worker the tests run in."""
    context_length = description["components"]["schemas"]["ChatRequest"]["properties"]["max_tokens"]["maximum"] + 1
    tally, failures = Tally(), []
    errors_before = server_errors(served)
    for method, path, mode in FUZZED:
        try:
            fuzz(api[path][method], mode, served, description, context_length, tally)
        except (Exception, BaseExceptionGroup) as e:  # the other operations are fuzzed all the same
            failures.append(f"{method} {path} ({mode}): {type(e).__name__}: {e}")
    print(tally.report())
    assert not failures, "\n\n".join(failures)
    for method, path, mode in FUZZED:
        assert any(op == f"{method} {path}" and m == mode for op, m, _ in tally.counts), (method, path, mode)
    assert sum(n for (_, _, status), n in tally.counts.items() if status >= 500) == 0
    assert_alive(served)
    assert server_errors(served) == errors_before


def assert_alive(served) -> None:
    """/health is 200 and a seeded chat request answers exactly as a second identical one."""
    assert served.get("/health").status_code == 200
    body = {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 8, "temperature": 1.0,
            "seed": 11, "logit_bias": {"2": -100}}  # token 2 ends the reply: banned, the reply has 8 tokens
    first, second = served.post("/v1/chat/completions", body), served.post("/v1/chat/completions", body)
    assert first.status_code == second.status_code == 200
    a, b = first.json(), second.json()
    assert a["usage"]["completion_tokens"] == 8 and a["choices"][0]["finish_reason"] == "length"
    assert a["choices"][0]["message"] == b["choices"][0]["message"]


def server_errors(served) -> int:
    """Requests /metrics counted with a 5xx status."""
    total = 0
    for line in served.get("/metrics").text.splitlines():
        if line.startswith("tiny_llm_requests_total{") and re.search(r'status="5\d\d"', line):
            total += int(float(line.split()[-1]))
    return total


# ---- regular tests of the defects the fuzzing found (fixed in protocol.py) --------------------------


@pytest.mark.parametrize("body, param", [
    # A top_k beyond int32 failed the whole batch's step (MLX: std::bad_cast): every request
    # decoding beside it got a 500. Found as {"top_k": 10505410304, "prompt": ...}.
    ({"prompt": "hi", "top_k": 2**31}, "top_k"),
    ({"prompt": "hi", "top_k": 10**20}, "top_k"),
    # Numbers the sampler's float32 cannot hold: a 500 "no finite logit" (found as
    # {"repetition_penalty": 5e-324}) or, for an integer too large for a float, a 500
    # OverflowError.
    ({"prompt": "hi", "repetition_penalty": 5e-324}, "repetition_penalty"),
    ({"prompt": "hi", "frequency_penalty": -1e300}, "frequency_penalty"),
    ({"prompt": "hi", "top_n_sigma": 3.402823466385289e38}, "top_n_sigma"),
    ({"prompt": "hi", "presence_penalty": 10**400}, "presence_penalty"),
    ({"prompt": "hi", "temperature": 10**400}, "temperature"),
    # Only the default of an unsupported field: 0 and 1.0 passed as false and 1.
    ({"prompt": "hi", "echo": 0}, "echo"),
    ({"prompt": "hi", "echo": 0.0}, "echo"),
    ({"prompt": "hi", "best_of": 1.0}, "best_of"),
    # OpenAI's logit_bias is an object; the command line's list form slipped through, its
    # biases unchecked (["15+1000"] biased a token by 1000).
    ({"prompt": "hi", "logit_bias": ["15+1000"]}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": []}, "logit_bias"),
])
def test_a_request_the_fuzzer_found_is_refused(served, error_schema, body, param):
    answer = served.post("/v1/completions", {**body, "max_tokens": 2})
    assert answer.status_code == 400, answer.text
    jsonschema.validate(answer.json(), error_schema)
    assert answer.json()["error"]["param"] == param


@pytest.mark.parametrize("body", [
    # null is an OpenAI field's default (as the clients send it); these answered 400.
    {"prompt": "hi", "stream": None}, {"prompt": "hi", "n": None},
    {"prompt": "hi", "stream": True, "stream_options": {"include_usage": None}},
    {"messages": [{"role": "user", "content": "hi"}], "logprobs": None},
    # The largest values protocol takes.
    {"prompt": "hi", "top_k": MAX_TOP_K, "temperature": 2},  # OpenAI's largest temperature
    {"prompt": "hi", "presence_penalty": -3.4028234663852886e38, "min_p": 1.401298464324817e-45},
])
def test_a_request_the_fuzzer_found_is_answered(served, body):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    answer = served.post(path, {**body, "max_tokens": 2})
    assert answer.status_code == 200, answer.text
    if not body.get("stream"):
        assert answer.json()["usage"]["completion_tokens"] >= 1


# ---- raw HTTP ---------------------------------------------------------------------------------


def raw(served, data: bytes, *, shut: bool = False) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it (`shut`: close
    our side of the connection first)."""
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as s:
        try:
            s.sendall(data)
            if shut:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):  # the server answered before reading it all
            pass
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                return out
            out += chunk
        return out


def request(method: str, path: str, body: bytes = b"", headers: bytes = b"", version: bytes = b"HTTP/1.1",
            content_type: bytes = b"application/json") -> bytes:
    return (method.encode() + b" " + path.encode() + b" " + version + b"\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            + b"Content-Type: " + content_type + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n"
            + headers + b"\r\n" + body)


def parsed(answer: bytes) -> tuple[int, dict, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower().decode(): v.strip().decode() for k, _, v in (h.partition(b":") for h in lines[1:])}
    return status, headers, body


COMPLETION_BODY = b'{"prompt": "hi", "max_tokens": 2}'
DEEP = 100_000

# (name, bytes sent, the statuses allowed, who refuses it). uvicorn itself (h11) answers a
# request it cannot parse — a garbage request line, a bad Content-Length, a 1 MiB header
# (beyond h11's 16 KiB of incomplete head; 64 KiB of headers that arrive at once pass) — with
# 400 and a text/plain body before the app sees it: those cases are marked "uvicorn"; every
# 4xx of the app carries OpenAI's error object. (A body that breaks off — truncated,
# or broken chunked encoding — is in `test_bodies_that_break_off_leave_the_server_serving`.)
RAW = [
    ("garbage request line", b"GARBAGE\r\n\r\n", {400}, "uvicorn"),
    ("binary request line", bytes(range(1, 256)) + b"\r\n\r\n", {400}, "uvicorn"),
    ("bad Content-Length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
     {400}, "uvicorn"),
    ("negative Content-Length", b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}",
     {400}, "uvicorn"),
    ("1 MiB header", request("GET", "/health", headers=b"X-Big: " + b"a" * (1 << 20) + b"\r\n"), {400}, "uvicorn"),
    ("64 KiB header", request("GET", "/health", headers=b"X-Big: " + b"a" * (64 << 10) + b"\r\n"),
     {200, 400, 431}, "uvicorn"),
    ("5000 headers", request("GET", "/health", headers=b"".join(b"X-%d: y\r\n" % i for i in range(5000))),
     {200, 400, 431}, "uvicorn"),
    ("HTTP/1.0 GET", b"GET /health HTTP/1.0\r\n\r\n", {200}, "app"),
    ("HTTP/1.0 POST", request("POST", "/v1/completions", COMPLETION_BODY, version=b"HTTP/1.0"), {200}, "app"),
    ("text/plain body", request("POST", "/v1/completions", COMPLETION_BODY, content_type=b"text/plain"),
     {200, 415}, "app"),
    ("form body", request("POST", "/v1/completions", b"prompt=hi&max_tokens=2",
                          content_type=b"application/x-www-form-urlencoded"), {400, 415}, "app"),
    ("multipart body", request("POST", "/tokenize", b'--x\r\nContent-Disposition: form-data; name="prompt"\r\n\r\n'
                                                    b"hi\r\n--x--\r\n",
                               content_type=b"multipart/form-data; boundary=x"), {400, 415}, "app"),
    ("non-UTF-8 bytes", request("POST", "/v1/chat/completions", b"\xff\xfe\x00{\x80"), {400}, "app"),
    ("Latin-1 in a string", request("POST", "/v1/completions", b'{"prompt": "caf\xe9", "max_tokens": 2}'),
     {400}, "app"),
    ("empty body", request("POST", "/v1/chat/completions"), {400}, "app"),
    ("empty body (detokenize)", request("POST", "/detokenize"), {400}, "app"),
    ("JSON array", request("POST", "/v1/chat/completions", b"[]"), {400}, "app"),
    ("JSON string", request("POST", "/v1/completions", b'"hi"'), {400}, "app"),
    ("JSON number", request("POST", "/tokenize", b"42"), {400}, "app"),
    ("JSON null", request("POST", "/detokenize", b"null"), {400}, "app"),
    ("truncated JSON", request("POST", "/v1/completions", b'{"prompt": "hi", "max_tok'), {400}, "app"),
    ("nested 100 000 deep", request("POST", "/v1/chat/completions", b"[" * DEEP + b"]" * DEEP), {400}, "app"),
    ("objects 100 000 deep", request("POST", "/tokenize", b'{"a":' * DEEP + b"1" + b"}" * DEEP), {400}, "app"),
    ("deep messages", request("POST", "/v1/chat/completions", b'{"messages": ' + b"[" * DEEP + b"]" * DEEP + b"}"),
     {400}, "app"),
    ("body over the limit", request("POST", "/v1/completions", b'{"prompt": "' + b"a" * (5 << 20) + b'"}'),
     {413}, "app"),
    ("Content-Length over the limit", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                      b"Content-Length: 999999999\r\n\r\n{", {413}, "app"),
    ("GET of a POST route", request("GET", "/v1/chat/completions"), {405}, "app"),
    ("DELETE of a GET route", request("DELETE", "/health"), {405}, "app"),
    ("no such path", request("GET", "/v1/nothing"), {404}, "app"),
    ("path of 8 KiB", request("GET", "/v1/models/" + "m" * 8192), {404}, "app"),
]


@pytest.mark.parametrize("name, data, allowed, kind", RAW, ids=[r[0] for r in RAW])
def test_raw_http(served, error_schema, name, data, allowed, kind):
    """Malformed HTTP: a 4xx (or a 2xx where the request is fine after all), never a 5xx (nor
    one counted by /metrics for a client that did not see it); an answer of the app's is
    OpenAI's error object. The server answers /health afterwards."""
    errors_before = server_errors(served)
    status, headers, body = parsed(raw(served, data))
    assert status in allowed, (name, status, body[:300])
    if status >= 400 and kind == "app":
        assert headers["content-type"].startswith("application/json")
        jsonschema.validate(json.loads(body), error_schema)
    assert served.get("/health").status_code == 200
    assert server_errors(served) == errors_before


def test_raw_http_leaves_the_server_serving(served):
    """After the raw requests (those of this worker, in file order): a real request answers."""
    assert_alive(served)


BROKEN_CHUNKS = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"zz\r\nabc\r\n0\r\n\r\n")


def test_bodies_that_break_off_leave_the_server_serving(served):
    """A body shorter than its Content-Length, then the connection closed (or only our side
    of it): nobody is left to answer; broken chunked encoding: uvicorn answers 400 (text).
    The server goes on serving. (The app counts each as a 500: see
    `test_a_body_that_breaks_off_is_not_a_server_error`.)"""
    status, headers, _ = parsed(raw(served, BROKEN_CHUNKS))
    assert status == 400 and headers["content-type"].startswith("text/plain")
    for path in ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"):
        head = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\n\r\n")
        host, port = served.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as s:
            s.sendall(head + b'{"messages": [{"role": "user", "content": "he')
            time.sleep(0.05)
        answer = raw(served, head + b'{"prompt": "he', shut=True)
        assert answer == b"" or parsed(answer)[0] < 500, answer[:300]
    assert_alive(served)


# ---- the description ---------------------------------------------------------------------------


def test_the_description_covers_the_app(description):
    """Every route of `create_app` with its methods (HEAD, which Starlette adds to every GET
    route, aside), every field protocol accepts in the request bodies and no other, and a
    valid OpenAPI 3.1 document whose every schema is valid JSON Schema."""
    app = create_app(SimpleNamespace()).app  # the Starlette app inside the middleware
    routes = {(re.sub(r"{(\w+):\w+}", r"{\1}", route.path), method.lower())
              for route in app.routes for method in route.methods - {"HEAD"}}
    described = {(path, method) for path, item in description["paths"].items() for method in item}
    assert described == routes
    assert {(m, p) for m, p in EXAMPLES} == {(m.upper(), p) for p, m in described}

    schemas = description["components"]["schemas"]
    for name, allowed in (("ChatRequest", CHAT | EXTENSIONS | IGNORED),
                          ("CompletionRequest", COMPLETION | EXTENSIONS | IGNORED),
                          ("MessagesRequest", anthropic.MESSAGES | set(anthropic.REFUSED)),
                          ("MessageTokensRequest", anthropic.PROMPT | set(anthropic.REFUSED))):
        assert set(schemas[name]["properties"]) == allowed
        assert schemas[name]["additionalProperties"] is False
    for name, schema in schemas.items():
        jsonschema.Draft202012Validator.check_schema(schema)
    schemathesis.openapi.from_dict(description).validate()  # against OpenAPI 3.1's own schema
    assert description["info"]["x-model"] == NAME
    # Refusals: OpenAI's Error, Anthropic's for the Messages API's own; a 405 (the router's)
    # is OpenAI's everywhere, a 503 may be the middleware's (draining) before the route.
    error, anthropic_error = ({"$ref": f"#/components/schemas/{name}"} for name in ("Error", "AnthropicError"))
    for path, item in description["paths"].items():
        for method, op in item.items():
            for status, response in op["responses"].items():
                expected = error
                if path.startswith("/v1/messages") and status != "405":
                    expected = {"anyOf": [anthropic_error, error]} if status == "503" else anthropic_error
                if int(status) >= 400 and not path == "/health":
                    assert response["content"]["application/json"]["schema"] == expected, (path, method, status)


def test_the_description_with_an_api_key_requires_it(description):
    ctx = SimpleNamespace(model_ids=("m", "alias"), context_length=None, vocab_size=100)
    keyed, open_ = describe(SimpleNamespace(ctx=ctx, api_key="k")), describe(SimpleNamespace(ctx=ctx, api_key=None))
    op = "/v1/chat/completions"
    assert keyed["paths"][op]["post"]["security"] == [{"bearer": []}]
    assert open_["paths"][op]["post"]["security"] == [{}, {"bearer": []}]  # the key is optional
    assert keyed["paths"]["/health"]["get"]["security"] == []
    assert "maximum" not in keyed["components"]["schemas"]["ChatRequest"]["properties"]["max_tokens"]
    assert keyed["components"]["schemas"]["ChatRequest"]["properties"]["model"]["enum"] == ["m", "alias", None]


def _numbers_at_the_edges(schema: dict):
    """(value, accepted) pairs at each bound of a number schema: the bound itself (or the
    next number inside it) accepted, the next number outside it refused."""
    integer = schema["type"][0] == "integer" if isinstance(schema["type"], list) else schema["type"] == "integer"
    step = (lambda x, d: x + d) if integer else (lambda x, d: math.nextafter(x, d * math.inf))
    if "minimum" in schema:
        yield schema["minimum"], True
        yield step(schema["minimum"], -1), False
    if "exclusiveMinimum" in schema:
        yield schema["exclusiveMinimum"], False
        yield step(schema["exclusiveMinimum"], 1), True
    if "maximum" in schema:
        yield schema["maximum"], True
        yield step(schema["maximum"], 1), False
    if "not" in schema:  # a float32: 0, or at least its smallest positive number in magnitude
        tiny = schema["not"]["exclusiveMaximum"]
        yield tiny, True
        yield tiny / 2, False
        yield 0, True


def test_the_described_bounds_are_protocols(description, default_tokenizer):
    """Each bound of a number field of the described requests, checked with `protocol.parse`
    itself: the value at the bound is accepted, the next one beyond it is refused naming the
    field. Enumerations likewise: each listed value accepted, another refused."""
    ctx = Context(default_tokenizer, (NAME,), 2048, 49152)
    properties = description["components"]["schemas"]["CompletionRequest"]["properties"]
    checked = 0
    for name, schema in sorted(properties.items()):
        schema = next((s for s in schema.get("anyOf", [schema]) if s.get("type") != "null"), schema)
        if name in ("max_tokens", "logprobs", "prompt"):
            continue  # max_tokens' bound depends on the prompt; logprobs and the prompt have tests of their own
        cases = []
        if schema.get("type") in ("integer", "number", ["integer", "null"], ["number", "null"]):
            cases = list(_numbers_at_the_edges(schema))
        elif "enum" in schema and name != "model":
            cases = [(v, True) for v in schema["enum"] if v is not None] + [("not one of them", False)]
        for value, accepted in cases:
            body = {"prompt": "hi", "max_tokens": 2, name: value}
            if name == "min_tokens":
                body["max_tokens"] = 2
            try:
                parse(body, "completion", ctx)
                assert accepted, (name, value)
            except RequestError as e:
                assert not accepted, (name, value, e.message)
                assert e.param == name, (name, value, e.message)
            checked += 1
    assert checked >= 40


# ---- defects outside protocol.py that the fuzzing found ------------------------------------------


@pytest.mark.parametrize("fields", [
    {"regex": "\u001d"},  # the tokenizer drops that character: no token can start the reply
    {"temperature": 1.401298464324817e-45},  # the logits over it overflow float32: no finite logit
])
def test_a_request_that_cannot_be_decoded_is_refused(served, fields):
    """A request whose rows fail at their first token, for reasons of its own alone: a 400,
    not a 500."""
    answer = served.post("/v1/completions", {"prompt": "hi", "max_tokens": 2, **fields})
    assert answer.status_code == 400, answer.text


def test_an_integer_of_5000_digits_is_refused(served):
    answer = raw(served, request("POST", "/v1/completions", b'{"prompt": "hi", "metadata": 1' + b"0" * 5000 + b"}"))
    assert parsed(answer)[0] == 400, answer[:300]


@pytest.mark.parametrize("broken", ["truncated", "chunked"])
def test_a_body_that_breaks_off_is_not_a_server_error(served, broken):
    before = server_errors(served)
    if broken == "chunked":
        raw(served, BROKEN_CHUNKS)
    else:
        raw(served, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\": \"he", shut=True)
    time.sleep(0.2)  # the handler runs on after the connection is gone
    assert server_errors(served) == before
