"""Engine — the server's engine thread: the one place that runs the model.

HTTP handlers never touch MLX. They `submit` a checked `Job` and read `Event`s from the
job's `Handle`; the engine thread inserts jobs into its `BatchGenerator` between decode
steps, runs the steps, finds stop strings and tool calls in each choice's text, and hands
every piece to the handler's event loop. A cancelled job (its client went away) leaves the
batch before the next step.

Tests: tests/test_serve_anthropic.py, tests/test_serve_engine.py, tests/test_serve_responses.py
"""

import asyncio
import os
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

import mlx.core as mx

from ..batch import BatchGenerator, TokenLogprobs
from ..constrain import TokenTable
from ..defaults import BatchSettings
from ..distributed import lost_peer
from ..model import Model
from ..tokenizer import Tokenizer
from .faults import Faults
from .metrics import Metrics
from .protocol import Job, RequestError
from .lockstep import HEARTBEAT, Leader
from .text import StopStrings, ToolCall, ToolCallDelta, ToolCallText


class QueueFull(Exception):
    """More jobs are waiting for a batch row than the server queues."""


class EngineStopped(Exception):
    """The engine thread has ended (the server is shutting down, or the thread died)."""


@dataclass
class Event:
    """A piece of one choice: new text, the token it came from (with its log-probabilities
    when asked for), tool calls as they are written and once complete, and at the end why
    it finished and how many tokens it drew."""

    index: int
    text: str = ""
    token: int | None = None
    logprobs: TokenLogprobs | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_deltas: list[ToolCallDelta] = field(default_factory=list)  # calls as they are written
    finish_reason: str | None = None  # "stop", "length", "tool_calls" or "error"
    error: str | None = None
    status: int = 500  # the HTTP status of an error (503: the server is shutting down)
    tokens: int = 0  # tokens drawn by this choice so far (the end-of-sequence token included)
    cached_tokens: int = 0  # prompt tokens that came from the prefix cache


class Handle:
    """One job's link from the engine thread to its handler: a queue on the handler's event
    loop. Its first item is "accepted" or a `RequestError`; then `Event`s."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop, request_id: str = "-"):
        self.job, self.loop, self.request_id = job, loop, request_id
        self.queue: asyncio.Queue = asyncio.Queue()
        self.submitted = time.perf_counter()
        self.uids: list[int] = []
        self.waiting = True  # counts against the queue until it has a batch row
        self.started = False  # its first token has come

    def put(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the handler's loop has closed: nobody is listening
            pass


@dataclass
class _Choice:
    handle: Handle
    index: int
    stops: StopStrings
    tools: ToolCallText | None
    last: float | None = None  # when its last token came


class Engine:
    """Owns the model and a `BatchGenerator` on a thread of its own. `submit` and `cancel`
    may be called from any thread."""

    def __init__(self, model: Model, tokenizer: Tokenizer, settings: BatchSettings, *, max_queue: int,
                 metrics: Metrics, group: mx.distributed.Group | None = None, faults: Faults | None = None):
        self.model, self.tokenizer, self.metrics = model, tokenizer, metrics
        self.group = group  # ranks that run every operation with this one (tensor parallelism)
        self.settings, self.max_queue = settings, max_queue
        self.faults = faults or Faults()
        self.gen = self._generator()
        self.table = TokenTable.from_tokenizer(tokenizer)  # built once, before any grammar needs it
        self.queued = 0  # jobs waiting for a batch row (submitted, not yet in the batch)
        self.steps = 0  # model steps run
        self.failures = 0  # steps that failed as a whole (the batch was rebuilt)
        self.step_started: float | None = None  # time.monotonic() when the step in progress began
        self.stopped: str | None = None  # why the engine thread ended (no job is taken after it)
        self._gauges_at = 0.0
        self._lock = threading.Lock()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._choices: dict[int, _Choice] = {}
        self._queued: list[Handle] = []  # inserted jobs with a row still waiting for the batch
        self._thread = threading.Thread(target=self._run, name="tiny-llm-engine", daemon=True)

    def _generator(self) -> "BatchGenerator | Leader":
        if self.group is not None:
            return Leader(self.group, self.model, self.tokenizer, self.settings)
        return BatchGenerator(self.model, self.tokenizer, **self.settings.kwargs())

    # ---- any thread --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Fail every job with 503 "shutting down" and end the engine thread (at once; the
        thread ends after the step it is in)."""
        self._command("stop", None)

    def stop(self, timeout: float = 10.0) -> None:
        self.close()
        self._thread.join(timeout)

    def submit(self, job: Job, loop: asyncio.AbstractEventLoop, request_id: str = "-") -> Handle:
        """Queue `job`; raises `QueueFull` when `max_queue` jobs already wait, `EngineStopped`
        once the engine thread has ended."""
        handle = Handle(job, loop, request_id)
        with self._lock:  # the thread's end takes this lock too: no job is left behind it
            if self.stopped is not None:
                raise EngineStopped(self.stopped)
            if self.queued >= self.max_queue:
                raise QueueFull(f"{self.queued} requests are waiting, the most this server queues "
                                f"(--max-queue {self.max_queue})")
            self.queued += 1
            self._command("submit", handle)
        self.metrics.queue.set(self.queued)
        return handle

    def health(self) -> dict:
        """What `/health` reports: whether the thread runs, how long the step in progress has
        taken, whole-step failures, rows running and jobs waiting."""
        started = self.step_started
        return {"alive": self._thread.is_alive() and self.stopped is None,
                "step_seconds": round(time.monotonic() - started, 3) if started is not None else 0.0,
                "failures": self.failures, "running": len(self.gen.running), "queued": self.queued}

    def cancel(self, handle: Handle) -> None:
        """Take the job out of the queue or the batch (its client went away)."""
        self._command("cancel", handle)

    def _command(self, name: str, handle: Handle | None) -> None:
        self._commands.put((name, handle))
        self._wake.set()

    # ---- the engine thread -------------------------------------------------------------------

    def _run(self) -> None:
        reason, status = "the server is shutting down", 503
        try:
            self._loop()
            if self.group is not None:
                self.gen.stop()  # the other ranks end with this one
        except BaseException as e:
            if isinstance(e, RuntimeError) and lost_peer(e):
                # Without the other ranks no forward pass can run: the server ends.
                print(f"tiny-llm: error: rank 0: the connection to another rank was lost (it exited or was "
                      f"killed): {e}", file=sys.stderr, flush=True)
                os._exit(1)
            # A bug of ours outside any one job: every job ends with an error, and /health
            # fails from now on (a supervisor restarts the server).
            reason, status = f"the engine stopped: {type(e).__name__}: {e}", 503
            print(f"tiny-llm: error: {reason}", file=sys.stderr, flush=True)
            traceback.print_exc()
        finally:
            with self._lock:
                self.stopped = reason
            self._fail_all(reason, status)
            # MLX asks each thread to release its streams before it ends
            mx.synchronize()
            mx.clear_streams()

    def _loop(self) -> None:
        while True:
            while True:
                try:
                    name, handle = self._commands.get_nowait()
                except queue.Empty:
                    break
                if name == "stop":
                    return
                try:
                    (self._insert if name == "submit" else self._cancel)(handle)
                except Exception as e:  # a bug of ours: this job fails, the others go on
                    self._fail(handle, f"internal error: {type(e).__name__}: {e}", log=True)
            if not self.gen.has_work():
                self._gauges(force=True)
                if not self._wake.wait(HEARTBEAT if self.group is not None else None):
                    self.gen.ping()  # idle: a rank that died is noticed all the same
                self._wake.clear()
                continue
            prefilled, cached = self.gen.stats.prompt_tokens, self.gen.stats.cached_tokens
            self.steps += 1
            self.step_started = time.monotonic()
            try:
                self.faults.before_step(self.steps)
                responses = self.gen.step()
            except Exception as e:  # the model failed: every job in the batch fails with it
                self._recover(f"the model failed: {type(e).__name__}: {e}")
                continue
            finally:
                self.step_started = None
            self.metrics.prefill_tokens.inc(self.gen.stats.prompt_tokens - prefilled)
            self.metrics.cached_tokens.inc(self.gen.stats.cached_tokens - cached)
            self._admitted()
            now = time.perf_counter()
            for response in responses:
                try:
                    self._respond(response, now)
                except Exception as e:  # a bug of ours: this job fails, the others go on
                    choice = self._choices.get(response.uid)
                    if choice is not None:
                        self._fail(choice.handle, f"internal error: {type(e).__name__}: {e}", log=True)
            self.metrics.running.set(len(self.gen.running))
            self._gauges()

    def _recover(self, message: str) -> None:
        """After a whole step failed: its jobs end with `message`, and a new batch (and
        prefix cache) takes the old one's place; jobs not yet inserted wait for it."""
        print(f"tiny-llm: error: {message}; the jobs in the batch fail, the engine goes on with a new batch",
              file=sys.stderr, flush=True)
        self.gen = self._generator()
        self._fail_inserted(message, 500)
        self.failures += 1
        self.metrics.engine_failures.inc()
        self.metrics.running.set(0)
        self._gauges(force=True)

    def _gauges(self, force: bool = False) -> None:
        """The page pool's and the prefix cache's gauges (at most four times a second)."""
        now = time.monotonic()
        if not force and now - self._gauges_at < 0.25:
            return
        self._gauges_at = now
        gen = getattr(self.gen, "gen", self.gen)  # a lockstep Leader wraps the BatchGenerator
        pool, cache = gen.pool, gen.prefix_cache
        self.metrics.pages_in_use.set(pool.pages_in_use if pool is not None else 0)
        self.metrics.pages_capacity.set(pool.capacity if pool is not None else 0)
        self.metrics.prefix_pages.set(cache.pages if cache is not None else 0)
        self.metrics.prefix_idle_bytes.set(cache.idle_bytes if cache is not None else 0)
        self.metrics.prefix_budget_bytes.set(cache.max_bytes if cache is not None else 0)

    def _insert(self, handle: Handle) -> None:
        job = handle.job
        try:
            for params in job.params:
                handle.uids.append(self.gen.insert(job.prompt, job.max_tokens, params,
                                                   logprobs=job.logprobs is not None))
        except ValueError as e:  # a check only the engine can make; nothing of the job runs
            for uid in handle.uids:
                self.gen.cancel(uid)
            self._leave_queue(handle)
            handle.put(RequestError(str(e)))
            return
        for index, uid in enumerate(handle.uids):
            self._choices[uid] = _Choice(handle, index, StopStrings(job.stop), ToolCallText() if job.tools else None)
        self._queued.append(handle)
        self.metrics.prompt_tokens.inc(len(job.prompt))
        handle.put("accepted")

    def _admitted(self) -> None:
        """Jobs whose rows have all joined the batch leave the queue."""
        waiting = set(self.gen.waiting)
        for handle in [h for h in self._queued if not any(uid in waiting for uid in h.uids)]:
            self._leave_queue(handle)

    def _cancel(self, handle: Handle) -> None:
        """Counted once: a job already over (or cancelled) is left as it is."""
        live = handle.waiting
        for uid in handle.uids:
            if self._choices.pop(uid, None) is not None:
                self.gen.cancel(uid)
                live = True
        self._leave_queue(handle)
        if live:
            self.metrics.cancelled.inc()
        self.metrics.running.set(len(self.gen.running))

    def _leave_queue(self, handle: Handle) -> None:
        if handle in self._queued:
            self._queued.remove(handle)
        if handle.waiting:
            handle.waiting = False
            with self._lock:
                self.queued -= 1
            self.metrics.queue.set(self.queued)

    def _fail(self, handle: Handle, message: str, status: int = 500, log: bool = False, rows: bool = True) -> None:
        """End one job with an error: all its rows leave the batch (`rows=False`: the batch
        is not touched, it is gone with the engine thread)."""
        if log:
            print(f"tiny-llm: error: id={handle.request_id} {message}", file=sys.stderr, flush=True)
        for uid in handle.uids:
            if self._choices.pop(uid, None) is not None and rows:
                self.gen.cancel(uid)
        self._leave_queue(handle)
        handle.put(Event(0, finish_reason="error", error=message, status=status) if handle.uids
                   else RequestError(message, status=status, type="server_error"))

    def _fail_inserted(self, message: str, status: int) -> None:
        """Every inserted job (in the batch, or waiting for a row) ends with an error; the
        batch they were in is not touched (it is being replaced, or the thread ends)."""
        handles = {id(c.handle): c.handle for c in self._choices.values()}
        handles.update((id(h), h) for h in self._queued)
        for handle in handles.values():
            self._fail(handle, message, status, rows=False)

    def _fail_all(self, message: str, status: int) -> None:
        """Every job ends with an error as the engine thread ends: those inserted, and those
        submitted but not yet inserted."""
        self._fail_inserted(message, status)
        while True:  # jobs submitted but not yet inserted
            try:
                name, handle = self._commands.get_nowait()
            except queue.Empty:
                break
            if name == "submit":
                self._leave_queue(handle)
                handle.put(RequestError(message, status=503, type="server_error"))

    def _respond(self, r, now: float) -> None:
        choice = self._choices.get(r.uid)
        if choice is None:
            return
        handle = choice.handle
        if not handle.started:
            handle.started = True
            self.metrics.time_to_first_token.observe(now - handle.submitted)
        elif choice.last is not None:
            self.metrics.inter_token_latency.observe(now - choice.last)
        choice.last = now
        if r.finish_reason == "error":  # the whole job fails: its other choices leave too
            # A row fails alone when nothing can be drawn for it (its grammar allows no token,
            # its sampling parameters leave no finite logit): the request's own doing.
            self._fail(handle, r.error, status=400)
            return
        self.metrics.generation_tokens.inc()
        text, found = choice.stops.feed(r.text)
        finish = r.finish_reason
        if found:
            finish = "stop"
            if r.finish_reason is None:
                self.gen.cancel(r.uid)  # the row leaves before the next step
        elif finish:
            text += choice.stops.flush()
        calls, deltas = [], []
        if choice.tools:
            text, calls = choice.tools.feed(text)
            if finish:
                rest, more = choice.tools.finish()
                text, calls = text + rest, calls + more
                if finish == "stop" and choice.tools.calls:
                    finish = "tool_calls"
            deltas = choice.tools.deltas()
        eos = r.finish_reason == "stop"  # the end-of-sequence token: not part of the reply
        if finish:
            del self._choices[r.uid]
        if text or calls or deltas or finish or (r.logprobs and not eos):
            handle.put(Event(choice.index, text, None if eos else r.token, None if eos else r.logprobs,
                             calls, deltas, finish, tokens=r.generation_tokens, cached_tokens=r.cached_tokens))
