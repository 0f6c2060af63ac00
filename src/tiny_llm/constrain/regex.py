r"""Engine — regular expressions to GBNF: one grammar expression with the regex's full-match language.

    regex_to_gbnf_expression(r"\d{3}-[a-z]+")   # '[0-9]{3} "-" [a-z]+'
    regex_to_gbnf(r"\d{3}-[a-z]+")              # 'root ::= [0-9]{3} "-" [a-z]+\n'
    search_branches(r"^ab|c$")                  # [(True, "ab", False), (False, "c", True)]: a search's branches

The grammar built from `pattern` accepts exactly the strings `s` for which
`re.fullmatch(pattern, s, re.ASCII)` matches. Supported (Python `re` syntax): literal characters;
escaped metacharacters (any escaped character that is not an ASCII letter or digit is itself);
`\a \f \n \r \t \v`, `\0` and octal `\ooo`, `\xHH`, `\uHHHH`, `\UHHHHHHHH`, `\N{name}`;
`\d \D \w \W \s \S`; `.`; classes `[...]` and `[^...]` with ranges and class escapes (`]` first
and `-` first or last are literal, `\b` is a backspace); groups `( )`, `(?: )`, `(?P<name> )`;
alternation, with empty alternatives; `* + ? {m} {m,} {,n} {m,n}` and their lazy forms (a `{`
that starts no quantifier is a literal, as in Python); `^` first and `$` last.

The pattern is parsed into a small tree, simplified, and printed as a GBNF expression:

- Every single-character construct (a literal, an escape, `.`, `\d`, `[...]`, `[^...]`) becomes an
  exact set of code-point ranges over 0..0x10FFFF. Class escapes use ASCII semantics
  (`\d` = [0-9], `\w` = [A-Za-z0-9_], `\s` = [ \t\n\r\f\v]; `\D`, `\W`, `\S` are their complements),
  and `.` is every character except `\n`. So `[^\W\d]` or `[\Wa]` need no special case: a set
  holding one code point prints as a literal `"x"`, any other as a positive class `[...]` or a
  negated class `[^...]`, whichever is shorter. The empty set (`[^\s\S]`) prints as
  `[^\x00-\U0010FFFF]`, a class no character matches, so its language stays exact.
- Adjacent literals merge into one string (`abc` -> `"abc"`), groups and alternatives become
  `( ... | ... )`, and alternatives that are single characters merge into one class
  (`a|b|c` -> `[a-c]`).
- Quantifiers `* + ? {m} {m,} {m,n}` (and `{,n}` = `{0,n}`) map to the same GBNF quantifiers; lazy
  forms match the same strings, so they map to the greedy ones. A repeated body that can match the
  empty string is first rewritten to its non-empty part (`(a|)*` -> `"a"*`, `(a?){2,3}` ->
  `"a"{0,3}`): the language is unchanged and the grammar has no repetition of an empty match.
- Under full-match semantics `^` at the very start and `$` at the very end change nothing, so they
  are dropped; anywhere else they raise.
- Literals and classes are written by `escape.gbnf_literal` and `escape.gbnf_class_char`, as for
  JSON schemas: a literal escapes `"` and `\` and writes `\n \r \t` by name, a class writes
  `\ ] ^ -` as `\xHH`, characters that are not printable (controls, separators such as U+2028,
  lone surrogates) become `\xHH`, `\uHHHH` or `\UHHHHHHHH`, and the others appear as themselves.

Constructs with no GBNF counterpart (backreferences, lookarounds, `\b \B \A \Z`, inline flags,
possessive quantifiers, atomic and conditional groups, comment groups, `\p{..}`) raise
`ValueError` naming the construct and its 0-based position in the pattern, as does a malformed
pattern (the cases where `re.compile` raises).

Over 600 lines because Python's regex syntax is large: the parser (`_Parser`), the tree's
simplification and the GBNF printer are one pipeline over one node type, and a search's
branches (`search_branches`) reuse the parser's tree.

Tests: tests/test_constrain_regex.py, tests/test_constrain_grammar.py
"""

from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass

from .escape import gbnf_class_char, gbnf_literal
from .limits import MAX_NESTING, MAX_REPEAT

__all__ = ["format_chars", "parse_regex", "regex_to_gbnf", "regex_to_gbnf_expression", "search_branches"]

MAX_CODE_POINT = 0x10FFFF

Ranges = tuple[tuple[int, int], ...]


def _normalize(ranges: list[tuple[int, int]] | Ranges) -> Ranges:
    """Sorted, disjoint, non-adjacent ranges covering the same code points."""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def _complement(ranges: Ranges) -> Ranges:
    """The code points in 0..MAX_CODE_POINT that are not in the (normalized) `ranges`."""
    gaps: list[tuple[int, int]] = []
    start = 0
    for lo, hi in ranges:
        if lo > start:
            gaps.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        gaps.append((start, MAX_CODE_POINT))
    return tuple(gaps)


DIGIT: Ranges = ((0x30, 0x39),)
WORD: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
SPACE: Ranges = ((0x09, 0x0D), (0x20, 0x20))
CLASS_ESCAPES: dict[str, Ranges] = {
    "d": DIGIT, "D": _complement(DIGIT),
    "w": WORD, "W": _complement(WORD),
    "s": SPACE, "S": _complement(SPACE),
}
ANY_BUT_NEWLINE: Ranges = _complement(((0x0A, 0x0A),))


# Class escapes and `.` that mean the same under ECMA-262 (JSON Schema's regexes) and Python's
# Unicode `re` (what validators written in Python use): where the two differ, the characters
# both agree on. `\d \w \s` are their ASCII sets (in both), `\D \W \S` leave out what either
# counts as a digit, word character or space, and `.` leaves out every line terminator of
# either (`\n \r` U+2028 U+2029).
PORTABLE_DOT: Ranges = _complement(((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)))
_ECMA_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
               (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]


@functools.cache
def portable_escape(letter: str) -> Ranges:
    """The portable meaning of the class escape `\<letter>` (see above)."""
    if letter in "dws":
        return CLASS_ESCAPES[letter]
    test = {"D": str.isdecimal, "W": lambda ch: ch.isalnum() or ch == "_", "S": str.isspace}[letter]
    points = [(cp, cp) for cp in range(MAX_CODE_POINT + 1) if test(chr(cp))]
    points += list(CLASS_ESCAPES[letter.lower()]) + (_ECMA_SPACE if letter == "S" else [])
    return _complement(_normalize(points))
CHAR_ESCAPES = {"a": 0x07, "f": 0x0C, "n": 0x0A, "r": 0x0D, "t": 0x09, "v": 0x0B}
HEX_DIGITS = "0123456789abcdefABCDEF"
OCT_DIGITS = "01234567"
DIGITS = "0123456789"
INLINE_FLAGS = "aiLmsux-"


# ---------------------------------------------------------------------------------------------
# The tree: character sets, sequences, alternations and repetitions.


@dataclass(frozen=True)
class Chars:
    """One character from a set of code points (normalized ranges; empty matches nothing)."""

    ranges: Ranges


@dataclass(frozen=True)
class Seq:
    """Concatenation; no items is the empty string."""

    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    """Alternation of two or more options."""

    options: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    """`body` repeated lo..hi times (hi None: unbounded); `body` never matches the empty string."""

    body: Node
    lo: int
    hi: int | None


Node = Chars | Seq | Alt | Repeat
EMPTY = Seq(())


def _char(cp: int) -> Chars:
    return Chars(((cp, cp),))


def _point(ranges: Ranges) -> int | None:
    """The code point if `ranges` holds exactly one, else None."""
    return ranges[0][0] if len(ranges) == 1 and ranges[0][0] == ranges[0][1] else None


def _single(node: Node) -> int | None:
    """The code point of a one-character literal, else None."""
    return _point(node.ranges) if isinstance(node, Chars) else None


def _seq(items: list[Node] | tuple[Node, ...]) -> Node:
    flat: list[Node] = []
    for item in items:
        flat.extend(item.items if isinstance(item, Seq) else (item,))
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def _alt(options: list[Node]) -> Node:
    """Alternation with nested alternations flattened, character sets merged into the first one,
    and duplicate options dropped."""
    flat: list[Node] = []
    for option in options:
        flat.extend(option.options if isinstance(option, Alt) else (option,))
    union = Chars(_normalize([r for option in flat if isinstance(option, Chars) for r in option.ranges]))
    # Every set becomes the union; dropping duplicates keeps it where the first set stood.
    unique = list(dict.fromkeys(union if isinstance(option, Chars) else option for option in flat))
    return unique[0] if len(unique) == 1 else Alt(tuple(unique))


def _nullable(node: Node) -> bool:
    """Whether `node` matches the empty string."""
    if isinstance(node, Chars):
        return False
    if isinstance(node, Seq):
        return all(_nullable(item) for item in node.items)
    if isinstance(node, Alt):
        return any(_nullable(option) for option in node.options)
    return node.lo == 0


def _without_empty(node: Node) -> Node | None:
    """A node matching what `node` matches except the empty string (None: nothing is left)."""
    if not _nullable(node):
        return node
    if isinstance(node, Seq):
        # A non-empty match has a first non-empty part: items before it matched the empty string.
        options = []
        for i, item in enumerate(node.items):
            head = _without_empty(item)
            if head is not None:
                options.append(_seq((head, *node.items[i + 1:])))
        return _alt(options) if options else None
    if isinstance(node, Alt):
        options = [rest for rest in map(_without_empty, node.options) if rest is not None]
        return _alt(options) if options else None
    assert isinstance(node, Repeat)
    return _repeat(node.body, 1, node.hi)


def _repeat(body: Node, lo: int, hi: int | None) -> Node:
    """`body{lo,hi}`. A body matching the empty string is replaced by its non-empty part with lo
    = 0: k non-empty matches, padded with empty ones, cover every count from lo to hi."""
    if _nullable(body):
        rest = _without_empty(body)
        if rest is None:
            return EMPTY
        body, lo = rest, 0
    if hi == 0:
        return EMPTY
    if lo == hi == 1:
        return body
    if isinstance(body, Repeat) and body.lo == 1 and body.hi is None:
        return Repeat(body.body, lo, None)  # (x+){lo,hi} = x{lo,}: any count splits into lo..hi runs
    return Repeat(body, lo, hi)


# ---------------------------------------------------------------------------------------------
# Parsing (Python `re` syntax).


class _Parser:
    def __init__(self, pattern: str, portable: bool = False):
        self.pattern = pattern
        self.portable = portable
        self.pos = 0
        self.group_names: set[str] = set()
        self.depth = 0  # groups open around the current position

    def error(self, message: str, pos: int) -> ValueError:
        return ValueError(f"regex: {message} (position {pos} in {self.pattern!r})")

    def peek(self, offset: int = 0) -> str | None:
        i = self.pos + offset
        return self.pattern[i] if i < len(self.pattern) else None

    def take_while(self, allowed: str, limit: int | None = None) -> str:
        start = self.pos
        while self.pos < len(self.pattern) and self.pattern[self.pos] in allowed:
            if limit is not None and self.pos - start == limit:
                break
            self.pos += 1
        return self.pattern[start:self.pos]

    def parse(self) -> Node:
        if self.peek() == "^":
            self.pos += 1
        node = self.parse_alternation()
        if self.pos < len(self.pattern):  # parse_alternation stops only at the end or a ")"
            raise self.error("unbalanced parenthesis", self.pos)
        return node

    def parse_alternation(self) -> Node:
        options = [self.parse_sequence()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.parse_sequence())
        return _alt(options)

    def parse_sequence(self) -> Node:
        items: list[Node] = []
        repeated = False  # whether the last item already carries a quantifier
        while (c := self.peek()) is not None and c not in "|)":
            start = self.pos
            bounds = self.parse_quantifier() if c in "*+?{" else None
            if bounds is not None:
                if not items:
                    raise self.error("nothing to repeat", start)
                if repeated:
                    raise self.error("multiple repeat", start)
                if self.peek() == "?":  # lazy: same strings
                    self.pos += 1
                elif self.peek() == "+":
                    raise self.error("possessive quantifiers are not supported", start)
                items[-1] = _repeat(items[-1], *bounds)
                repeated = True
            elif c == "$" and start == len(self.pattern) - 1:
                self.pos += 1  # `$` at the very end: a no-op under full-match semantics
            else:
                items.append(self.parse_atom())
                repeated = False
        return _seq(items)

    def parse_quantifier(self) -> tuple[int, int | None] | None:
        """Bounds of the quantifier at `pos` (consumed), or None for a `{` that is a literal."""
        start = self.pos
        c = self.pattern[start]
        self.pos += 1
        if c != "{":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        if self.peek() == "}":
            self.pos = start
            return None
        lo = hi = self.take_while(DIGITS)
        if self.peek() == ",":
            self.pos += 1
            hi = self.take_while(DIGITS)
        if self.peek() != "}":
            self.pos = start
            return None
        self.pos += 1
        low = int(lo) if lo else 0
        high = int(hi) if hi else None
        if max(low, high or 0) > MAX_REPEAT:
            raise self.error(f"repetition count {max(low, high or 0)} is above the limit of {MAX_REPEAT}", start)
        if high is not None and high < low:
            raise self.error("min repeat greater than max repeat", start)
        return low, high

    def parse_atom(self) -> Node:
        start = self.pos
        c = self.pattern[start]
        if c == "(":
            return self.parse_group()
        if c == "[":
            return Chars(self.parse_class())
        if c == "\\":
            return Chars(self.parse_escape(in_class=False))
        if c == ".":
            self.pos += 1
            return Chars(PORTABLE_DOT if self.portable else ANY_BUT_NEWLINE)
        if c == "^":
            raise self.error("'^' anchors are not supported except at the start of the pattern", start)
        if c == "$":
            raise self.error("'$' anchors are not supported except at the end of the pattern", start)
        self.pos += 1
        return _char(ord(c))

    def parse_group(self) -> Node:
        start = self.pos
        if self.depth == MAX_NESTING:
            raise self.error(f"groups are nested more than {MAX_NESTING} deep", start)
        self.pos += 1
        if self.peek() == "?":
            self.parse_extension(start)
        self.depth += 1
        node = self.parse_alternation()
        self.depth -= 1
        if self.peek() != ")":
            raise self.error("missing ), unterminated subpattern", start)
        self.pos += 1
        return node

    def parse_extension(self, start: int) -> None:
        """Consume the `?...` after a `(`, accepting only `(?:` and `(?P<name>`."""
        self.pos += 1
        c = self.peek()
        self.pos += 1
        if c is None:
            raise self.error("unexpected end of pattern", start)
        if c == ":":
            return
        if c == "P" and self.peek() == "<":
            self.pos += 1
            self.parse_group_name(start)
            return
        if c == "P" and self.peek() == "=":
            raise self.error("backreferences are not supported", start)
        if c in ("=", "!") or (c == "<" and self.peek() in ("=", "!")):
            raise self.error("lookaround assertions are not supported", start)
        unsupported = {"#": "comment groups", "(": "conditional groups", ">": "atomic groups"}
        if c in unsupported:
            raise self.error(f"{unsupported[c]} are not supported", start)
        if c in INLINE_FLAGS:
            raise self.error("inline flags are not supported", start)
        raise self.error(f"unknown extension ?{c}", start)

    def parse_group_name(self, start: int) -> None:
        end = self.pattern.find(">", self.pos)
        if end < 0:
            raise self.error("missing >, unterminated name", start)
        name = self.pattern[self.pos:end]
        if not name.isidentifier():
            raise self.error(f"bad character in group name {name!r}", start)
        if name in self.group_names:
            raise self.error(f"redefinition of group name {name!r}", start)
        self.group_names.add(name)
        self.pos = end + 1

    def parse_class(self) -> Ranges:
        """The code points of the `[...]` at `pos`."""
        start = self.pos
        self.pos += 1
        negate = self.peek() == "^"
        if negate:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.peek()
            if c is None:
                raise self.error("unterminated character set", start)
            if c == "]" and not first:
                self.pos += 1
                break
            first = False
            item_start = self.pos
            item = self.parse_class_item()
            if self.peek() == "-" and self.peek(1) == "]":  # a "-" before the "]" is literal
                ranges.extend((*item, (0x2D, 0x2D)))
                self.pos += 2
                break
            if self.peek() == "-" and self.peek(1) is not None:
                self.pos += 1
                low, high = _point(item), _point(self.parse_class_item())
                if low is None or high is None or high < low:
                    raise self.error("bad character range", item_start)
                ranges.append((low, high))
            else:
                ranges.extend(item)
        normalized = _normalize(ranges)
        return _complement(normalized) if negate else normalized

    def parse_class_item(self) -> Ranges:
        c = self.peek()
        if c is None:
            raise self.error("unterminated character set", self.pos)
        if c == "\\":
            return self.parse_escape(in_class=True)
        self.pos += 1
        return ((ord(c), ord(c)),)

    def parse_escape(self, in_class: bool) -> Ranges:
        """The code points of the escape at `pos` (a single one unless it is a class escape)."""
        start = self.pos
        c = self.peek(1)
        if c is None:
            raise self.error("trailing backslash", start)
        self.pos += 2
        if c in CLASS_ESCAPES:
            return portable_escape(c) if self.portable else CLASS_ESCAPES[c]
        if c in CHAR_ESCAPES or (c == "b" and in_class):
            cp = CHAR_ESCAPES.get(c, 0x08)
        elif c in "bB" and not in_class:
            raise self.error("word boundaries (\\b, \\B) are not supported", start)
        elif c in "AZ" and not in_class:
            raise self.error("string anchors (\\A, \\Z) are not supported", start)
        elif c in "xuU":
            cp = self.parse_hex(c, start)
        elif c == "N":
            cp = self.parse_named(start)
        elif c in DIGITS:
            cp = self.parse_numeric(c, in_class, start)
        elif c in "pP":
            raise self.error("Unicode property escapes (\\p, \\P) are not supported", start)
        elif c.isascii() and c.isalpha():
            raise self.error(f"bad escape \\{c}", start)
        else:
            cp = ord(c)
        return ((cp, cp),)

    def parse_hex(self, kind: str, start: int) -> int:
        count = {"x": 2, "u": 4, "U": 8}[kind]
        digits = self.take_while(HEX_DIGITS, count)
        if len(digits) != count:
            raise self.error(f"incomplete escape \\{kind}{digits}", start)
        cp = int(digits, 16)
        if cp > MAX_CODE_POINT:
            raise self.error(f"bad escape \\{kind}{digits}", start)
        return cp

    def parse_named(self, start: int) -> int:
        end = self.pattern.find("}", self.pos)
        if self.peek() != "{" or end < 0:
            raise self.error("bad \\N escape, expected \\N{name}", start)
        name = self.pattern[self.pos + 1:end]
        try:
            cp = ord(unicodedata.lookup(name))
        except KeyError:
            raise self.error(f"undefined character name {name!r}", start) from None
        self.pos = end + 1
        return cp

    def parse_numeric(self, first: str, in_class: bool, start: int) -> int:
        """`\\0`, octal `\\ooo`, or (outside a class) a group reference, as Python reads them."""
        if first == "0":
            return int(self.take_while(OCT_DIGITS, 2) or "0", 8)
        if in_class:
            if first not in OCT_DIGITS:
                raise self.error(f"bad escape \\{first}", start)
            digits = first + self.take_while(OCT_DIGITS, 2)
        else:
            following = self.pattern[self.pos:self.pos + 2]
            if not (first in OCT_DIGITS and len(following) == 2 and all(d in OCT_DIGITS for d in following)):
                raise self.error("backreferences are not supported", start)
            self.pos += 2
            digits = first + following
        if int(digits, 8) > 0o377:
            raise self.error(f"octal escape value \\{digits} outside of range 0-0o377", start)
        return int(digits, 8)


# ---------------------------------------------------------------------------------------------
# Printing GBNF.


def _class_body(ranges: Ranges) -> str:
    parts = []
    for lo, hi in ranges:
        first, last = gbnf_class_char(chr(lo)), gbnf_class_char(chr(hi))
        parts.append(first if lo == hi else first + last if hi == lo + 1 else f"{first}-{last}")
    return "".join(parts)


def format_chars(ranges: Ranges) -> str:
    """A one-character literal, or the shorter of the positive and the negated class."""
    cp = _point(ranges)
    if cp is not None:
        return gbnf_literal(chr(cp))
    complement = _complement(ranges)
    if not complement:
        return f"[{_class_body(ranges)}]"
    negated = f"[^{_class_body(complement)}]"
    if not ranges:
        return negated
    positive = f"[{_class_body(ranges)}]"
    return positive if len(positive) <= len(negated) else negated


def _format(node: Node) -> str:
    """The node as a GBNF expression (an alternation at the top level needs no parentheses)."""
    if isinstance(node, Alt):
        return " | ".join(_format_sequence(option) for option in node.options)
    return _format_sequence(node)


def _format_sequence(node: Node) -> str:
    items = node.items if isinstance(node, Seq) else (node,)
    if not items:
        return '""'
    parts: list[str] = []
    run: list[str] = []  # consecutive one-character literals, printed as one string
    for item in items:
        cp = _single(item)
        if cp is not None:
            run.append(chr(cp))
            continue
        if run:
            parts.append(gbnf_literal("".join(run)))
            run = []
        parts.append(_format_item(item))
    if run:
        parts.append(gbnf_literal("".join(run)))
    return " ".join(parts)


def _format_item(node: Node) -> str:
    """One element of a sequence."""
    if isinstance(node, Repeat):
        return _format_atom(node.body) + _quantifier(node.lo, node.hi)
    return _format_atom(node)


def _format_atom(node: Node) -> str:
    """The node as one GBNF element that a quantifier can follow."""
    if isinstance(node, Chars):
        return format_chars(node.ranges)
    if isinstance(node, Seq) and all(_single(item) is not None for item in node.items):
        return _format_sequence(node)
    return f"({_format(node)})"


def _quantifier(lo: int, hi: int | None) -> str:
    named = {(0, None): "*", (1, None): "+", (0, 1): "?"}
    if (lo, hi) in named:
        return named[(lo, hi)]
    if hi is None:
        return f"{{{lo},}}"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


# ---------------------------------------------------------------------------------------------


def regex_to_gbnf_expression(pattern: str) -> str:
    """One GBNF expression whose language is `{s : re.fullmatch(pattern, s, re.ASCII)}`.

    Raises ValueError for a pattern that is not a str, is malformed, or uses a construct GBNF
    cannot express (the message names it and its position)."""
    return _format(parse_regex(pattern))


def parse_regex(pattern: str, portable: bool = False) -> Node:
    """The simplified tree of `pattern` (for building automata, `automata.DFA.from_regex`);
    `portable`: class escapes and `.` as `portable_escape` and `PORTABLE_DOT` have them (JSON
    Schema's patterns)."""
    if not isinstance(pattern, str):
        raise ValueError(f"regex: pattern must be a str, got {type(pattern).__name__}")
    return _Parser(pattern, portable).parse()


def regex_to_gbnf(pattern: str) -> str:
    """A whole grammar (rule `root`) for the full-match language of `pattern`."""
    return f"root ::= {regex_to_gbnf_expression(pattern)}\n"


def search_branches(pattern: str) -> list[tuple[bool, str, bool]]:
    """`pattern` as a search reads it (`re.search`, a JSON Schema `pattern`): split at the `|`
    outside groups and classes, each branch as (anchored at the start by a leading `^`, the
    branch without its anchors, anchored at the end by a trailing `$` that is not escaped).
    The branches themselves are not checked here: `parse_regex` does that."""
    branches, depth, start, i, in_class = [], 0, 0, 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            i += 1
            if pattern[i:i + 1] == "^":
                i += 1
            if pattern[i:i + 1] == "]":  # a ']' first in a class is itself
                i += 1
            continue
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            branches.append(pattern[start:i])
            start = i + 1
        i += 1
    branches.append(pattern[start:])
    out = []
    for branch in branches:
        starts = branch.startswith("^")
        backslashes = len(branch) - 1 - len(branch[:-1].rstrip("\\"))
        ends = branch.endswith("$") and backslashes % 2 == 0
        out.append((starts, branch[1 if starts else 0:len(branch) - 1 if ends else len(branch)], ends))
    return out
