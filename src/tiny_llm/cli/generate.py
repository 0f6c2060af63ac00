"""Engine — `tiny-llm generate`: a reply to one prompt, sampled, by beam search, or with
speculative decoding.

Tests: tests/test_cli.py, tests/test_progress.py, tests/test_request.py
"""

import argparse
import sys

from ..defaults import NUM_DRAFT_TOKENS
from .common import UserError, load, messages_text, print_stats, prompt_tokens, read_stdin, stream, user_text
from .options import add_model_options, add_sampling_options, flag_of, request, sampler


def add_parser(commands) -> argparse.ArgumentParser:
    gen = commands.add_parser("generate", help="write a reply to one prompt")
    gen.add_argument("--prompt", "-p", default=None, help="the prompt (default: read standard input)")
    add_model_options(gen)
    add_sampling_options(gen)
    gen.add_argument("--num-beams", type=int, default=1,
                     help="beam search with this many beams, on the model's log-probabilities "
                          "(the sampling flags do not apply; default 1: off)")
    gen.add_argument("--num-return-sequences", type=int, default=1,
                     help="with --num-beams: print this many best sequences, each with its score (default 1)")
    gen.add_argument("--draft-model", default=None, metavar="MODEL",
                     help="speculative decoding with this draft model (same tokenizer as --model)")
    gen.add_argument("--prompt-lookup", action="store_true",
                     help="speculative decoding with drafts copied from earlier text (no second model)")
    gen.add_argument("--num-draft-tokens", type=int, default=NUM_DRAFT_TOKENS,
                     help=f"tokens drafted per round of speculative decoding (default {NUM_DRAFT_TOKENS})")
    return gen


def run(args: argparse.Namespace) -> None:
    prompt = user_text(args.prompt, "--prompt") if args.prompt is not None else read_stdin()
    if not prompt.strip():
        raise UserError("the prompt is empty: pass --prompt TEXT or text on standard input")
    params = request(args).params  # check the flags before loading anything
    check_beams(args, params)
    speculative = check_speculative(args, params)
    model, tokenizer = load(args)
    params = request(args, tokenizer, model.args.vocab_size).params
    text = messages_text(tokenizer, args, [{"role": "user", "content": prompt}])
    prompt = prompt_tokens(model, tokenizer, text, args)
    if args.num_beams > 1:
        print_beams(model, tokenizer, prompt, args)
        return
    if speculative is not None:
        if args.draft_model:
            speculative["draft_model"] = load(args, args.draft_model)[0]
        _, last = stream(model, tokenizer, prompt, args, sampler=params, speculative=speculative)
        print(flush=True)
        if args.verbose:
            print_stats(last)
            st = speculative["speculative_stats"]
            print(f"speculative: {st.rounds} target passes, {st.drafted} tokens drafted, {st.accepted} "
                  f"accepted ({st.acceptance_rate:.0%}), {st.emitted / max(st.rounds, 1):.2f} tokens per pass",
                  file=sys.stderr)
        return
    engine = sampler(args, params, tokenizer)
    timing = {} if args.verbose else None
    _, last = stream(model, tokenizer, prompt, args, sampler=engine, timing=timing)
    print(flush=True)
    if args.verbose:
        print_stats(last, engine, timing)


def check_beams(args: argparse.Namespace, params) -> None:
    if args.num_beams < 1:
        raise UserError(f"--num-beams must be a positive integer, got {args.num_beams}")
    if not 1 <= args.num_return_sequences <= args.num_beams:
        raise UserError(f"--num-return-sequences must be between 1 and --num-beams ({args.num_beams}), "
                        f"got {args.num_return_sequences}")
    if args.num_beams > 1 and args.max_tokens < 1:
        raise UserError(f"--max-tokens must be a positive integer for beam search, got {args.max_tokens}")
    if args.num_beams > 1 and params.grammar is not None:
        raise UserError("beam search does not combine with --grammar, --json-schema or --regex")


def print_beams(model, tokenizer, prompt: list[int], args: argparse.Namespace) -> None:
    """Beam search: print the best sequence, or each of the --num-return-sequences best
    under a header with its score."""
    from ..beam_search import beam_search

    hyps = beam_search(model, tokenizer, prompt, args.num_beams, args.max_tokens,
                       num_return_sequences=args.num_return_sequences,
                       prefill_step_size=args.prefill_step_size)
    if args.num_return_sequences == 1:
        print(hyps[0].text, flush=True)
        return
    for i, h in enumerate(hyps):
        reason = "stop" if h.finished else "length"
        print(f"--- sequence {i} (score {h.score:.4f}, {reason}, {len(h.tokens)} tokens) ---", flush=True)
        print(h.text, flush=True)


def check_speculative(args: argparse.Namespace, params) -> dict | None:
    """The keyword arguments of speculative decoding, or None without --draft-model and
    --prompt-lookup; conflicting flags are a UserError."""
    from ..speculative import SpeculativeStats, refused_fields

    if not args.draft_model and not args.prompt_lookup:
        return None
    if args.draft_model and args.prompt_lookup:
        raise UserError("pass either --draft-model or --prompt-lookup, not both")
    if args.num_draft_tokens < 1:
        raise UserError(f"--num-draft-tokens must be a positive integer, got {args.num_draft_tokens}")
    refused = refused_fields(params)
    for flag, clash in (("--num-beams", args.num_beams > 1), ("--no-kv-cache", args.no_kv_cache),
                        ("a grammar", "grammar" in refused), ("--logprobs", params.logprobs),
                        *((flag_of(field), True) for field in refused if field != "grammar")):
        if clash:
            raise UserError(f"speculative decoding does not combine with {flag}")
    return dict(prompt_lookup=args.prompt_lookup, num_draft_tokens=args.num_draft_tokens,
                speculative_stats=SpeculativeStats())
