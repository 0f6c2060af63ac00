"""Engine — an object schema as rules: every key named by `properties`, `required` or a
dependency gets the conjunction of every schema that applies to it (its property schema, the
`patternProperties` it matches, else `additionalProperties`, and `unevaluatedProperties`
where nothing evaluated it); other keys fall into classes by the patterns they match, each
class a key automaton with its value's conjunction. Counts (`minProperties`,
`maxProperties`) and `dependentRequired` are tracked by the rules that write the members.

    {"properties": {"name": {"type": "string"}}, "required": ["name"]}
    # root ::= "{" space root-name-kv "}" space
    # root-name-kv ::= "\\"name\\"" space ":" space string

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

import json

from ..automata import DFA, JSON_CONTROL, json_string
from ..escape import gbnf_literal
from .keywords import pointer
from .members import Values, explore, state_rules
from .part import Part, at
from .rules import Rules, group, sequence, slug
from .specs import ObjectSpec

MAX_KEY_CLASSES = 64  # classes of extra keys (by the patterns they match)


class ObjectShape:
    """The members of an object: the named keys in order, then extra pairs, written by rules
    that count what `minProperties`, `maxProperties` and `dependentRequired` need."""

    def __init__(self, rules: Rules, values: Values, leaves: list[Part], name: str, path: str):
        self.rules, self.values, self.leaves, self.name, self.path = rules, values, leaves, name, path
        self.specs = [ObjectSpec.read(leaf.schema, leaf.path) for leaf in leaves]

    def expression(self) -> str | None:
        """The object's rule body; None if no object is valid."""
        rules, leaves, name, path = self.rules, self.leaves, self.name, self.path
        named: dict[str, None] = {}
        needed: set[str] = set()
        needs: dict[str, set[str]] = {}
        low, high = 0, None
        for spec in self.specs:
            named.update(dict.fromkeys(spec.properties or ()))
            for key in spec.required:
                named.setdefault(key)
                needed.add(key)
            for key, others in spec.dependent_required.items():
                named.setdefault(key)
                named.update(dict.fromkeys(others))
                needs.setdefault(key, set()).update(others)
            low = max(low, spec.min_properties)
            top = spec.max_properties
            high = top if high is None else high if top is None else min(high, top)
        if high is not None and low > high:
            return None
        extras_said = any(spec.says_extras for spec in self.specs)
        open_ = extras_said or not any(spec.properties is not None and not self.values.made(leaf.schema)
                                       for leaf, spec in zip(leaves, self.specs))
        if not named and open_ and low == 0 and high is None and not extras_said:
            return rules.primitive("object")
        pairs = []  # (key, kv rule or None, required)
        for key in named:
            value = self._named_value(key)
            if value is None and key in needed:
                return None
            kv = None
            if value is not None:
                literal = gbnf_literal(json.dumps(key, ensure_ascii=False))
                kv = rules.add(f"{name}-{slug(key) or 'property'}-kv", f'{literal} space ":" space {value}')
            pairs.append((key, kv, key in needed))
        extra = self._extra_pair(set(named)) if open_ else None
        if low > sum(1 for _, kv, _ in pairs if kv):
            raise ValueError(f"json schema: 'minProperties' at {path} is {low}, more than the {len(pairs)} "
                             "properties the schema names (a grammar cannot keep extra keys distinct)")
        return self._members(pairs, extra, low, high, needs)

    def _named_value(self, key: str) -> str | None:
        """The rule for the value of `key`, or None if the key cannot appear."""
        values = self.values
        parts: list[Part] = []
        evaluated: list[Part] = []  # the annotating leaves that evaluate the key
        for leaf, spec in zip(self.leaves, self.specs):
            p = leaf.path
            properties = spec.properties or {}
            listed = key in properties
            if listed:
                parts.append(at(leaf, properties[key], f"{p}/properties/{pointer(key)}"))
            # Every pattern the key matches applies too, listed or not.
            matched = [(pattern, sub) for pattern, sub in spec.pattern_properties.items()
                       if values.pattern(pattern, f"{p}/patternProperties").accepts(key)]
            parts += [at(leaf, sub, f"{p}/patternProperties/{pointer(pattern)}") for pattern, sub in matched]
            if not listed and not matched and spec.additional is not None:
                parts.append(at(leaf, spec.additional, f"{p}/additionalProperties"))
            if listed or matched or spec.additional is not None:
                evaluated.append(leaf)
            if spec.property_names is not None and not values.key_names(self._names(leaf, spec)).accepts(key):
                return None
        parts += self._unevaluated(evaluated)
        return values.value(parts, f"{self.name}-{slug(key) or 'property'}", self.path)

    def _unevaluated(self, evaluated: list[Part]) -> list[Part]:
        """The `unevaluatedProperties` schemas that apply to a key the `evaluated` leaves saw."""
        out = []
        for leaf, spec in zip(self.leaves, self.specs):
            if spec.unevaluated is not None and not any(e.evaluated_by(leaf) for e in evaluated):
                out.append(at(leaf, spec.unevaluated, f"{leaf.path}/unevaluatedProperties"))
        return out

    @staticmethod
    def _names(leaf: Part, spec: ObjectSpec) -> Part:
        """The `propertyNames` schema of `leaf`, in its place."""
        return at(leaf, spec.property_names, f"{leaf.path}/propertyNames")

    def _extra_pair(self, named: set[str]) -> str | None:
        """The rule for one `"key": value` pair whose key is not named, or None if none can be."""
        rules, values, name = self.rules, self.values, self.name
        start = DFA.everything().difference(DFA.of_strings(named)) if named else DFA.everything()
        classes: list[tuple[DFA, list[Part], list[Part]]] = [(start, [], [])]  # keys, schemas, evaluators
        for leaf, spec in zip(self.leaves, self.specs):
            p = leaf.path
            if spec.property_names is not None:
                names = values.key_names(self._names(leaf, spec))
                classes = [(k.intersect(names), ps, ev) for k, ps, ev in classes]
                classes = [c for c in classes if not c[0].is_empty()]
            patterns = spec.pattern_properties
            if not patterns and spec.additional is None:
                continue
            split = []
            for keys, parts, evaluators in classes:
                pieces = [(keys, parts, evaluators, False)]
                for pattern, sub in patterns.items():
                    language = values.pattern(pattern, f"{p}/patternProperties")
                    step = []
                    for k, ps, ev, matched in pieces:
                        inside, outside = k.intersect(language), k.difference(language)
                        sub_part = at(leaf, sub, f"{p}/patternProperties/{pointer(pattern)}")
                        if not inside.is_empty():
                            step.append((inside, ps + [sub_part], ev + [leaf], True))
                        if not outside.is_empty():
                            step.append((outside, ps, ev, matched))
                    pieces = step
                for k, ps, ev, matched in pieces:
                    if not matched and spec.additional is not None:
                        ps = ps + [at(leaf, spec.additional, f"{p}/additionalProperties")]
                        ev = ev + [leaf]
                    split.append((k, ps, ev))
            classes = split
            if len(classes) > MAX_KEY_CLASSES:
                raise ValueError(f"json schema: 'patternProperties' at {p} splits the keys into more than "
                                 f"{MAX_KEY_CLASSES} classes")
        alternatives = []
        for i, (keys, parts, evaluators) in enumerate(classes):
            parts = parts + self._unevaluated(evaluators)
            label = f"{name}-additional" if len(classes) == 1 else f"{name}-additional-{i}"
            value = values.value(parts, f"{label}-value", self.path)
            if value is None:
                continue
            if not named and keys.size == 1 and keys.accepts("") and keys.edges[0] == ((0, 0x10FFFF, 0),):
                key = rules.primitive("string")
            else:
                rules.primitive(JSON_CONTROL)
                body = keys.rules(rules.reserve, rules.define, f"{label}-k", json_string)
                key = rules.add(f"{label}-key", sequence(r'"\""', body if body != '""' else "", r'"\""', "space"))
            alternatives.append(f'{key} ":" space {value}')
        if not alternatives:
            return None
        return rules.add(f"{name}-additional-kv", " | ".join(alternatives))

    def _members(self, pairs: list, extra: str | None, low: int, high: int | None,
                 needs: dict[str, set[str]]) -> str | None:
        """Rules that write the members: state (next named key, named keys written (up to
        `low`), pairs written (while `high` counts), keys written that dependencies are about,
        whether a pair came before)."""
        name = self.name
        watched = sorted({k for k in needs} | {o for others in needs.values() for o in others})
        bit = {key: 1 << i for i, key in enumerate(watched)}
        n = len(pairs)

        def satisfied(mask: int) -> bool:
            return all(not mask & bit[k] or all(mask & bit[o] for o in others) for k, others in needs.items())

        def moves(state):
            i, got, total, mask, first = state
            if i < n:
                key, kv, needed = pairs[i]
                if not needed:
                    yield None, (i + 1, got, total, mask, first)
                if kv is not None and (high is None or total < high):
                    yield kv, (i + 1, min(got + 1, low), total + 1 if high is not None else 0,
                               mask | bit.get(key, 0), False)
            elif extra is not None and (high is None or total < high):
                yield extra, (i, got, total + 1 if high is not None else 0, mask, False)

        def final(state) -> bool:
            i, got, _, mask, _ = state
            return i == n and got >= low and satisfied(mask)

        start = (0, 0, 0, 0, True)
        states = explore(start, moves, f"the object at {self.path}", "properties")
        body = state_rules(self.rules, f"{name}-members", start, states, final,
                           lambda state, kv: kv if state[4] else f'"," space {kv}')
        return None if body is None else sequence('"{" space', group(body), '"}" space')
