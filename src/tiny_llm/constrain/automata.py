r"""Engine — finite automata over code points: the regular languages a JSON schema combines.

    digits = DFA.from_regex(r"[0-9]+")
    short = DFA.from_regex(r".{0,3}")
    digits.intersect(short).accepts("123")   # True
    digits.difference(DFA.literal("7"))      # digit strings other than "7"
    DFA.from_search(r"(a+)+$").accepts("a" * 40 + "b")   # False, in one pass: no backtracking

A JSON schema's keywords about one string (a `pattern`, a `format`, lengths, the names of
properties, the values `not` excludes) each describe a regular language, and a string is valid
when it is in all of them; regular languages are closed under intersection, union and
complement, so their combination is regular again and needs no special case. A `DFA` is
deterministic: each state has at most one move per character, given as sorted, disjoint ranges
of code points `(lo, hi, target)`; a character with no range leads to an implicit dead state.
State 0 is the start.

Results are kept small: `minimized()` drops states that are unreachable or lead nowhere and
merges states with the same future (Moore's partition refinement). Every construction counts
its states and raises `TooLarge` (a ValueError) past `limits.MAX_STATES`, so a schema or a
search that would need a huge automaton gets a one-line error instead of a hang.

`rules(add_rule, name, spell)` writes the automaton as GBNF, one rule per state (`name-0 ::=
[a-z] name-1 | ...`); the grammar engine enters a rule named last in a sequence without keeping
a frame for it, so a long string costs no stack. `spell` turns a set of code points into the
GBNF items that write one of them: `plain` writes the characters themselves, `json_string`
their spelling inside a JSON string (`"` as `\"`, controls as `\n` or `\u001f`, the way
`json.dumps(..., ensure_ascii=False)` writes them), so that each string has one spelling.

Tests: tests/test_constrain_numbers.py, tests/test_constrain_regex.py
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .limits import MAX_STATES, MAX_WORK

__all__ = ["DFA", "JSON_CONTROL", "JSON_CONTROL_BODY", "TooLarge", "json_string", "plain", "reaching"]

MAX_CODE_POINT = 0x10FFFF

Edge = tuple[int, int, int]  # lo, hi (inclusive), target state


class TooLarge(ValueError):
    """A language whose automaton would pass `MAX_STATES` states, or `MAX_WORK` steps to build."""


class DFA:
    """A deterministic automaton over code points; state 0 is the start."""

    __slots__ = ("edges", "accepting", "minimal")

    def __init__(self, edges: Iterable[Iterable[Edge]], accepting: Iterable[int]):
        self.edges: list[tuple[Edge, ...]] = [tuple(e) for e in edges]
        self.accepting: frozenset[int] = frozenset(accepting)
        self.minimal = False  # set by `minimized()`: minimizing again would change nothing
        if not self.edges:
            self.edges = [()]

    # ---- making ------------------------------------------------------------------------

    @classmethod
    def empty(cls) -> DFA:
        """The automaton of no string at all."""
        return cls([()], ())

    @classmethod
    def everything(cls, lo: int = 0, hi: int = MAX_CODE_POINT) -> DFA:
        """Every string of characters in [lo, hi], the empty one included."""
        return cls([((lo, hi, 0),)], (0,))

    @classmethod
    def literal(cls, text: str) -> DFA:
        """Exactly `text`."""
        return cls([((ord(c), ord(c), i + 1),) for i, c in enumerate(text)] + [()], (len(text),))

    @classmethod
    def of_strings(cls, texts: Iterable[str]) -> DFA:
        """Exactly the given strings (a trie, minimized)."""
        edges: list[dict[int, int]] = [{}]
        accepting = set()
        for text in texts:
            state = 0
            for ch in text:
                nxt = edges[state].get(ord(ch))
                if nxt is None:
                    nxt = edges[state][ord(ch)] = len(edges)
                    edges.append({})
                state = nxt
            accepting.add(state)
        _count(len(edges))
        return cls([_merge_edges((c, c, t) for c, t in e.items()) for e in edges], accepting).minimized()

    @classmethod
    def length(cls, low: int, high: int | None) -> DFA:
        """Every string of `low`..`high` characters (`high` None: no upper limit)."""
        top = low if high is None else high
        _count(top + 1, "a length of", top)
        edges = [((0, MAX_CODE_POINT, i + 1),) for i in range(top)]
        edges.append(((0, MAX_CODE_POINT, top),) if high is None else ())
        return cls(edges, range(low, top + 1))

    @classmethod
    def from_regex(cls, pattern: str, portable: bool = False) -> DFA:
        """The strings `re.fullmatch(pattern, s, re.ASCII)` matches (the syntax of `regex.py`);
        `portable`: with the class escapes both ECMA-262 and Python's Unicode `re` agree on."""
        from .regex import parse_regex

        return _Nfa.of(parse_regex(pattern, portable)).determinized().minimized()

    @classmethod
    def from_search(cls, pattern: str, portable: bool = False) -> DFA:
        """The strings in which `pattern` finds a match, as `re.search(pattern, s, re.ASCII)`
        does in a string without newlines (`portable`: as JSON Schema reads a `pattern`): each
        top-level branch (`regex.search_branches`) with any text before it unless it starts
        with `^`, and after it unless it ends with `$`. `accepts` then answers in one pass
        over the string, without backtracking, whatever the pattern."""
        from .regex import search_branches

        language = cls.empty()
        for starts, body, ends in search_branches(pattern):
            middle = cls.from_regex(body, portable)
            if not starts:
                middle = cls.everything().concat(middle)
            if not ends:
                middle = middle.concat(cls.everything())
            language = language.union(middle)
        return language

    # ---- asking ------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return len(self.edges)

    def step(self, state: int, cp: int) -> int | None:
        for lo, hi, target in self.edges[state]:
            if lo <= cp <= hi:
                return target
            if cp < lo:
                break
        return None

    def accepts(self, text: str) -> bool:
        state: int | None = 0
        for ch in text:
            state = self.step(state, ord(ch))
            if state is None:
                return False
        return state in self.accepting

    def is_empty(self) -> bool:
        return not (self._reachable() & self.accepting)

    def finite_strings(self, limit: int) -> list[str] | None:
        """The language as a list, if it is finite and has at most `limit` strings (whose
        characters are taken one range at a time: each range must be a single character)."""
        trimmed = self.minimized()
        if trimmed.is_empty():
            return []
        out: list[str] = []
        on_path: set[int] = set()

        def walk(state: int, prefix: str) -> bool:
            if state in on_path or len(out) > limit:
                return False
            if state in trimmed.accepting:
                out.append(prefix)
            on_path.add(state)
            for lo, hi, target in trimmed.edges[state]:
                if hi - lo + 1 > limit or not all(walk(target, prefix + chr(c)) for c in range(lo, hi + 1)):
                    return False
            on_path.discard(state)
            return True

        return out if walk(0, "") and len(out) <= limit else None

    # ---- combining ---------------------------------------------------------------------

    def intersect(self, other: DFA) -> DFA:
        return _product(self, other, lambda a, b: a and b, keep_dead=False)

    def union(self, other: DFA) -> DFA:
        return _product(self, other, lambda a, b: a or b, keep_dead=True)

    def difference(self, other: DFA) -> DFA:
        return _product(self, other, lambda a, b: a and not b, keep_dead=True)

    def concat(self, other: DFA) -> DFA:
        return _Nfa.of_dfas(self, other).determinized().minimized()

    def minimized(self) -> DFA:
        """The smallest automaton of the same language (states renumbered, start 0)."""
        if self.minimal:
            return self
        live = self._reachable() & self._coreachable()
        if 0 not in live:
            empty = DFA.empty()
            empty.minimal = True
            return empty
        block = _hopcroft(self, sorted(live))
        # Renumber so that the start's block is 0, others in order of first appearance.
        number: dict[int, int] = {block[0]: 0}
        queue = [0]
        representative = {0: 0}
        while queue:
            s = queue.pop(0)
            for _, _, t in self.edges[s]:
                if t in live and block[t] not in number:
                    number[block[t]] = len(number)
                    representative[number[block[t]]] = t
                    queue.append(t)
        edges = []
        for i in range(len(number)):
            s = representative[i]
            edges.append(_merge_edges((lo, hi, number[block[t]]) for lo, hi, t in self.edges[s] if t in live))
        accepting = {number[block[s]] for s in live if s in self.accepting}
        result = DFA(edges, accepting)
        result.minimal = True
        return result

    def _reachable(self) -> set[int]:
        seen, todo = {0}, [0]
        while todo:
            for _, _, t in self.edges[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return seen

    def _coreachable(self) -> set[int]:
        return reaching({s: [t for _, _, t in edges] for s, edges in enumerate(self.edges)}, self.accepting)

    # ---- writing -----------------------------------------------------------------------

    def rules(self, reserve: Callable[[str], str], define: Callable[[str, str], None], name: str,
              spell: Callable[[tuple[tuple[int, int], ...]], list[str]]) -> str:
        """Write the automaton as GBNF, one rule per state: `reserve(name) -> rule name` picks
        a free name, `define(rule, body)` sets its body. Returns the start's rule name (`'""'`
        for the empty string alone). The language must not be empty."""
        dfa = self.minimized()
        if dfa.is_empty():
            raise ValueError("json schema: a string or number language is empty")
        if dfa.edges == [()]:
            return '""'
        names = [reserve(f"{name}-{s}") if s == 0 or edges else "" for s, edges in enumerate(dfa.edges)]
        for s, edges in enumerate(dfa.edges):
            if not names[s]:
                continue
            by_target: dict[int, list[tuple[int, int]]] = {}
            for lo, hi, t in edges:
                by_target.setdefault(t, []).append((lo, hi))
            alternatives = []
            for t, ranges in by_target.items():
                follow = names[t] if dfa.edges[t] else ""
                alternatives.extend(f"{item} {follow}".rstrip() for item in spell(tuple(ranges)))
            if s in dfa.accepting:
                alternatives.append('""')
            define(names[s], " | ".join(alternatives))
        return names[0]


def reaching(moves: Mapping[Any, Iterable[Any]], targets: Iterable[Any]) -> set:
    """The states of a graph (`moves[state]`: the states it leads to) from which one of
    `targets` can be reached, the targets included."""
    back: dict = {}
    for state, nexts in moves.items():
        for nxt in nexts:
            back.setdefault(nxt, set()).add(state)
    seen = set(targets)
    todo = list(seen)
    while todo:
        for prev in back.get(todo.pop(), ()):
            if prev not in seen:
                seen.add(prev)
                todo.append(prev)
    return seen


# ---- spelling -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def plain(ranges: tuple[tuple[int, int], ...]) -> list[str]:
    """The characters as themselves: one GBNF literal or class."""
    from .regex import format_chars

    return [format_chars(ranges)]


# The name of a shared rule for every control character as json.dumps escapes it; a grammar
# that uses `json_string` defines it with `JSON_CONTROL_BODY`.
JSON_CONTROL = "json-control"
JSON_CONTROL_BODY = r'"\\" [bfnrt] | "\\u00" ( "0" [0-7] | "0" [bef] | "1" [0-9a-f] )'
_JSON_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}


@functools.lru_cache(maxsize=4096)
def json_string(ranges: tuple[tuple[int, int], ...]) -> list[str]:
    """The characters as `json.dumps(..., ensure_ascii=False)` writes them inside a string:
    `"` and `\\` and the controls escaped, surrogates left out, everything else raw."""
    from .escape import gbnf_literal
    from .regex import format_chars

    raw = _subtract(ranges, ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0xD800, 0xDFFF)))
    items = [format_chars(raw)] if raw else []
    controls = any(lo == 0 and hi >= 0x1F for lo, hi in ranges)
    if controls:
        items.append(JSON_CONTROL)
    for lo, hi in ranges:
        for cp in range(lo, min(hi, 0x5C) + 1):
            if cp in (0x22, 0x5C) or cp < 0x20 and not controls:
                items.append(gbnf_literal(_JSON_ESCAPES.get(cp, f"\\u{cp:04x}")))
    return items


def _subtract(ranges, holes) -> tuple[tuple[int, int], ...]:
    out = []
    for lo, hi in ranges:
        pieces = [(lo, hi)]
        for a, b in holes:
            pieces = [p for x, y in pieces for p in ((x, min(y, a - 1)), (max(x, b + 1), y)) if p[0] <= p[1]]
        out.extend(pieces)
    return tuple(out)


# ---- constructions --------------------------------------------------------------------------


def _count(n: int, what: str = "", value=None) -> None:
    if n > MAX_STATES:
        detail = f" ({what} {value})" if what else ""
        raise TooLarge(f"json schema: a string or number language needs more than {MAX_STATES} "
                       f"automaton states{detail}")


def _hopcroft(dfa: DFA, states: list[int]) -> dict[int, int]:
    """Hopcroft's partition refinement of `states` (live: reachable and leading somewhere):
    each state's block, states with the same future sharing one. Moves are read on the
    intervals between every range boundary (one symbol each), and moves out of `states` go
    to one dead block."""
    live = set(states)
    cuts = sorted({lo for s in states for lo, _, _ in dfa.edges[s]}
                  | {hi + 1 for s in states for _, hi, _ in dfa.edges[s]})
    symbol = {lo: i for i, lo in enumerate(cuts)}
    dead = -1
    into: list[dict[int, list[int]]] = [{} for _ in cuts]  # symbol -> target -> sources
    for s in states:
        covered = set()
        for lo, hi, t in dfa.edges[s]:
            target = t if t in live else dead
            for a in range(symbol[lo], symbol[hi + 1]):
                into[a].setdefault(target, []).append(s)
                covered.add(a)
        for a in range(len(cuts)):
            if a not in covered:
                into[a].setdefault(dead, []).append(s)
    accepting = [s for s in states if s in dfa.accepting]
    others = [s for s in states if s not in dfa.accepting] + [dead]
    blocks: list[set[int]] = [set(accepting), set(others)] if accepting else [set(others)]
    block = {s: i for i, members in enumerate(blocks) for s in members}
    work = {(0, a) for a in range(len(cuts))}
    while work:
        splitter, a = work.pop()
        sources = {s for t in blocks[splitter] for s in into[a].get(t, ())}
        touched: dict[int, set[int]] = {}
        for s in sources:
            touched.setdefault(block[s], set()).add(s)
        for b, inside in touched.items():
            if len(inside) == len(blocks[b]):
                continue
            outside = blocks[b] - inside
            small, large = (inside, outside) if len(inside) <= len(outside) else (outside, inside)
            blocks[b] = large
            blocks.append(small)
            new = len(blocks) - 1
            for s in small:
                block[s] = new
            work.update((new, c) for c in range(len(cuts)))  # the smaller half suffices
    return {s: block[s] for s in states}


def _merge_edges(edges: Iterable[Edge]) -> tuple[Edge, ...]:
    """Sorted edges with touching ranges to the same target joined."""
    out: list[list[int]] = []
    for lo, hi, t in sorted(edges):
        if out and out[-1][2] == t and out[-1][1] + 1 == lo:
            out[-1][1] = hi
        else:
            out.append([lo, hi, t])
    return tuple(map(tuple, out))


def _product(a: DFA, b: DFA, accept: Callable[[bool, bool], bool], keep_dead: bool) -> DFA:
    """The product automaton; -1 stands for a side's dead state (kept only if `keep_dead`)."""
    ids: dict[tuple[int, int], int] = {(0, 0): 0}
    todo = [(0, 0)]
    edges: list[list[Edge]] = [[]]
    accepting = []
    while todo:
        pair = todo.pop()
        sid = ids[pair]
        i, j = pair
        if accept(i in a.accepting, j in b.accepting):
            accepting.append(sid)
        left = a.edges[i] if i >= 0 else ()
        right = b.edges[j] if j >= 0 else ()
        if keep_dead:
            left, right = _complete(left), _complete(right)
        for lo, hi, ti, tj in _overlay(left, right):
            if (ti, tj) == (-1, -1):
                continue
            key = (ti, tj)
            if key not in ids:
                ids[key] = len(edges)
                edges.append([])
                todo.append(key)
                _count(len(edges))
            edges[sid].append((lo, hi, ids[key]))
    return DFA([_merge_edges(e) for e in edges], accepting).minimized()


def _complete(edges: tuple[Edge, ...]) -> list[Edge]:
    """`edges` with the gaps filled by moves to the dead state -1."""
    out, at = [], 0
    for lo, hi, t in edges:
        if lo > at:
            out.append((at, lo - 1, -1))
        out.append((lo, hi, t))
        at = hi + 1
    if at <= MAX_CODE_POINT:
        out.append((at, MAX_CODE_POINT, -1))
    return out


def _overlay(left: Iterable[Edge], right: Iterable[Edge]):
    """The ranges both sides move on, with each side's target."""
    left, right = list(left), list(right)
    i = j = 0
    while i < len(left) and j < len(right):
        lo = max(left[i][0], right[j][0])
        hi = min(left[i][1], right[j][1])
        if lo <= hi:
            yield lo, hi, left[i][2], right[j][2]
        if left[i][1] < right[j][1]:
            i += 1
        else:
            j += 1


class _Nfa:
    """Thompson's construction: states with character moves and empty moves."""

    def __init__(self):
        self.moves: list[list[Edge]] = []
        self.empty: list[list[int]] = []
        self.work = 0  # NFA states visited while determinizing, against MAX_WORK

    def state(self) -> int:
        self.moves.append([])
        self.empty.append([])
        _count(len(self.moves) // 2)
        return len(self.moves) - 1

    @classmethod
    def of(cls, node) -> _Nfa:
        nfa = cls()
        start, end = nfa.state(), nfa.state()
        nfa.build(node, start, end)
        nfa.start, nfa.end = start, end
        return nfa

    @classmethod
    def of_dfas(cls, *dfas: DFA) -> _Nfa:
        nfa = cls()
        nfa.start = at = nfa.state()
        for dfa in dfas:
            offset = len(nfa.moves)
            for _ in range(dfa.size):
                nfa.state()
            nfa.empty[at].append(offset)
            nfa.end = end = nfa.state()
            for s, edges in enumerate(dfa.edges):
                nfa.moves[offset + s] = [(lo, hi, offset + t) for lo, hi, t in edges]
                if s in dfa.accepting:
                    nfa.empty[offset + s].append(end)
            at = end
        return nfa

    def build(self, node, start: int, end: int) -> None:
        from .regex import Alt, Chars, Repeat, Seq

        if isinstance(node, Chars):
            self.moves[start].extend((lo, hi, end) for lo, hi in node.ranges)
        elif isinstance(node, Seq):
            at = start
            for item in node.items:
                nxt = self.state()
                self.build(item, at, nxt)
                at = nxt
            self.empty[at].append(end)
        elif isinstance(node, Alt):
            for option in node.options:
                self.build(option, start, end)
        else:
            assert isinstance(node, Repeat)
            at = start
            for _ in range(node.lo):
                nxt = self.state()
                self.build(node.body, at, nxt)
                at = nxt
            if node.hi is None:
                loop = self.state()
                self.empty[at].append(loop)
                back = self.state()
                self.build(node.body, loop, back)
                self.empty[back].append(loop)
                self.empty[loop].append(end)
            else:
                for _ in range(node.hi - node.lo):
                    self.empty[at].append(end)
                    nxt = self.state()
                    self.build(node.body, at, nxt)
                    at = nxt
                self.empty[at].append(end)

    def closure(self, states: Iterable[int]) -> frozenset[int]:
        seen = set(states)
        todo = list(seen)
        self.work += len(seen)
        if self.work > MAX_WORK:
            raise TooLarge(f"json schema: a string language needs more than {MAX_WORK} steps to turn into "
                           "an automaton (a long counted repetition inside an unanchored pattern?)")
        while todo:
            for t in self.empty[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)

    def determinized(self) -> DFA:
        first = self.closure([self.start])
        ids = {first: 0}
        todo = [first]
        edges: list[list[Edge]] = [[]]
        accepting = []
        while todo:
            current = todo.pop()
            sid = ids[current]
            if self.end in current:
                accepting.append(sid)
            moves = [m for s in current for m in self.moves[s]]
            cuts = sorted({lo for lo, _, _ in moves} | {hi + 1 for _, hi, _ in moves})
            for lo, nxt in zip(cuts, cuts[1:]):
                targets = self.closure(t for a, b, t in moves if a <= lo and nxt - 1 <= b)
                if not targets:
                    continue
                if targets not in ids:
                    ids[targets] = len(edges)
                    edges.append([])
                    todo.append(targets)
                    _count(len(edges))
                edges[sid].append((lo, nxt - 1, ids[targets]))
        return DFA([_merge_edges(e) for e in edges], accepting)
