"""`tiny-llm serve` when things go wrong, on live servers on 127.0.0.1 with a random-weight
model: a whole model step that fails, a tokenizer that fails for one request, an engine
thread that dies or is stuck, a client that never reads, a request past its time limit,
too many connections, and a SIGTERM with streams open (the drain). Failures are injected
with the server's test hook (`TINY_LLM_FAULTS`, see `tiny_llm.serve.faults`)."""

import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from serve_support import loopback, running_server
from test_serve import EOS, error_of

pytestmark = pytest.mark.xdist_group("serve-faults")


def stream(url: str, body: dict, **kw) -> list:
    """Every `data:` payload of a streamed request (JSON decoded, "[DONE]" as it is)."""
    with loopback.stream("POST", url, json={**body, "stream": True}, timeout=60, **kw) as response:
        assert response.status_code == 200, response.read()
        return [line[6:] if line == "data: [DONE]" else json.loads(line[6:])
                for line in response.iter_lines() if line.startswith("data: ")]


def text_of(chunks: list) -> str:
    return "".join(c["choices"][0]["text"] for c in chunks if isinstance(c, dict) and c.get("choices"))


def wait_for(condition, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


FOREVER = {"prompt": "Once upon a time", "max_tokens": 2000, "logit_bias": EOS}


def test_a_failed_step_fails_its_batch_and_the_engine_goes_on(tiny_dir):
    """Step 1 stalls while three requests arrive; step 8 raises with all three decoding:
    each ends with the injected error (streams: an error chunk, then [DONE]), the engine
    rebuilds its batch, and the same requests then succeed with their seeded tokens."""
    faults = {"TINY_LLM_FAULTS": "stall=1:1,step=8,tokenizer=BOOM"}
    with running_server("--max-batch-size", "4", model=str(tiny_dir), env=faults) as server:
        url = server.url + "/v1/completions"
        bodies = [{"prompt": f"Story {i}:", "max_tokens": 40, "temperature": 1.0, "seed": i, "logit_bias": EOS}
                  for i in range(3)]
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(stream, url, bodies[0]), pool.submit(stream, url, bodies[1]),
                       pool.submit(server.post, "/v1/completions", bodies[2])]
            first, second, whole = [f.result(timeout=120) for f in futures]
        for chunks in (first, second):
            assert chunks[-1] == "[DONE]"
            assert "injected fault: the model step failed" in chunks[-2]["error"]["message"]
        assert "injected fault: the model step failed" in error_of(whole, 500)["message"]

        health = server.get("/health")
        assert health.status_code == 200 and health.json()["engine"]["failures"] == 1
        assert server.metric("tiny_llm_engine_failures_total") == 1
        assert server.metric("tiny_llm_running_rows") == 0 and server.metric("tiny_llm_queue_length") == 0
        # The rebuilt engine: the same requests run, and run as they do alone.
        again = [text_of(stream(url, b)) for b in bodies]
        assert again == [server.post("/v1/completions", b).json()["choices"][0]["text"] for b in bodies]
        assert all(again)

        # The tokenizer fails for one request: that one alone gets a 500.
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            fine = pool.submit(stream, url, bodies[0])
            boom = server.post("/v1/completions", {"prompt": "say BOOM", "max_tokens": 3})
            assert text_of(fine.result(timeout=60)) == again[0]
        assert "injected fault: the tokenizer failed" in error_of(boom, 500)["message"]
        request_id = boom.headers["X-Request-Id"]
        assert server.get("/health").json()["engine"]["failures"] == 1
        refused = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                       "temperature": 9})
        assert refused.status_code == 400

    log = server.log_text
    # One access line per request, each naming its id; the error's traceback names it too.
    assert f"tiny-llm: error: id={request_id} POST /v1/completions: internal error" in log
    access = re.findall(r"^tiny-llm: access: id=(\S+) (\S+) (\S+) (\d+) ", log, re.M)
    assert (request_id, "POST", "/v1/completions", "500") in access
    assert sum(path == "/v1/completions" for _, _, path, _ in access) == 3 + 6 + 2
    # A refused request's line says why: the error's code and the field at fault.
    line = next(line for line in log.splitlines() if f"access: id={refused.headers['X-Request-Id']} " in line)
    assert " 400 " in line and line.endswith(" error: invalid_request_error param=temperature")
    assert "the engine goes on with a new batch" in log


def test_a_dead_engine_fails_health_and_every_request(tiny_dir):
    """Step 3 stalls past the engine deadline (/health: 503 "stuck", answered at once), then
    step 6 ends the engine thread: the open stream ends with a 503 error, /health says
    "dead", and new requests are refused at once instead of hanging."""
    faults = {"TINY_LLM_FAULTS": "stall=3:2.5,die=6"}
    with running_server("--engine-deadline", "1", model=str(tiny_dir), env=faults) as server:
        url = server.url + "/v1/completions"
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(stream, url, FOREVER)
            wait_for(lambda: server.get("/health").status_code == 503, "/health never said stuck")
            health = server.get("/health", timeout=1.0)
            assert health.json()["status"] == "stuck" and health.json()["engine"]["step_seconds"] > 1
            chunks = running.result(timeout=60)
        assert chunks[-1] == "[DONE]"
        error = chunks[-2]["error"]
        assert "the engine stopped: EngineKilled" in error["message"] and error["type"] == "server_error"
        health = server.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "dead"
        assert health.json()["engine"]["alive"] is False
        refused = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert error_of(refused, 503)["code"] == "engine_stopped" and refused.headers["Retry-After"] == "1"


def test_a_client_that_never_reads_is_cancelled_after_the_write_timeout(tiny_dir):
    with running_server("--write-timeout", "1", model=str(tiny_dir)) as server:
        body = json.dumps({**FOREVER, "stream": True, "logprobs": 5}).encode()  # big chunks
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window fills fast
            sock.connect(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            # Never read: the server's buffers fill, its writes stall, the request is cancelled.
            wait_for(lambda: server.metric("tiny_llm_slow_clients_total") == 1, "the stream was not cancelled", 60)
            wait_for(lambda: server.metric("tiny_llm_running_rows") == 0, "the row was not freed")
            assert server.metric("tiny_llm_generation_tokens_total") < 2000
            assert server.metric("tiny_llm_open_requests") == 0
        assert "cancelled: the client took none of the response for 1 s (--write-timeout)" in server.log_text
        assert "ASGI callable" not in server.log_text


def test_a_request_past_its_time_limit_ends_with_408(tiny_dir):
    with running_server("--request-timeout", "1", model=str(tiny_dir)) as server:
        url = server.url + "/v1/completions"
        slow = server.post("/v1/completions", FOREVER)
        error = error_of(slow, 408)
        assert error["code"] == "request_timeout" and "--request-timeout" in error["message"]
        chunks = stream(url, FOREVER, headers={"X-Request-Id": "cut-stream"})
        assert chunks[-1] == "[DONE]" and chunks[-2]["error"]["code"] == "request_timeout"
        assert text_of(chunks)  # it streamed until the limit
        wait_for(lambda: "id=cut-stream " in server.log_text, "no access line for the stream")
        line = next(line for line in server.log_text.splitlines() if "access: id=cut-stream " in line)
        assert " 200 " in line and line.endswith(" ended: 408 request_timeout")
        assert server.metric("tiny_llm_timed_out_requests_total") == 2
        wait_for(lambda: server.metric("tiny_llm_running_rows") == 0, "the rows were not freed")
        assert server.post("/v1/completions", {"prompt": "hi", "max_tokens": 3}).status_code == 200


def test_connections_beyond_the_limit_are_turned_away(tiny_dir):
    """Two idle connections open: a third is answered 503 in OpenAI's shape; once they
    close, it is served."""
    with running_server("--max-connections", "2", model=str(tiny_dir)) as server:
        port = int(server.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)), socket.create_connection(("127.0.0.1", port)):
            wait_for(lambda: server.get("/v1/models").status_code == 503, "the third connection was served")
            busy = server.get("/v1/models")
            assert error_of(busy, 503)["code"] == "too_many_connections" and busy.headers["Retry-After"] == "1"
        wait_for(lambda: server.get("/v1/models").status_code == 200, "the limit stayed after they closed")


def test_sigterm_drains_streams_in_progress_then_exits_0(tiny_dir):
    """Two streams are open at SIGTERM: the short one finishes whole, the endless one ends
    with a 503 error after --shutdown-timeout; meanwhile new requests get 503 and /health
    fails; the server exits with status 0."""
    # Alone, the short stream takes about 0.1 s and the endless one (2000 tokens) about 8 s;
    # the 3-second drain leaves the short one thirty times its need, so a loaded machine (two
    # test workers, a course walkthrough) still sees it finish whole.
    with running_server("--shutdown-timeout", "3", model=str(tiny_dir)) as server:
        url = server.url + "/v1/completions"
        short = {"prompt": "Count:", "max_tokens": 12, "temperature": 0.0, "logit_bias": EOS}
        expected = text_of(stream(url, short))
        results, started = {}, threading.Barrier(3)

        def run(name, body):
            with loopback.stream("POST", url, json={**body, "stream": True}, timeout=60,
                                 headers={"X-Request-Id": f"drain-{name}"}) as response:
                lines = response.iter_lines()
                first = next(lines)
                started.wait(30)
                results[name] = [first] + list(lines)

        threads = [threading.Thread(target=run, args=(n, b)) for n, b in (("short", short), ("forever", FOREVER))]
        for t in threads:
            t.start()
        started.wait(30)
        os.killpg(server.process.pid, signal.SIGTERM)
        wait_for(lambda: server.get("/health").status_code == 503, "/health did not fail while draining", 10)
        assert server.get("/health").json()["status"] == "draining"
        refused = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert error_of(refused, 503)["code"] == "shutting_down" and refused.headers["Retry-After"] == "1"
        for t in threads:
            t.join(60)
        assert server.process.wait(30) == 0

    def chunks(name):
        return [line[6:] if line == "data: [DONE]" else json.loads(line[6:])
                for line in results[name] if line.startswith("data: ")]

    short_chunks, forever_chunks = chunks("short"), chunks("forever")
    assert short_chunks[-1] == "[DONE]"
    assert not any("error" in c for c in short_chunks[:-1]), short_chunks[-2]
    assert text_of(short_chunks) == expected
    assert short_chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert forever_chunks[-1] == "[DONE]"
    assert forever_chunks[-2]["error"]["message"] == "the server is shutting down"
    assert "Traceback" not in server.log_text
    # Both answers began with 200; the access line of the one cut says how it ended.
    access = {name: [line for line in server.log_text.splitlines() if f"access: id=drain-{name} " in line]
              for name in ("short", "forever")}
    assert len(access["short"]) == len(access["forever"]) == 1, access
    assert " 200 " in access["short"][0] and "ended" not in access["short"][0]
    assert " 200 " in access["forever"][0] and access["forever"][0].endswith(" ended: 503 server_error")


def test_listening_beyond_loopback_without_a_key_warns(tmp_path):
    """The warning comes once the address is known to be free, before the model loads; here
    the model does not exist, so nothing ever listens (the check only binds, then lets go)."""
    run = subprocess.run([sys.executable, "-m", "tiny_llm", "serve", "--model", str(tmp_path / "missing"),
                          "--host", "0.0.0.0", "--port", "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    warning, error = run.stderr.strip().splitlines()[-2:]
    assert warning.startswith("tiny-llm serve: warning: listening on 0.0.0.0 without --api-key")
    assert error.startswith("tiny-llm: error:") and "missing" in error
    with_key = subprocess.run([sys.executable, "-m", "tiny_llm", "serve", "--model", str(tmp_path / "missing"),
                               "--host", "0.0.0.0", "--port", "0", "--api-key", "k"],
                              capture_output=True, text=True, timeout=60)
    assert with_key.returncode == 2 and "warning" not in with_key.stderr


@pytest.mark.parametrize("flag,value", [("--request-timeout", "0"), ("--write-timeout", "-1"),
                                        ("--shutdown-timeout", "nan"), ("--engine-deadline", "inf"),
                                        ("--max-connections", "0")])
def test_bad_limits_are_refused_before_the_model_loads(flag, value):
    run = subprocess.run([sys.executable, "-m", "tiny_llm", "serve", "--model", "/nonexistent", flag, value],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].startswith(f"tiny-llm: error: {flag} must be")


def test_a_bad_fault_spec_is_refused():
    run = subprocess.run([sys.executable, "-m", "tiny_llm", "serve", "--model", "/nonexistent"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "TINY_LLM_FAULTS": "step=x"})
    assert run.returncode == 2 and "TINY_LLM_FAULTS: cannot read 'step=x'" in run.stderr
