"""Engine — serving across ranks: rank 0's batch operations replayed on every other rank.

Under `mlx.launch -n N -- tiny-llm serve`, rank 0 runs the HTTP server and its engine
thread; the other ranks hold their shards of the model and must run every forward pass
with it. Rank 0's `BatchGenerator` is wrapped in a `Leader`, which sends each operation
(a new generator, `insert`, `cancel`, `step`) to the other ranks before it runs it; each
other rank `follow`s, running the same operations on its own generator in the same order.
Their inputs are the same, their sums over ranks give the same logits, their fresh seeds
come from the same stream: they draw the same tokens, and only rank 0 answers.

Tests: tests/test_serve_lockstep.py, tests/test_week3_day5.py
"""

import pickle

import mlx.core as mx
import numpy as np

from ..batch import BatchGenerator
from ..defaults import BatchSettings

HEARTBEAT = 5.0  # seconds: an idle leader pings the other ranks this often, so that it notices one that died


def send(group: mx.distributed.Group, op: tuple) -> None:
    """Rank 0: one operation to every rank (its length, then its pickled bytes)."""
    _exchange(group, pickle.dumps(op))


def receive(group: mx.distributed.Group) -> tuple:
    """The other ranks: the next operation rank 0 sends."""
    return pickle.loads(_exchange(group, None))


def _exchange(group: mx.distributed.Group, data: bytes | None) -> bytes:
    """Rank 0's `data` on every rank: two sums over the ranks, in which the others add zeros."""
    n = mx.distributed.all_sum(mx.array([len(data) if data is not None else 0], dtype=mx.int32), group=group,
                               stream=mx.cpu).item()
    mine = np.frombuffer(data, dtype=np.uint8).astype(np.int32) if data is not None else np.zeros(n, np.int32)
    every = mx.distributed.all_sum(mx.array(mine), group=group, stream=mx.cpu)
    return np.array(every).astype(np.uint8).tobytes()


class Leader:
    """Rank 0's `BatchGenerator`, whose operations every other rank runs too."""

    def __init__(self, group: mx.distributed.Group, model, tokenizer, settings: BatchSettings):
        self.group = group
        send(group, ("new", (), settings.kwargs()))
        self.gen = BatchGenerator(model, tokenizer, **settings.kwargs())

    def insert(self, *args, **kwargs) -> int:
        send(self.group, ("insert", args, kwargs))
        return self.gen.insert(*args, **kwargs)

    def cancel(self, uid: int) -> bool:
        send(self.group, ("cancel", (uid,), {}))
        return self.gen.cancel(uid)

    def step(self):
        send(self.group, ("step", (), {}))
        return self.gen.step()

    def ping(self) -> None:
        send(self.group, ("ping", (), {}))

    def stop(self) -> None:
        send(self.group, ("stop", (), {}))

    def has_work(self) -> bool:
        return self.gen.has_work()

    @property
    def running(self) -> list[int]:
        return self.gen.running

    @property
    def waiting(self) -> list[int]:
        return self.gen.waiting

    @property
    def stats(self):
        return self.gen.stats


def follow(group: mx.distributed.Group, model, tokenizer) -> None:
    """A rank other than 0: run rank 0's operations until it stops. A request that rank 0
    refuses or a step that fails there fails here the same way; rank 0 answers it."""
    gen = None
    while True:
        name, args, kwargs = receive(group)
        if name == "stop":
            return
        if name == "new":
            gen = BatchGenerator(model, tokenizer, **kwargs)
        elif name != "ping":
            try:
                getattr(gen, name)(*args, **kwargs)
            except Exception:  # noqa: BLE001 — rank 0 met the same error and handles it
                pass
