"""The `tiny-llm` command line: `generate`, `chat` and `smoke`."""

import argparse
import re
import sys

import mlx.core as mx

DEFAULT_MAX_TOKENS = 256


class UserError(Exception):
    """A mistake on the command line: printed as one line, exit status 2."""


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default",
                        help="'default' (SmolLM2-135M-Instruct), a model directory, a .gguf file or a HF repo id")


def _add_sampling_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", "-m", type=int, default=DEFAULT_MAX_TOKENS,
                        help=f"most tokens to generate (default {DEFAULT_MAX_TOKENS}; -1: no limit)")
    parser.add_argument("--temp", type=float, default=0.0, help="temperature; 0 is greedy (default 0)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass to keep (default 1: off)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0: off)")
    parser.add_argument("--min-p", type=float, default=0.0, help="keep tokens with p >= min_p * p_max (default 0: off)")
    parser.add_argument("--repetition-penalty", type=float, default=None,
                        help="divide the logits of recent tokens by this (default: off)")
    parser.add_argument("--repetition-context-size", type=int, default=20,
                        help="how many recent tokens the penalty looks at (default 20)")
    parser.add_argument("--seed", type=int, default=None, help="random seed, for reproducible sampling")
    parser.add_argument("--system", "--system-prompt", dest="system", default=None,
                        help="system message for the chat template")
    parser.add_argument("--no-chat-template", "--ignore-chat-template", dest="no_chat_template",
                        action="store_true", help="feed the prompt as raw text")
    parser.add_argument("--verbose", action="store_true", help="print statistics to stderr")


def _sampling(args: argparse.Namespace):
    """Sampler and logits processors from the flags; bad values become a UserError."""
    from .sampler import make_logits_processors, make_sampler
    from .sampler.checks import check_float

    if args.max_tokens == 0 or args.max_tokens < -1:
        raise UserError(f"--max-tokens must be positive or -1 (no limit), got {args.max_tokens}")
    try:
        if args.repetition_penalty is not None:
            check_float("repetition_penalty", args.repetition_penalty, minimum=0.0, min_open=True)
        sampler = make_sampler(args.temp, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p)
        processors = make_logits_processors(
            repetition_penalty=args.repetition_penalty,
            repetition_context_size=args.repetition_context_size,
        )
    except ValueError as e:
        raise UserError(_flag_names(str(e))) from None
    if args.seed is not None:
        mx.random.seed(args.seed)
    return sampler, processors


_FLAGS = ("temp", "top_p", "top_k", "min_p", "repetition_penalty")


def _flag_names(message: str) -> str:
    """Speak of `--top-p`, not `top_p`: the user typed flags."""
    message = message.replace("repetition_penalty context_size", "--repetition-context-size")
    pattern = r"(?<![\w-])(" + "|".join(_FLAGS) + r")(?![\w-])"
    return re.sub(pattern, lambda m: "--" + m.group(1).replace("_", "-"), message)


def _load(args: argparse.Namespace):
    from .loader import load

    try:
        return load(args.model)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None


def _messages_text(tokenizer, args, messages: list[dict]) -> str:
    if args.no_chat_template or not tokenizer.chat_template:
        return "\n".join(m["content"] for m in messages if m["role"] != "system")
    system = [{"role": "system", "content": args.system}] if args.system else []
    return tokenizer.apply_chat_template(system + messages)


def _print_stats(response) -> None:
    if response is None:
        return
    print(
        f"prompt: {response.prompt_tokens} tokens, {response.prompt_tps:.1f} tokens/s, "
        f"first token after {response.time_to_first_token:.2f} s\n"
        f"generation: {response.generation_tokens} tokens, {response.generation_tps:.1f} tokens/s\n"
        f"peak memory: {response.peak_memory:.3f} GB",
        file=sys.stderr,
    )


def _stream(model, tokenizer, text: str, args, sampler, processors):
    """Print the reply as it is produced; return (reply text, last response)."""
    from .generate import stream_generate

    reply, last = "", None
    for response in stream_generate(model, tokenizer, text, args.max_tokens,
                                    sampler=sampler, logits_processors=processors):
        print(response.text, end="", flush=True)
        reply += response.text
        last = response
    return reply, last


def _generate(args: argparse.Namespace) -> None:
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if not prompt.strip():
        raise UserError("the prompt is empty: pass --prompt TEXT or text on standard input")
    sampler, processors = _sampling(args)
    model, tokenizer = _load(args)
    text = _messages_text(tokenizer, args, [{"role": "user", "content": prompt}])
    _, last = _stream(model, tokenizer, text, args, sampler, processors)
    print(flush=True)
    if args.verbose:
        _print_stats(last)


def _chat(args: argparse.Namespace) -> None:
    sampler, processors = _sampling(args)
    model, tokenizer = _load(args)
    interactive = sys.stdin.isatty()
    if interactive:
        print("Type a message and press Enter. Ctrl-C stops a reply, Ctrl-D leaves.", file=sys.stderr)
    messages: list[dict] = []
    while True:
        try:
            line = input(">> " if interactive else "")
        except EOFError:
            print(file=sys.stderr)
            return
        except KeyboardInterrupt:
            print(file=sys.stderr)
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        text = _messages_text(tokenizer, args, messages)
        reply, last = "", None
        try:
            reply, last = _stream(model, tokenizer, text, args, sampler, processors)
        except KeyboardInterrupt:
            print(" [stopped]", end="")
        print()
        messages.append({"role": "assistant", "content": reply})
        if args.verbose:
            _print_stats(last)


def _smoke(args: argparse.Namespace) -> None:
    if not args.prompt.strip():
        raise UserError("--prompt is empty")
    if args.top <= 0:
        raise UserError(f"--top must be a positive integer, got {args.top}")
    model, tokenizer = _load(args)
    text = _messages_text(tokenizer, args, [{"role": "user", "content": args.prompt}])
    tokens = tokenizer.encode(text)
    logits = model(mx.array([tokens]))[0, -1].astype(mx.float32)  # V
    logprobs = logits - mx.logsumexp(logits)
    print(f"{len(tokens)} prompt tokens; most likely next tokens:")
    for token in mx.argsort(-logprobs)[: args.top].tolist():
        print(f"  {mx.exp(logprobs[token]).item():7.2%}  {token:6d}  {tokenizer.decode([token])!r}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit status 2, no usage dump
        print(f"tiny-llm: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tiny-llm", description="Qwen2/Llama inference built from mlx.core primitives.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    gen = commands.add_parser("generate", help="write a reply to one prompt")
    gen.add_argument("--prompt", "-p", default=None, help="the prompt (default: read standard input)")
    _add_model_options(gen)
    _add_sampling_options(gen)
    gen.set_defaults(run=_generate)

    chat = commands.add_parser("chat", help="an interactive conversation")
    _add_model_options(chat)
    _add_sampling_options(chat)
    chat.set_defaults(run=_chat)

    smoke = commands.add_parser("smoke", help="run the model once and show the next-token distribution")
    smoke.add_argument("--prompt", required=True, help="the prompt text")
    smoke.add_argument("--top", type=int, default=5, help="how many candidates to show (default 5)")
    smoke.add_argument("--system", default=None, help="system message for the chat template")
    smoke.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    _add_model_options(smoke)
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
    except UserError as e:
        print(f"tiny-llm: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    return 0
