"""Engine — what the object and array shapes share: the few things they ask of the compiler
(`Values`), and the little automaton over their members that counts what their keywords need
(`explore` its states, `state_rules` writes one rule per state).

    states = explore(start, moves, "the array at #", "items")
    body = state_rules(rules, "root-items", start, states, final, write)

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ..automata import DFA, reaching
from .part import Part
from .rules import Rules, sequence

MAX_MEMBER_STATES = 5000  # states of the rules that write an object's or an array's members


class Values(Protocol):
    """What a shape asks of the compiler about the schemas of its members."""

    def value(self, parts: list[Part], name: str, path: str) -> str | None:
        """The rule (or expression) for the values valid under every part (any value if
        there are none); None if no value is."""

    def negation(self, part: Part) -> Part:
        """A part for the values `part` rejects, at its place."""

    def finite_values(self, parts: list[Part]) -> list | None:
        """Every value valid under every part, if they are few; None if they are not."""

    def pattern(self, pattern: Any, path: str) -> DFA:
        """The strings in which the `pattern` at `path` finds a match."""

    def key_names(self, names: Part) -> DFA:
        """The keys a `propertyNames` schema (`names`, in its place) allows."""

    def made(self, schema: Any) -> bool:
        """Whether the compiler made `schema` (it is no schema of the document)."""


def explore(start, moves: Callable[[Any], Iterable[tuple[Any, Any]]], what: str, counted: str) -> dict:
    """Every state reachable from `start`, with its moves (`moves(state)` yields (item,
    next state) pairs); ValueError past MAX_MEMBER_STATES."""
    states, order, seen = {}, [start], {start}
    while order:
        state = order.pop()
        states[state] = list(moves(state))
        for _, nxt in states[state]:
            if nxt not in seen:
                seen.add(nxt)
                order.append(nxt)
                if len(seen) > MAX_MEMBER_STATES:
                    raise ValueError(f"json schema: {what} needs more than {MAX_MEMBER_STATES} states to count "
                                     f"its {counted}")
    return states


def live(states: dict, final: Callable[[Any], bool]) -> set:
    """The states from which a final state can be reached."""
    return reaching({s: [nxt for _, nxt in moves] for s, moves in states.items()}, [s for s in states if final(s)])


def state_rules(rules: Rules, name: str, start, states: dict, final: Callable[[Any], bool],
                write: Callable[[Any, str], str]) -> str | None:
    """Rules for a little automaton over members: `states` maps a state to its moves (item or
    None for an empty move, next state); `final(state)` says whether the members may end
    there, `write(state, item)` spells an item written from a state (its comma). One rule per
    state that can still end; the start's body is returned (None if it cannot end)."""
    alive = live(states, final)
    if start not in alive:
        return None
    names: dict = {}
    order = [start]
    bodies: dict = {}
    while order:
        state = order.pop(0)
        options = []
        for item, nxt in states[state]:
            if nxt not in alive:
                continue
            head = "" if item is None else write(state, item)
            follow = ""
            if states[nxt] and any(n in alive for _, n in states[nxt]):
                if nxt not in names:
                    names[nxt] = rules.reserve(f"{name}-{len(names) + 1}")
                    order.append(nxt)
                follow = names[nxt]
            options.append(sequence(head, follow))
        if final(state):
            options.append('""')
        bodies[state] = " | ".join(dict.fromkeys(options))
    for state, rule in names.items():
        rules.define(rule, bodies[state])
    return bodies[start] if start not in names else names[start]
