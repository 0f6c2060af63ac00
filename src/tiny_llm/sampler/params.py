"""Engine — sampling parameters: one frozen, validated object per request (or per batch row).

The range of each number field is data (`BOUNDS`, field to `Bound`): `SamplingParams` checks
it, the command line's --help and the server's OpenAPI description show it. Every value it
refuses is a `ParamError` that carries its field, which each caller names in its own words.

Tests: tests/test_cli.py, tests/test_request.py, tests/test_sampler_params.py
"""

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields

from ..constrain.grammar import Grammar
from .draw import DRAWS

# Whether a stage is on for one row's parameters (off: it leaves the row's logits as they
# are), stage by stage in llama.cpp's order. The one place these rules are written:
# `enabled_stages`, the engine's chain and the fast path's window all ask here.
STAGE_ON: dict[str, Callable[["SamplingParams"], bool]] = {
    "penalties": lambda p: p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0,
    "dry": lambda p: p.dry_multiplier > 0,
    "top_n_sigma": lambda p: p.top_n_sigma > 0,
    "top_k": lambda p: p.top_k > 0,
    "typical_p": lambda p: p.typical_p < 1.0,
    "top_p": lambda p: p.top_p < 1.0,
    "min_p": lambda p: p.min_p > 0.0,
    "xtc": lambda p: p.xtc_probability > 0 and p.xtc_threshold <= 0.5,  # above 0.5, no two tokens reach it
    "temperature": lambda p: p.temperature != 1.0 or p.dynatemp_range > 0,
}

STAGES = tuple(STAGE_ON)


def stage_on(stage: str, params: "SamplingParams") -> bool:
    """Whether `stage` (a name of `STAGES`) is on for a row with these `params`."""
    return STAGE_ON[stage](params)


# Stage aliases accepted in `order` (llama.cpp's --samplers names and a few common spellings).
ALIASES = {
    "top-k": "top_k", "top-p": "top_p", "nucleus": "top_p", "min-p": "min_p",
    "typical": "typical_p", "typ_p": "typical_p", "typical-p": "typical_p", "temp": "temperature",
    "top-n-sigma": "top_n_sigma", "top_nsigma": "top_n_sigma", "penalty": "penalties",
}

PRESETS: dict[str, tuple[str, ...]] = {
    # llama.cpp's default chain: filters see the untempered distribution.
    "llama.cpp": STAGES,
    # Hugging Face transformers: processors (penalties), then temperature first among warpers.
    "hf": ("penalties", "temperature", "top_k", "top_p", "min_p", "typical_p"),
    # vLLM: penalties, temperature, then min-p, then top-k and top-p.
    "vllm": ("penalties", "temperature", "min_p", "top_k", "top_p"),
    # mlx-lm: logits processors, then top-p on the full distribution, min-p, XTC, top-k,
    # and temperature inside the final categorical draw.
    "mlx-lm": ("penalties", "top_p", "min_p", "xtc", "top_k", "temperature"),
}

DEFAULT_DRY_BREAKERS: tuple[str, ...] = ("\n", ":", '"', "*")


class ParamError(ValueError):
    """A value `SamplingParams` refuses. `field` is the field at fault and the message starts
    with its name, so that a caller names the field its own way (`named`) without reading
    the message back."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field

    def named(self, name: str) -> str:
        """The message with the field called `name` (the flag `--top-p`, say, for `top_p`)."""
        return name + str(self)[len(self.field):]


# The sampler computes in float32: a parameter beyond its range (or nonzero and below its
# smallest positive number, so that it rounds to zero) turns the logits into infinities, so
# such a value is refused, with its name.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.401298464324817e-45  # float32's smallest positive (subnormal) number
MAX_TOP_K = 2**31 - 1  # the sampler holds top_k as an int32; beyond it MLX fails the whole batch


@dataclass(frozen=True)
class Bound:
    """The values a number field of `SamplingParams` takes: an integer (`integer`), or else a
    float32 (0, or between FLOAT32_TINY and FLOAT32_MAX in magnitude); at least `minimum`
    (above it, if `above`) and at most `maximum`, where given."""

    integer: bool = False
    minimum: float | None = None
    maximum: float | None = None
    above: bool = False  # the minimum itself is outside

    def __post_init__(self):
        if self.minimum is not None and self.maximum is not None and self.minimum > self.maximum:
            raise ValueError(f"Bound's minimum must be at most its maximum, got minimum={self.minimum!r} and "
                             f"maximum={self.maximum!r}")

    def interval(self) -> str:
        """The range in interval notation: `[0.0, 1.0]`, `(1.0, inf)`."""
        low = "(-inf" if self.minimum is None else ("(" if self.above else "[") + f"{self.minimum}"
        high = "inf)" if self.maximum is None else f"{self.maximum}]"
        return f"{low}, {high}"

    def check(self, field: str, value, name: str | None = None) -> None:
        """Raise `ParamError` for `field` unless `value` is in range; the message calls the
        value `name` (default `field`, e.g. "logit_bias token")."""
        name = name or field
        kind = numbers.Integral if self.integer else numbers.Real
        if isinstance(value, bool) or not isinstance(value, kind) or value != value:  # NaN is no number
            raise ParamError(field, f"{name} must be {'an integer' if self.integer else 'a number'}, got {value!r}")
        low = self.minimum is not None and (value <= self.minimum if self.above else value < self.minimum)
        if low or (self.maximum is not None and value > self.maximum):
            raise ParamError(field, f"{name} must be in {self.interval()}, got {value!r}"[:300])
        if not self.integer and value != 0 and not FLOAT32_TINY <= _magnitude(value) <= FLOAT32_MAX:
            raise ParamError(field, f"{name} must be a float32 (the sampler's numbers): 0, or between "
                                    f"{FLOAT32_TINY!r} and {FLOAT32_MAX!r} in magnitude, got {value!r}"[:300])


def _magnitude(value: numbers.Real) -> float:
    try:
        return abs(float(value))
    except OverflowError:  # an integer beyond any float
        return math.inf


PROBABILITY = Bound(minimum=0.0, maximum=1.0)
TOKEN_ID = Bound(integer=True, minimum=0)
# The range of every number field of `SamplingParams`, written once: its checks, the command
# line's --help and the server's OpenAPI description read them here. (`mirostat` takes one of
# 0, 1 and 2: a choice, not a range.)
BOUNDS: dict[str, Bound] = {
    "temperature": Bound(minimum=0.0),
    "top_k": Bound(integer=True, minimum=0, maximum=MAX_TOP_K),
    "top_p": PROBABILITY,
    "min_p": PROBABILITY,
    "typical_p": PROBABILITY,
    "top_n_sigma": Bound(),
    "xtc_probability": PROBABILITY,
    "xtc_threshold": PROBABILITY,
    "dynatemp_range": Bound(minimum=0.0),
    "dynatemp_exponent": Bound(minimum=0.0),
    "repetition_penalty": Bound(minimum=0.0, above=True),
    "frequency_penalty": Bound(),
    "presence_penalty": Bound(),
    "penalty_last_n": Bound(integer=True, minimum=-1),
    "dry_multiplier": Bound(minimum=0.0),
    "dry_base": Bound(minimum=1.0, above=True),
    "dry_allowed_length": Bound(integer=True, minimum=1),
    "dry_penalty_last_n": Bound(integer=True, minimum=-1),
    "mirostat_tau": Bound(minimum=0.0, above=True),
    "mirostat_eta": Bound(minimum=0.0, above=True),
    "min_tokens": Bound(integer=True, minimum=0),
    "seed": Bound(integer=True, minimum=0, maximum=2**32 - 1),
    "logprobs": Bound(integer=True, minimum=0),
}


def _check_list(field: str, value, what: str, name: str | None = None) -> None:
    """`value` must be a list or tuple (of `what`), not a string, a number or None; the
    message calls it `name` (default `field`)."""
    if not isinstance(value, list | tuple):
        raise ParamError(field, f"{name or field} must be a list of {what}, got {value!r}")


def _bias(token: int, value) -> float:
    """A `logit_bias` value as a float: a number, or -inf to ban the token."""
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if math.isnan(number) or number == math.inf:
        raise ParamError("logit_bias", f"logit_bias value for token {token} must be a number or -inf, got {value!r}")
    return number


def _breaker(breaker) -> str | tuple[int, ...]:
    """A `dry_sequence_breakers` entry: a non-empty string, or a non-empty sequence of token ids."""
    field = "dry_sequence_breakers"
    if isinstance(breaker, str):
        if not breaker:
            raise ParamError(field, "dry_sequence_breakers must not contain an empty string")
        return breaker
    _check_list(field, breaker, "token ids", "dry_sequence_breakers entry")
    if not breaker:
        raise ParamError(field, "dry_sequence_breakers must not contain an empty sequence")
    for t in breaker:
        TOKEN_ID.check(field, t, "dry_sequence_breakers token")
    return tuple(int(t) for t in breaker)


def resolve_order(order: str | Sequence[str] | None) -> tuple[str, ...]:
    """Stage names in the order they run; `order` is a preset name, a `;`-separated string
    of stage names (llama.cpp's `--samplers`), a sequence of names, or None (llama.cpp)."""
    if order is None:
        return PRESETS["llama.cpp"]
    if isinstance(order, str):
        if order in PRESETS:
            return PRESETS[order]
        names = [n for n in order.replace(",", ";").split(";") if n.strip()]
    elif isinstance(order, Sequence):
        names = list(order)
    else:
        raise ParamError("order", f"order must be a preset name, stage names separated by ';', or a list of "
                                  f"stage names, got {order!r}")
    stages = []
    for name in names:
        if not isinstance(name, str):
            raise ParamError("order", f"order entries must be stage names, got {name!r}")
        stage = ALIASES.get(name.strip(), name.strip())
        if stage not in STAGES:
            raise ParamError(
                "order", f"order has unknown stage {name!r}: use presets {', '.join(PRESETS)} "
                f"or stage names {', '.join(STAGES)}"
            )
        if stage in stages:
            raise ParamError("order", f"order names stage {stage!r} twice")
        stages.append(stage)
    return tuple(stages)


@dataclass(frozen=True)
class SamplingParams:
    """Everything that decides how the next token is chosen. Fields follow llama.cpp's names.

    "Off" values: `top_k=0`, `top_p=1`, `min_p=0`, `typical_p=1`, `top_n_sigma<=0`,
    `xtc_probability=0`, `repetition_penalty=1`, `frequency_penalty=presence_penalty=0`,
    `dry_multiplier=0`, `mirostat=0`. `temperature = 0` is greedy.
    `penalty_last_n` / `dry_penalty_last_n`: how many of the latest history tokens the
    penalties look at; -1 = all, 0 = none. `dry_sequence_breakers`: strings (turned into
    token ids with the tokenizer given to the `Sampler`) or token-id sequences.
    `logprobs`: how many top log-probabilities `Sampler.sample_with_logprobs` returns.
    `order`: a preset (`"llama.cpp"`, `"hf"`, `"vllm"`, `"mlx-lm"`) or stage names.
    `grammar`: a `tiny_llm.constrain.Grammar` the generated text must follow (the `Sampler`
    needs the tokenizer). The token is drawn from the final distribution renormalised over
    the tokens the grammar allows. `grammar_first=False` draws first and applies the mask
    only when the grammar rejects the draw (llama.cpp's default); `True` masks every step.
    Both give exactly the same distribution.
    `draw`: how the token is drawn from the final distribution — `"inverse_cdf"` (the first
    token whose running mass reaches a uniform; the default, the faster on the CPU) or
    `"race"` (the largest logit plus Gumbel noise: the exponential race). Both are exact
    draws from the same distribution, each reproducible from the row's seed, but they pick
    different tokens for one seed.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str | tuple[int, ...], ...] = DEFAULT_DRY_BREAKERS
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    min_tokens: int = 0
    eos_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    order: str | tuple[str, ...] | None = None
    logprobs: int = 0
    grammar: Grammar | None = None
    grammar_first: bool = False
    draw: str = "inverse_cdf"

    def __post_init__(self):
        for name, bound in BOUNDS.items():
            value = getattr(self, name)
            if not (name == "seed" and value is None):  # no seed: a fresh one
                bound.check(name, value)
        breakers = self.dry_sequence_breakers
        if isinstance(breakers, str | bytes):  # would split into characters
            raise ParamError("dry_sequence_breakers", f"dry_sequence_breakers must be a list of strings or "
                             f"token-id sequences, got the string {breakers!r} (write [{breakers!r}])")
        _check_list("dry_sequence_breakers", breakers, "strings or token-id sequences")
        object.__setattr__(self, "dry_sequence_breakers", tuple(_breaker(b) for b in breakers))
        if self.mirostat not in (0, 1, 2) or isinstance(self.mirostat, bool):
            raise ParamError("mirostat", f"mirostat must be 0 (off), 1 or 2, got {self.mirostat!r}")
        if not isinstance(self.logit_bias, Mapping):
            raise ParamError("logit_bias", f"logit_bias must be a mapping of token id to bias, got {self.logit_bias!r}")
        bias = {}
        for token, value in dict(self.logit_bias).items():
            TOKEN_ID.check("logit_bias", token, "logit_bias token")
            bias[int(token)] = _bias(token, value)
        object.__setattr__(self, "logit_bias", bias)
        _check_list("eos_token_ids", self.eos_token_ids, "token ids")
        for t in self.eos_token_ids:
            TOKEN_ID.check("eos_token_ids", t, "eos_token_ids entry")
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))
        if self.min_tokens > 0 and not self.eos_token_ids:
            raise ParamError("min_tokens", f"min_tokens={self.min_tokens} needs eos_token_ids to know what to "
                                           f"suppress")
        object.__setattr__(self, "order", resolve_order(self.order))
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise ParamError("grammar", f"grammar must be a tiny_llm.constrain.Grammar (e.g. Grammar.from_gbnf(text)), "
                                        f"got {type(self.grammar).__name__}")
        if not isinstance(self.grammar_first, bool):
            raise ParamError("grammar_first", f"grammar_first must be True or False, got {self.grammar_first!r}")
        if self.draw not in DRAWS:
            raise ParamError("draw", f"draw must be one of {', '.join(DRAWS)}, got {self.draw!r}")
        if self.draw == "race" and (self.grammar is not None or self.mirostat):
            raise ParamError("draw", "draw='race' does not combine with a grammar or mirostat: they draw by the "
                                     "inverse CDF")
        if self.grammar is not None and self.mirostat:
            raise ParamError("grammar", f"grammar does not combine with mirostat={self.mirostat}: mirostat's "
                                        f"target surprise assumes the unconstrained distribution")
        missing = [stage for stage in self.enabled_stages() if stage not in self.order]
        if missing and not self.mirostat:
            raise ParamError("order", f"order {'; '.join(self.order)} leaves out {', '.join(missing)}, "
                                      f"which these parameters switch on")

    def __hash__(self):
        return hash(tuple((f.name, repr(getattr(self, f.name))) for f in fields(self)))

    def check_vocabulary(self, vocab_size: int) -> None:
        """Raise `ParamError` when a token id of these parameters (`logit_bias`,
        `eos_token_ids`, `dry_sequence_breakers`) is outside a vocabulary of `vocab_size`
        tokens. Called where the model is known, before anything runs."""
        breakers = [t for b in self.dry_sequence_breakers if not isinstance(b, str) for t in b]
        for name, ids in (("logit_bias", self.logit_bias), ("eos_token_ids", self.eos_token_ids),
                          ("dry_sequence_breakers", breakers)):
            outside = sorted(t for t in ids if t >= vocab_size)
            if outside:
                raise ParamError(name, f"{name} names token {outside[0]}, outside the vocabulary [0, {vocab_size})")

    def enabled_stages(self) -> list[str]:
        """The stages whose parameters are not "off" (`STAGE_ON`), in `STAGES` order."""
        return [stage for stage, on in STAGE_ON.items() if on(self)]
