"""Engine — week 4: a coding agent on tiny-llm.

`core` holds the shared types; day 1 `actions` (a schema for every tool call, enforced while
decoding) and `loop` (one action per step, a JSONL run log), day 2 `workspace` (tools behind
the security boundary of `boundary`, receipts; with `tools`, `files`, `blobs`, `outputs`,
`receipts`, `runner` and `sandbox` around it), day 3 `session` (checkpoints, resume,
compaction, steering), day 4 `evaluate` (tasks, held-out checks, reports), day 5 `fork`
(branches on a shared prefix, select one); `models` puts the engine, an OpenAI-compatible
endpoint or a script behind `core.Model`.

Tests: tests/test_week4_day2.py, tests/test_week4_day3.py, tests/test_week4_day5.py
"""
