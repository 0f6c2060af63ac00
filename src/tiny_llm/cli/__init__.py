"""Engine — the `tiny-llm` command line: `generate`, `chat`, `batch`, `serve`, `smoke` and `agent`.

One module per command, each with `add_parser(commands)` and `run(args)`; `options` holds
the option groups they share and `common` the rest. This module builds the parser and runs a
command in the process's lifecycle: one-line user errors, a starter's missing day, and the
ranks of `mlx.launch`.

Tests: tests/test_cli.py, tests/test_progress.py, tests/test_request.py
"""

import argparse
import atexit
import contextlib
import os
import signal
import sys

import mlx.core as mx

from .. import distributed
from ..progress import missing_day
from . import agent, batch, chat, generate, serve, smoke
from .common import UserError, missing_day_message

COMMANDS = (generate, chat, batch, serve, smoke, agent)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit status 2, no usage dump
        print(f"tiny-llm: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tiny-llm", description="Qwen2/Llama inference built from mlx.core primitives.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for command in COMMANDS:
        command.add_parser(commands).set_defaults(module=command)
    return parser


def _finish_mlx() -> None:
    """At exit, while the interpreter is still whole: wait for work still queued (a reply
    that ended early leaves the next step running) and release the main thread's streams.
    MLX asks for this; its own clean-up comes after the interpreter's and can crash."""
    mx.synchronize()
    mx.clear_streams()


_said: list[str] = []  # the error this process printed, if any


def _stopped_by_launcher(where: str, errors):
    """A SIGTERM handler for one rank of several: mlx.launch ends the other ranks when one
    fails. Say so (unless this rank has said why it ends already) and end now."""

    def handler(signum, frame):
        if not _said:
            print(f"tiny-llm: error: {where}stopped by mlx.launch: another rank exited or was killed",
                  file=errors, flush=True)
        os._exit(1)

    return handler


def main(argv: list[str] | None = None) -> int:
    atexit.unregister(_finish_mlx)  # once, however often `main` runs in one process
    atexit.register(_finish_mlx)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "module", None):
        parser.print_help()
        return 0
    errors = sys.stderr
    with contextlib.ExitStack() as quiet:
        try:
            where = ""
            if distributed.launched():  # one rank of several (mlx.launch): rank 0 alone prints
                where = f"rank {distributed.rank()}: "
                signal.signal(signal.SIGTERM, _stopped_by_launcher(where, errors))
                if distributed.rank() != 0:
                    sink = quiet.enter_context(open(os.devnull, "w"))
                    quiet.enter_context(contextlib.redirect_stdout(sink))
                    quiet.enter_context(contextlib.redirect_stderr(sink))
            status = args.module.run(args)
        except UserError as e:
            print(f"tiny-llm: error: {where}{e}", file=errors)
            return 2
        except NotImplementedError as e:  # a starter whose day is not done yet
            if (found := missing_day(e)) is None:
                raise
            print(f"tiny-llm: error: {where}{missing_day_message(*found)}", file=errors)
            return 2
        except RuntimeError as e:
            if not distributed.lost_peer(e):
                raise
            # mlx.launch's SIGTERM may come now: this rank's one message is this one.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            _said.append("lost")
            print(f"tiny-llm: error: {where}the connection to another rank was lost (it exited or was "
                  f"killed): {e}", file=errors, flush=True)
            # End now: work queued behind the failed collective must not hold the exit up.
            sys.stdout.flush()
            os._exit(1)
        except KeyboardInterrupt:
            print(file=errors)
            return 130
    return status or 0


__all__ = ["COMMANDS", "UserError", "build_parser", "main"]
