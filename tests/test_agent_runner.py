"""A command's result as typed fields (`tiny_llm.agent.runner`, `tiny_llm.agent.receipts`): the
closing lines of its observation are made from them, and a receipt of an older log reads back."""

import json
import re
import signal

import pytest

from tiny_llm.agent.core import Receipt


def test_a_commands_closing_lines_are_made_from_its_result():
    from tiny_llm.agent.runner import CommandResult, closing_lines
    from tiny_llm.agent.sandbox import CommandLimits

    limits = CommandLimits(cpu_seconds=5, file_bytes=1 << 20)
    cases = [
        (CommandResult(b"x", 0, False, 0, True), "[exit status 0]\n"),
        (CommandResult(b"x", -9, True, 0, True), "[timed out after 2.5 s: killed, exit status -9]\n"),
        (CommandResult(b"x", 1, False, 7, False),
         "[7 more bytes of output were dropped]\n[exit status 1; not sandboxed (--unsandboxed-commands)]\n"),
        (CommandResult(b"", -signal.SIGXCPU, False, 0, True),
         f"[exit status {-signal.SIGXCPU}: killed by the CPU time limit (5 s)]\n"),
        (CommandResult(b"", 128 + signal.SIGXFSZ, False, 0, True),
         f"[exit status {128 + signal.SIGXFSZ}: killed by the file size limit (1048576 bytes)]\n"),
    ]
    for result, lines in cases:
        assert closing_lines(result, seconds=2.5, limits=limits) == lines
    with pytest.raises(ValueError, match="dropped_bytes: an integer >= 0, got -1"):
        CommandResult(b"", 0, False, -1, True)


def test_a_receipt_from_an_older_log_reads_back_with_its_command_fields_unknown():
    """A log written before receipts recorded `timed_out` and `dropped_bytes` reads back with
    them None, and writes back as it was (a compaction summary made from it is the same)."""
    old = {"tool": "run", "args": {"command": ["python", "t.py"]}, "before": {"t.py": None}, "after": {"t.py": None},
           "exit_status": 1}
    receipt = Receipt.from_json(old)
    assert (receipt.exit_status, receipt.timed_out, receipt.dropped_bytes) == (1, None, None)
    assert receipt.to_json() == old
    new = Receipt("run", {"command": ["python"]}, {}, {}, -9, True, 0)
    assert Receipt.from_json(json.loads(json.dumps(new.to_json()))) == new
    for kwargs, message in [({"exit_status": True}, "exit_status: an integer or None, got True"),
                            ({"timed_out": "yes"}, "timed_out: True, False or None, got 'yes'"),
                            ({"dropped_bytes": -1}, "dropped_bytes: an integer >= 0 or None, got -1")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            Receipt("run", {}, **kwargs)
