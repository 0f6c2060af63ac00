"""Engine — sampling parameters: one frozen, validated object per request (or per batch row)."""

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields

from ..constrain.grammar import Grammar
from .checks import check_float, check_int
from .draw import DRAWS

# Whether a stage is on for one row's parameters (off: it leaves the row's logits as they
# are), stage by stage in llama.cpp's order. The one place these rules are written:
# `enabled_stages`, the engine's chain and the fast path's window all ask here.
MAX_TOP_K = 2**31 - 1  # the sampler holds top_k as an int32; beyond it MLX fails the whole batch
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


def _check_list(name: str, value, what: str) -> None:
    """`value` must be a list or tuple (of `what`), not a string, a number or None."""
    if not isinstance(value, list | tuple):
        raise ValueError(f"{name} must be a list of {what}, got {value!r}")


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
        raise ValueError(f"order must be a preset name, stage names separated by ';', or a list of stage "
                         f"names, got {order!r}")
    stages = []
    for name in names:
        if not isinstance(name, str):
            raise ValueError(f"order entries must be stage names, got {name!r}")
        stage = ALIASES.get(name.strip(), name.strip())
        if stage not in STAGES:
            raise ValueError(
                f"order has unknown stage {name!r}: use presets {', '.join(PRESETS)} "
                f"or stage names {', '.join(STAGES)}"
            )
        if stage in stages:
            raise ValueError(f"order names stage {stage!r} twice")
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
        f = check_float
        f("temperature", self.temperature, minimum=0.0, maximum=math.inf, max_open=True)
        check_int("top_k", self.top_k, minimum=0, maximum=MAX_TOP_K)
        f("top_p", self.top_p, minimum=0.0, maximum=1.0)
        f("min_p", self.min_p, minimum=0.0, maximum=1.0)
        f("typical_p", self.typical_p, minimum=0.0, maximum=1.0)
        f("top_n_sigma", self.top_n_sigma)
        f("xtc_probability", self.xtc_probability, minimum=0.0, maximum=1.0)
        f("xtc_threshold", self.xtc_threshold, minimum=0.0, maximum=1.0)
        f("dynatemp_range", self.dynatemp_range, minimum=0.0)
        f("dynatemp_exponent", self.dynatemp_exponent, minimum=0.0)
        f("repetition_penalty", self.repetition_penalty, minimum=0.0, min_open=True)
        f("frequency_penalty", self.frequency_penalty)
        f("presence_penalty", self.presence_penalty)
        check_int("penalty_last_n", self.penalty_last_n, minimum=-1)
        f("dry_multiplier", self.dry_multiplier, minimum=0.0)
        f("dry_base", self.dry_base, minimum=1.0, min_open=True)
        check_int("dry_allowed_length", self.dry_allowed_length, minimum=1)
        check_int("dry_penalty_last_n", self.dry_penalty_last_n, minimum=-1)
        if isinstance(self.dry_sequence_breakers, str | bytes):  # would split into characters
            raise ValueError(f"dry_sequence_breakers must be a list of strings or token-id sequences, "
                             f"got the string {self.dry_sequence_breakers!r} (write [{self.dry_sequence_breakers!r}])")
        _check_list("dry_sequence_breakers", self.dry_sequence_breakers, "strings or token-id sequences")
        breakers = []
        for b in self.dry_sequence_breakers:
            if isinstance(b, str):
                if not b:
                    raise ValueError("dry_sequence_breakers must not contain an empty string")
                breakers.append(b)
            else:
                _check_list("dry_sequence_breakers entry", b, "token ids")
                ids = tuple(b)
                if not ids:
                    raise ValueError("dry_sequence_breakers must not contain an empty sequence")
                for t in ids:
                    check_int("dry_sequence_breakers token", t, minimum=0)
                breakers.append(tuple(int(t) for t in ids))
        object.__setattr__(self, "dry_sequence_breakers", tuple(breakers))
        if self.mirostat not in (0, 1, 2) or isinstance(self.mirostat, bool):
            raise ValueError(f"mirostat must be 0 (off), 1 or 2, got {self.mirostat!r}")
        f("mirostat_tau", self.mirostat_tau, minimum=0.0, min_open=True)
        f("mirostat_eta", self.mirostat_eta, minimum=0.0, min_open=True)
        if not isinstance(self.logit_bias, Mapping):
            raise ValueError(f"logit_bias must be a mapping of token id to bias, got {self.logit_bias!r}")
        bias = {}
        for token, value in dict(self.logit_bias).items():
            check_int("logit_bias token", token, minimum=0)
            value = float(value) if not isinstance(value, bool) else value
            if not isinstance(value, float) or math.isnan(value) or value == math.inf:
                raise ValueError(f"logit_bias value for token {token} must be a number or -inf, got {value!r}")
            bias[int(token)] = value
        object.__setattr__(self, "logit_bias", bias)
        check_int("min_tokens", self.min_tokens, minimum=0)
        _check_list("eos_token_ids", self.eos_token_ids, "token ids")
        object.__setattr__(self, "eos_token_ids", tuple(
            check_int("eos_token_ids entry", t, minimum=0) for t in self.eos_token_ids))
        if self.min_tokens > 0 and not self.eos_token_ids:
            raise ValueError(f"min_tokens={self.min_tokens} needs eos_token_ids to know what to suppress")
        if self.seed is not None:
            check_int("seed", self.seed, minimum=0, maximum=2**32 - 1)
        object.__setattr__(self, "order", resolve_order(self.order))
        check_int("logprobs", self.logprobs, minimum=0)
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise ValueError(
                f"grammar must be a tiny_llm.constrain.Grammar (e.g. Grammar.from_gbnf(text)), "
                f"got {type(self.grammar).__name__}"
            )
        if not isinstance(self.grammar_first, bool):
            raise ValueError(f"grammar_first must be True or False, got {self.grammar_first!r}")
        if self.draw not in DRAWS:
            raise ValueError(f"draw must be one of {', '.join(DRAWS)}, got {self.draw!r}")
        if self.draw == "race" and (self.grammar is not None or self.mirostat):
            raise ValueError("draw='race' does not combine with a grammar or mirostat: they draw by the "
                             "inverse CDF")
        if self.grammar is not None and self.mirostat:
            raise ValueError(f"grammar does not combine with mirostat={self.mirostat}: mirostat's "
                             f"target surprise assumes the unconstrained distribution")
        missing = [stage for stage in self.enabled_stages() if stage not in self.order]
        if missing and not self.mirostat:
            raise ValueError(
                f"order {'; '.join(self.order)} leaves out {', '.join(missing)}, "
                f"which these parameters switch on"
            )

    def __hash__(self):
        return hash(tuple((f.name, repr(getattr(self, f.name))) for f in fields(self)))

    def check_vocabulary(self, vocab_size: int) -> None:
        """Raise `ValueError` when a token id of these parameters (`logit_bias`,
        `eos_token_ids`, `dry_sequence_breakers`) is outside a vocabulary of `vocab_size`
        tokens. Called where the model is known, before anything runs."""
        breakers = [t for b in self.dry_sequence_breakers if not isinstance(b, str) for t in b]
        for name, ids in (("logit_bias", self.logit_bias), ("eos_token_ids", self.eos_token_ids),
                          ("dry_sequence_breakers", breakers)):
            outside = sorted(t for t in ids if t >= vocab_size)
            if outside:
                raise ValueError(f"{name} names token {outside[0]}, outside the vocabulary [0, {vocab_size})")

    def enabled_stages(self) -> list[str]:
        """The stages whose parameters are not "off" (`STAGE_ON`), in `STAGES` order."""
        return [stage for stage, on in STAGE_ON.items() if on(self)]
