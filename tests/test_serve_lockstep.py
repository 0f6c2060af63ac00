"""Serving across ranks (`tiny_llm.serve.lockstep`): rank 0's bytes reach every rank intact,
and the `Leader` that sends each operation answers exactly as the generator it wraps. (Real
ranks under `mlx.launch` serve in tests/test_week3_day5.py.)"""

import mlx.core as mx
from conftest import generate_alone, tiny_model, vocab_tokenizer

from tiny_llm.defaults import BatchSettings
from tiny_llm.sampler import SamplingParams
from tiny_llm.serve.lockstep import Leader, _exchange


def test_rank_zeros_bytes_arrive_whole():
    group = mx.distributed.init()
    data = bytes(range(256)) + b"\x00tail"
    assert _exchange(group, data) == data


def test_a_leader_answers_as_the_generator_it_wraps():
    """One rank: every operation is sent to no one else, and the tokens are each prompt's own."""
    model, _ = tiny_model("llama-tied", seed=5)
    tok = vocab_tokenizer(model.args.vocab_size)
    leader = Leader(mx.distributed.init(), model, tok, BatchSettings(max_batch_size=2, prefill_step_size=16))
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]]
    greedy = SamplingParams(temperature=0.0)
    uids = [leader.insert(p, 6, greedy) for p in prompts]
    dropped = leader.insert([11, 12], 6, greedy)
    assert leader.cancel(dropped) and dropped not in leader.waiting
    got = {u: [] for u in uids}
    while leader.has_work():
        for r in leader.step():
            if r.token not in tok.eos_token_ids:
                got[r.uid].append(r.token)
    leader.stop()
    assert [got[u] for u in uids] == [generate_alone(model, tok, p, 6) for p in prompts]
