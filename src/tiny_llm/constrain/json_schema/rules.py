r"""Engine — writing GBNF: the table of rules a schema compiles to, the shared rules every JSON
grammar draws on, and the small pieces of rule text (groups, sequences, repeats).

    rules = Rules(compact=False)
    rules.primitive("string")                      # "string" (and "char", "space", ... it uses)
    rules.add("root-name", '"\\"" char* "\\""')    # "root-name", or "root-name-2" if taken
    rules.text()                                   # root first, the others in alphabetical order

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

import re

from ..automata import JSON_CONTROL, JSON_CONTROL_BODY

HEX = "[0-9a-fA-F]"
# Shared rules: name -> (body, the shared rules the body uses).
PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "space": (r'| " " | "\n" [ \t]{0,20}', ()),
    "char": (r'[^"\x5C\x7F\x00-\x1F] | "\\" (["\x5C/bfnrt] | "u" unicode-escape)', ("unicode-escape",)),
    # A UTF-16 unit that is no surrogate, or a surrogate pair (one character).
    "unicode-escape": (f'[0-9a-cA-Ce-fE-F] {HEX}{{3}} | [dD] [0-7] {HEX}{{2}} '
                       rf'| [dD] [89abAB] {HEX}{{2}} "\\u" [dD] [c-fC-F] {HEX}{{2}}', ()),
    "string": (r'"\"" char* "\"" space', ("char", "space")),
    "integral-part": ('"0" | [1-9] [0-9]{0,15}', ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "integer": ('"-"? integral-part space', ("integral-part", "space")),
    "number": ('"-"? integral-part ("." decimal-part)? ([eE] ("+" | "-")? integral-part)? space',
               ("integral-part", "decimal-part", "space")),
    "boolean": ('("true" | "false") space', ("space",)),
    JSON_CONTROL: (JSON_CONTROL_BODY, ()),
    "null": ('"null" space', ("space",)),
    "value": ("object | array | string | number | boolean | null",
              ("object", "array", "string", "number", "boolean", "null")),
    "object": ('"{" space ( string ":" space value ( "," space string ":" space value )* )? "}" space',
               ("string", "value", "space")),
    "array": ('"[" space ( value ( "," space value )* )? "]" space', ("value", "space")),
}
COMPACT_SPACE = '| " "'  # `compact=True`: at most one blank between tokens, no newlines
NAME = re.compile(r"[a-zA-Z0-9-]+")


class Rules:
    """The rules of one grammar by name, `root` first; a rule whose body is None is being
    written (its name is taken, so rules inside it can refer to it)."""

    def __init__(self, compact: bool = False):
        self._compact = compact
        self._table: dict[str, str | None] = {"root": None}

    def primitive(self, name: str) -> str:
        """The shared rule `name` (and the shared rules it uses), added once."""
        body, deps = PRIMITIVES[name]
        body = COMPACT_SPACE if name == "space" and self._compact else body
        if name not in self._table:
            self._table[name] = body
            for dep in deps:
                self.primitive(dep)
        return name

    def add(self, name: str, body: str | None) -> str:
        """Add `name ::= body`, as `name-2`, `name-3`, ... if another rule has the name; an
        identical rule is shared. A None body holds a name for a rule being written."""
        candidate, n = name, 1
        while candidate in self._table or candidate in PRIMITIVES:
            if body is not None and self._table.get(candidate) == body:
                return candidate
            n += 1
            candidate = f"{name}-{n}"
        self._table[candidate] = body
        return candidate

    def reserve(self, name: str) -> str:
        """A name for a rule whose body comes later (`define`)."""
        return self.add(name, None)

    def define(self, name: str, body: str) -> None:
        self._table[name] = body

    def drop(self, name: str) -> None:
        del self._table[name]

    def writing(self, name: str) -> bool:
        """Whether `name` is reserved and its body not yet defined."""
        return name in self._table and self._table[name] is None

    def named(self, expression: str, name: str) -> str:
        """`expression` if it is a rule name, else a new rule `name` for it."""
        return expression if NAME.fullmatch(expression) else self.add(name, expression)

    def text(self) -> str:
        names = ["root", *sorted(n for n in self._table if n != "root")]
        return "".join(f"{name} ::= {self._table[name]}\n" for name in names)


def has_top_level_bar(expression: str) -> bool:
    """Whether `expression` has a `|` outside literals, classes and groups."""
    depth, i = 0, 0
    while i < len(expression):
        c = expression[i]
        if c in "\"[":
            close = '"' if c == '"' else "]"
            i += 1
            while expression[i] != close:
                i += 2 if expression[i] == "\\" else 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            return True
        i += 1
    return False


def group(expression: str) -> str:
    """`expression` made safe to use as one item of a sequence."""
    return f"( {expression} )" if has_top_level_bar(expression) else expression


def sequence(*items: str) -> str:
    return " ".join(i for i in items if i) or '""'


def repeat(item: str, low: int, high: int | None) -> str:
    """`item` repeated `low`..`high` times (`high` None: no limit); "" for exactly zero."""
    if high == 0:
        return ""
    if high is None:
        return f"{item}*" if low == 0 else f"{item}+" if low == 1 else f"{item}{{{low},}}"
    if (low, high) == (0, 1):
        return f"{item}?"
    if (low, high) == (1, 1):
        return item
    return f"{item}{{{low}}}" if low == high else f"{item}{{{low},{high}}}"


def slug(text: str) -> str:
    """`text` as a piece of a rule name: runs of other characters become `-`."""
    return re.sub(r"[^a-zA-Z0-9]+", "-", text).strip("-")
