"""Engine — the `tiny-llm` command line: `generate`, `chat`, `batch`, `serve` and `smoke`."""

import argparse
import atexit
import contextlib
import dataclasses
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import mlx.core as mx

from .defaults import (CPU_PREFILL_STEP_SIZE, MAX_BATCH_SIZE, MAX_QUEUE, MAX_TOKENS, NUM_DRAFT_TOKENS, PAGE_SIZE,
                       PREFILL_STEP_SIZE, PREFIX_CACHE_BYTES, TEMPERATURE)
from . import distributed, kernels
from .progress import missing_day


class UserError(Exception):
    """A mistake on the command line: printed as one line, exit status 2."""


PROGRESS_AFTER = 2.0  # seconds of prefill before a progress line is shown


def _prefill_step(args: argparse.Namespace) -> int:
    if args.prefill_step_size is None:
        args.prefill_step_size = CPU_PREFILL_STEP_SIZE if mx.default_device() == mx.cpu else PREFILL_STEP_SIZE
    return args.prefill_step_size


class _PrefillProgress:
    """`model`, telling on standard error how far the prefill of a `total`-token prompt has
    got, once it has run for PROGRESS_AFTER seconds: a line redrawn in place on a terminal,
    a line every PROGRESS_AFTER seconds with --verbose otherwise. Every call with more than
    one position before the prompt is through is one chunk of it."""

    def __init__(self, model, total: int, live: bool, verbose: bool):
        self.model, self.total, self.live, self.verbose = model, total, live, verbose
        self.sent, self.start, self.shown = 0, None, None
        # The model contract (`tiny_llm.model.Model`), offered as real attributes: a protocol
        # check does not look through __getattr__ (Python 3.12 and later).
        self.args, self.layers, self.make_cache = model.args, model.layers, model.make_cache

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, tokens, *args, **kwargs):
        cache = kwargs.get("cache", args[0] if args else None)
        if self.start is None and not self.sent and cache:  # a prefix cache may hold the start already
            self.total -= cache[0].offset
        if self.sent < self.total:  # the chunks before this one have been evaluated
            now = time.perf_counter()
            self.start = self.start or now
            due = self.shown is None or self.live or now - self.shown >= PROGRESS_AFTER
            if self.sent and now - self.start >= PROGRESS_AFTER and due and (self.live or self.verbose):
                line = (f"prefill: {self.sent}/{self.total} tokens, "
                        f"{self.sent / (now - self.start):.1f} tokens/s")
                print("\r\033[K" + line if self.live else line, end="" if self.live else "\n",
                      file=sys.stderr, flush=True)
                self.shown = now
            self.sent += tokens.shape[-1]
            if self.sent >= self.total and self.shown and self.live:
                print("\r\033[K", end="", file=sys.stderr, flush=True)
        return self.model(tokens, *args, **kwargs)


def _add_model_options(parser: argparse.ArgumentParser, generation: bool = True) -> None:
    parser.add_argument("--model", default="default",
                        help="'default' (SmolLM2-135M-Instruct), a model directory (qwen2, llama incl. Llama 3 "
                             "RoPE scaling, qwen3, qwen2_moe, qwen3_moe; float or MLX-quantized), a .gguf file "
                             "(llama, qwen2) or a HF repo id")
    parser.add_argument("--no-fused", action="store_true",
                        help="run the hand-written RMSNorm, RoPE and attention instead of mx.fast kernels")
    parser.add_argument("--no-kernels", action="store_true",
                        help="run matrix products and paged attention on MLX ops instead of tiny-llm's own CPU "
                             "kernels (also TINY_LLM_KERNELS=0)")
    if generation:
        _add_prefill_option(parser)
        parser.add_argument("--no-kv-cache", action="store_true",
                            help="recompute the whole sequence for every token (week 1's loop; slow)")


def _add_prefill_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefill-step-size", type=int, default=None,
                        help=f"prefill the prompt in chunks of this many tokens (default {PREFILL_STEP_SIZE} "
                             f"on a GPU; {CPU_PREFILL_STEP_SIZE} on the CPU, where a token of prefill takes a "
                             f"tenth of a second or more and Ctrl-C acts between chunks)")


_BYTE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _byte_count(text: str) -> int:
    """`--prefix-cache-bytes`: a count of bytes, or with a K, M or G suffix (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?\s*", text, re.I)
    if not m or (m[2] == "" and "." in m[1]):
        raise argparse.ArgumentTypeError(f"expected a number of bytes such as 1073741824, 512M or 1G "
                                         f"(0 turns the cache off), got {text!r}")
    return int(float(m[1]) * _BYTE_UNITS[m[2].upper()])


def _add_cache_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--page-size", type=int, default=PAGE_SIZE,
                        help=f"positions per page of the paged KV cache (default {PAGE_SIZE})")
    parser.add_argument("--prefix-cache-bytes", type=_byte_count, default=None, metavar="SIZE",
                        help="keep up to this much of finished requests' keys and values, so that prompts "
                             f"starting alike are prefilled once (e.g. 512M; default {PREFIX_CACHE_BYTES >> 30}G "
                             "once week 3 day 3 is done; 0: off)")


def _check_cache_options(args: argparse.Namespace) -> None:
    if args.page_size < 1:
        raise UserError(f"--page-size must be a positive integer, got {args.page_size}")


def _prefix_cache_days_done(args: argparse.Namespace) -> bool:
    """Whether the prefix cache's days (week 3 days 2 and 3) are done; a --prefix-cache-bytes
    above 0 given before then is a UserError naming the missing day."""
    from .paged_cache import paged_cache_implemented
    from .prefix_cache import prefix_cache_implemented

    for day, done in (("week3-day2", paged_cache_implemented), ("week3-day3", prefix_cache_implemented)):
        if not done():
            if args.prefix_cache_bytes:
                raise UserError(_missing_day_message(day, "--prefix-cache-bytes needs the prefix cache"))
            return False
    return True


def _prefix_cache(args: argparse.Namespace, model):
    """The prefix cache `chat` keeps across turns, or None when it is off (by
    --prefix-cache-bytes 0, --no-kv-cache, or days not done yet)."""
    from .model import heads_share
    from .paged_cache import PagePool
    from .prefix_cache import PrefixCache

    budget = args.prefix_cache_bytes
    if budget == 0 or not _kv_cache(args) or not _prefix_cache_days_done(args):
        return None
    return PrefixCache(PagePool(args.page_size, heads_share=heads_share(model)),
                       PREFIX_CACHE_BYTES if budget is None else budget)


# (flag, SamplingParams field, type, help). Defaults come from SamplingParams, except the
# temperature, which is 0 (greedy) as in mlx_lm.generate.
_SAMPLING_FLAGS = [
    (("--temp", "--temperature"), "temperature", float, "temperature; 0 is greedy (default 0)"),
    (("--top-k",), "top_k", int, "keep the k most likely tokens (0: off)"),
    (("--top-p",), "top_p", float, "nucleus: keep the most likely tokens up to this mass (1: off)"),
    (("--min-p",), "min_p", float, "keep tokens with p >= min_p * p_max (0: off)"),
    (("--typical-p", "--typical"), "typical_p", float, "locally typical sampling mass (1: off)"),
    (("--top-n-sigma",), "top_n_sigma", float, "keep logits >= max - n * std (<= 0: off)"),
    (("--xtc-probability",), "xtc_probability", float, "chance of excluding the top choices (0: off)"),
    (("--xtc-threshold",), "xtc_threshold", float, "probability above which XTC excludes tokens"),
    (("--dynatemp-range",), "dynatemp_range", float, "dynamic temperature range (0: off)"),
    (("--dynatemp-exp",), "dynatemp_exponent", float, "dynamic temperature exponent"),
    (("--repetition-penalty", "--repeat-penalty"), "repetition_penalty", float, "divide logits of recent tokens (1: off)"),
    (("--frequency-penalty",), "frequency_penalty", float, "subtract per occurrence in recent tokens (0: off)"),
    (("--presence-penalty",), "presence_penalty", float, "subtract once for recent tokens (0: off)"),
    (("--penalty-last-n", "--repeat-last-n", "--repetition-context-size"), "penalty_last_n", int,
     "how many recent tokens the penalties see (-1: all, 0: none)"),
    (("--dry-multiplier",), "dry_multiplier", float, "DRY repetition penalty strength (0: off)"),
    (("--dry-base",), "dry_base", float, "DRY exponential base"),
    (("--dry-allowed-length",), "dry_allowed_length", int, "repeats up to this length are free"),
    (("--dry-penalty-last-n",), "dry_penalty_last_n", int, "how many recent tokens DRY scans (-1: all)"),
    (("--mirostat",), "mirostat", int, "mirostat version: 0 (off), 1 or 2"),
    (("--mirostat-ent", "--mirostat-tau"), "mirostat_tau", float, "mirostat target surprise"),
    (("--mirostat-lr", "--mirostat-eta"), "mirostat_eta", float, "mirostat learning rate"),
    (("--min-tokens",), "min_tokens", int, "suppress end-of-sequence for this many tokens"),
    (("--seed", "-s"), "seed", int, "random seed, for reproducible sampling (default: fresh)"),
    (("--logprobs",), "logprobs", int, "print each token's log-probability and this many alternatives"),
]
_FIELD_FLAG = {field: flags[0] for flags, field, _, _ in _SAMPLING_FLAGS}
_FIELD_FLAG.update({"dry_sequence_breakers": "--dry-sequence-breaker", "logit_bias": "--logit-bias",
                    "order": "--samplers"})


def _add_sampling_options(parser: argparse.ArgumentParser) -> None:
    from .sampler import SamplingParams

    defaults = SamplingParams()
    parser.add_argument("--max-tokens", "-m", type=int, default=MAX_TOKENS,
                        help=f"most tokens to generate (default {MAX_TOKENS}; -1: no limit)")
    for flags, field, kind, text in _SAMPLING_FLAGS:
        default = TEMPERATURE if field == "temperature" else getattr(defaults, field)
        parser.add_argument(*flags, dest=field, type=kind, default=default,
                            help=f"{text} (default {default})")
    parser.add_argument("--dry-sequence-breaker", dest="dry_sequence_breakers", action="append",
                        default=None, metavar="TEXT",
                        help="a string DRY repeats may not cross (repeatable; 'none' for no breakers; "
                             "default: newline, ':', '\"', '*')")
    parser.add_argument("--logit-bias", dest="logit_bias", action="append", default=[], metavar="TOKEN+BIAS",
                        help="add BIAS to TOKEN's logit, e.g. 15043+1 or 15043-inf (repeatable)")
    parser.add_argument("--samplers", dest="order", default=None,
                        help="stage order, e.g. 'top_k;top_p;temperature', or a preset: "
                             "llama.cpp (default), hf, vllm, mlx-lm")
    parser.add_argument("--grammar", "--grammar-file", dest="grammar_file", default=None, metavar="FILE",
                        help="constrain the output to a GBNF grammar (llama.cpp's format; root rule 'root')")
    parser.add_argument("--json-schema", dest="json_schema", default=None, metavar="FILE",
                        help="constrain the output to JSON that validates against this JSON schema")
    parser.add_argument("--regex", dest="regex", default=None, metavar="PATTERN",
                        help="constrain the output to text this regular expression matches in full")
    parser.add_argument("--grammar-first", dest="grammar_first", action="store_true",
                        help="mask every step instead of checking the drawn token first (same distribution)")
    parser.add_argument("--system", "--system-prompt", dest="system", default=None,
                        help="system message for the chat template")
    parser.add_argument("--no-chat-template", "--ignore-chat-template", dest="no_chat_template",
                        action="store_true", help="feed the prompt as raw text")
    parser.add_argument("--verbose", action="store_true", help="print statistics to stderr")


def _logit_bias(entries: list[str]) -> dict[int, float]:
    bias = {}
    for entry in entries:
        m = re.fullmatch(r"\s*(\d+)\s*(?:=|(?=[+-]))\s*([+-]?(?:inf|\d+(?:\.\d*)?(?:e[+-]?\d+)?))\s*", entry, re.I)
        if not m:
            raise UserError(f"--logit-bias takes TOKEN+BIAS, TOKEN-BIAS or TOKEN=BIAS, got {entry!r}")
        bias[int(m[1])] = float(m[2])
    return bias


def _sampling(args: argparse.Namespace, tokenizer=None):
    """The sampling parameters from the flags; bad values become a UserError naming the flag."""
    from .sampler import SamplingParams

    if args.max_tokens == 0 or args.max_tokens < -1:
        raise UserError(f"--max-tokens must be positive or -1 (no limit), got {args.max_tokens}")
    values = {field: getattr(args, field) for _, field, _, _ in _SAMPLING_FLAGS}
    values["logit_bias"] = _logit_bias(args.logit_bias)
    if args.dry_sequence_breakers is not None:
        values["dry_sequence_breakers"] = tuple(
            b.encode().decode("unicode_escape") for b in args.dry_sequence_breakers if b != "none")
    values["order"] = args.order
    values["grammar"], values["grammar_first"] = _grammar(args), args.grammar_first
    if tokenizer is not None and values["min_tokens"] > 0:
        values["eos_token_ids"] = tuple(sorted(tokenizer.eos_token_ids))
    try:
        return SamplingParams(**values)
    except ValueError as e:
        raise UserError(_flag_names(str(e))) from None


def _grammar(args: argparse.Namespace):
    """The grammar of --grammar, --json-schema or --regex (parsed once), or None."""
    given = [(flag, value) for flag, value in (("--grammar", args.grammar_file), ("--json-schema", args.json_schema),
                                               ("--regex", args.regex)) if value is not None]
    if len(given) > 1:
        raise UserError(f"pass one of --grammar, --json-schema and --regex, not {' and '.join(f for f, _ in given)}")
    if not given:
        if args.grammar_first:
            raise UserError("--grammar-first needs --grammar, --json-schema or --regex")
        return None
    if getattr(args, "_grammar", None) is None:
        flag, value = given[0]
        text = value
        if flag != "--regex":
            try:
                text = Path(value).read_text(encoding="utf-8")
            except OSError as e:
                raise UserError(f"cannot read {flag} {value}: {e.strerror or e}") from None
            except UnicodeDecodeError as e:
                raise UserError(f"{flag} {value} is not valid UTF-8 text (byte {e.start + 1})") from None
        args._grammar = _compile_grammar(flag.strip("-").replace("-", "_"), text, f"{flag} {value}")
    return args._grammar


def _make_sampler(args: argparse.Namespace, tokenizer):
    from .sampler import Sampler

    try:
        return Sampler(_sampling(args, tokenizer), tokenizer)
    except ValueError as e:
        raise UserError(_flag_names(str(e))) from None


def _flag_names(message: str) -> str:
    """Speak of `--top-p`, not `top_p`: the user typed flags (messages start with the field)."""
    fields = sorted(_FIELD_FLAG, key=len, reverse=True)
    pattern = r"^(" + "|".join(fields) + r")(?![\w-])"
    return re.sub(pattern, lambda m: _FIELD_FLAG[m.group(1)], message)


def _load(args: argparse.Namespace, name: str | None = None):
    from .loader import fused_kernels_implemented, load

    if hasattr(args, "prefill_step_size") and _prefill_step(args) < 1:
        raise UserError(f"--prefill-step-size must be a positive integer, got {args.prefill_step_size}")
    fused = not args.no_fused
    if fused and not fused_kernels_implemented():
        _note_once("week2-day3 is not implemented yet: the hand-written RMSNorm, RoPE and attention run "
                   "instead (as with --no-fused)")
        fused = False
    if args.no_kernels:
        kernels.enable(False)
    try:
        loaded = load(name or args.model, fused=fused, group=distributed.group())
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    _kernel_notes(args)  # after the model loads: a user error stays one line
    return loaded


def _kernel_notes(args: argparse.Namespace) -> None:
    """--verbose says whether our own kernels run; a starter whose kernel days are not done
    yet runs those products on MLX ops, with a note."""
    if getattr(args, "verbose", False):
        _note_once(kernels.status())
    ext = kernels.extension() if kernels.enabled() else None
    if ext is not None and mx.default_device() == mx.cpu:
        paged = getattr(args, "command", None) in ("batch", "chat", "serve")  # the commands on pages
        for day, what in (("week2-day6", "the matrix products"), ("week3-day6", "attention over pages")):
            if (day == "week2-day6" or paged) and not kernels.active(day):
                _note_once(f"{day} is not implemented yet: {what} run on MLX ops (as with --no-kernels)")


def _kv_cache(args: argparse.Namespace) -> bool:
    """Whether generation uses the KV cache: unless --no-kv-cache, once week 2 day 2 is done."""
    from .generate import cached_loop_implemented

    if args.no_kv_cache:
        return False
    if not cached_loop_implemented():
        _note_once("week2-day2 is not implemented yet: week 1's loop runs instead, without a KV cache "
                   "(as with --no-kv-cache)")
        return False
    return True


_noted: set[str] = set()


def _note_once(message: str) -> None:
    if message not in _noted:
        _noted.add(message)
        print(f"tiny-llm: note: {message}", file=sys.stderr)


# How to run without a course day that a starter has not implemented yet.
_WITHOUT_DAY = {
    **{f"week1-day{d}": f"the model is built from it (see book/docs/week1-day{d}.md)" for d in range(1, 6)},
    "week1-day6": "`tiny-llm smoke` runs the model once without it",
    "week2-day2": "`tiny-llm generate --no-kv-cache` without --num-beams, --draft-model or --prompt-lookup "
                  "runs without it",
    "week2-day3": "--no-fused runs without it",
    "week2-day4": "`tiny-llm generate` runs one prompt at a time without it",
    "week2-day5": "`tiny-llm generate` runs one prompt at a time without it",
    "week3-day1": "`tiny-llm generate` without --draft-model and --prompt-lookup runs without it",
    "week3-day4": "dense models (--model default) run without it",
}


def _missing_day_message(day: str, what: str) -> str:
    return f"{day} is not implemented yet ({what}); {_WITHOUT_DAY.get(day, f'see book/docs/{day}.md')}"


def _messages_text(tokenizer, args, messages: list[dict]) -> str:
    if args.no_chat_template or not tokenizer.chat_template:
        return "\n".join(m["content"] for m in messages if m["role"] != "system")
    system = [{"role": "system", "content": args.system}] if args.system else []
    return tokenizer.apply_chat_template(system + messages)


def _print_stats(response, sampler=None) -> None:
    if response is None:
        return
    if sampler is not None and sampler.stats.draws:
        ms = 1000 * sampler.stats.seconds / sampler.stats.draws
        print(f"sampling: {sampler.stats.draws} draws, {sampler.stats.seconds:.3f} s in total, "
              f"{ms:.2f} ms per draw", file=sys.stderr)
    cached = (f" ({response.cached_tokens} from the prefix cache, "
              f"{response.prompt_tokens - response.cached_tokens} prefilled)" if response.cached_tokens else "")
    print(
        f"prompt: {response.prompt_tokens} tokens{cached}, {response.prompt_tps:.1f} tokens/s, "
        f"first token after {response.time_to_first_token:.2f} s\n"
        f"generation: {response.generation_tokens} tokens, {response.generation_tps:.1f} tokens/s\n"
        f"peak memory: {response.peak_memory:.3f} GB",
        file=sys.stderr,
    )


def _stream(model, tokenizer, prompt: list[int], args, *, sampler, pieces: list[str] | None = None,
            speculative=None, prefix_cache=None):
    """Print the reply as it is produced; return (reply text, last response). The text so
    far is also appended to `pieces`, so that it survives a Ctrl-C. `speculative`: the
    keyword arguments of speculative decoding, with `sampler` then a SamplingParams."""
    from .generate import stream_generate

    pieces = [] if pieces is None else pieces
    last, shown = None, []
    kv_cache = None if speculative else _kv_cache(args)  # speculative decoding makes its own caches
    model = _PrefillProgress(model, len(prompt), sys.stderr.isatty(), args.verbose)
    for response in stream_generate(model, tokenizer, prompt, args.max_tokens, params=sampler,
                                    prefill_step_size=args.prefill_step_size, kv_cache=kv_cache,
                                    prefix_cache=prefix_cache, **(speculative or {})):
        print(response.text, end="", flush=True)
        pieces.append(response.text)
        last = response
        if args.logprobs:
            shown.append((response.token, response.logprobs))
    if shown:
        print(flush=True)
        print("token log-probabilities under the model (before sampling), with the top "
              f"{args.logprobs} alternatives:", file=sys.stderr)
        for token, logprobs in shown:
            top = mx.argsort(-logprobs)[: args.logprobs].tolist()
            alts = ", ".join(f"{tokenizer.decode([t])!r} {logprobs[t].item():.2f}" for t in top)
            print(f"  {tokenizer.decode([token])!r:>16} {logprobs[token].item():7.2f}   [{alts}]", file=sys.stderr)
    return "".join(pieces), last


def _check_beams(args: argparse.Namespace) -> None:
    if args.num_beams < 1:
        raise UserError(f"--num-beams must be a positive integer, got {args.num_beams}")
    if not 1 <= args.num_return_sequences <= args.num_beams:
        raise UserError(f"--num-return-sequences must be between 1 and --num-beams ({args.num_beams}), "
                        f"got {args.num_return_sequences}")
    if args.num_beams > 1 and args.max_tokens < 1:
        raise UserError(f"--max-tokens must be a positive integer for beam search, got {args.max_tokens}")
    if args.num_beams > 1 and _grammar(args) is not None:
        raise UserError("beam search does not combine with --grammar, --json-schema or --regex")


def _print_beams(model, tokenizer, prompt: list[int], args: argparse.Namespace) -> None:
    """Beam search: print the best sequence, or each of the --num-return-sequences best
    under a header with its score."""
    from .beam_search import beam_search

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


def _user_text(text: str, where: str) -> str:
    """`text`, if it is text: bytes that are not UTF-8 reach Python as lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UserError(f"{where} is not valid UTF-8 text (character {e.start + 1})") from None
    return text


def _read_stdin() -> str:
    try:
        return _user_text(sys.stdin.read(), "standard input")
    except UnicodeDecodeError as e:
        raise UserError(f"standard input is not valid UTF-8 text (byte {e.start + 1})") from None


def _check_vocabulary(params, model) -> None:
    """Token ids in the flags must exist in the model's vocabulary (known once it is loaded)."""
    try:
        params.check_vocabulary(model.args.vocab_size)
    except ValueError as e:
        raise UserError(_flag_names(str(e))) from None


def _prompt_tokens(model, tokenizer, text: str, args: argparse.Namespace) -> list[int]:
    """The token ids of `text`, which with --max-tokens more must fit the model's context:
    a UserError otherwise."""
    from .model import check_context

    tokens = tokenizer.encode(text)
    try:
        check_context(model, len(tokens), args.max_tokens)
    except ValueError as e:
        raise UserError(str(e).replace("max_tokens=", "--max-tokens ")) from None
    return tokens


def _generate(args: argparse.Namespace) -> None:
    prompt = _user_text(args.prompt, "--prompt") if args.prompt is not None else _read_stdin()
    if not prompt.strip():
        raise UserError("the prompt is empty: pass --prompt TEXT or text on standard input")
    params = _sampling(args)  # check the flags before loading anything
    _check_beams(args)
    speculative = _check_speculative(args, params)
    model, tokenizer = _load(args)
    _check_vocabulary(params, model)
    text = _messages_text(tokenizer, args, [{"role": "user", "content": prompt}])
    prompt = _prompt_tokens(model, tokenizer, text, args)
    if args.num_beams > 1:
        _print_beams(model, tokenizer, prompt, args)
        return
    if speculative is not None:
        if args.draft_model:
            speculative["draft_model"] = _load(args, args.draft_model)[0]
        _, last = _stream(model, tokenizer, prompt, args, sampler=_sampling(args, tokenizer), speculative=speculative)
        print(flush=True)
        if args.verbose:
            _print_stats(last)
            st = speculative["speculative_stats"]
            print(f"speculative: {st.rounds} target passes, {st.drafted} tokens drafted, {st.accepted} "
                  f"accepted ({st.acceptance_rate:.0%}), {st.emitted / max(st.rounds, 1):.2f} tokens per pass",
                  file=sys.stderr)
        return
    sampler = _make_sampler(args, tokenizer)
    _, last = _stream(model, tokenizer, prompt, args, sampler=sampler)
    print(flush=True)
    if args.verbose:
        _print_stats(last, sampler)


def _check_speculative(args: argparse.Namespace, params) -> dict | None:
    """The keyword arguments of speculative decoding, or None without --draft-model and
    --prompt-lookup; conflicting flags are a UserError."""
    from .speculative import SpeculativeStats

    if not args.draft_model and not args.prompt_lookup:
        return None
    if args.draft_model and args.prompt_lookup:
        raise UserError("pass either --draft-model or --prompt-lookup, not both")
    if args.num_draft_tokens < 1:
        raise UserError(f"--num-draft-tokens must be a positive integer, got {args.num_draft_tokens}")
    for flag, clash in (("--num-beams", args.num_beams > 1), ("--no-kv-cache", args.no_kv_cache),
                        ("a grammar", params.grammar is not None),
                        ("--mirostat", params.mirostat), ("--xtc-probability", params.xtc_probability > 0),
                        ("--logprobs", params.logprobs), ("--min-tokens", params.min_tokens)):
        if clash:
            raise UserError(f"speculative decoding does not combine with {flag}")
    return dict(prompt_lookup=args.prompt_lookup, num_draft_tokens=args.num_draft_tokens,
                speculative_stats=SpeculativeStats())


def _chat(args: argparse.Namespace) -> None:
    params = _sampling(args)
    _check_cache_options(args)
    model, tokenizer = _load(args)
    _check_vocabulary(params, model)
    sampler = _make_sampler(args, tokenizer)  # one sampler: its seed stream runs across turns
    prefix_cache = _prefix_cache(args, model)  # each turn prefills only what the last one did not hold
    interactive = sys.stdin.isatty()
    if interactive:
        print("Type a message and press Enter. Ctrl-C stops a reply, Ctrl-D leaves.", file=sys.stderr)
    messages: list[dict] = []
    while True:
        try:
            line = _user_text(input(">> " if interactive else ""), "that line")
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
        text = _messages_text(tokenizer, args, messages)
        try:
            prompt = _prompt_tokens(model, tokenizer, text, args)
        except UserError as e:  # that turn is dropped; a shorter one may still fit
            messages.pop()
            print(f"tiny-llm: error: {e}", file=sys.stderr)
            continue
        pieces, last = [], None
        sampler.reset_grammar()  # every reply follows the grammar from its start
        try:
            _, last = _stream(model, tokenizer, prompt, args, sampler=sampler, pieces=pieces,
                              prefix_cache=prefix_cache)
        except KeyboardInterrupt:
            print(" [stopped]", end="")
        print()
        # The conversation keeps what was shown, also of a reply cut short.
        messages.append({"role": "assistant", "content": "".join(pieces)})
        if args.verbose:
            _print_stats(last, sampler)


def _compile_grammar(kind: str, value, label: str):
    """The grammar of `value`: GBNF text (`kind` "grammar"), a pattern ("regex") or a JSON
    schema ("json_schema": an object or its JSON text). Errors start with `label`."""
    from .constrain import Grammar

    if kind == "json_schema" and isinstance(value, dict):
        value = json.dumps(value)
    if not isinstance(value, str):
        raise UserError(f"{label} must be " + ("a JSON schema object" if kind == "json_schema" else "text")
                        + f", got {value!r}")
    build = {"grammar": Grammar.from_gbnf, "regex": Grammar.from_regex, "json_schema": Grammar.from_json_schema}[kind]
    try:
        grammar = build(value)
    except ValueError as e:
        raise UserError(f"{label}: {e}") from None
    if grammar.matches_only_empty():
        raise UserError(f"{label}: matches only the empty text, so there is nothing to generate")
    return grammar


def _read_requests(args: argparse.Namespace, defaults) -> list[tuple[str, int, object]]:
    """`(prompt, max_tokens, SamplingParams)` per request in `--prompts FILE`: one prompt per
    line, or a JSON object with "prompt" and optional "max_tokens", SamplingParams fields,
    and a constraint as text: "grammar" (GBNF), "regex" or "json_schema". With --seed S,
    request i without its own seed gets S + i."""
    path = Path(args.prompts)
    try:
        data = path.read_bytes()
        lines = data.decode("utf-8").splitlines()
    except OSError as e:
        raise UserError(f"cannot read --prompts {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"{path}:{line}: not valid UTF-8 text (byte {e.start + 1} of the file)") from None
    fields = {f.name for f in dataclasses.fields(defaults)}
    requests = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        entry = {"prompt": line}
        if line.lstrip().startswith("{"):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(entry, dict) or not isinstance(entry.get("prompt"), str):
                raise UserError(f'{where}: a JSON line needs a "prompt" string')
        unknown = sorted(set(entry) - fields - {"prompt", "max_tokens", "regex", "json_schema"})
        if unknown:
            raise UserError(f"{where}: unknown keys {', '.join(unknown)} (use SamplingParams field names)")
        if not entry["prompt"].strip():
            raise UserError(f"{where}: the prompt is empty")
        max_tokens = entry.get("max_tokens", args.max_tokens)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise UserError(f"{where}: max_tokens must be a positive integer, got {max_tokens!r}")
        changes = {k: v for k, v in entry.items() if k in fields}
        constraints = [k for k in ("grammar", "regex", "json_schema") if k in entry]
        if len(constraints) > 1:
            raise UserError(f"{where}: give one of grammar, regex and json_schema, not {' and '.join(constraints)}")
        if constraints:
            changes["grammar"] = _compile_grammar(constraints[0], entry[constraints[0]], f"{where}: {constraints[0]}")
        if "seed" not in changes and defaults.seed is not None:
            changes["seed"] = defaults.seed + len(requests)
        if "logit_bias" in changes and isinstance(changes["logit_bias"], dict):
            for key in changes["logit_bias"]:
                if not key.strip().isdecimal():  # JSON object keys are strings
                    raise UserError(f"{where}: logit_bias keys are token ids such as \"15043\", got {key!r}")
            changes["logit_bias"] = {int(k): v for k, v in changes["logit_bias"].items()}
        try:
            params = dataclasses.replace(defaults, **changes)
        except (TypeError, ValueError) as e:
            raise UserError(f"{where}: {e}") from None
        requests.append((entry["prompt"], max_tokens, params))
    if not requests:
        raise UserError(f"--prompts {path} holds no prompt")
    return requests


def _batch(args: argparse.Namespace) -> int:
    from .batch import BatchGenerator

    if args.max_tokens < 1:
        raise UserError(f"--max-tokens must be a positive integer for batch, got {args.max_tokens}")
    if args.max_batch_size < 1:
        raise UserError(f"--max-batch-size must be a positive integer, got {args.max_batch_size}")
    _check_cache_options(args)
    requests = _read_requests(args, _sampling(args))
    _prefix_cache_days_done(args)
    model, tokenizer = _load(args)
    gen = BatchGenerator(model, tokenizer, max_batch_size=args.max_batch_size,
                         prefill_step_size=args.prefill_step_size, page_size=args.page_size,
                         prefix_cache_bytes=args.prefix_cache_bytes)
    for i, (prompt, max_tokens, params) in enumerate(requests):
        text = _messages_text(tokenizer, args, [{"role": "user", "content": prompt}])
        try:
            gen.insert(text, max_tokens, params)
        except ValueError as e:
            raise UserError(f"request {i}: {e}") from None
    texts = {i: [] for i in range(len(requests))}
    counts = dict.fromkeys(texts, 0)
    done: list[int] = []
    failed: list[int] = []
    live = sys.stderr.isatty()
    while gen.has_work():
        for r in gen.step():
            texts[r.uid].append(r.text)
            counts[r.uid] = r.generation_tokens
            if r.finish_reason:
                done.append(r.uid)
                if live:
                    print("\r\033[K", end="", file=sys.stderr)
                print(f"--- request {r.uid} ({r.finish_reason}, {r.generation_tokens} tokens) ---", flush=True)
                print("".join(texts[r.uid]), flush=True)
                if r.error:  # this request alone failed; the others go on
                    failed.append(r.uid)
                    print(f"tiny-llm: error: {r.error}", file=sys.stderr, flush=True)
        running = " ".join(f"#{u} {counts[u]}/{requests[u][1]}" for u in gen.running)
        status = f"running: {running or '-'} | waiting: {len(gen.waiting)} | done: {len(done)}/{len(requests)}"
        if live:
            print("\r\033[K" + status, end="", file=sys.stderr, flush=True)
        elif args.verbose:
            print(status, file=sys.stderr)
    if live:
        print("\r\033[K", end="", file=sys.stderr)
    if args.verbose:
        s = gen.stats
        cached = f" ({s.cached_tokens} more from the prefix cache)" if s.cached_tokens else ""
        print(f"prompt: {s.prompt_tokens} tokens prefilled{cached}, {s.prompt_tps:.1f} tokens/s\n"
              f"generation: {s.generation_tokens} tokens, {s.generation_tps:.1f} tokens/s\n"
              f"peak memory: {s.peak_memory:.3f} GB", file=sys.stderr)
    return 1 if failed else 0  # every request was answered, but not all of them well


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


def _serve(args: argparse.Namespace) -> None:
    import socket

    for flag, value, low in (("--port", args.port, 0), ("--max-batch-size", args.max_batch_size, 1),
                             ("--max-queue", args.max_queue, 1), ("--max-prompt-tokens", args.max_prompt_tokens, 1)):
        if value is not None and (value < low or (flag == "--port" and value > 65535)):
            raise UserError(f"{flag} must be {'a port number from 0 to 65535' if flag == '--port' else f'an integer >= {low}'}"
                            f", got {value}")
    if args.api_key is not None and not args.api_key.strip():
        raise UserError("--api-key is empty")
    _check_cache_options(args)
    if distributed.rank() != 0:  # another rank of a tensor-parallel server: rank 0 listens
        from .serve.lockstep import follow

        _prefix_cache_days_done(args)
        model, tokenizer = _load(args)
        follow(distributed.group(), model, tokenizer)
        return
    try:  # a clear message now rather than uvicorn's log line after the model has loaded
        family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((args.host, args.port))
    except OSError as e:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    import uvicorn

    from .serve import build, create_app

    _prefix_cache_days_done(args)
    model, tokenizer = _load(args)
    name = args.served_model_name or (args.model if args.model == "default" else Path(args.model).name or args.model)
    server = build(model, tokenizer, model_ids=tuple(dict.fromkeys([name, args.model])),
                   max_batch_size=args.max_batch_size, max_queue=args.max_queue,
                   prefill_step_size=_prefill_step(args), api_key=args.api_key,
                   max_prompt_tokens=args.max_prompt_tokens, page_size=args.page_size,
                   prefix_cache_bytes=args.prefix_cache_bytes, group=distributed.group())
    print(f"tiny-llm serve: {name} on http://{args.host}:{args.port} (chat page at /, API at /v1; "
          f"up to {args.max_batch_size} requests decode together); Ctrl-C stops", file=sys.stderr, flush=True)

    class Uvicorn(uvicorn.Server):
        def handle_exit(self, sig, frame):  # Ctrl-C: open requests end now, with a 503
            server.engine.close()
            super().handle_exit(sig, frame)

    Uvicorn(uvicorn.Config(create_app(server), host=args.host, port=args.port, log_level="warning",
                           timeout_graceful_shutdown=5)).run()


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
    gen.set_defaults(run=_generate)

    chat = commands.add_parser("chat", help="an interactive conversation")
    _add_model_options(chat)
    _add_sampling_options(chat)
    _add_cache_options(chat)
    chat.set_defaults(run=_chat)

    batch = commands.add_parser("batch", help="generate for many prompts at once (continuous batching)")
    batch.add_argument("--prompts", required=True, metavar="FILE",
                       help='one prompt per line, or JSON lines {"prompt": ..., "max_tokens": ..., "seed": ...} '
                            "with any sampling field")
    batch.add_argument("--max-batch-size", type=int, default=MAX_BATCH_SIZE,
                       help=f"most requests decoding together; the others wait (default {MAX_BATCH_SIZE})")
    _add_model_options(batch)
    _add_sampling_options(batch)
    _add_cache_options(batch)
    batch.set_defaults(run=_batch)

    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server (continuous batching)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)")
    serve.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    serve.add_argument("--max-batch-size", type=int, default=MAX_BATCH_SIZE,
                       help=f"most requests decoding together; the others wait (default {MAX_BATCH_SIZE})")
    serve.add_argument("--max-queue", type=int, default=MAX_QUEUE,
                       help=f"most requests waiting for a row; beyond it the server answers 503 (default {MAX_QUEUE})")
    serve.add_argument("--api-key", default=None, metavar="KEY",
                       help="require 'Authorization: Bearer KEY' on the API (default: no key)")
    serve.add_argument("--max-prompt-tokens", type=int, default=None, metavar="N",
                       help="refuse prompts longer than N tokens (default: the model's context)")
    serve.add_argument("--served-model-name", default=None, metavar="NAME",
                       help="the model name clients send and /v1/models lists (default: 'default' or the "
                            "model directory's name)")
    _add_model_options(serve, generation=False)
    _add_prefill_option(serve)
    _add_cache_options(serve)
    serve.set_defaults(run=_serve)

    smoke = commands.add_parser("smoke", help="run the model once and show the next-token distribution")
    smoke.add_argument("--prompt", required=True, help="the prompt text")
    smoke.add_argument("--top", type=int, default=5, help="how many candidates to show (default 5)")
    smoke.add_argument("--system", default=None, help="system message for the chat template")
    smoke.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    _add_model_options(smoke, generation=False)
    smoke.set_defaults(run=_smoke)
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
    if not getattr(args, "run", None):
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
            status = args.run(args)
        except UserError as e:
            print(f"tiny-llm: error: {where}{e}", file=errors)
            return 2
        except NotImplementedError as e:  # a starter whose day is not done yet
            if (found := missing_day(e)) is None:
                raise
            print(f"tiny-llm: error: {where}{_missing_day_message(*found)}", file=errors)
            return 2
        except RuntimeError as e:
            if not distributed.lost_peer(e):
                raise
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


if __name__ == "__main__":
    raise SystemExit(main())
