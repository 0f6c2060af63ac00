"""Engine — the command line's option groups (model, prefill, caches, sampling), and what they
turn into: a request from `tiny_llm.request` and the batch's `BatchSettings`.

Tests: tests/test_request.py, tests/test_cli.py, tests/test_fuzz.py
"""

import argparse
import re
from pathlib import Path

from ..defaults import (CPU_PREFILL_STEP_SIZE, MAX_BATCH_SIZE, MAX_TOKENS, PAGE_SIZE, PREFILL_STEP_SIZE,
                        PREFIX_CACHE_BYTES, TEMPERATURE, BatchSettings)
from ..request import FieldError, Request, build_request
from .common import UserError, prefill_step


def add_model_options(parser: argparse.ArgumentParser, generation: bool = True) -> None:
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
        add_prefill_option(parser)
        parser.add_argument("--no-kv-cache", action="store_true",
                            help="recompute the whole sequence for every token (week 1's loop; slow)")


def add_prefill_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefill-step-size", type=int, default=None,
                        help=f"prefill the prompt in chunks of this many tokens (default {PREFILL_STEP_SIZE} "
                             f"on a GPU; {CPU_PREFILL_STEP_SIZE} on the CPU, where a token of prefill takes a "
                             f"tenth of a second or more and Ctrl-C acts between chunks)")


BYTE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def byte_count(text: str) -> int:
    """`--prefix-cache-bytes`: a count of bytes, or with a K, M or G suffix (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?\s*", text, re.I)
    if not m or (m[2] == "" and "." in m[1]):
        raise argparse.ArgumentTypeError(f"expected a number of bytes such as 1073741824, 512M or 1G "
                                         f"(0 turns the cache off), got {text!r}")
    return int(float(m[1]) * BYTE_UNITS[m[2].upper()])


def add_cache_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--page-size", type=int, default=PAGE_SIZE,
                        help=f"positions per page of the paged KV cache (default {PAGE_SIZE})")
    parser.add_argument("--prefix-cache-bytes", type=byte_count, default=None, metavar="SIZE",
                        help="keep up to this much of finished requests' keys and values, so that prompts "
                             f"starting alike are prefilled once (e.g. 512M; default {PREFIX_CACHE_BYTES >> 30}G "
                             "once week 3 day 3 is done; 0: off)")


def check_cache_options(args: argparse.Namespace) -> None:
    if args.page_size < 1:
        raise UserError(f"--page-size must be a positive integer, got {args.page_size}")


def add_batch_size_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-batch-size", type=int, default=MAX_BATCH_SIZE,
                        help=f"most requests decoding together; the others wait (default {MAX_BATCH_SIZE})")


def batch_settings(args: argparse.Namespace) -> BatchSettings:
    """The batch of `batch` and `serve`, from --max-batch-size, --prefill-step-size,
    --page-size and --prefix-cache-bytes; bad values are a UserError naming the flag."""
    if args.max_batch_size < 1:
        raise UserError(f"--max-batch-size must be an integer >= 1, got {args.max_batch_size}")
    if prefill_step(args) < 1:
        raise UserError(f"--prefill-step-size must be a positive integer, got {args.prefill_step_size}")
    check_cache_options(args)
    return BatchSettings(args.max_batch_size, prefill_step(args), args.page_size, args.prefix_cache_bytes)


# (flag, SamplingParams field, type, help). Defaults come from SamplingParams, except the
# temperature, which is 0 (greedy) as in mlx_lm.generate; ranges from its BOUNDS.
SAMPLING_FLAGS = [
    (("--temp", "--temperature"), "temperature", float, "temperature; 0 is greedy"),
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
    (("--draw",), "draw", str, "how the token is drawn from the final distribution: inverse_cdf or race "
                                "(the exponential race; same distribution, other tokens for a seed)"),
    (("--logprobs",), "logprobs", int, "print each token's log-probability and this many alternatives"),
]
# The request fields the flags set, by the flag a message names.
FIELD_FLAG = {field: flags[0] for flags, field, _, _ in SAMPLING_FLAGS}
FIELD_FLAG.update({"dry_sequence_breakers": "--dry-sequence-breaker", "logit_bias": "--logit-bias",
                   "order": "--samplers", "max_tokens": "--max-tokens", "grammar": "--grammar",
                   "json_schema": "--json-schema", "regex": "--regex", "grammar_first": "--grammar-first"})


def flag_of(field: str) -> str:
    return FIELD_FLAG.get(field, field)


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    from ..sampler import SamplingParams
    from ..sampler.params import BOUNDS

    defaults = SamplingParams()
    parser.add_argument("--max-tokens", "-m", type=int, default=MAX_TOKENS,
                        help=f"most tokens to generate (default {MAX_TOKENS}; -1: no limit)")
    for flags, field, kind, text in SAMPLING_FLAGS:
        default = TEMPERATURE if field == "temperature" else getattr(defaults, field)
        within = f"; in {BOUNDS[field].interval()}" if field in BOUNDS else ""
        parser.add_argument(*flags, dest=field, type=kind, default=default,
                            help=f"{text} (default {default}{within})")
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


def request_fields(args: argparse.Namespace) -> dict:
    """The request the sampling flags describe, as fields of `tiny_llm.request`: a
    --grammar or --json-schema file is read here, and once `request` has compiled the
    constraint, the compiled grammar stands in its place."""
    fields = {field: getattr(args, field) for _, field, _, _ in SAMPLING_FLAGS}
    fields.update(max_tokens=args.max_tokens, logit_bias=args.logit_bias, order=args.order,
                  grammar_first=args.grammar_first)
    if args.dry_sequence_breakers is not None:
        fields["dry_sequence_breakers"] = tuple(
            b.encode().decode("unicode_escape") for b in args.dry_sequence_breakers if b != "none")
    given = [(flag, value) for flag, value in (("--grammar", args.grammar_file), ("--json-schema", args.json_schema),
                                               ("--regex", args.regex)) if value is not None]
    if not given and args.grammar_first:
        raise UserError("--grammar-first needs --grammar, --json-schema or --regex")
    compiled = getattr(args, "_grammar", None)
    for flag, value in given:
        if compiled is None and flag != "--regex":
            value = read_text_file(flag, value)
        fields[flag.strip("-").replace("-", "_")] = compiled or value
    return fields


def read_text_file(flag: str, value: str) -> str:
    try:
        return Path(value).read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot read {flag} {value}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{flag} {value} is not valid UTF-8 text (byte {e.start + 1})") from None


def flag_label(field: str, args: argparse.Namespace) -> str:
    """How a message names `field`: its flag, and for a constraint the value given too."""
    flag = flag_of(field)
    value = {"grammar": args.grammar_file, "json_schema": args.json_schema, "regex": args.regex}.get(field)
    return flag if value is None else f"{flag} {value}"


def request(args: argparse.Namespace, tokenizer=None, vocab_size: int | None = None) -> Request:
    """The request of the flags (`tiny_llm.request.build_request`), its mistakes a UserError
    naming the flag. Without a tokenizer the flags are checked before a model is loaded.
    A constraint is compiled once and kept in `args`."""
    try:
        built = build_request(request_fields(args), tokenizer, spell=flag_of, label=lambda f: flag_label(f, args),
                              vocab_size=vocab_size, unlimited=True, verb="pass")
    except FieldError as e:
        raise UserError(str(e)) from None
    args._grammar = built.params.grammar
    return built


def sampler(args: argparse.Namespace, params, tokenizer):
    """The sampling engine for `params` (checked by `request`); what it refuses is a UserError."""
    from ..sampler import Sampler

    try:
        return Sampler(params, tokenizer)
    except ValueError as e:
        raise UserError(str(e)) from None
