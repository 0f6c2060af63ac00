"""Text generation: prefill the prompt, then decode one token at a time.

`generate_step` yields `(token, logprobs)`; `stream_generate` adds detokenized text and
statistics; `generate` returns the whole text. Names and meanings follow `mlx_lm.generate`.
"""

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass

import mlx.core as mx

from .sampler import LogitsProcessor, Sampler, SamplerFunction, SamplingParams, greedy_sampler
from .sampler.checks import check_int
from .tokenizer import StreamingDetokenizer, Tokenizer

Model = Callable[..., mx.array]


@dataclass(frozen=True)
class GenerationResponse:
    """One step of `stream_generate`.

    `text` is the newly released text (may be empty while a character is incomplete);
    `logprobs [V]` are the model's log-probabilities for this step, after the logits
    processors and before the sampler's filters. Rates are tokens per second; `peak_memory`
    is in GB. `finish_reason` is `"stop"` (an end-of-sequence token), `"length"`
    (`max_tokens` reached) or None while generation goes on.
    """

    text: str
    token: int
    logprobs: mx.array
    from_draft: bool
    prompt_tokens: int
    prompt_tps: float
    time_to_first_token: float
    generation_tokens: int
    generation_tps: float
    peak_memory: float
    finish_reason: str | None = None


def generate_step(
    prompt: mx.array,
    model: Model,
    *,
    max_tokens: int = 256,
    sampler: SamplerFunction | None = None,
    logits_processors: Sequence[LogitsProcessor] | None = None,
    prompt_cache: list | None = None,
) -> Generator[tuple[int, mx.array], None, None]:
    """Yield `(token, logprobs [V])` for up to `max_tokens` tokens (-1: no limit).

    Prefill: the whole prompt `[L]` goes through the model at once and the first token is
    sampled from its last position. Decode: one token per step. With a KV cache
    (`prompt_cache`, or a new one from `model.make_cache()` when the model has it) each step
    feeds only the newest token; without one the model recomputes the whole sequence.
    Logits processors see every token so far (prompt and generated) as `tokens [T]`.
    """
    sampler = sampler or greedy_sampler
    processors = list(logits_processors or [])
    if prompt_cache is None and hasattr(model, "make_cache"):
        prompt_cache = model.make_cache()
    # BEGIN SOLUTION week1-day6
    tokens = prompt  # T: everything so far

    def step(new: mx.array) -> tuple[mx.array, mx.array]:
        if prompt_cache is None:
            logits = model(tokens[None])  # 1, T, V
        else:
            logits = model(new[None], cache=prompt_cache)  # 1, len(new), V
        logits = logits[:, -1, :]  # 1, V: only the last position predicts the next token
        for processor in processors:
            logits = processor(tokens, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # 1, V
        return sampler(logprobs), logprobs[0]

    new = prompt
    n = 0
    while n != max_tokens:
        token, logprobs = step(new)  # token: [1]
        mx.eval(token, logprobs)
        yield int(token.item()), logprobs
        new = token.astype(prompt.dtype)
        tokens = mx.concatenate([tokens, new])
        n += 1
    # END SOLUTION


def stream_generate(
    model: Model,
    tokenizer: Tokenizer,
    prompt: str | Sequence[int] | mx.array,
    max_tokens: int = 256,
    *,
    sampler: SamplerFunction | None = None,
    logits_processors: Sequence[LogitsProcessor] | None = None,
    params: SamplingParams | Sampler | None = None,
) -> Generator[GenerationResponse, None, None]:
    """Generate text from `prompt` (a string, token ids or `mx.array [L]`), one response per
    token. Generation ends at an end-of-sequence token (not shown) or after `max_tokens`.

    Choose tokens either with `sampler` (a function of log-probabilities, e.g. from
    `make_sampler`) and `logits_processors`, or with the sampling engine: `params` (a
    `SamplingParams`, or a `Sampler` to keep its state and statistics), which sees the whole
    history (prompt and generated tokens) for its penalties.
    """
    max_tokens = check_int("max_tokens", max_tokens, minimum=-1)
    if max_tokens == 0:
        raise ValueError("max_tokens must be positive or -1 (no limit), got 0")
    if isinstance(prompt, str):
        prompt = tokenizer.encode(prompt)
    prompt = mx.array(prompt) if not isinstance(prompt, mx.array) else prompt
    if prompt.ndim != 1 or prompt.size == 0:
        raise ValueError(f"prompt must be a non-empty sequence of token ids, got shape {prompt.shape}")

    if params is not None:
        if sampler is not None:
            raise ValueError("pass either sampler or params, not both")
        sampler, recorder = _engine_sampler(params, tokenizer, prompt.tolist())
        logits_processors = [*(logits_processors or []), recorder]

    detokenizer = StreamingDetokenizer(tokenizer)
    eos = tokenizer.eos_token_ids
    mx.reset_peak_memory()
    start = time.perf_counter()
    steps = generate_step(
        prompt, model, max_tokens=max_tokens, sampler=sampler, logits_processors=logits_processors
    )
    ttft = prompt_tps = 0.0
    decode_start = start
    for n, (token, logprobs) in enumerate(steps):
        if n == 0:
            ttft = time.perf_counter() - start
            prompt_tps = prompt.size / ttft
            decode_start = time.perf_counter()
        finish = "stop" if token in eos else ("length" if n + 1 == max_tokens else None)
        if finish == "stop":  # the end-of-sequence token itself is not shown
            detokenizer.finalize()
            text = detokenizer.last_segment
        else:
            detokenizer.add_token(token)
            text = detokenizer.last_segment
            if finish == "length":
                detokenizer.finalize()
                text += detokenizer.last_segment
        elapsed = time.perf_counter() - decode_start
        yield GenerationResponse(
            text=text,
            token=token,
            logprobs=logprobs,
            from_draft=False,
            prompt_tokens=prompt.size,
            prompt_tps=prompt_tps,
            time_to_first_token=ttft,
            generation_tokens=n + 1,
            # The first token belongs to the prefill: the rate counts the tokens after it.
            generation_tps=n / elapsed if n and elapsed > 0 else 0.0,
            peak_memory=mx.get_peak_memory() / 1e9,
            finish_reason=finish,
        )
        if finish:
            return


def _engine_sampler(
    params: SamplingParams | Sampler, tokenizer: Tokenizer, prompt: list[int]
) -> tuple[SamplerFunction, LogitsProcessor]:
    """Adapt the engine to generate_step: a last logits processor hands it the logits (its
    repetition penalty acts on logits, not on normalised log-probabilities), and the
    sampler keeps the history."""
    engine = params if isinstance(params, Sampler) else Sampler(params, tokenizer)
    history = list(prompt)
    seen: list[mx.array] = []

    def record(_tokens: mx.array, logits: mx.array) -> mx.array:
        seen[:] = [logits]
        return logits

    def sample(_logprobs: mx.array) -> mx.array:
        token = engine.sample(seen[0], [history])
        history.append(int(token.item()))
        return token

    return sample, record


def generate(
    model: Model,
    tokenizer: Tokenizer,
    prompt: str | Sequence[int] | mx.array,
    max_tokens: int = 256,
    *,
    sampler: SamplerFunction | None = None,
    logits_processors: Sequence[LogitsProcessor] | None = None,
    params: SamplingParams | Sampler | None = None,
) -> str:
    """The whole text `stream_generate` produces."""
    return "".join(
        r.text for r in stream_generate(
            model, tokenizer, prompt, max_tokens, sampler=sampler,
            logits_processors=logits_processors, params=params,
        )
    )
