"""The server's engine thread in this process, without HTTP: a job that hits a bug fails
alone, the others finish with their solo tokens."""

import asyncio

from conftest import generate_alone, tiny_model, vocab_tokenizer

from tiny_llm.defaults import BatchSettings
from tiny_llm.sampler import SamplingParams
from tiny_llm.serve.engine import Engine, Event
from tiny_llm.serve.metrics import Metrics
from tiny_llm.serve.protocol import Job
from tiny_llm.serve.text import ToolCallText


def run_jobs(engine: Engine, jobs: list[Job]) -> list[list]:
    async def main():
        loop = asyncio.get_running_loop()
        handles = [engine.submit(job, loop) for job in jobs]
        out = []
        for handle in handles:
            items = [await handle.queue.get()]
            while isinstance(items[-1], str) or not (items[-1].finish_reason or isinstance(items[-1], Exception)):
                items.append(await asyncio.wait_for(handle.queue.get(), 60))
            out.append(items)
        return out

    engine.start()
    try:
        return asyncio.run(main())
    finally:
        engine.stop()


def test_a_job_that_hits_a_bug_fails_alone(monkeypatch):
    model, _ = tiny_model("llama-tied", seed=43)
    tok = vocab_tokenizer(model.args.vocab_size)

    def broken(self, text):
        raise RuntimeError("broken parser")

    monkeypatch.setattr(ToolCallText, "feed", broken)
    engine = Engine(model, tok, BatchSettings(max_batch_size=4, prefill_step_size=16), max_queue=8, metrics=Metrics())
    params = SamplingParams(temperature=0.9, seed=5)
    jobs = [Job("completion", "m", [3, 4, 5], 6, [params], tools=True),
            Job("completion", "m", [7, 8], 6, [params])]
    failed, fine = run_jobs(engine, jobs)
    assert failed[0] == "accepted" and failed[-1].finish_reason == "error"
    assert "RuntimeError: broken parser" in failed[-1].error
    assert fine[0] == "accepted" and fine[-1].finish_reason in ("length", "stop")
    tokens = [e.token for e in fine[1:] if isinstance(e, Event) and e.token is not None]
    assert tokens == generate_alone(model, tok, [7, 8], 6, params)
    assert engine.queued == 0 and engine.gen.running == []
