"""Engine — a grammar's rules compiled for matching: numbered elements, checked for left recursion and dead ends.

llama.cpp's layout: the rules are flattened into one array of elements, each alternative a
run of CHAR (a character class) and REF (a rule) elements closed by END, and a position in
the grammar is a stack of indices into that array (see `pushdown.Automaton`). Groups and
repetitions become helper rules. Compiling also refuses a rule that can reach itself
before it reads a character (matching would expand it forever) and drops the alternatives
that can never be completed, so that every prefix the automaton keeps can still be finished.

Tests: tests/test_constrain_grammar.py
"""

from __future__ import annotations

from collections import deque

from .gbnf import is_empty

CHAR, REF, END = 0, 1, 2


class NoTextError(ValueError):
    """The grammar's start rule matches no text at all."""


class LeftRecursionError(ValueError):
    """A rule can reach itself before it reads a character."""


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
        empty = [is_empty(cs) for cs in self.charsets]
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
