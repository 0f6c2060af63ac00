"""Live `tiny-llm serve` processes for the server tests: started on a free loopback port,
waited for, and stopped (with everything they started) when the test is done."""

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import httpx
import mlx.core as mx
from conftest import model_weights, reference_model

START_TIMEOUT = 120.0  # seconds for the model to load and the port to answer

# httpx builds a TLS context for every client it makes, reading every CA certificate (about
# 60 ms of CPU), even for plain http:// on loopback; its one-call functions make a client
# each. The tests' one-call requests share one context instead.
TLS = ssl.create_default_context()
loopback = SimpleNamespace(**{name: partial(getattr(httpx, name), verify=TLS)
                              for name in ("get", "post", "delete", "stream")})

# A random-weight Llama with the default model's tokenizer and chat template: the same
# text handling as the real model, at a hundredth of its cost per token.
TINY_SERVED = dict(
    model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=49152, rms_norm_eps=1e-5, rope_theta=10_000.0, tie_word_embeddings=True,
    max_position_embeddings=2048,
)


def tiny_served_model(directory: Path, default_model_dir: Path) -> Path:
    """Write the random model of `TINY_SERVED` as a model directory with the default
    model's tokenizer files."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**TINY_SERVED, "architectures": ["LlamaForCausalLM"]}))
    mx.save_safetensors(str(directory / "model.safetensors"), model_weights(reference_model(TINY_SERVED, seed=5)))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (directory / name).write_bytes((default_model_dir / name).read_bytes())
    return directory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    url: str
    process: subprocess.Popen
    log: Path
    final_log: str | None = None  # the log's text once the server has stopped

    @property
    def log_text(self) -> str:
        """What the server printed (stdout and stderr), so far or in all."""
        return self.final_log if self.final_log is not None else self.log.read_text(errors="replace")

    def get(self, path: str, **kw) -> httpx.Response:
        return loopback.get(self.url + path, **{"timeout": 60, **kw})

    def post(self, path: str, body=None, **kw) -> httpx.Response:
        return loopback.post(self.url + path, json=body, **{"timeout": 300, **kw})

    def metric(self, name: str) -> float:
        """The value of one sample line of /metrics (`name` with its labels, if any)."""
        for line in self.get("/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0


@contextlib.contextmanager
def running_server(*args: str, model: str = "default", env: dict[str, str] | None = None):
    """`tiny-llm serve --model MODEL ARGS` on a free port of 127.0.0.1 (with `env` added to the
    environment); yields a `LiveServer` once /health answers, and stops it (SIGINT, then
    SIGKILL) afterwards."""
    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"tiny-llm-serve-{port}.log"
    command = [sys.executable, "-m", "tiny_llm", "serve", "--model", model, "--port", str(port), *args]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, **(env or {})})
    server = LiveServer(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"tiny-llm serve exited with {process.returncode}:\n{log.read_text()}")
            try:
                if loopback.get(server.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"tiny-llm serve did not answer within {START_TIMEOUT} s:\n{log.read_text()}")
            time.sleep(0.2)
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
        server.final_log = server.log_text
        log.unlink(missing_ok=True)


def openai_client(server, timeout: float = 120):
    """The official `openai` client of a live server: no retries, `timeout` seconds a request."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=timeout)
