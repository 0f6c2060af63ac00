"""Engine — GBNF text: read into syntax trees, written back, and rules renamed for composing.

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

`parse` reads text into one syntax tree per rule; `write` turns trees back into text that
`parse` reads as the same rules, so a grammar made of trees (`Grammar.union`,
`Grammar.concat`) still has a text to show, save or send; `renamed` prefixes every rule
name, so that the rules of two grammars can live in one.

Tests: tests/test_constrain_grammar.py
"""

from __future__ import annotations

from collections.abc import Mapping

from .escape import HEX_ESCAPES, NAMED_ESCAPES, gbnf_class_char, gbnf_literal
from .limits import MAX_NESTING, MAX_REPEAT

# ---- syntax tree --------------------------------------------------------------------------
# ("chars", ranges, negated)   ranges: tuple of (lo, hi) code points, inclusive
# ("ref", name, pos)           a rule name, with its offset in the source for errors
# ("seq", items)               items one after another ("seq", ()) is the empty string
# ("alt", seqs)                one of the alternatives
# ("rep", item, lo, hi)        item repeated lo..hi times; hi None = no limit

ANY = ("chars", (), True)


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
        negated = self.peek(1) == "^"
        self.pos += 2 if negated else 1  # past "[" or "[^"
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


# ---- character classes --------------------------------------------------------------------
# A class's charset is (ranges, negated), as in its "chars" node.


def is_empty(charset: tuple) -> bool:
    """No character is in `charset` (surrogates are not characters: UTF-8 has none)."""
    charset = (tuple(sorted(charset[0])), charset[1])
    return not overlaps(charset, 0, 0xD7FF) and not overlaps(charset, 0xE000, 0x10FFFF)


def overlaps(charset: tuple, lo: int, hi: int) -> bool:
    """Does `charset` hold some character of [lo, hi]?"""
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


# ---- writing and renaming -----------------------------------------------------------------


def write(rules: Mapping[str, tuple]) -> str:
    """GBNF text of `rules`, a rule a line, that `parse` reads back as the same rules (an
    empty sequence of its own is written `""`, which compiles alike)."""
    return "".join(f"{name} ::= {_alternatives(body)}\n" for name, body in rules.items())


def _alternatives(node: tuple) -> str:
    return " | ".join(_sequence(seq) for seq in (node[1] if node[0] == "alt" else (node,)))


def _sequence(node: tuple) -> str:
    if node[0] != "seq":
        return _item(node)
    return " ".join(_item(item) for item in node[1]) or '""'


def _item(node: tuple) -> str:
    kind = node[0]
    if kind == "ref":
        return node[1]
    if kind == "chars":
        if node == ANY:
            return "."
        ranges = "".join(gbnf_class_char(chr(lo)) + (f"-{gbnf_class_char(chr(hi))}" if hi > lo else "")
                         for lo, hi in node[1])
        return f"[{'^' if node[2] else ''}{ranges}]"
    if kind == "seq":
        if all(_is_char(item) for item in node[1]):  # a string literal (or "", the empty string)
            return gbnf_literal("".join(chr(item[1][0][0]) for item in node[1]))
        return f"({_sequence(node)})"
    if kind == "alt":
        return f"({_alternatives(node)})"
    _, item, lo, hi = node  # rep
    count = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((lo, hi))
    if count is None:
        count = f"{{{lo}}}" if lo == hi else f"{{{lo},}}" if hi is None else f"{{{lo},{hi}}}"
    return _item(item) + count


def _is_char(node: tuple) -> bool:
    """One character, as a string literal holds it."""
    return node[0] == "chars" and not node[2] and len(node[1]) == 1 and node[1][0][0] == node[1][0][1]


def renamed(rules: Mapping[str, tuple], prefix: str) -> dict[str, tuple]:
    """`rules` with `prefix` before every rule name, where it is defined and where it is
    used: rules renamed with different prefixes never collide."""

    def walk(node: tuple) -> tuple:
        kind = node[0]
        if kind == "ref":
            return ("ref", prefix + node[1], node[2])
        if kind in ("seq", "alt"):
            return (kind, tuple(walk(child) for child in node[1]))
        if kind == "rep":
            return ("rep", walk(node[1]), node[2], node[3])
        return node

    return {prefix + name: walk(body) for name, body in rules.items()}
