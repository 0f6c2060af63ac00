"""The `tiny-llm` command line."""

import argparse
import sys

import mlx.core as mx


class UserError(Exception):
    """A mistake in the command line: printed as one line, exit status 2."""


def _smoke(args: argparse.Namespace) -> None:
    from .basics import softmax
    from .loader import load

    if not args.prompt.strip():
        raise UserError("--prompt is empty")
    if args.top <= 0:
        raise UserError(f"--top must be a positive integer, got {args.top}")
    model, tokenizer = load(args.model)
    text = args.prompt
    if tokenizer.chat_template and not args.no_chat_template:
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}])
    tokens = tokenizer.encode(text)
    logits = model(mx.array([tokens]))[0, -1]  # V
    probs = softmax(logits.astype(mx.float32))
    order = mx.argsort(-probs)[: args.top].tolist()
    print(f"{len(tokens)} prompt tokens; most likely next tokens:")
    for token in order:
        print(f"  {probs[token].item():7.2%}  {token:6d}  {tokenizer.decode([token])!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tiny-llm", description="Qwen2/Llama inference built from mlx.core primitives."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    smoke = commands.add_parser("smoke", help="run the model once and show the next-token distribution")
    smoke.add_argument("--model", default="default", help="'default', a model directory, a .gguf file or a HF repo id")
    smoke.add_argument("--prompt", required=True, help="the prompt text")
    smoke.add_argument("--top", type=int, default=5, help="how many candidates to show (default 5)")
    smoke.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    smoke.set_defaults(run=_smoke)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 0
    try:
        args.run(args)
    except (UserError, ValueError, FileNotFoundError) as e:
        print(f"tiny-llm: error: {e}", file=sys.stderr)
        return 2
    return 0
