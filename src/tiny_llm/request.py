"""Engine — one way to build a request: the fields of a command line, a batch file's JSON line
or an OpenAI body turned into `SamplingParams`, a grammar and stop strings.

    request = build_request({"temperature": 0.7, "min_tokens": 5, "regex": "[0-9]+"}, tokenizer)
    request.params   # SamplingParams, with the tokenizer's end-of-sequence ids for min_tokens

Every caller gives plain fields under their `SamplingParams` names (plus `samplers`, `stop`
and the constraints `grammar`, `regex` and `json_schema`) and how it spells each field to
its user (`--top-p` on the command line, `top_p` in a request body). Every mistake is a
`FieldError` naming the field in that spelling (`SamplingParams`' own `ParamError` carries
its field, which is spelled here); the caller turns it into its own kind of error (a
one-line message, an HTTP 400).

Tests: tests/test_request.py, tests/test_serve_agents.py
"""

import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace

from .constrain import Grammar
from .constrain.grammar import SourceError
from .sampler import SamplingParams
from .sampler.params import ParamError
from .tokenizer import Tokenizer

PARAMS = frozenset(f.name for f in fields(SamplingParams))
CONSTRAINTS = Grammar.KINDS  # at most one of them per request
MAX_STOP_STRINGS = 16

# `--logit-bias` entries: TOKEN+BIAS, TOKEN-BIAS or TOKEN=BIAS (BIAS may be inf).
BIAS_ENTRY = re.compile(r"\s*(\d+)\s*(?:=|(?=[+-]))\s*([+-]?(?:inf|\d+(?:\.\d*)?(?:e[+-]?\d+)?))\s*", re.I)


class FieldError(ValueError):
    """A field a request cannot have: `field` is its name as the caller spells it."""

    def __init__(self, message: str, field: str | None):
        super().__init__(message)
        self.field = field


Spelling = Callable[[str], str]


def as_is(name: str) -> str:
    return name


@dataclass(frozen=True)
class Request:
    """What a checked request asks for: how to draw (`params`, with its grammar), at most
    how many tokens (`max_tokens`; None: the caller's default), where to stop (`stop`) and
    which field the grammar came from (`constraint`, as the caller spells it)."""

    params: SamplingParams
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    constraint: str | None = None


def canonical(value) -> str:
    """A constraint's value as a cache key: its JSON with sorted keys, so that one schema
    written with its keys in another order shares the grammar."""
    return json.dumps(value, sort_keys=True, default=repr)


class GrammarCache:
    """Compiled grammars by source, so that requests with the same schema share one grammar
    and its token masks (least recently used ones dropped beyond `size`)."""

    def __init__(self, size: int = 64):
        self.size = size
        self._grammars: OrderedDict[tuple, Grammar] = OrderedDict()
        # Requests are checked on several threads; reentrant, as a composed grammar's
        # `build` gets its parts from the same cache.
        self._lock = threading.RLock()

    def get(self, key: tuple, build: Callable[[], Grammar]) -> Grammar:
        with self._lock:
            grammar = self._grammars.get(key)
            if grammar is None:
                grammar = build()
                self._grammars[key] = grammar
                while len(self._grammars) > self.size:
                    self._grammars.popitem(last=False)
            self._grammars.move_to_end(key)
            return grammar

    def of_kind(self, kind: str, value, *, compact: bool = False) -> Grammar:
        """`Grammar.from_kind(kind, value, compact=compact)`, compiled once per canonical
        JSON of `value`."""
        return self.get((kind, canonical(value), compact), lambda: Grammar.from_kind(kind, value, compact=compact))


def build_request(given: Mapping, tokenizer: Tokenizer | None, *, base: Mapping | None = None,
                  spell: Spelling = as_is, vocab_size: int | None = None, constraints: Sequence[tuple] = (),
                  grammars: GrammarCache | None = None, openai_bias: bool = False,
                  unlimited: bool = False, label: Spelling | None = None, verb: str = "give",
                  also: Sequence[str] = ()) -> Request:
    """The request of the fields `given` over `base` (fields that hold where `given` is
    silent, e.g. the command line's flags under a batch file's line).

    `tokenizer`: its end-of-sequence ids are what `min_tokens` suppresses; None checks the
    fields before a model is loaded (the result is for checking only). `vocab_size`: token
    ids must lie below it. `constraints`: more `(field, kind, value)` sources of a grammar
    than the fields `grammar`, `regex` and `json_schema` (e.g. a `response_format`), where
    `kind` is one of `Grammar.KINDS` or a function that builds the grammar; at most one
    source may be given in all (a `grammar` may be a compiled `Grammar`). `grammars`: a cache of compiled grammars. `openai_bias`:
    `logit_bias` is an object whose values lie in [-100, 100], -100 banning the token
    (OpenAI's meaning), not a list of the command line's entries.
    `unlimited`: `max_tokens` may be -1, no limit. `label`: how a message about a
    constraint's value names it (default `spell`); `verb`: what the user does with a field
    ("give", "pass", "send"), for the message that asks for one constraint, which also names
    the caller's other sources of a grammar, `also` (and those in `constraints`).
    """
    fields_ = {**(base or {}), **given}
    values = {name: fields_[name] for name in PARAMS if fields_.get(name) is not None}
    if fields_.get("samplers") is not None:
        if fields_.get("order") is not None:
            raise FieldError(f"{spell('samplers')} and {spell('order')} name the same thing; send one", spell("order"))
        values["order"] = fields_["samplers"]
    if isinstance(values.get("order"), list):
        values["order"] = tuple(values["order"])
    bias = values.get("logit_bias")  # a value of neither form is SamplingParams' to refuse
    if isinstance(bias, Mapping) or (isinstance(bias, list | tuple) and not openai_bias):
        values["logit_bias"] = parse_logit_bias(bias, spell("logit_bias"), openai=openai_bias)
    if isinstance(values.get("dry_sequence_breakers"), list):
        values["dry_sequence_breakers"] = tuple(
            tuple(b) if isinstance(b, list) else b for b in values["dry_sequence_breakers"])
    sources = [(name, name, fields_[name]) for name in CONSTRAINTS if fields_.get(name) is not None]
    options = [*dict.fromkeys([*also, *(c[0] for c in constraints)]), *CONSTRAINTS]
    grammar, constraint = compile_constraint([*constraints, *sources], spell, grammars, label=label,
                                             options=options, verb=verb)
    values["grammar"] = grammar
    min_tokens = values.get("min_tokens")
    if isinstance(min_tokens, int) and not isinstance(min_tokens, bool) and min_tokens > 0:
        # The end-of-sequence ids are the model's: a caller never has to give them.
        values["eos_token_ids"] = (0,) if tokenizer is None else tuple(sorted(tokenizer.eos_token_ids))
    try:
        params = SamplingParams(**values)
        if vocab_size is not None:
            params.check_vocabulary(vocab_size)
    except ParamError as e:
        raise _spelled(e, spell, constraint) from None
    max_tokens = fields_.get("max_tokens")
    if max_tokens is not None:
        max_tokens = check_max_tokens(max_tokens, spell("max_tokens"), unlimited=unlimited)
    return Request(params, max_tokens, parse_stop(fields_.get("stop"), spell("stop")), constraint)


def _spelled(error: ParamError, spell: Spelling, constraint: str | None) -> FieldError:
    """`SamplingParams`' error with its field in the caller's words. The grammar's came from
    the field `constraint`, which it names; its message keeps the word "grammar"."""
    if error.field == "grammar":
        return FieldError(str(error), constraint)
    field = spell(error.field)
    return FieldError(error.named(field), field)


def check_max_tokens(value, field: str = "max_tokens", *, unlimited: bool = False) -> int:
    """A request's most new tokens: a positive integer (or -1, no limit, if `unlimited`)."""
    if isinstance(value, bool) or not isinstance(value, int) or not (value >= 1 or (unlimited and value == -1)):
        raise FieldError(f"{field} must be a positive integer{' or -1 (no limit)' if unlimited else ''}, "
                         f"got {value!r}"[:300], field)
    return value


def compile_constraint(sources: Sequence[tuple], spell: Spelling = as_is, grammars: GrammarCache | None = None,
                       *, label: Spelling | None = None, options: Sequence[str] = CONSTRAINTS,
                       verb: str = "give") -> tuple[Grammar | None, str | None]:
    """The one grammar of `sources` — `(field, kind, value)`, `kind` one of `Grammar.KINDS`
    or a function building the grammar — and the field (spelled by `label`, default
    `spell`) it came from; (None, None) without sources. Two sources (of the fields
    `options`), a value that does not compile, or a grammar whose one text is the empty one
    are a `FieldError` (a builder may raise its own, naming another field)."""
    if len(sources) > 1:
        names, given = [spell(o) for o in options], [spell(s[0]) for s in sources]
        raise FieldError(f"{verb} one of {', '.join(names[:-1])} and {names[-1]}, not {given[0]} and {given[1]}",
                         given[1])
    if not sources:
        return None, None
    field, kind, value = sources[0]
    label = (label or spell)(field)
    if isinstance(value, Grammar):  # compiled already
        return value, label
    grammars = GrammarCache() if grammars is None else grammars
    try:
        grammar = grammars.get((field, canonical(value)), kind) if callable(kind) else grammars.of_kind(kind, value)
    except FieldError:
        raise  # the builder named the field at fault itself (a part of a combined grammar)
    except SourceError as e:  # about the value itself: "json_schema is not valid JSON: ..."
        raise FieldError(f"{label} {e.what}", label) from None
    except (ValueError, RecursionError) as e:
        raise FieldError(f"{label}: {e}", label) from None
    if grammar.matches_only_empty():
        raise FieldError(f"{label}: matches only the empty text, so there is nothing to generate", label)
    return grammar, label


def parse_logit_bias(bias: Mapping | Sequence[str], field: str = "logit_bias", *,
                     openai: bool = False) -> dict:
    """Token id to bias, from a mapping (JSON keys are strings of digits) or from entries
    "TOKEN+BIAS", "TOKEN-BIAS", "TOKEN=BIAS" (the command line's). `openai`: the values lie
    in [-100, 100] and -100 bans the token. The ids and values are `SamplingParams`' to check."""
    pairs = bias.items() if isinstance(bias, Mapping) else [_bias_entry(entry, field) for entry in bias]
    out = {}
    for key, value in pairs:
        if isinstance(key, str):
            if not (key.isascii() and key.isdigit()):
                raise FieldError(f'{field} keys are token ids such as "15043", got {key!r}', field)
            key = int(key)
        if openai:
            if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
                raise FieldError(f"{field} for token {key} must be a number in [-100, 100], got {value!r}", field)
            value = -math.inf if value == -100 else float(value)
        out[key] = value
    return out


def _bias_entry(entry, field: str) -> tuple[int, float]:
    """A command line's `--logit-bias` entry as (token, bias)."""
    m = BIAS_ENTRY.fullmatch(entry) if isinstance(entry, str) else None
    if not m:
        raise FieldError(f"{field} takes TOKEN+BIAS, TOKEN-BIAS or TOKEN=BIAS, got {entry!r}"[:300], field)
    return int(m[1]), float(m[2])


def parse_stop(stop, field: str = "stop") -> tuple[str, ...]:
    """Stop strings: one non-empty string or a list of at most MAX_STOP_STRINGS of them."""
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list | tuple) or not all(isinstance(s, str) and s for s in stops) \
            or len(stops) > MAX_STOP_STRINGS:
        raise FieldError(f"{field} must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them, "
                         f"got {stop!r}"[:300], field)
    return tuple(stops)


def seeded(params: SamplingParams, i: int) -> SamplingParams:
    """`params` for the i-th of several requests or choices made from one: with a seed S,
    the i-th draws with S + i, so that they differ (and each is reproducible)."""
    if params.seed is None or i == 0:
        return params
    return replace(params, seed=(params.seed + i) % 2**32)
