"""Engine — an array schema as rules: each position gets its `prefixItems`/`items`
conjunction; `contains` counts matching items (exactly where its complement can be written),
`uniqueItems` holds when items come from a few values, and `unevaluatedItems` applies where
nothing evaluated an item.

    {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}}
    # root ::= "[" space ( string ( "," space integer )* )? "]" space

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

from ..escape import gbnf_literal
from .facts import MAX_UNIQUE_VALUES
from .members import Values, explore, state_rules
from .part import Part, at
from .rules import Rules, group, repeat, sequence
from .specs import ArraySpec, ContainsSpec
from .values import canonical_number, compact_text, kind_of

MAX_CONTAINS = 4  # `contains` clauses that apply to one array (each doubles an item's alternatives)


class ArrayShape:
    """The items of an array: each position's conjunction, and the rules that count what
    `minItems`, `maxItems`, `contains` and `uniqueItems` need."""

    def __init__(self, rules: Rules, values: Values, leaves: list[Part], name: str, path: str):
        self.rules, self.values, self.leaves, self.name, self.path = rules, values, leaves, name, path
        self.specs = [ArraySpec.read(leaf.schema, leaf.path) for leaf in leaves]

    def expression(self) -> str | None:
        """The array's rule body; None if no array is valid."""
        leaves, specs, path = self.leaves, self.specs, self.path
        low, high = 0, None
        for spec in specs:
            low = max(low, spec.min_items)
            top = spec.max_items
            high = top if high is None else high if top is None else min(high, top)
        if high is not None and low > high:
            return None
        prefix_length = max([len(spec.prefix_items or ()) for spec in specs] or [0])
        clauses = []  # (contains part, low, high, leaf)
        for leaf in leaves:
            contains = ContainsSpec.read(leaf.schema, leaf.path)
            if contains is None or contains.low == 0 and contains.high is None:
                continue
            clauses.append((at(leaf, contains.schema, f"{leaf.path}/contains"), contains.low, contains.high, leaf))
        unique = any(spec.unique for spec in specs) and (high is None or high > 1)
        unevaluated = [(l, spec.unevaluated) for l, spec in zip(leaves, specs) if spec.unevaluated is not None]
        if not any(spec.items is not None or spec.prefix_items is not None for spec in specs) and not (
                clauses or unique or unevaluated) and low == 0 and high is None:
            return self.rules.primitive("array")
        if len(clauses) > MAX_CONTAINS:
            raise ValueError(f"json schema: 'contains' at {path}: more than {MAX_CONTAINS} of them apply to "
                             "one array")
        positions = max(prefix_length, low, high if high is not None else 0) if high is not None else max(
            prefix_length, low)
        if unique and clauses:
            raise ValueError(f"json schema: 'uniqueItems' next to 'contains' at {path} is not supported")
        if not clauses and not unique and not unevaluated:
            return self._simple(prefix_length, low, high)
        return self._counted(prefix_length, positions, low, high, clauses, unique, unevaluated)

    def _position_parts(self, i: int) -> tuple[list[Part], list[Part]]:
        """The schemas for the item at position `i`, and the leaves that evaluate it there."""
        parts, evaluators = [], []
        for leaf, spec in zip(self.leaves, self.specs):
            prefix = spec.prefix_items or ()
            if i < len(prefix):
                parts.append(at(leaf, prefix[i], f"{leaf.path}/prefixItems/{i}"))
                evaluators.append(leaf)
            elif spec.items is not None:
                parts.append(at(leaf, spec.items, f"{leaf.path}/items"))
                evaluators.append(leaf)
        return parts, evaluators

    def _item(self, parts: list[Part], label: str) -> str | None:
        return self.values.value(parts, label, self.path)

    def _simple(self, prefix_length: int, low: int, high: int | None) -> str | None:
        rules = []
        for i in range(prefix_length if high is None else min(prefix_length, high)):
            rule = self._item(self._position_parts(i)[0], f"{self.name}-tuple-{i}")
            if rule is None:
                high = i
                break
            rules.append(rule)
        if high is not None and low > high:
            return None
        more = high is None or high > len(rules)
        item = self._item(self._position_parts(len(rules))[0], f"{self.name}-item") if more else None
        if item is None and more:
            if low > len(rules):
                return None
            high = len(rules)
        return sequence('"[" space', array_elements(rules, item, low, high), '"]" space')

    def _counted(self, prefix_length, positions, low, high, clauses, unique, unevaluated) -> str | None:
        name = self.name
        negations = [self.values.negation(part) if c_high is not None else None for part, _, c_high, _ in clauses]
        caps = [c_high + 1 if c_high is not None else c_low for _, c_low, c_high, _ in clauses]
        alternatives_at: dict[int, list[tuple[str, tuple[int, ...], str | None]]] = {}  # position -> (rule, adds, text)

        def alternatives(i: int):
            if i in alternatives_at:
                return alternatives_at[i]
            base, evaluators = self._position_parts(i)
            label = f"{name}-tuple-{i}" if i < prefix_length else f"{name}-item"
            out = []
            for subset in range(1 << len(clauses)):
                parts = list(base)
                adds = tuple((subset >> j) & 1 for j in range(len(clauses)))
                for j, (part, _, _, _) in enumerate(clauses):
                    if adds[j]:
                        parts.append(part)
                    elif negations[j] is not None:
                        parts.append(negations[j])
                for leaf, schema in unevaluated:
                    seen_here = any(e.evaluated_by(leaf) for e in evaluators)
                    counted = any(adds[j] and c[3].evaluated_by(leaf) for j, c in enumerate(clauses))
                    if not seen_here and not counted:
                        parts.append(at(leaf, schema, f"{leaf.path}/unevaluatedItems"))
                if unique:
                    for text in self._finite_texts(parts):
                        out.append((gbnf_literal(text) + " space", adds, text))
                    continue
                rule = self._item(parts, label if not clauses else f"{label}-{subset}")
                if rule is not None:
                    out.append((rule, adds, None))
            alternatives_at[i] = out
            return out

        texts: dict[str, int] = {}

        def moves(state):
            i, counts, used = state
            if high is not None and i >= high:
                return
            for rule, adds, text in alternatives(min(i, positions)):
                bit = 0
                if text is not None:
                    bit = 1 << texts.setdefault(text, len(texts))
                    if used & bit:
                        continue
                new_counts = tuple(min(c + a, cap) for c, a, cap in zip(counts, adds, caps))
                if any(c_high is not None and c > c_high for c, (_, _, c_high, _) in zip(new_counts, clauses)):
                    continue
                # Past every position that differs, one state (but past the first: a comma).
                yield rule, (i + 1 if high is not None else min(i + 1, max(positions, 1)), new_counts, used | bit)

        start = (0, (0,) * len(clauses), 0)
        states = explore(start, moves, f"the array at {self.path}", "items")

        def final(state) -> bool:
            i, counts, _ = state
            return i >= low and all(c >= c_low for c, (_, c_low, _, _) in zip(counts, clauses))

        body = state_rules(self.rules, f"{name}-items", start, states, final,
                           lambda state, item: item if state[0] == 0 else f'"," space {item}')
        return None if body is None else sequence('"[" space', group(body), '"]" space')

    def _finite_texts(self, parts: list[Part]) -> list[str]:
        """The texts of the few values an item may take (`uniqueItems` keeps them apart)."""
        values = self.values.finite_values(parts)
        if values is None or len(values) > MAX_UNIQUE_VALUES:
            raise ValueError(f"json schema: 'uniqueItems' at {self.path}: the items can take more than "
                             f"{MAX_UNIQUE_VALUES} values, and a grammar cannot keep unboundedly many apart")
        return [compact_text(v, self.path) if kind_of(v) != "number" else canonical_number(v) for v in values]


def array_elements(prefix: list[str], item: str | None, low: int, high: int | None) -> str:
    """Elements: the `prefix` rules one by one, then `item` repeated, `low`..`high` in all."""
    def from_index(i: int) -> str:
        if high is not None and i >= high:
            return ""
        comma = '"," space ' if i else ""
        if i < len(prefix):
            body = sequence(f"{comma}{prefix[i]}", from_index(i + 1))
            return body if i < low else f"( {body} )?"
        if item is None:
            return ""
        need = max(low - i, 0)
        room = None if high is None else high - i
        if i > 0:
            return repeat(f'( "," space {item} )', need, room)
        rest = repeat(f'( "," space {item} )', max(need - 1, 0), None if room is None else room - 1)
        body = sequence(item, rest)
        return body if need else f"( {body} )?"

    return from_index(0)
