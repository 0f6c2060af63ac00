"""Engine — the server's Prometheus metrics (`GET /metrics`), one registry per server.

Tests: tests/test_serve_engine.py
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Metrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("tiny_llm_requests", "HTTP requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.cancelled = Counter("tiny_llm_cancelled_requests", "Requests whose client went away before the end",
                                 registry=r)
        self.prompt_tokens = Counter("tiny_llm_prompt_tokens", "Prompt tokens of accepted requests", registry=r)
        self.prefill_tokens = Counter("tiny_llm_prefill_tokens", "Prompt tokens run through the model (choices of "
                                      "one request, and equal prompts that join together, share one prefill)",
                                      registry=r)
        self.cached_tokens = Counter("tiny_llm_cached_prompt_tokens", "Prompt tokens taken from the prefix cache "
                                     "instead of being prefilled", registry=r)
        self.generation_tokens = Counter("tiny_llm_generation_tokens", "Tokens generated", registry=r)
        self.queue = Gauge("tiny_llm_queue_length", "Requests waiting for their first token", registry=r)
        self.running = Gauge("tiny_llm_running_rows", "Rows in the running batch", registry=r)
        self.open_requests = Gauge("tiny_llm_open_requests", "HTTP requests in progress (a stream until its last "
                                   "byte), /health, /metrics and /openapi.json left out", registry=r)
        self.open_connections = Gauge("tiny_llm_open_connections", "HTTP connections open", registry=r)
        self.engine_failures = Counter("tiny_llm_engine_failures", "Model steps that failed as a whole (their "
                                       "requests ended with an error; the engine went on with a new batch)",
                                       registry=r)
        self.timed_out = Counter("tiny_llm_timed_out_requests", "Requests ended by --request-timeout", registry=r)
        self.slow_clients = Counter("tiny_llm_slow_clients", "Streams ended because their client took no data "
                                    "for --write-timeout seconds", registry=r)
        self.pages_in_use = Gauge("tiny_llm_kv_pages_in_use", "KV pages held (by rows or the prefix cache)",
                                  registry=r)
        self.pages_capacity = Gauge("tiny_llm_kv_pages_capacity", "KV pages the pool has room for", registry=r)
        self.prefix_pages = Gauge("tiny_llm_prefix_cache_pages", "KV pages the prefix cache holds", registry=r)
        self.prefix_idle_bytes = Gauge("tiny_llm_prefix_cache_idle_bytes", "Bytes of the prefix cache's pages "
                                       "that only the cache holds (what its budget bounds)", registry=r)
        self.prefix_budget_bytes = Gauge("tiny_llm_prefix_cache_budget_bytes", "The prefix cache's budget",
                                         registry=r)
        ProcessCollector(registry=r)  # process_resident_memory_bytes and friends (Linux)
        self.time_to_first_token = Histogram("tiny_llm_time_to_first_token_seconds",
                                             "From a request's arrival to its first token",
                                             buckets=LATENCY_BUCKETS, registry=r)
        self.inter_token_latency = Histogram("tiny_llm_inter_token_latency_seconds",
                                             "Between two tokens of one choice", buckets=LATENCY_BUCKETS, registry=r)

    def text(self) -> bytes:
        return generate_latest(self.registry)
