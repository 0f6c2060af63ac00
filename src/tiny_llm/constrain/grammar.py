"""Engine — GBNF grammars: parse, compile to a pushdown automaton, and run it byte by byte.

The format is llama.cpp's GBNF:

    root   ::= object
    object ::= "{" space (pair ("," space pair)*)? "}" space
    pair   ::= string ":" space value
    space  ::= | " " | "\\n" [ \\t]{0,20}     # an empty alternative is the empty string

Rules are `name ::= alternatives`; an alternative is a sequence of string literals
(`"..."`), character classes (`[a-z]`, `[^"\\\\]`), `.` (any character), rule names and
groups `( ... )`, each optionally repeated with `*`, `+`, `?`, `{m}`, `{m,}` or `{m,n}`.
`#` starts a comment. A rule goes on past the end of its line only inside parentheses or
after a `|`.

Matching follows llama.cpp: a position in the grammar is a *stack* of pointers into the
rules (the top is the next terminal to match; the pointers below are where to return), and
the matcher's state is the set of stacks still alive. Feeding a character keeps the stacks
whose top accepts it and expands what follows. Text arrives as bytes (a token may end in the
middle of a UTF-8 character), so the automaton also remembers the bytes of an unfinished
character and only keeps going while some stack accepts a character that starts with them.
States are numbered as they are first reached, and every (state, byte) transition is
computed once and kept in a table, so the automaton turns into a DFA as it is used.
"""

from __future__ import annotations

import json
from collections import deque

import numpy as np

from .escape import HEX_ESCAPES, NAMED_ESCAPES
from .limits import MAX_NESTING, MAX_REPEAT

# ---- syntax tree --------------------------------------------------------------------------
# ("chars", ranges, negated)   ranges: tuple of (lo, hi) code points, inclusive
# ("ref", name, pos)           a rule name, with its offset in the source for errors
# ("seq", items)               items one after another ("seq", ()) is the empty string
# ("alt", seqs)                one of the alternatives
# ("rep", item, lo, hi)        item repeated lo..hi times; hi None = no limit

ANY = ("chars", (), True)


class NoTextError(ValueError):
    """The grammar's start rule matches no text at all."""


class LeftRecursionError(ValueError):
    """A rule can reach itself before it reads a character."""


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.depth = 0  # parentheses open around the current position

    def error(self, message: str, pos: int | None = None):
        pos = self.pos if pos is None else pos
        line = self.text.count("\n", 0, pos) + 1
        column = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return ValueError(f"grammar: {message} at line {line}, column {column}")

    def peek(self, k: int = 0) -> str:
        i = self.pos + k
        return self.text[i] if i < len(self.text) else ""

    def space(self, newlines: bool) -> None:
        """Skip blanks and comments (and newlines when `newlines`)."""
        text = self.text
        while self.pos < len(text):
            c = text[self.pos]
            if c == "#":
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end
            elif c in " \t" or (newlines and c in "\r\n"):
                self.pos += 1
            else:
                return

    def parse(self) -> dict[str, tuple]:
        rules: dict[str, tuple] = {}
        self.space(True)
        while self.pos < len(self.text):
            start = self.pos
            name = self.name()
            self.space(False)
            if not self.text.startswith("::=", self.pos):
                raise self.error(f"expected '::=' after rule name {name!r}")
            self.pos += 3
            self.space(True)
            body = self.alternates(nested=False)
            if name in rules:
                raise self.error(f"rule {name!r} is defined twice", start)
            rules[name] = body
            self.space(False)
            if self.peek() not in ("", "\n", "\r"):
                c = self.peek()
                if c == ")":
                    raise self.error("unbalanced ')'")
                raise self.error(f"unexpected {c!r}")
            self.space(True)
        if not rules:
            raise self.error("the grammar has no rules")
        return rules

    def name(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and (self.text[self.pos].isascii() and
                                             (self.text[self.pos].isalnum() or self.text[self.pos] in "-_")):
            self.pos += 1
        if self.pos == start:
            c = self.peek()
            raise self.error(f"expected a rule name, found {c!r}" if c else "expected a rule name")
        return self.text[start:self.pos]

    def alternates(self, nested: bool) -> tuple:
        start = self.pos
        seqs = [self.sequence(nested)]
        while self.peek() == "|":
            self.pos += 1
            self.space(True)
            seqs.append(self.sequence(nested))
        if len(seqs) == 1 and not seqs[0][1]:
            raise self.error("empty alternation (write \"\" for the empty string)", start)
        return ("alt", tuple(seqs)) if len(seqs) > 1 else seqs[0]

    def sequence(self, nested: bool) -> tuple:
        items = []
        while True:
            c, start = self.peek(), self.pos
            if c == '"':
                self.pos += 1
                chars = []
                while self.peek() != '"':
                    if self.peek() in ("", "\n"):
                        raise self.error("unterminated string literal", start)
                    chars.append(self.char())
                self.pos += 1
                item = ("seq", tuple(("chars", ((ch, ch),), False) for ch in chars))
            elif c == "[":
                item = self.char_class()
            elif c == ".":
                self.pos += 1
                item = ANY
            elif c == "(":
                if self.depth == MAX_NESTING:
                    raise self.error(f"parentheses are nested more than {MAX_NESTING} deep", start)
                self.pos += 1
                self.space(True)
                self.depth += 1
                item = self.alternates(nested=True)
                self.depth -= 1
                if self.peek() != ")":
                    raise self.error("unbalanced '(': expected ')'", start)
                self.pos += 1
            elif c and c.isascii() and (c.isalnum() or c in "-_"):
                item = ("ref", self.name(), start)
            else:
                return ("seq", tuple(items))
            self.space(nested)
            while self.peek() in ("*", "+", "?", "{"):
                item = self.repetition(item)
                self.space(nested)
            items.append(item)

    def repetition(self, item: tuple) -> tuple:
        c, start = self.peek(), self.pos
        self.pos += 1
        if c == "*":
            return ("rep", item, 0, None)
        if c == "+":
            return ("rep", item, 1, None)
        if c == "?":
            return ("rep", item, 0, 1)
        lo = self.integer()
        hi = lo
        if self.peek() == ",":
            self.pos += 1
            hi = self.integer()
            lo = 0 if lo is None else lo
        elif lo is None:
            raise self.error("expected a number after '{'", start)
        if self.peek() != "}":
            raise self.error("expected '}' to close the repetition", start)
        self.pos += 1
        if hi is not None and hi < lo:
            raise self.error(f"repetition {{{lo},{hi}}} has its maximum below its minimum", start)
        if max(lo, hi or 0) > MAX_REPEAT:
            raise self.error(f"repetition count {max(lo, hi or 0)} is above the limit of {MAX_REPEAT}", start)
        return ("rep", item, lo, hi)

    def integer(self) -> int | None:
        self.space(False)
        start = self.pos
        while self.peek().isdigit() and self.peek().isascii():
            self.pos += 1
        value = int(self.text[start:self.pos]) if self.pos > start else None
        self.space(False)
        return value

    def char_class(self) -> tuple:
        start = self.pos
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges = []
        while self.peek() != "]":
            if self.peek() in ("", "\n"):
                raise self.error("unterminated character class", start)
            at = self.pos
            lo = self.char()
            hi = lo
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.pos += 1
                hi = self.char()
                if hi < lo:
                    raise self.error(f"character range {chr(lo)!r}-{chr(hi)!r} is reversed", at)
            ranges.append((lo, hi))
        self.pos += 1
        return ("chars", _merge(ranges), negated)

    def char(self) -> int:
        """One character of a literal or class, escapes decoded, as a code point."""
        c = self.peek()
        if c != "\\":
            self.pos += 1
            return ord(c)
        start = self.pos
        e = self.peek(1)
        self.pos += 2
        if e in NAMED_ESCAPES:
            return ord(NAMED_ESCAPES[e])
        digits = HEX_ESCAPES.get(e)
        if digits is None:
            raise self.error(f"unknown escape '\\{e}'", start)
        h = self.text[self.pos:self.pos + digits]
        if len(h) != digits or any(ch not in "0123456789abcdefABCDEF" for ch in h):
            raise self.error(f"'\\{e}' needs {digits} hex digits", start)
        self.pos += digits
        value = int(h, 16)
        if value > 0x10FFFF:
            raise self.error(f"'\\{e}{h}' is beyond Unicode", start)
        return value


def _merge(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def parse(text: str) -> dict[str, tuple]:
    """The rules of a GBNF grammar, as syntax trees; ValueError (with line and column) for
    bad syntax or a name used but never defined."""
    if not isinstance(text, str):
        raise ValueError(f"grammar must be GBNF text (a str), got {type(text).__name__}")
    parser = _Parser(text)
    rules = parser.parse()

    def check(node):
        kind = node[0]
        if kind == "ref" and node[1] not in rules:
            raise parser.error(f"undefined rule {node[1]!r}", node[2])
        for child in (node[1] if kind in ("seq", "alt") else (node[1],) if kind == "rep" else ()):
            check(child)

    for body in rules.values():
        check(body)
    return rules


# ---- compiled form ------------------------------------------------------------------------

CHAR, REF, END = 0, 1, 2


class Program:
    """Rules flattened into one array of elements, llama.cpp style: each alternative is a
    run of CHAR / REF elements closed by END. A stack is a tuple of indices into it."""

    def __init__(self, rules: dict[str, tuple], root: str):
        if root not in rules:
            raise ValueError(f"grammar: no rule named {root!r} (the start rule)")
        self.names: list[str] = []
        self.alts: list[list[int]] = []  # rule -> start index of each alternative
        self.kind: list[int] = []
        self.arg: list[int] = []  # CHAR: charset index; REF: rule index
        self.charsets: list[tuple] = []
        self._charset_ids: dict[tuple, int] = {}
        self._ids = {name: self._new_rule(name) for name in rules}
        bodies: dict[int, list[list[tuple]]] = {}
        self.chains: list[list[int]] = []  # each bounded repetition's rules, by depth (see below)
        self._pending = deque((self._ids[n], body) for n, body in rules.items())
        self.owner = list(range(len(self.names)))  # the written rule each rule comes from
        while self._pending:  # helper rules made for groups and repetitions join the queue
            rule, body = self._pending.popleft()
            self._current = self.owner[rule]
            bodies[rule] = [self._elements(seq) for seq in (body[1] if body[0] == "alt" else (body,))]
        for rule in range(len(self.names)):
            for elements in bodies[rule]:
                self.alts[rule].append(len(self.kind))
                for kind, arg in elements:
                    self.kind.append(kind), self.arg.append(arg)
                self.kind.append(END), self.arg.append(-1)
        self.root = self._ids[root]
        self._number_repetitions()
        self._check_left_recursion()
        self._drop_dead_ends()

    def _new_rule(self, name: str) -> int:
        if hasattr(self, "owner"):
            self.owner.append(self._current)
        self.names.append(name)
        self.alts.append([])
        return len(self.names) - 1

    def _helper(self, body: tuple, what: str) -> int:
        rule = self._new_rule(f"{what}-{len(self.names)}")
        self._pending.append((rule, body))
        return rule

    def _elements(self, node: tuple) -> list[tuple[int, int]]:
        kind = node[0]
        if kind == "chars":
            key = (node[1], node[2])
            if key not in self._charset_ids:
                self._charset_ids[key] = len(self.charsets)
                self.charsets.append(key)
            return [(CHAR, self._charset_ids[key])]
        if kind == "ref":
            return [(REF, self._ids[node[1]])]
        if kind == "ref_id":  # a helper rule, by number
            return [(REF, node[1])]
        if kind == "seq":
            return [e for item in node[1] for e in self._elements(item)]
        if kind == "alt":
            return [(REF, self._helper(node, "group"))]
        _, item, lo, hi = node  # rep: lo copies, then an optional tail
        out = self._elements(item) * lo if lo else []
        if hi is None:  # R ::= item R | ""
            rule = self._new_rule(f"star-{len(self.names)}")
            self._pending.append((rule, ("alt", (("seq", (item, ("ref_id", rule))), ("seq", ())))))
            out.append((REF, rule))
        elif hi > lo:  # R1 ::= item | "";  Rk ::= item R(k-1) | ""
            inner, chain = None, []
            for _ in range(hi - lo):
                rule = self._new_rule(f"opt-{len(self.names)}")
                seq = (item,) if inner is None else (item, ("ref_id", inner))
                self._pending.append((rule, ("alt", (("seq", seq), ("seq", ())))))
                inner = rule
                chain.append(rule)
            self.chains.append(chain)
            out.append((REF, inner))
        return out

    def _number_repetitions(self) -> None:
        """Where each element of a bounded repetition's rules stands: `depth[e]` (how many
        more items Rk allows, 0 outside such rules), its chain and its offset in the
        rule's first alternative. From depth 2 on the rules of a chain are laid out alike,
        so an offset names the same place in each."""
        n = len(self.kind)
        self.depth, self.chain_of, self.offset = [0] * n, [0] * n, [0] * n
        self.chain_starts = [[self.alts[rule][0] for rule in chain] for chain in self.chains]
        for c, chain in enumerate(self.chains):
            for d, rule in enumerate(chain, 1):
                start, end = self.alts[rule]
                for e in range(start, end):
                    self.depth[e], self.chain_of[e], self.offset[e] = d, c, e - start

    def shallow(self, e: int, horizon: int) -> int:
        """Element `e`, or, in a bounded repetition that allows more than `horizon` + 1
        further items, the same place in the rule that allows `horizon` + 1. Within
        `horizon` bytes the two cannot be told apart: each item that reads a byte uses one
        repetition, and both have more left than the bytes can use."""
        d = self.depth[e]
        if d <= horizon + 1:
            return e
        return self.chain_starts[self.chain_of[e]][horizon] + self.offset[e]

    def _check_left_recursion(self) -> None:
        """A rule that can reach itself before consuming a character would expand forever.
        Linear in the grammar: nullable rules by counting (as in `_drop_dead_ends`), then the
        strongly connected parts of the "can start with" graph (Tarjan's, with a work list)."""
        n = len(self.names)
        nullable = self._nullable_rules()
        first: list[list[int]] = [[] for _ in range(n)]  # rules reachable at the start
        for r in range(n):
            for s in self.alts[r]:
                i = s
                while self.kind[i] == REF:
                    first[r].append(self.arg[i])
                    if not nullable[self.arg[i]]:
                        break
                    i += 1
        cyclic = [r for component in _components(first) for r in component
                  if len(component) > 1 or r in first[r]]
        if cyclic:
            r = min(cyclic)
            raise LeftRecursionError(
                f"grammar: rule {self.names[self.owner[r]]!r} is left-recursive (it can reach "
                f"itself without consuming a character; so does a repetition of something "
                f"that can be empty, like (\"a\"?)*)")

    def _nullable_rules(self) -> list[bool]:
        """Which rules match the empty string: an alternative of REF elements only counts the
        rules it still waits for, and is nullable when none is left."""
        waiting: list[int] = []
        owner: list[int] = []
        users: list[list[int]] = [[] for _ in self.names]
        done = deque()
        for rule, starts in enumerate(self.alts):
            for i in starts:
                count = 0
                while self.kind[i] == REF:
                    users[self.arg[i]].append(len(waiting))
                    count += 1
                    i += 1
                if self.kind[i] != END:
                    count = -1  # a character: never empty
                elif count == 0:
                    done.append(rule)
                waiting.append(count)
                owner.append(rule)
        return _settle(len(self.names), waiting, owner, users, done)

    def _drop_dead_ends(self) -> None:
        """Drop the alternatives that can never be completed: they need a character of a
        class no character is in, or a rule that matches no text. Then every prefix the
        automaton accepts can still be finished; a start rule left with no alternative is an
        error. Linear: each alternative counts the rules it still waits for."""
        empty = [_is_empty(cs) for cs in self.charsets]
        waiting: list[int] = []  # per alternative: rules not yet known to match (-1: never)
        owner: list[int] = []
        users: list[list[int]] = [[] for _ in self.names]  # rule -> alternatives that use it
        done = deque()
        for rule, starts in enumerate(self.alts):
            for i in starts:
                count, dead = 0, False
                while self.kind[i] != END:
                    if self.kind[i] == CHAR:
                        dead = dead or empty[self.arg[i]]
                    else:
                        users[self.arg[i]].append(len(waiting))
                        count += 1
                    i += 1
                if not dead and count == 0:
                    done.append(rule)
                waiting.append(-1 if dead else count)
                owner.append(rule)
        matches = _settle(len(self.names), waiting, owner, users, done)
        if not matches[self.root]:
            raise NoTextError(f"grammar: rule {self.names[self.root]!r} matches no text (every alternative "
                             f"needs a character class that no character is in, like [^\\x00-\\U0010FFFF], "
                             f"or a rule that matches no text)")
        a = 0
        for rule, starts in enumerate(self.alts):
            self.alts[rule] = [i for k, i in enumerate(starts, a) if waiting[k] == 0]
            a += len(starts)



def _settle(n: int, waiting: list[int], owner: list[int], users: list[list[int]], done: deque) -> list[bool]:
    """Which of `n` rules hold, when a rule holds once one of its alternatives waits for no
    rule (`waiting[a]`: rules alternative `a` still waits for, -1 never; `owner[a]`: its rule;
    `users[r]`: the alternatives waiting for rule `r`; `done`: rules that hold already).
    Each alternative's count goes down once per rule it uses: linear in the grammar."""
    holds = [False] * n
    while done:
        rule = done.popleft()
        if holds[rule]:
            continue
        holds[rule] = True
        for a in users[rule]:
            if waiting[a] > 0:
                waiting[a] -= 1
                if waiting[a] == 0:
                    done.append(owner[a])
    return holds


def _components(edges: list[list[int]]) -> list[list[int]]:
    """The strongly connected components of a graph (Tarjan's algorithm, iterative)."""
    index: list[int | None] = [None] * len(edges)
    low = [0] * len(edges)
    on_stack = [False] * len(edges)
    stack: list[int] = []
    out: list[list[int]] = []
    counter = 0
    for root in range(len(edges)):
        if index[root] is not None:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            if i < len(edges[v]):
                work.append((v, i + 1))
                w = edges[v][i]
                if index[w] is None:
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    component.append(w)
                    if w == v:
                        break
                out.append(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return out


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
            if not _overlaps(charset, lo, hi):
                continue
            if _overlaps((charset[0], not charset[1]), lo, hi):  # ranges are sorted (`_merge`)
                return None  # part of the range only
            takers.append(stack)
        return frozenset(takers)

    def _may_start(self, stacks: frozenset, lo: int, hi: int) -> bool:
        """Does some stack accept a character in [lo, hi]?"""
        arg, charsets = self.program.arg, self.program.charsets
        return any(stack and _overlaps(charsets[arg[stack[-1]]], lo, hi) for stack in stacks)

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


def _is_empty(charset: tuple) -> bool:
    """No character is in `charset` (surrogates are not characters: UTF-8 has none)."""
    charset = (tuple(sorted(charset[0])), charset[1])
    return not _overlaps(charset, 0, 0xD7FF) and not _overlaps(charset, 0xE000, 0x10FFFF)


def _overlaps(charset: tuple, lo: int, hi: int) -> bool:
    ranges, negated = charset
    if not negated:
        return any(a <= hi and lo <= b for a, b in ranges)
    # Negated: is some point of [lo, hi] outside every range? Walk the gaps.
    at = lo
    for a, b in ranges:
        if b < at:
            continue
        if a > at:
            return True
        at = b + 1
        if at > hi:
            return False
    return at <= hi


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


class Grammar:
    """A compiled grammar: what constrained generation is allowed to write.

        Grammar.from_gbnf('root ::= "yes" | "no"')
        Grammar.from_json_schema({"type": "object", "properties": {"age": {"type": "integer"}}})
        Grammar.from_regex(r"\\d{3}-\\d{4}")

    `gbnf` is the grammar's text (also for schemas and regular expressions, so it can be
    read, saved and given to llama.cpp). `accepts(text)` tells whether a whole text is in
    the language, `accepts_prefix(text)` whether it can still be completed. Token masks
    for a vocabulary come from `tiny_llm.constrain.TokenMatcher`.
    """

    def __init__(self, gbnf: str, root: str = "root"):
        self.gbnf = gbnf
        self.root = root
        self.program = Program(parse(gbnf), root)
        self.automaton = Automaton(self.program)
        self._matchers: dict = {}  # per token table

    def __reduce__(self):
        """Pickled as its GBNF text (and compiled again when unpickled), without the masks
        its matchers have cached: how a request's grammar reaches the other ranks."""
        return (Grammar, (self.gbnf, self.root))

    @classmethod
    def from_gbnf(cls, text: str, root: str = "root") -> Grammar:
        return cls(text, root)

    @classmethod
    def from_json_schema(cls, schema) -> Grammar:
        """A grammar for JSON text that validates against `schema` (a dict or JSON text);
        see `tiny_llm.constrain.json_schema` for what is supported."""
        from .json_schema import json_schema_to_gbnf

        try:
            return cls(json_schema_to_gbnf(schema))
        except LeftRecursionError:  # only a '$ref' can lead back without reading a character
            raise LeftRecursionError("json schema: a '$ref' leads back to a schema that holds it before any "
                                     "character of a value is read, so no JSON value ever ends") from None
        except NoTextError:
            raise NoTextError("json schema: no finite JSON value validates (every branch of a '$ref' "
                              "cycle needs another level)") from None

    @classmethod
    def from_regex(cls, pattern: str) -> Grammar:
        """A grammar for the texts `re.fullmatch(pattern, text, re.ASCII)` matches; see
        `tiny_llm.constrain.regex` for the supported syntax."""
        from .regex import regex_to_gbnf

        try:
            return cls(regex_to_gbnf(pattern))
        except NoTextError:
            raise NoTextError(f"regex: {pattern!r} matches no text") from None

    KINDS = ("grammar", "regex", "json_schema")

    @classmethod
    def from_kind(cls, kind: str, value) -> Grammar:
        """The grammar of a request's constraint by its kind: "grammar" (GBNF text), "regex"
        (a pattern) or "json_schema" (a schema: an object, a boolean or its JSON text).
        `ValueError` for an unknown kind, a value of the wrong type, or one that does not
        parse (the message does not name the field: the caller knows its own name for it)."""
        if kind not in cls.KINDS:
            raise ValueError(f"a constraint's kind is one of {', '.join(cls.KINDS)}, got {kind!r}")
        if kind == "json_schema":
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except json.JSONDecodeError as e:
                    raise ValueError(f"is not valid JSON: {e}") from None
            if not isinstance(value, dict | bool):
                raise ValueError(f"must be a JSON schema object, got {value!r}"[:300])
            return cls.from_json_schema(value)
        if not isinstance(value, str):
            raise ValueError(f"must be text, got {value!r}"[:300])
        return cls.from_gbnf(value) if kind == "grammar" else cls.from_regex(value)

    def matches_only_empty(self) -> bool:
        """Whether the empty text is the one sentence of the grammar: nothing to generate."""
        a = self.automaton
        return all(a.walk(a.start, bytes([b])) == Automaton.DEAD for b in range(256))

    def accepts(self, text: str) -> bool:
        data = text.encode(errors="surrogatepass")  # a lone surrogate is invalid UTF-8: rejected
        return self.automaton.accepting(self.automaton.walk(self.automaton.start, data))

    def accepts_prefix(self, text: str | bytes) -> bool:
        data = text.encode(errors="surrogatepass") if isinstance(text, str) else text
        return self.automaton.walk(self.automaton.start, data) != Automaton.DEAD

    def __repr__(self) -> str:
        lines = self.gbnf.strip().splitlines()
        head = lines[0] if lines else ""
        more = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
        return f"Grammar({head!r}{more})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Grammar) and (self.gbnf, self.root) == (other.gbnf, other.root)

    def __hash__(self) -> int:
        return hash((self.gbnf, self.root))
