"""Engine — what the commands of the command line share: user errors, loading the model with
the course's day gates, the chat template, prompts that fit the context, printing a reply
as it streams, and statistics.

Tests: tests/test_cli.py, tests/test_progress.py, tests/test_request.py
"""

import sys
import time

import mlx.core as mx

from .. import distributed, kernels
from ..defaults import CPU_PREFILL_STEP_SIZE, PREFILL_STEP_SIZE


class UserError(Exception):
    """A mistake on the command line: printed as one line, exit status 2."""


PROGRESS_AFTER = 2.0  # seconds of prefill before a progress line is shown


def prefill_step(args) -> int:
    """--prefill-step-size, or the default of the device the model runs on."""
    if args.prefill_step_size is None:
        args.prefill_step_size = CPU_PREFILL_STEP_SIZE if mx.default_device() == mx.cpu else PREFILL_STEP_SIZE
    return args.prefill_step_size


_noted: set[str] = set()


def note_once(message: str) -> None:
    if message not in _noted:
        _noted.add(message)
        print(f"tiny-llm: note: {message}", file=sys.stderr)


# How to run without a course day that a starter has not implemented yet.
WITHOUT_DAY = {
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


def missing_day_message(day: str, what: str) -> str:
    return f"{day} is not implemented yet ({what}); {WITHOUT_DAY.get(day, f'see book/docs/{day}.md')}"


def load(args, name: str | None = None):
    """The model of --model (or `name`) and its tokenizer, with the course's fallbacks for
    days a starter has not done yet, each said once."""
    from ..loader import fused_kernels_implemented, load as load_model

    if hasattr(args, "prefill_step_size") and prefill_step(args) < 1:
        raise UserError(f"--prefill-step-size must be a positive integer, got {args.prefill_step_size}")
    fused = not args.no_fused
    if fused and not fused_kernels_implemented():
        note_once("week2-day3 is not implemented yet: the hand-written RMSNorm, RoPE and attention run "
                  "instead (as with --no-fused)")
        fused = False
    if args.no_kernels:
        kernels.enable(False)
    try:
        loaded = load_model(name or args.model, fused=fused, group=distributed.group())
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    kernel_notes(args)  # after the model loads: a user error stays one line
    return loaded


def kernel_notes(args) -> None:
    """--verbose says whether our own kernels run; a starter whose kernel days are not done
    yet runs those products on MLX ops, with a note."""
    if getattr(args, "verbose", False):
        note_once(kernels.status())
    ext = kernels.extension() if kernels.enabled() else None
    if ext is not None and mx.default_device() == mx.cpu:
        paged = getattr(args, "command", None) in ("batch", "chat", "serve")  # the commands on pages
        for day, what in (("week2-day6", "the matrix products run"), ("week2-day7", "each decode step runs layer by layer"),
                          ("week3-day6", "attention over pages runs")):
            if (day != "week3-day6" or paged) and not kernels.active(day):
                note_once(f"{day} is not implemented yet: {what} on MLX ops (as with --no-kernels)")


def kv_cache(args) -> bool:
    """Whether generation uses the KV cache: unless --no-kv-cache, once week 2 day 2 is done."""
    from ..generate import cached_loop_implemented

    if args.no_kv_cache:
        return False
    if not cached_loop_implemented():
        note_once("week2-day2 is not implemented yet: week 1's loop runs instead, without a KV cache "
                  "(as with --no-kv-cache)")
        return False
    return True


def prefix_cache_days_done(args) -> bool:
    """Whether the prefix cache's days (week 3 days 2 and 3) are done; a --prefix-cache-bytes
    above 0 given before then is a UserError naming the missing day."""
    from ..paged_cache import paged_cache_implemented
    from ..prefix_cache import prefix_cache_implemented

    for day, done in (("week3-day2", paged_cache_implemented), ("week3-day3", prefix_cache_implemented)):
        if not done():
            if args.prefix_cache_bytes:
                raise UserError(missing_day_message(day, "--prefix-cache-bytes needs the prefix cache"))
            return False
    return True


def user_text(text: str, where: str) -> str:
    """`text`, if it is text: bytes that are not UTF-8 reach Python as lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UserError(f"{where} is not valid UTF-8 text (character {e.start + 1})") from None
    return text


def read_stdin() -> str:
    try:
        return user_text(sys.stdin.read(), "standard input")
    except UnicodeDecodeError as e:
        raise UserError(f"standard input is not valid UTF-8 text (byte {e.start + 1})") from None


def messages_text(tokenizer, args, messages: list[dict]) -> str:
    """The prompt text of `messages`: the chat template with --system, or the raw text."""
    if args.no_chat_template or not tokenizer.chat_template:
        return "\n".join(m["content"] for m in messages if m["role"] != "system")
    system = [{"role": "system", "content": args.system}] if args.system else []
    return tokenizer.apply_chat_template(system + messages)


def prompt_tokens(model, tokenizer, text: str, args) -> list[int]:
    """The token ids of `text`, which with --max-tokens more must fit the model's context:
    a UserError otherwise."""
    from ..model import check_context

    tokens = tokenizer.encode(text)
    try:
        check_context(model, len(tokens), args.max_tokens)
    except ValueError as e:
        raise UserError(str(e).replace("max_tokens=", "--max-tokens ")) from None
    return tokens


def print_stats(response, sampler=None, timing: dict | None = None) -> None:
    if response is None:
        return
    if timing and "first" in timing:
        print_step_times(*timing["first"], *timing["last"])
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


class PrefillProgress:
    """`stream_generate`'s `prompt_progress`: tells on standard error how far the prefill has
    got once it has run for PROGRESS_AFTER seconds — a line redrawn in place on a terminal,
    a line every PROGRESS_AFTER seconds with --verbose otherwise."""

    def __init__(self, live: bool, verbose: bool):
        self.live, self.verbose = live, verbose
        self.start = time.perf_counter()
        self.shown: float | None = None

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if done >= total:
            if self.shown and self.live:
                print("\r\033[K", end="", file=sys.stderr, flush=True)
            return
        due = self.shown is None or self.live or now - self.shown >= PROGRESS_AFTER
        if done and now - self.start >= PROGRESS_AFTER and due and (self.live or self.verbose):
            line = f"prefill: {done}/{total} tokens, {done / (now - self.start):.1f} tokens/s"
            print("\r\033[K" + line if self.live else line, end="" if self.live else "\n",
                  file=sys.stderr, flush=True)
            self.shown = now


def stream(model, tokenizer, prompt: list[int], args, *, sampler, pieces: list[str] | None = None,
           speculative=None, prefix_cache=None, timing: dict | None = None):
    """Print the reply as it is produced; return (reply text, last response). The text so
    far is also appended to `pieces`, so that it survives a Ctrl-C. `speculative`: the
    keyword arguments of speculative decoding, with `sampler` then a SamplingParams.
    `timing` (a dict): filled with where the decode steps' time went (`print_stats` shows it)."""
    from ..generate import stream_generate

    from ..streaming import StepTimes

    pieces = [] if pieces is None else pieces
    last, shown = None, []
    cached = None if speculative else kv_cache(args)  # speculative decoding makes its own caches
    progress = PrefillProgress(sys.stderr.isatty(), args.verbose)
    # Where each decode step's time goes, between the first token and the last.
    times = StepTimes() if timing is not None and not speculative else None
    for response in stream_generate(model, tokenizer, prompt, args.max_tokens, params=sampler,
                                    prefill_step_size=args.prefill_step_size, kv_cache=cached,
                                    prefix_cache=prefix_cache, prompt_progress=progress, **(speculative or {}),
                                    **({"step_times": times} if times is not None else {})):
        print(response.text, end="", flush=True)
        pieces.append(response.text)
        last = response
        if times is not None:
            timing.setdefault("first", (time.perf_counter(), times.copy()))
            timing["last"] = (time.perf_counter(), times.copy())
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


def print_step_times(t0: float, first, t1: float, last) -> None:
    """One line: the decode steps' mean time, split into model, sampling and host."""
    steps = last.steps - first.steps
    if steps < 1:
        return
    model, sampling = (last.model - first.model) / steps, (last.sampling - first.sampling) / steps
    total = (t1 - t0) / steps
    host = max(total - model - sampling, 0.0)
    print(f"decode step: {1000 * total:.2f} ms = model {1000 * model:.2f} ({model / total:.0%}) + sampling "
          f"{1000 * sampling:.2f} ({sampling / total:.0%}) + host {1000 * host:.2f} ({host / total:.0%}), "
          f"over {steps} steps, each part evaluated on its own", file=sys.stderr)
