"""Engine — one row of the sampling engine: its parameters and where it has got to.

A `Sampler` is a list of `Row`s, one per batch row. Taking rows out of a batch or adding
rows to it is a list operation; each row carries its own seed, draw counter, mirostat
estimate and grammar state, so it goes on where it was.

Tests: tests/test_sampler_engine.py
"""

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..distributed import fresh_seed
from ..constrain import TokenMatcher, TokenTable
from . import fast
from .params import SamplingParams, stage_on

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer


@dataclass
class Row:
    """One batch row: `params`, the `seed` of its random stream, and its state — `counter`
    (tokens drawn so far: the position in the stream), `reply_start` (the counter when the
    current reply began: `min_tokens` counts from it), `mu` (mirostat's running estimate)
    and `grammar_state` (None: the grammar's start). `breakers` are the DRY sequence
    breakers as token ids; `matcher` is the row's grammar over the vocabulary."""

    params: SamplingParams
    seed: int
    breakers: tuple[tuple[int, ...], ...] = ()
    matcher: TokenMatcher | None = None
    counter: int = 0
    reply_start: int = 0
    mu: float = field(init=False)
    grammar_state: int | None = None
    # The cheapest path the parameters allow: "greedy", "plain" (temperature, min-p and
    # top-p: passes over every token and a search for the nucleus), "window" (top-k: the
    # fast path's window) or "full" (the chain).
    kind: str = field(init=False)
    penalised: bool = field(init=False)  # whether the penalties stage is on

    def __post_init__(self):
        self.mu = self.first_mu()
        self.kind = _kind(self.params)
        self.penalised = stage_on("penalties", self.params)

    def first_mu(self) -> float:
        """Mirostat's estimate before the first draw: twice the target surprise."""
        return 2.0 * self.params.mirostat_tau

    def restart(self) -> None:
        """Back to the first draw: counter 0, mirostat's first estimate, the grammar's start."""
        self.counter, self.reply_start, self.mu, self.grammar_state = 0, 0, self.first_mu(), None

    def fork(self, seed: int | None = None) -> "Row":
        """A copy that goes on independently (with another `seed`, if given)."""
        row = copy.copy(self)
        if seed is not None:
            row.seed = seed
        return row

    def grammar_at(self) -> int:
        """The grammar state the next token is checked against (rows with a grammar)."""
        return self.matcher.start if self.grammar_state is None else self.grammar_state


def make_rows(params: Sequence[SamplingParams], tokenizer: "Tokenizer | TokenTable | None") -> list[Row]:
    """One fresh `Row` per `SamplingParams`. An unseeded row draws a seed once: its stream is
    new but self-consistent. `tokenizer` (a `Tokenizer` or a `TokenTable`) encodes string
    DRY breakers and gives grammars their vocabulary."""
    matchers = _grammar_matchers(params, tokenizer)
    return [Row(p, p.seed if p.seed is not None else fresh_seed(), _encode_breakers(p, tokenizer), m)
            for p, m in zip(params, matchers)]


def _kind(p: SamplingParams) -> str:
    if p.mirostat or not fast.eligible([p], p.order):
        return "full"
    if p.temperature <= 0:
        return "greedy"
    if p.draw == "race":  # the race runs over the whole vocabulary's final logits
        return "full" if any(stage_on(s, p) for s in fast.FILTERS) else "plain"
    return "window" if fast.wants_window([p]) else "plain"


def _grammar_matchers(params: Sequence[SamplingParams], tokenizer) -> list[TokenMatcher | None]:
    if not any(p.grammar for p in params):
        return [None] * len(params)
    if tokenizer is None:
        raise ValueError("grammar needs the vocabulary: pass tokenizer= (a Tokenizer or a TokenTable) to the Sampler")
    table = tokenizer if isinstance(tokenizer, TokenTable) else TokenTable.from_tokenizer(tokenizer)
    return [TokenMatcher.get(p.grammar, table) if p.grammar else None for p in params]


def _encode_breakers(params: SamplingParams, tokenizer) -> tuple[tuple[int, ...], ...]:
    out = []
    for b in params.dry_sequence_breakers:
        if isinstance(b, str):
            if tokenizer is None or isinstance(tokenizer, TokenTable):
                if stage_on("dry", params):
                    raise ValueError(
                        f"dry_sequence_breakers has the string {b!r}: pass tokenizer= to the Sampler "
                        f"or give token-id sequences"
                    )
                continue
            ids = tuple(tokenizer.encode(b, add_special_tokens=False))
            if ids:
                out.append(ids)
        else:
            out.append(tuple(b))
    return tuple(out)
