r"""Engine — GBNF escapes: the ones gbnf.py reads, and the writers of literals and classes.

The parser (`gbnf.py`) reads, after a backslash in a string literal or a character class, one
of `n r t \ " [ ] - ^ /` or a hex escape `\xHH`, `\uHHHH`, `\UHHHHHHHH` (a code point). The
converters (`regex.py`, `json_schema/`) write their literals and classes with the two
functions below, so what they write is read back as exactly the characters they meant:

    gbnf_literal('say "hi"\n')   # '"say \\"hi\\"\\n"'
    gbnf_class_char("-")         # '\\x2D'

Only escapes that llama.cpp reads too are written (`\" \\ \n \r \t` and the hex ones), so the
text can be given to llama.cpp as it is.

Tests: tests/test_constrain_grammar.py
"""

from __future__ import annotations

__all__ = ["HEX_ESCAPES", "NAMED_ESCAPES", "gbnf_class_char", "gbnf_literal"]

# The character after a backslash -> the character the escape stands for.
NAMED_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-",
                 "^": "^", "/": "/"}
# The letter after a backslash -> how many hex digits of a code point follow.
HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}

# Written by name in a literal: `"` (it would end the literal), `\` (it starts an escape), and
# newline, carriage return and tab (a raw newline is refused; none of the three is printable).
_LITERAL_NAMED = {NAMED_ESCAPES[e]: "\\" + e for e in 'nrt\\"'}
# In a class, `\` starts an escape, `]` ends the class, `^` first negates it and `-` between
# two characters makes a range; written as hex wherever they stand.
_CLASS_SPECIALS = "\\]^-"


def _hex(cp: int) -> str:
    if cp <= 0xFF:
        return f"\\x{cp:02X}"
    if cp <= 0xFFFF:
        return f"\\u{cp:04X}"
    return f"\\U{cp:08X}"


def gbnf_literal(text: str) -> str:
    """`text` as a GBNF string literal, quotes included, that matches exactly `text`.

    `"` and `\\` are escaped, newline, carriage return and tab are written `\\n \\r \\t`, other
    characters that are not printable (controls, separators such as U+2028, lone surrogates)
    as hex escapes, and the rest as themselves."""
    out = []
    for ch in text:
        named = _LITERAL_NAMED.get(ch)
        out.append(named or (ch if ch.isprintable() else _hex(ord(ch))))
    return '"' + "".join(out) + '"'


def gbnf_class_char(char: str) -> str:
    """One character as an item of a GBNF class `[...]`, that stands for exactly `char`
    wherever in the class it is written: `\\ ] ^ -` and characters that are not printable
    as hex escapes, the rest as themselves."""
    if not isinstance(char, str) or len(char) != 1:
        raise ValueError(f"gbnf_class_char: char must be a str of one character, got {char!r}")
    return _hex(ord(char)) if char in _CLASS_SPECIALS or not char.isprintable() else char
