"""Engine — a grammar's pushdown automaton, run byte by byte and tabled into a DFA as it is used.

Matching follows llama.cpp: a position in the grammar is a *stack* of pointers into the
rules (the top is the next terminal to match; the pointers below are where to return), and
the matcher's state is the set of stacks still alive. Feeding a character keeps the stacks
whose top accepts it and expands what follows. Text arrives as bytes (a token may end in the
middle of a UTF-8 character), so the automaton also remembers the bytes of an unfinished
character and only keeps going while some stack accepts a character that starts with them.
States are numbered as they are first reached, and every (state, byte) transition is
computed once and kept in a table, so the automaton turns into a DFA as it is used.

Tests: tests/test_constrain_grammar.py, tests/test_constrain_sampling.py
"""

from __future__ import annotations

import numpy as np

from .gbnf import overlaps
from .program import CHAR, END, Program


class Automaton:
    """The byte-level automaton of a compiled grammar. State 0 is dead; state 1 the start.

    A state is a set of stacks plus the bytes of an unfinished UTF-8 character; a stack
    that is empty means the text so far is a complete sentence of the grammar."""

    DEAD = 0

    def __init__(self, program: Program):
        self.program = program
        self._match = [_matcher(cs) for cs in program.charsets]
        # ASCII bytes that every character class holds alike lead to the same state from
        # any state: one transition is computed and copied to the rest of its class.
        signatures = [tuple(match(b) for match in self._match) for b in range(0x80)]
        classes: dict[tuple, list[int]] = {}
        for b, signature in enumerate(signatures):
            classes.setdefault(signature, []).append(b)
        self._alike = [np.array(classes[signature]) for signature in signatures]
        self.states: list[tuple[frozenset, bytes]] = [(frozenset(), b"")]
        self._ids: dict[tuple[frozenset, bytes], int] = {}
        self.table = np.full((64, 256), -1, dtype=np.int32)  # -1: not computed yet
        self._mixed: set[int] = set()  # states whose stacks take some non-ASCII characters only
        self.table[0] = 0
        start: set[tuple[int, ...]] = set()
        self._expand([(alt,) if program.kind[alt] != END else () for alt in program.alts[program.root]], start)
        self.start = self._state(frozenset(start), b"")

    # -- stacks --

    def _expand(self, stacks, out: set) -> None:
        """Add to `out` every stack that `stacks` can turn into whose top is a terminal (or
        which is empty), by entering the rules named on top. Each stack is expanded once,
        however many ways lead to it (a row of optional items would otherwise branch
        exponentially), and with a work list rather than recursion (long chains of optional
        items nest deep)."""
        kind, arg, alts = self.program.kind, self.program.arg, self.program.alts
        todo, seen = list(stacks), set()
        while todo:
            stack = todo.pop()
            if stack in seen:
                continue
            seen.add(stack)
            if not stack or kind[stack[-1]] == CHAR:
                out.add(stack)
                continue
            top = stack[-1]
            rest = stack[:-1] + ((top + 1,) if kind[top + 1] != END else ())
            todo.extend(rest + (alt,) if kind[alt] != END else rest for alt in alts[arg[top]])

    def _feed(self, stacks: frozenset, cp: int | None) -> frozenset:
        """The stacks after character `cp` (None: every stack takes it)."""
        kind, arg = self.program.kind, self.program.arg
        out: set = set()
        moved = [stack[:-1] + ((stack[-1] + 1,) if kind[stack[-1] + 1] != END else ())
                 for stack in stacks if stack and (cp is None or self._match[arg[stack[-1]]](cp))]
        self._expand(moved, out)
        return frozenset(out)

    def _taking_all(self, stacks: frozenset, lo: int, hi: int) -> frozenset | None:
        """The stacks whose next character class holds all of [lo, hi], if every other
        stack's holds none of it; None if some class holds part of the range."""
        arg, charsets = self.program.arg, self.program.charsets
        takers = []
        for stack in stacks:
            if not stack:
                continue
            charset = charsets[arg[stack[-1]]]
            if not overlaps(charset, lo, hi):
                continue
            if overlaps((charset[0], not charset[1]), lo, hi):  # ranges are sorted (`gbnf._merge`)
                return None  # part of the range only
            takers.append(stack)
        return frozenset(takers)

    def _may_start(self, stacks: frozenset, lo: int, hi: int) -> bool:
        """Does some stack accept a character in [lo, hi]?"""
        arg, charsets = self.program.arg, self.program.charsets
        return any(stack and overlaps(charsets[arg[stack[-1]]], lo, hi) for stack in stacks)

    # -- states --

    def _state(self, stacks: frozenset, pending: bytes) -> int:
        if not stacks:
            return self.DEAD
        key = (stacks, pending)
        sid = self._ids.get(key)
        if sid is None:
            sid = self._ids[key] = len(self.states)
            self.states.append(key)
            if sid >= len(self.table):
                grown = np.full((2 * len(self.table), 256), -1, dtype=np.int32)
                grown[: len(self.table)] = self.table
                self.table = grown
        return sid

    def step(self, sid: int, byte: int) -> int:
        """The state after one more byte."""
        nxt = int(self.table[sid, byte])
        if nxt < 0:
            pending = self.states[sid][1]
            if isinstance(pending, tuple):  # every allowed byte leads to the same state
                _, lo, hi = pending
                going = self._compute(sid, lo)
                self.table[sid] = self.DEAD
                self.table[sid, lo: hi + 1] = going
                return going if lo <= byte <= hi else self.DEAD
            if byte >= 0x80 and not pending and sid not in self._mixed and self._leads(sid):
                return int(self.table[sid, byte])
            nxt = self._compute(sid, byte)
            if byte < 0x80 and not pending:
                self.table[sid, self._alike[byte]] = nxt
            else:
                self.table[sid, byte] = nxt
        return nxt

    def _leads(self, sid: int) -> bool:
        """Fill in every byte from 0x80 up at once, if each stack takes either every
        character past ASCII or none: then a lead byte's state depends only on how many
        bytes its character has and what the next may be (invalid lead bytes: dead).
        False (and remembered) if some stack takes only some of those characters."""
        stacks = self.states[sid][0]
        takers = self._taking_all(stacks, 0x80, 0x10FFFF)
        if takers is None:
            self._mixed.add(sid)
            return False
        self.table[sid, 0x80:] = self.DEAD
        for lead in range(0xC2, 0xF5):
            second = _SECOND.get(lead, (0x80, 0xBF))
            self.table[sid, lead] = self._state(takers, (_utf8_length(lead) - 1, *second))
        return True

    def _compute(self, sid: int, byte: int) -> int:
        stacks, pending = self.states[sid]
        if isinstance(pending, tuple):  # (bytes still to come, range of the next byte)
            left, lo, hi = pending
            if not lo <= byte <= hi:
                return self.DEAD
            if left > 1:
                return self._state(stacks, (left - 1, 0x80, 0xBF))
            return self._state(self._feed(stacks, None), b"")
        if not pending:
            if byte < 0x80:
                return self._state(self._feed(stacks, byte), b"")
            pending = bytes([byte])
        elif 0x80 <= byte <= 0xBF:
            pending += bytes([byte])
        else:
            return self.DEAD
        span = _utf8_span(pending)
        if span is None:
            return self.DEAD
        lo, hi = span
        length = _utf8_length(pending[0])
        if lo == hi and len(pending) == length:
            return self._state(self._feed(stacks, lo), b"")
        if not self._may_start(stacks, lo, hi):
            return self.DEAD
        takers = self._taking_all(stacks, lo, hi)
        if takers is not None:
            # The stacks that go on take every character this one can still become: which
            # one it is no longer matters, only how many bytes are left and what the next
            # may be. Characters of many lead bytes then share their states (and masks).
            second = _SECOND.get(pending[0], (0x80, 0xBF)) if len(pending) == 1 else (0x80, 0xBF)
            return self._state(takers, (length - len(pending), *second))
        return self._state(stacks, pending)

    def walk(self, sid: int, data: bytes) -> int:
        for byte in data:
            sid = self.step(sid, byte)
            if sid == self.DEAD:
                break
        return sid

    def mask_key(self, sid: int, horizon: int) -> tuple:
        """What decides which texts of at most `horizon` bytes can follow state `sid`: its
        stacks with every bounded repetition cut to `horizon` + 1 items left (see
        `Program.shallow`), and its unfinished character. States with equal keys allow
        the same tokens of that length."""
        stacks, pending = self.states[sid]
        shallow = self.program.shallow
        return frozenset(tuple(shallow(e, horizon) for e in stack) for stack in stacks), pending

    def accepting(self, sid: int) -> bool:
        """Is the text so far a whole sentence?"""
        stacks, pending = self.states[sid]
        return not pending and () in stacks

    def complete(self, sid: int) -> bool:
        """Is the text a whole sentence that nothing can extend?"""
        stacks, pending = self.states[sid]
        return not pending and stacks == frozenset({()})

    def grow(self, states: np.ndarray, data: np.ndarray) -> np.ndarray:
        """`states` after one more byte each (`data`), for many (state, byte) pairs at once."""
        pairs = (states.astype(np.intp) << 8) | data
        nxt = self.table.reshape(-1).take(pairs)
        missing = nxt < 0
        if missing.any():
            for pair in np.unique(pairs[missing]).tolist():
                self.step(pair >> 8, pair & 0xFF)
            nxt = self.table.reshape(-1).take(pairs)
        return nxt


def _matcher(charset: tuple):
    ranges, negated = charset
    if len(ranges) == 1 and not negated:
        lo, hi = ranges[0]
        return lambda cp: lo <= cp <= hi
    return lambda cp: any(lo <= cp <= hi for lo, hi in ranges) != negated



def _utf8_length(lead: int) -> int:
    return 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


_SECOND = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


def _utf8_span(pending: bytes) -> tuple[int, int] | None:
    """The code points whose UTF-8 encoding starts with `pending` (a lead byte and maybe some
    continuation bytes): a range, as UTF-8 keeps code-point order; None if there are none."""
    lead = pending[0]
    if not 0xC2 <= lead <= 0xF4:
        return None
    n = _utf8_length(lead)
    lo2, hi2 = _SECOND.get(lead, (0x80, 0xBF))
    if len(pending) > 1 and not lo2 <= pending[1] <= hi2:
        return None
    low = pending + (bytes([lo2]) if len(pending) == 1 else b"") + b"\x80" * n
    high = pending + (bytes([hi2]) if len(pending) == 1 else b"") + b"\xbf" * n
    return ord(low[:n].decode("utf-8")), ord(high[:n].decode("utf-8"))
