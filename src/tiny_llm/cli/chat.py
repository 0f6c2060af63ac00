"""Engine — `tiny-llm chat`: an interactive conversation, each turn prefilling only what the
prefix cache does not hold of it.

Tests: tests/test_cli.py, tests/test_progress.py, tests/test_request.py
"""

import argparse
import sys

from .common import UserError, load, messages_text, prefix_cache_days_done, print_stats, prompt_tokens, stream, \
    user_text, kv_cache
from .options import add_cache_options, add_model_options, add_sampling_options, check_cache_options, request, \
    sampler


def add_parser(commands) -> argparse.ArgumentParser:
    chat = commands.add_parser("chat", help="an interactive conversation")
    add_model_options(chat)
    add_sampling_options(chat)
    add_cache_options(chat)
    return chat


def prefix_cache(args: argparse.Namespace, model):
    """The prefix cache `chat` keeps across turns, or None when it is off (by
    --prefix-cache-bytes 0, --no-kv-cache, or days not done yet)."""
    from ..defaults import PREFIX_CACHE_BYTES
    from ..model import heads_share
    from ..paged_cache import PagePool
    from ..prefix_cache import PrefixCache

    budget = args.prefix_cache_bytes
    if budget == 0 or not kv_cache(args) or not prefix_cache_days_done(args):
        return None
    return PrefixCache(PagePool(args.page_size, heads_share=heads_share(model)),
                       PREFIX_CACHE_BYTES if budget is None else budget)


def run(args: argparse.Namespace) -> None:
    request(args)  # check the flags before loading anything
    check_cache_options(args)
    model, tokenizer = load(args)
    engine = sampler(args, request(args, tokenizer, model.args.vocab_size).params, tokenizer)
    cache = prefix_cache(args, model)  # each turn prefills only what the last one did not hold
    interactive = sys.stdin.isatty()
    if interactive:
        print("Type a message and press Enter. Ctrl-C stops a reply, Ctrl-D leaves.", file=sys.stderr)
    messages: list[dict] = []
    while True:
        try:
            line = user_text(input(">> " if interactive else ""), "that line")
        except EOFError:
            print(file=sys.stderr)
            return
        except KeyboardInterrupt:
            print(file=sys.stderr)
            continue
        except (UserError, UnicodeDecodeError) as e:  # the conversation goes on without it
            why = e if isinstance(e, UserError) else f"that line is not valid UTF-8 text (byte {e.start + 1})"
            print(f"tiny-llm: error: {why}", file=sys.stderr)
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        text = messages_text(tokenizer, args, messages)
        try:
            prompt = prompt_tokens(model, tokenizer, text, args)
        except UserError as e:  # that turn is dropped; a shorter one may still fit
            messages.pop()
            print(f"tiny-llm: error: {e}", file=sys.stderr)
            continue
        pieces, last = [], None
        engine.new_reply()  # every reply follows the grammar from its start, and --min-tokens anew
        try:
            _, last = stream(model, tokenizer, prompt, args, sampler=engine, pieces=pieces, prefix_cache=cache)
        except KeyboardInterrupt:
            print(" [stopped]", end="")
        print()
        # The conversation keeps what was shown, also of a reply cut short.
        messages.append({"role": "assistant", "content": "".join(pieces)})
        if args.verbose:
            print_stats(last, engine)
