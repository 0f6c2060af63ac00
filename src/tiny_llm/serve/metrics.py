"""Engine — the server's Prometheus metrics (`GET /metrics`), one registry per server."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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
        self.time_to_first_token = Histogram("tiny_llm_time_to_first_token_seconds",
                                             "From a request's arrival to its first token",
                                             buckets=LATENCY_BUCKETS, registry=r)
        self.inter_token_latency = Histogram("tiny_llm_inter_token_latency_seconds",
                                             "Between two tokens of one choice", buckets=LATENCY_BUCKETS, registry=r)

    def text(self) -> bytes:
        return generate_latest(self.registry)
