"""Engine — `tiny-llm smoke`: run the model once on a prompt and show the most likely next tokens.

Tests: tests/test_progress.py
"""

import argparse

import mlx.core as mx

from .common import UserError, load, messages_text
from .options import add_model_options


def add_parser(commands) -> argparse.ArgumentParser:
    smoke = commands.add_parser("smoke", help="run the model once and show the next-token distribution")
    smoke.add_argument("--prompt", required=True, help="the prompt text")
    smoke.add_argument("--top", type=int, default=5, help="how many candidates to show (default 5)")
    smoke.add_argument("--system", default=None, help="system message for the chat template")
    smoke.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    add_model_options(smoke, generation=False)
    return smoke


def run(args: argparse.Namespace) -> None:
    if not args.prompt.strip():
        raise UserError("--prompt is empty")
    if args.top <= 0:
        raise UserError(f"--top must be a positive integer, got {args.top}")
    model, tokenizer = load(args)
    text = messages_text(tokenizer, args, [{"role": "user", "content": args.prompt}])
    tokens = tokenizer.encode(text)
    logits = model(mx.array([tokens]))[0, -1].astype(mx.float32)  # V
    logprobs = logits - mx.logsumexp(logits)
    print(f"{len(tokens)} prompt tokens; most likely next tokens:")
    for token in mx.argsort(-logprobs)[: args.top].tolist():
        print(f"  {mx.exp(logprobs[token]).item():7.2%}  {token:6d}  {tokenizer.decode([token])!r}")
