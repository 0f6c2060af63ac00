"""Engine — from grammar states to token masks over a vocabulary.

A token is allowed in a state when feeding its bytes keeps the automaton alive: the text so
far plus the token can still be completed into a sentence. End-of-sequence tokens are
allowed exactly where the text is a whole sentence. Special tokens (control tokens such as
a chat template's markers) have no text and are never allowed.

`TokenTable` lays the vocabulary out once per tokenizer: the tokens' bytes in a matrix,
sorted by length. A mask is then computed for many tokens at once, one byte column at a
time: the states of all tokens still alive go through the automaton's transition table with
a single gather. Masks are kept per state, up to a byte budget (least recently used go
first), so a state seen again costs nothing.

A new state rarely needs all of its mask computed. The table cuts the vocabulary into
buckets by token length, and a bucket's part of the mask depends only on what the state
allows within that many bytes (`Automaton.mask_key`): inside a string of at most 200
characters, the short tokens' answer is the same 150 characters from the end as 100, so
only the buckets of long tokens are walked again as the string fills up. An unfinished
non-ASCII character that the grammar takes whole is one state whatever the character, so
text in any script shares its masks too.

Tests: tests/test_serve.py, tests/test_constrain_grammar.py
"""

from __future__ import annotations

import re
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .grammar import Automaton, Grammar

_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Token lengths (bytes) where the buckets end: short buckets where most tokens are, so that
# a bounded repetition leaves them alone as long as possible.
BUCKET_EDGES = [2, 4, 6, 8, 10, 12, 16, 24, 32, 64]


class TokenTable:
    """The bytes of every token id (None: a token with no text, never allowed), and the
    end-of-sequence ids."""

    def __init__(self, tokens: Sequence[bytes | None], eos_token_ids: Iterable[int] = ()):
        self.tokens = [None if t is None else bytes(t) for t in tokens]
        self.size = len(self.tokens)
        self.eos = tuple(sorted({int(i) for i in eos_token_ids if 0 <= int(i) < self.size}))
        eos = set(self.eos)
        text = [i for i, t in enumerate(self.tokens) if t and i not in eos]
        text.sort(key=lambda i: len(self.tokens[i]))
        self.order = np.array(text, dtype=np.int64)  # text tokens, shortest first
        lengths = np.array([len(self.tokens[i]) for i in text], dtype=np.int64)
        width = int(lengths[-1]) if len(text) else 0
        # One reshape per token length, not one copy per token.
        self.bytes = np.zeros((len(text), width), dtype=np.int32)
        for n, first, end in _runs(lengths):
            joined = b"".join(self.tokens[i] for i in text[first:end])
            self.bytes[first:end, :n] = np.frombuffer(joined, dtype=np.uint8).reshape(end - first, n)
        self.columns = np.ascontiguousarray(self.bytes.T)  # byte k of every row, contiguous
        # starts[k]: the first row (in `order`) whose token has more than k bytes.
        self.starts = np.searchsorted(lengths, np.arange(width), side="right")
        # Buckets of rows by token length: (first row, end row, longest token in bytes).
        edges = np.searchsorted(lengths, BUCKET_EDGES, side="right").tolist() + [len(text)]
        self.buckets = [(a, b, int(lengths[b - 1])) for a, b in zip([0, *edges], edges) if b > a]

    @classmethod
    def from_tokenizer(cls, tokenizer) -> TokenTable:
        """The table of a `tiny_llm` tokenizer (built once per tokenizer object)."""
        table = _TABLES.get(tokenizer)
        if table is None:
            table = _TABLES[tokenizer] = cls(token_bytes(tokenizer), tokenizer.eos_token_ids)
        return table


def _runs(lengths: np.ndarray) -> list[tuple[int, int, int]]:
    """`(length, first, end)` for each run of equal values in sorted `lengths`."""
    cuts = np.flatnonzero(np.diff(lengths)) + 1
    firsts, ends = [0, *cuts.tolist()], [*cuts.tolist(), len(lengths)]
    return [(int(lengths[a]), a, b) for a, b in zip(firsts, ends) if b > a]


def token_bytes(tokenizer) -> list[bytes | None]:
    """Each token's bytes: byte-level BPE tokens through GPT-2's byte alphabet, byte-fallback
    tokens `<0xHH>` as that byte, SentencePiece's `▁` as a space; special tokens None."""
    backend = tokenizer.backend
    added = backend.get_added_tokens_decoder()
    pieces: list[str | None] = [None] * tokenizer.vocab_size
    for piece, i in backend.get_vocab(with_added_tokens=True).items():
        if 0 <= i < len(pieces):
            pieces[i] = piece
    byte_level = _byte_level(backend)
    out: list[bytes | None] = []
    for i, piece in enumerate(pieces):
        if piece is None or (i in added and added[i].special):
            out.append(None)
        elif i in added:
            out.append(piece.encode())
        elif byte_level and not _OUTSIDE_ALPHABET.search(piece):
            out.append(piece.translate(_ALPHABET_TO_LATIN1).encode("latin-1"))
        elif m := _BYTE_FALLBACK.fullmatch(piece):
            out.append(bytes([int(m[1], 16)]))
        else:
            out.append(piece.replace("\u2581", " ").encode())
    return out


def _byte_level(backend) -> bool:
    """Does the tokenizer decode through GPT-2's byte alphabet (a ByteLevel decoder, alone or
    in a sequence, or a ByteLevel pre-tokenizer)?"""
    parts = (backend.decoder, backend.pre_tokenizer)
    return any(b'"ByteLevel"' in part.__getstate__() for part in parts if part is not None)


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


# A byte-level piece's characters to the bytes they stand for (as Latin-1 characters), and
# the characters that are not in the alphabet.
_ALPHABET_TO_LATIN1 = {ord(c): b for c, b in _byte_alphabet().items()}
_OUTSIDE_ALPHABET = re.compile("[^" + re.escape("".join(_byte_alphabet())) + "]")
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@dataclass
class MaskStats:
    """What a matcher's masks cost: masks built (states not in the cache), bucket walks
    they needed (the rest came from the bucket cache), and the seconds they took."""

    masks: int = 0
    walks: int = 0
    seconds: float = 0.0


class TokenMatcher:
    """A grammar over one vocabulary. States are the automaton's state numbers:
    `start`, then `advance(state, token)` after each token."""

    MASK_BYTES = 256 << 20  # bytes of whole masks kept per matcher (one byte per token each);
    # as many again for the buckets' parts

    def __init__(self, grammar: Grammar, table: TokenTable):
        self.grammar = grammar
        self.automaton: Automaton = grammar.automaton
        self.table = table
        self.start = self.automaton.start
        self.stats = MaskStats()
        self._masks: dict[int, np.ndarray] = {}  # least recently used first
        self._parts: dict[tuple, np.ndarray] = {}  # (bucket, mask key) -> allowed, per row
        self._part_bytes = 0

    @classmethod
    def get(cls, grammar: Grammar, table: TokenTable) -> TokenMatcher:
        """One matcher per (grammar, table), so masks are shared by every row and request."""
        matcher = grammar._matchers.get(id(table))
        if matcher is None or matcher.table is not table:
            matcher = grammar._matchers[id(table)] = cls(grammar, table)
        return matcher

    def allows(self, state: int, token: int) -> bool:
        if token in self.table.eos:
            return self.automaton.accepting(state)
        data = self.table.tokens[token] if 0 <= token < self.table.size else None
        return bool(data) and self.automaton.walk(state, data) != Automaton.DEAD

    def advance(self, state: int, token: int) -> int:
        """The state after `token` (an end-of-sequence token leaves it as it is)."""
        if token in self.table.eos:
            return state
        return self.automaton.walk(state, self.table.tokens[token] or b"")

    def accepting(self, state: int) -> bool:
        return self.automaton.accepting(state)

    def has_mask(self, state: int) -> bool:
        """Whether `state`'s mask is in the cache (then `mask` costs nothing)."""
        return state in self._masks

    def mask(self, state: int, size: int | None = None) -> np.ndarray:
        """Which tokens may come next: bool `[size]` (default: the table's size; ids past
        the table are never allowed)."""
        mask = self._masks.pop(state, None)
        if mask is None:
            start = time.perf_counter()
            mask = self._compute(state)
            self.stats.masks += 1
            self.stats.seconds += time.perf_counter() - start
            # Make room within the budget, least recently used first (the newest always stays).
            while self._masks and (len(self._masks) + 1) * mask.nbytes > self.MASK_BYTES:
                self._masks.pop(next(iter(self._masks)))
        self._masks[state] = mask  # now the most recently used
        size = self.table.size if size is None else size
        if size == len(mask):
            return mask
        out = np.zeros(size, dtype=bool)
        out[: min(size, len(mask))] = mask[:size]
        return out

    def _compute(self, state: int) -> np.ndarray:
        t = self.table
        alive = np.empty(len(t.order), dtype=bool)
        runs: list[list[tuple]] = []  # buckets to walk, in runs of neighbours (walked together)
        for b, (first, end, longest) in enumerate(t.buckets):
            key = (b, self.automaton.mask_key(state, longest))
            part = self._parts.pop(key, None)
            if part is None:
                if runs and runs[-1][-1][0] == b - 1:
                    runs[-1].append((b, key))
                else:
                    runs.append([(b, key)])
                continue
            self._parts[key] = part  # now the most recently used
            alive[first:end] = part
        for run in runs:
            first, end = t.buckets[run[0][0]][0], t.buckets[run[-1][0]][1]
            alive[first:end] = self._walk(state, first, end, t.buckets[run[-1][0]][2])
            for b, key in run:
                part = alive[t.buckets[b][0]: t.buckets[b][1]].copy()
                self.stats.walks += 1
                self._part_bytes += part.nbytes
                while self._parts and self._part_bytes > self.MASK_BYTES:
                    self._part_bytes -= self._parts.pop(next(iter(self._parts))).nbytes
                self._parts[key] = part
        mask = np.zeros(t.size, dtype=bool)
        mask[t.order] = alive
        if self.automaton.accepting(state):
            mask[list(t.eos)] = True
        return mask

    def _walk(self, state: int, first: int, end: int, longest: int) -> np.ndarray:
        """Which tokens of rows first..end (at most `longest` bytes) the automaton takes
        whole from `state`: all at once, a byte column at a time."""
        t = self.table
        states = np.full(end - first, state, dtype=np.int32)
        for k in range(longest):
            start = max(int(t.starts[k]), first) - first  # the rows longer than k bytes
            column = t.columns[k, first + start: end]
            live = np.flatnonzero(states[start:])
            if len(live) == end - first - start:  # all alive: no gather needed
                states[start:] = self.automaton.grow(states[start:], column)
                continue
            if not len(live):
                break
            states[start + live] = self.automaton.grow(states[start + live], column[live])
        return states != Automaton.DEAD
