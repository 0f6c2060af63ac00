"""GBNF parsing and writing, composed grammars, the byte-level matcher, and token masks against brute force."""

import contextlib
import functools
import itertools
import json
import pickle
import sys

import numpy as np
import pytest

from tiny_llm.constrain import Grammar, TokenMatcher, TokenTable
from tiny_llm.constrain.escape import gbnf_class_char, gbnf_literal
from tiny_llm.constrain.gbnf import parse, write
from tiny_llm.constrain.grammar import SourceError
from tiny_llm.constrain.json_schema import json_schema_to_gbnf
from tiny_llm.constrain.program import Program
from tiny_llm.constrain.pushdown import Automaton
from tiny_llm.constrain.regex import regex_to_gbnf

JSONISH = r"""
# a small JSON: objects, arrays, strings, integers
root   ::= value
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws (
             string ":" ws value ("," ws string ":" ws value)*
           )? "}" ws
array  ::= "[" ws (value ("," ws value)*)? "]" ws
string ::= "\"" ([^"\\\x00-\x1F] | "\\" ["\\/bfnrt])* "\"" ws
number ::= "-"? ([0-9] | [1-9] [0-9]*) ws
ws     ::= | " " | "\n" [ \t]{0,4}
"""


@pytest.mark.parametrize("text, expected", [
    ('{"a": [1, -20, "x\\n"], "b": {}}', True),
    ("[true,false,null]", True),
    ('{\n  "k": "é中😀"}', True),
    ("[01]", False),  # 0 then 1: no separator
    ('{"a" 1}', False),
    ("[1,]", False),
    ('"\\q"', False),
    ('"\x01"', False),
    ("{\n" + " " * 5 + '"a": 1}', False),  # at most 4 blanks after a newline
    ("", False),
])
def test_gbnf_json_like_grammar(text, expected):
    assert Grammar.from_gbnf(JSONISH).accepts(text) == expected


@pytest.mark.parametrize("gbnf, yes, no", [
    (r'root ::= "a"{2,3} "b"{2} "c"{1,} "d"{,2}', ["aabbc", "aaabbcccdd"], ["abbc", "aaaabbc", "aabbbc", "aabb", "aabbcddd"]),
    (r"root ::= [^a-c\x5D]+", ["d]".replace("]", ""), "xyz", "é"], ["a", "]", "dc", ""]),
    (r"root ::= . . .", ["abc", "é中😀", "\n\n\n"], ["ab", "abcd"]),
    (r'root ::= "\x41\u00e9\U0001F600\t\"\\"', ['Aé😀\t"\\'], ["A"]),
    (r"root ::= [-a] [a-]", ["--", "aa", "-a"], ["b-"]),
    ("root ::= a b\na ::= \"x\" | \"\"\nb ::= \"y\"   # trailing comment\n", ["xy", "y"], ["x", ""]),
    ("root ::= (\"a\"\n  | \"b\")\n\n   # comment line\n", ["a", "b"], ["ab"]),
    ('root ::= "a" |\n  "b"', ["a", "b"], [""]),
    ('root ::= "(" root ")" root | ""', ["", "()", "(())()"], ["(", "())", ")("]),
    ('root ::= ""', [""], ["a"]),
])
def test_gbnf_constructs(gbnf, yes, no):
    g = Grammar.from_gbnf(gbnf)
    assert [g.accepts(t) for t in yes] == [True] * len(yes)
    assert [g.accepts(t) for t in no] == [False] * len(no)


@pytest.mark.parametrize("gbnf, message", [
    ("root ::= foo", r"undefined rule 'foo' at line 1, column 10"),
    ('root ::= "a"\nx ::= "b" bar\n', r"undefined rule 'bar' at line 2, column 11"),
    ('root ::= ("a" "b"', r"unbalanced '\(': expected '\)' at line 1, column 10"),
    ('root ::= "a")', r"unbalanced '\)' at line 1, column 13"),
    ('root ::= "a" | ("b"\n', r"unbalanced '\('.* at line 1, column 16"),
    ("root ::= \n", r"empty alternation .* at line 2, column 1"),
    ("root ::= ()", r"empty alternation .* at line 1, column 11"),
    ('root ::= "a"\nroot ::= "b"', r"rule 'root' is defined twice at line 2, column 1"),
    ('root ::= "abc', r"unterminated string literal at line 1, column 10"),
    ("root ::= [a-", r"unterminated character class at line 1, column 10"),
    ("root ::= [z-a]", r"character range 'z'-'a' is reversed at line 1, column 11"),
    (r'root ::= "\q"', r"unknown escape '\\q' at line 1, column 11"),
    (r'root ::= "\x4"', r"'\\x' needs 2 hex digits at line 1, column 11"),
    ('root ::= "a"{3,1}', r"maximum below its minimum at line 1, column 13"),
    ('root ::= "a"{2', r"expected '}' .* at line 1, column 13"),
    ('root ::= "a"{0,1000000}', r"repetition count 1000000 is above the limit of 10000 at line 1, column 13"),
    ('root ::= "a"{4000000000}', r"repetition count 4000000000 is above the limit of 10000 at line 1, column 13"),
    ('root ::= "a" @', r"unexpected '@' at line 1, column 14"),
    ('root "a"', r"expected '::=' after rule name 'root' at line 1, column 6"),
    ("::= x", r"expected a rule name, found ':' at line 1, column 1"),
    ("# only a comment\n", r"the grammar has no rules"),
    ('start ::= "a"', r"no rule named 'root'"),
    ('root ::= root "a" | "b"', r"rule 'root' is left-recursive"),
    ('root ::= x\nx ::= "a"? root', r"rule '(root|x)' is left-recursive"),
    ('root ::= ("a"?)*', r"rule 'root' is left-recursive"),
    (r"root ::= [^\x00-\U0010FFFF]", r"rule 'root' matches no text"),
    ('root ::= "a" x\nx ::= "b" x', r"rule 'root' matches no text"),  # x never ends
])
def test_gbnf_errors(gbnf, message):
    with pytest.raises(ValueError, match=message):
        Grammar.from_gbnf(gbnf)


def test_parentheses_nest_at_most_100_deep():
    """Deeper nesting used to end in RecursionError; 100 levels still compile."""
    assert Grammar.from_gbnf("root ::= " + "(" * 100 + '"a"' + ")" * 100).accepts("a")
    for depth in (101, 600):
        with pytest.raises(ValueError, match=r"parentheses are nested more than 100 deep at line 1, column 110"):
            Grammar.from_gbnf("root ::= " + "(" * depth + '"a"' + ")" * depth)


def test_the_largest_allowed_repetition_compiles_and_counts_exactly():
    """`{0,10000}`, the limit, builds 10,000 helper rules and matches exactly up to 10,000."""
    grammar = Grammar.from_gbnf('root ::= "a"{0,10000}')
    assert grammar.accepts("a" * 10000) and grammar.accepts("")
    assert not grammar.accepts("a" * 10001)


def test_alternatives_that_cannot_be_completed_are_dropped():
    """A prefix is accepted only if some text completes it: an alternative that needs an
    empty class or a rule without an end is never entered, so sampling cannot dead-end in it."""
    g = Grammar.from_gbnf('root ::= "a" x | "a" y | "b"\nx ::= "c" x\ny ::= [^\\x00-\\U0010FFFF]')
    assert g.accepts("b") and not g.accepts_prefix("a") and not g.accepts_prefix("ac")
    g = Grammar.from_gbnf('root ::= "a" x | "b"\nx ::= "c" x | "d"')  # x ends: kept
    assert g.accepts("acccd") and g.accepts_prefix("acc")


def test_a_grammar_of_only_the_empty_text_says_so():
    assert Grammar.from_gbnf('root ::= ""').matches_only_empty()
    assert Grammar.from_regex("").matches_only_empty() and Grammar.from_regex("(|)").matches_only_empty()
    assert not Grammar.from_gbnf('root ::= "" | "a"').matches_only_empty()
    assert not Grammar.from_gbnf('root ::= "é"').matches_only_empty()  # its first byte is not ASCII


def test_gbnf_needs_text():
    with pytest.raises(ValueError, match="GBNF text"):
        Grammar.from_gbnf(b'root ::= "a"')


def test_grammar_other_root_and_equality():
    g = Grammar.from_gbnf('start ::= "x"', root="start")
    assert g.accepts("x") and not g.accepts("")
    assert g == Grammar.from_gbnf('start ::= "x"', root="start") and hash(g) == hash(Grammar('start ::= "x"', "start"))
    assert g != Grammar.from_gbnf('root ::= "x"')


def compiled(rules: dict, root: str = "root") -> tuple:
    program = Program(rules, root)
    return program.names, program.alts, program.kind, program.arg, program.charsets


@pytest.mark.parametrize("text", [
    JSONISH, 'root ::= "a"{2,3} "b"{2} "c"{1,} "d"{,2} [^a-c\\x5D]+ . [-a] ("x" | [\\u2028])*',
    'root ::= "" | ("a" "b") ("" | "c")?\nx ::= "\\"#\\x00\\U0001F600" [\\]\\-^]', json_schema_to_gbnf(True),
    json_schema_to_gbnf({"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}}}, compact=True),
    regex_to_gbnf(r"(ab|c)*?x{2,5}|[^\]\-\\]+|é\u2028\x00"),
], ids=range(6))
def test_written_gbnf_reads_back_as_the_same_rules(text):
    """`write` is what gives a composed grammar its text: read back, it compiles to the same
    elements, and writing that gives the same text."""
    rules = parse(text)
    written = write(rules)
    assert compiled(parse(written)) == compiled(rules)
    assert write(parse(written)) == written


def test_written_gbnf_is_plain_to_read():
    assert write(parse(JSONISH)).splitlines()[5:] == [
        'number ::= "-"? ([0-9] | [1-9] [0-9]*) ws', 'ws ::= "" | " " | "\\n" [\\x09 ]{0,4}']


# Two grammars with the same rule names, whose literals and classes hold those names too.
PART_A = 'root ::= "x" x?\nx ::= [r-t] root'
PART_B = 'root ::= x "root"\nx ::= "x" | ""'


def test_union_and_concat_compose_the_languages():
    a, b = reference(PART_A), reference(PART_B)
    union = Grammar.union(Grammar.from_gbnf(PART_A), Grammar.from_gbnf(PART_B))
    concat = Grammar.concat(Grammar.from_gbnf(PART_A), Grammar.from_gbnf(PART_B))
    texts = list(strings("xrot", 6))
    assert [union.accepts(t) for t in texts] == [a(t) or b(t) for t in texts]
    assert [concat.accepts(t) for t in texts] == [any(a(t[:i]) and b(t[i:]) for i in range(len(t) + 1))
                                                  for t in texts]
    assert union.accepts("xrx") and union.accepts("root") and concat.accepts("xxroot") and concat.accepts("xsxroot")
    assert not union.accepts("xrootx") and not concat.accepts("x")


def test_composed_grammars_keep_their_parts_apart_and_their_text():
    """Parts are renamed on their rules (a literal "x" stays "x"), composition never reads
    GBNF text, and a composed grammar's written text is the same grammar (how it is pickled
    for the other ranks)."""
    a, b = Grammar.from_gbnf(PART_A), Grammar.from_gbnf(PART_B)
    framed = Grammar.concat(Grammar.literal("<"), Grammar.union(a, b), Grammar.literal('"\\>'))
    assert framed.gbnf.splitlines()[:4] == [
        'root ::= g0-root g1-root g2-root', 'g0-root ::= "<"', 'g1-root ::= g1-g0-root | g1-g1-root',
        'g1-g0-root ::= "x" g1-g0-x?']
    assert 'g1-g1-root ::= g1-g1-x "root"' in framed.gbnf and 'g2-root ::= "\\"\\\\>"' in framed.gbnf
    assert framed.accepts('<xsx"\\>') and framed.accepts('<root"\\>') and not framed.accepts("<x")
    again = pickle.loads(pickle.dumps(framed))
    assert again == framed and again.accepts('<xsx"\\>') and compiled(again.rules) == compiled(framed.rules)
    one = Grammar.union(a)
    assert [one.accepts(t) for t in strings("xrot", 4)] == [a.accepts(t) for t in strings("xrot", 4)]
    assert Grammar.literal("").matches_only_empty() and Grammar.literal("é中").accepts("é中")


def test_composing_never_reads_text(monkeypatch):
    a, b = Grammar.from_gbnf(PART_A), Grammar.from_gbnf(PART_B)

    def no_parse(text):
        raise AssertionError("parsed GBNF text")

    monkeypatch.setattr("tiny_llm.constrain.grammar.parse", no_parse)
    assert Grammar.concat(Grammar.union(a, b), Grammar.literal("!")).accepts("root!")


@pytest.mark.parametrize("make, message", [
    (lambda: Grammar.union(), r"^Grammar\.union takes one or more grammars, got \(\)$"),
    (lambda: Grammar.concat(Grammar.literal("a"), 'root ::= "b"'), r"^Grammar\.concat takes one or more grammars"),
    (lambda: Grammar.literal(b"a"), r"^Grammar\.literal: text must be a str, got b'a'$"),
])
def test_composing_takes_grammars(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_schemas_json_text_is_read_once(monkeypatch):
    """The converter is handed the value `Grammar` read, never the text."""
    import tiny_llm.constrain.json_schema as converter

    given = []
    convert = converter.json_schema_to_gbnf
    monkeypatch.setattr(converter, "json_schema_to_gbnf", lambda schema, **kw: given.append(schema) or
                        convert(schema, **kw))
    assert Grammar.from_json_schema('{"type": "integer"}').accepts("12")
    assert Grammar.from_kind("json_schema", '{"enum": [1]}').accepts("1")
    assert given == [{"type": "integer"}, {"enum": [1]}]


@pytest.mark.parametrize("kind, value, what", [
    ("grammar", 5, "must be text, got 5"),
    ("regex", None, "must be text, got None"),
    ("json_schema", [1], "must be a JSON schema object, got [1]"),
    ("json_schema", "{x", "is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 "
                          "(char 1)"),
    ("json_schema", "[" * 100_000, "is JSON nested too deeply to read (the limit for a schema is 100 levels)"),
])
def test_a_value_that_is_no_source_says_so_of_itself(kind, value, what):
    """`what` reads after the caller's name for the value (`json_schema is not valid JSON`)."""
    with pytest.raises(SourceError) as e:
        Grammar.from_kind(kind, value)
    assert e.value.what == what
    assert str(e.value) == f"{'json schema' if kind == 'json_schema' else kind} {what}"


def test_only_a_schema_is_compact():
    assert Grammar.from_kind("json_schema", {"type": "array"}, compact=True).accepts("[1, 2]")
    assert not Grammar.from_kind("json_schema", {"type": "array"}, compact=True).accepts("[1,\n2]")
    with pytest.raises(ValueError, match="^compact is for a json_schema, not a regex$"):
        Grammar.from_kind("regex", "a", compact=True)


# ---- writing GBNF: the escapes of the converters, read back by the parser -----------------
# Every ASCII code point (so `"`, `\`, `]`, `-`, `^`, newline, tab and CR among them), and
# characters of 2, 3 and 4 UTF-8 bytes, printable or not (NEL, no-break space, the Arabic letter
# mark, U+2028, a BOM, a private-use character, U+FFFF, a tag character, the last code point).
ESCAPED = [chr(cp) for cp in range(128)] + [
    "é", "中", "😀", "\x85", "\xa0", "\u061c", "\u2028", "\ufeff", "\ue000", "\uffff", "\U000e0001",
    "\U0010ffff"]
TRICKY = ["", "\\n", '\\"', '"\\', "\\x41", "\\u00e9", '""', "#", 'a" | "b', "[^a]", "é中😀\u2028"]


def accepted(grammar: Grammar, texts) -> list[str]:
    return [t for t in texts if grammar.accepts(t)]


def test_an_escaped_literal_matches_exactly_its_text():
    for ch in ESCAPED:
        g = Grammar.from_gbnf(f"root ::= {gbnf_literal(ch)}")
        assert accepted(g, ESCAPED) == [ch], repr(ch)
        assert accepted(g, ["", ch * 2]) == [], repr(ch)
    for text in ["".join(ESCAPED), *TRICKY]:
        g = Grammar.from_gbnf(f"root ::= {gbnf_literal(text)}")
        assert g.accepts(text), repr(text)
        assert accepted(g, {text[:-1], text[1:], text + "a", "a" + text} - {text}) == [], repr(text)


def test_an_escaped_class_character_matches_exactly_that_character():
    a, z = gbnf_class_char("a"), gbnf_class_char("z")
    for ch in ESCAPED:
        item = gbnf_class_char(ch)
        assert accepted(Grammar.from_gbnf(f"root ::= [{item}]"), ESCAPED) == [ch], repr(ch)
        assert accepted(Grammar.from_gbnf(f"root ::= [^{item}]"), ESCAPED) == [c for c in ESCAPED if c != ch]
        between = Grammar.from_gbnf(f"root ::= [{a}{item}{z}]")  # a `-` here must not make a range
        assert accepted(between, ESCAPED) == [c for c in ESCAPED if c in {"a", ch, "z"}], repr(ch)
        assert accepted(Grammar.from_gbnf(f"root ::= [{item}-{item}]"), ESCAPED) == [ch], repr(ch)
        assert accepted(Grammar.from_gbnf(f"root ::= [{item}]"), ["", ch * 2]) == [], repr(ch)


def test_escapes_are_read_back_as_the_code_points_written():
    """Lone surrogates too, which `accepts` cannot see (they are not UTF-8)."""
    text = "a\ud800\udfff\\\"\n"
    chars = tuple(("chars", ((ord(c), ord(c)),), False) for c in text)
    assert parse(f"root ::= {gbnf_literal(text)}")["root"] == ("seq", (("seq", chars),))
    surrogate = ("chars", ((0xDC00, 0xDC00),), False)
    assert parse(f"root ::= [{gbnf_class_char(chr(0xDC00))}]")["root"] == ("seq", (surrogate,))


def test_escaped_text_is_exact():
    assert gbnf_literal('a"\\\n\r\t\x00\x7f\x85\u2028\ud800 é中😀\U0010ffff') == (
        r'"a\"\\\n\r\t\x00\x7F\x85\u2028\uD800 é中😀\U0010FFFF"')
    assert gbnf_literal("") == '""'
    assert [gbnf_class_char(c) for c in '\\]^-["# a\n\x7f\u2028😀'] == [
        r"\x5C", r"\x5D", r"\x5E", r"\x2D", "[", '"', "#", " ", "a", r"\x0A", r"\x7F", r"\u2028", "😀"]


@pytest.mark.parametrize("char", ["", "ab", 97])
def test_a_class_character_is_one_character(char):
    with pytest.raises(ValueError, match=f"gbnf_class_char: char must be a str of one character, got {char!r}"):
        gbnf_class_char(char)


# ---- the matcher against brute force ------------------------------------------------------
# An independent reference: backtracking over the syntax tree (no stacks, no automaton).

def reference(gbnf: str):
    rules = parse(gbnf)

    def ends(node, text: str, i: int) -> frozenset:
        kind = node[0]
        if kind == "chars":
            ok = i < len(text) and any(lo <= ord(text[i]) <= hi for lo, hi in node[1]) != node[2]
            return frozenset({i + 1}) if ok else frozenset()
        if kind == "ref":
            return rule_ends(node[1], text, i)
        if kind == "seq":
            at = {i}
            for item in node[1]:
                at = {j for k in at for j in ends(item, text, k)}
            return frozenset(at)
        if kind == "alt":
            return frozenset(j for seq in node[1] for j in ends(seq, text, i))
        _, item, lo, hi = node
        at, out, n = {i}, set(), 0
        while at and (hi is None or n <= hi):
            if n >= lo:
                out |= at
            if hi is not None and n == hi:
                break
            at = {j for k in at for j in ends(item, text, k)} - (out if n >= lo else set())
            n += 1
        return frozenset(out)

    @functools.lru_cache(maxsize=None)
    def rule_ends(name: str, text: str, i: int) -> frozenset:
        return ends(rules[name], text, i)

    return lambda text: len(text) in rule_ends("root", text, 0)


# grammar, alphabet, and how many characters the brute force may add to finish a text
CASES = {
    "choices": ('root ::= ("a" | "é" [bc]) ("," root)?', "aébc,", 3),
    "nesting": ('root ::= "(" root ")" root | ""', "()é", 5),
    "strings": (r'root ::= "\"" [^"\\]* "\"" | [0-9]{1,3}', '"\\1é', 3),
    "unicode": ("root ::= [α-ω]+ \"中\"? | \"😀\" [^α-ω]", "αω中😀a", 3),
    # Bounded repetitions longer than the tokens (their masks are shared between depths),
    # and characters the grammar takes whole (their unfinished bytes share states).
    "bounded": ('root ::= "\\"" [^"\\\\]{0,9} "\\"" [é東]{2,5}', '"aé東', 4),
}


def strings(alphabet: str, up_to: int):
    for n in range(up_to + 1):
        for chars in itertools.product(alphabet, repeat=n):
            yield "".join(chars)


@pytest.mark.parametrize("case", CASES)
def test_accepts_equals_reference(case):
    gbnf, alphabet, _ = CASES[case]
    g, member = Grammar.from_gbnf(gbnf), reference(gbnf)
    texts = list(strings(alphabet, 4))
    assert [g.accepts(t) for t in texts] == [member(t) for t in texts]
    assert any(member(t) for t in texts) and not all(member(t) for t in texts)


def vocabulary(alphabet: str) -> list[bytes | None]:
    """Every 1- and 2-character token, and tokens that cut multi-byte characters apart."""
    tokens: list[bytes | None] = [b"<eos>", None]  # 0 ends the sequence; 1 is a special token
    tokens += [c.encode() for c in alphabet]
    tokens += ["".join(p).encode() for p in itertools.product(alphabet, repeat=2)]
    for ch in alphabet:
        data = ch.encode()
        for k in range(1, len(data)):
            tokens += [data[:k], data[k:], b"a" + data[:k], data[k:] + b"a"]
    tokens += [b"\xff", b"\x80", b"\xc3\x28"]  # never valid UTF-8
    return list(dict.fromkeys(tokens))


def can_complete(member, alphabet: str, data: bytes, room: int = 3) -> bool:
    """Brute force: do at most `room` more characters (from `alphabet`) make `data` a
    sentence? `data` may end inside a character."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            head = data[:cut].decode()
        except UnicodeDecodeError:
            continue
        tail = data[cut:]
        if not tail:
            return any(member(head + s) for s in strings(alphabet, room))
        firsts = [c for c in alphabet if c.encode().startswith(tail) and len(c.encode()) > len(tail)]
        try:  # and a character outside the alphabet, for classes that hold more than it
            firsts.append((tail + b"\x80" * (_length(tail[0]) - len(tail))).decode())
        except (UnicodeDecodeError, IndexError):
            pass
        return any(member(head + c + s) for c in firsts for s in strings(alphabet, room - 1))
    return False


@pytest.mark.parametrize("case", CASES)
def test_mask_equals_brute_force(case):
    gbnf, alphabet, room = CASES[case]
    member = reference(gbnf)
    table = TokenTable(vocabulary(alphabet), eos_token_ids=[0])
    matcher = TokenMatcher(Grammar.from_gbnf(gbnf), table)
    rng = np.random.default_rng(7)
    prefixes = {b"", b"\xce"}  # the empty text, and the first byte of 'α' (or of nothing)
    for wide in (c.encode() for c in alphabet if len(c.encode()) > 1):  # the first character, then part of one
        prefixes |= {alphabet[0].encode() + wide[:k] for k in range(1, len(wide))}
    for _ in range(16):  # random texts that can still be completed, some cut mid-character
        text = ""
        for _ in range(rng.integers(0, 4)):
            ok = [c for c in alphabet if can_complete(member, alphabet, (text + c).encode(), 2)]
            if not ok:
                break
            text += ok[rng.integers(len(ok))]
        data = text.encode()
        if rng.random() < 0.3:
            wide = [c.encode() for c in alphabet if len(c.encode()) > 1]
            pick = wide[rng.integers(len(wide))]
            data += pick[: rng.integers(1, len(pick))]
        prefixes.add(data)
    checked_partial = False
    for data in sorted(prefixes):
        state = matcher.automaton.walk(matcher.start, data)
        expected = np.zeros(table.size, dtype=bool)
        for i, token in enumerate(table.tokens):
            if i == 0:
                expected[i] = _valid(data) and member(data.decode())
            elif token:
                expected[i] = can_complete(member, alphabet, data + token, room)
        if state == 0:  # a dead prefix allows nothing
            assert not expected.any()
            continue
        # The matcher that has seen the states before (its masks share parts), and a new one
        # that reaches this state first by walking to it.
        fresh = TokenMatcher(Grammar.from_gbnf(gbnf), table)
        for m, s in ((matcher, state), (fresh, fresh.automaton.walk(fresh.start, data))):
            assert m.mask(s).tolist() == expected.tolist(), (case, data, table.tokens)
            assert [m.allows(s, i) for i in range(table.size)] == expected.tolist()
        checked_partial |= not _valid(data)
    # Live prefixes cut inside a character were checked (the nesting grammar has none).
    assert checked_partial == (case != "nesting")


def _length(lead: int) -> int:
    """The length in bytes of the UTF-8 character that starts with `lead`."""
    return 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


def _valid(data: bytes) -> bool:
    try:
        data.decode()
        return True
    except UnicodeDecodeError:
        return False


def test_eos_only_where_the_text_is_a_sentence():
    table = TokenTable([b"<eos>", b"a", b"b"], eos_token_ids=[0])
    m = TokenMatcher(Grammar.from_gbnf('root ::= "a" "b"?'), table)
    s = m.start
    assert m.mask(s).tolist() == [False, True, False]
    s = m.advance(s, 1)
    assert m.mask(s).tolist() == [True, False, True] and m.accepting(s)
    s = m.advance(s, 2)
    assert m.mask(s).tolist() == [True, False, False]
    assert m.advance(s, 0) == s  # the end-of-sequence token adds no text
    assert m.mask(s, 5).tolist() == [True, False, False, False, False]  # ids past the table: never
    assert m.mask(s, 2).tolist() == [True, False]


def test_masks_are_cached_per_state():
    table = TokenTable([b"<eos>", b"a", b"b"], eos_token_ids=[0])
    g = Grammar.from_gbnf('root ::= "a"*')
    m = TokenMatcher.get(g, table)
    assert TokenMatcher.get(g, table) is m
    first = m.mask(m.start)
    assert m.mask(m.advance(m.start, 1)) is first  # "a"* comes back to the same state


def test_masks_along_a_bounded_repetition_share_parts_and_equal_brute_force():
    """In `[ab]{0,30} "c"` a token of n letters fits while n letters are left. Each length
    bucket's part of a mask is shared between the depths that leave more letters than its
    tokens have; every depth's mask is still exact."""
    letters = [("ab" * 20)[:n].encode() for n in range(1, 40)]
    closing = [("ba" * 20)[:n].encode() + b"c" for n in range(40)]
    vocab = [b"<eos>", *letters, *closing]
    table = TokenTable(vocab, eos_token_ids=[0])
    m = TokenMatcher(Grammar.from_gbnf('root ::= [ab]{0,30} "c"'), table)
    state = m.start
    for k in range(31):
        left = 30 - k
        expected = [False] + [len(t) <= left for t in letters] + [len(t) - 1 <= left for t in closing]
        assert m.mask(state).tolist() == expected, k
        state = m.advance(state, 1)  # one more "a"
    assert m.stats.masks == 31
    # A bucket of tokens up to h bytes tells apart the depths that leave 0..h+1 letters,
    # and walks once for all the deeper ones: h + 2 walks (31 for the longest buckets).
    assert [h for _, _, h in table.buckets] == [2, 4, 6, 8, 10, 12, 16, 24, 32, 40]
    assert m.stats.walks == sum(min(31, h + 2) for _, _, h in table.buckets) == 160


def test_the_mask_cache_keeps_to_its_byte_budget(monkeypatch):
    """A budget of two masks: walking through five states keeps at most two, the least
    recently used leave first, and a mask computed again equals the one that left."""
    table = TokenTable([b"<eos>", b"a", b"b", b"ab"], eos_token_ids=[0])
    m = TokenMatcher(Grammar.from_gbnf('root ::= "a" "b" "a" "b" "a"'), table)
    monkeypatch.setattr(TokenMatcher, "MASK_BYTES", 2 * table.size)
    states = [m.start]
    for token in (1, 2, 1, 2):
        states.append(m.advance(states[-1], token))
    first = m.mask(states[0]).copy()
    for s in states[1:]:
        m.mask(s)
        assert len(m._masks) <= 2 and sum(v.nbytes for v in m._masks.values()) <= 2 * table.size
    assert list(m._masks) == states[-2:]
    m.mask(states[3])  # used again: now the most recent
    m.mask(states[0])  # computed again, it pushes out the least recent (states[4])
    assert list(m._masks) == [states[3], states[0]]
    assert m.mask(states[0]).tolist() == first.tolist() == [False, True, False, True]


def test_masks_of_the_default_vocabulary_along_a_bounded_non_ascii_string(default_tokenizer):
    """A schema with a long bounded string, followed token by token through German and
    Japanese text: at sampled positions (inside characters cut by the tokenizer, deep in
    the repetition and near its end) every mask equals each token checked on its own."""
    table = TokenTable.from_tokenizer(default_tokenizer)
    grammar = Grammar.from_json_schema({"type": "object", "required": ["bio"],
                                        "properties": {"bio": {"type": "string", "maxLength": 120}}})
    m = TokenMatcher(grammar, table)
    bio = "Größe zählt nicht; 東京の空は青い. " * 3
    text = json.dumps({"bio": bio[:118]}, ensure_ascii=False)
    ids = default_tokenizer.encode(text)
    state, checked, inside = m.start, 0, 0
    for i, token in enumerate(ids):
        mask = m.mask(state)
        assert mask[token]
        if i % 9 == 4 or i >= len(ids) - 3:
            expected = [m.allows(state, t) for t in range(table.size)]
            assert mask.tolist() == expected, (i, text)
            checked += 1
            inside += isinstance(grammar.automaton.states[state][1], tuple)
        state = m.advance(state, token)
    assert m.accepting(state) and checked >= 6 and inside >= 1
    assert m.stats.walks < m.stats.masks * len(table.buckets)  # parts were shared


def test_token_table_reads_byte_level_tokens(default_tokenizer):
    table = TokenTable.from_tokenizer(default_tokenizer)
    assert TokenTable.from_tokenizer(default_tokenizer) is table
    for text in ['{"name": "Zoë", "emoji": "😀"}\n\tend', " spaced  out ", "中文"]:
        ids = default_tokenizer.encode(text, add_special_tokens=False)
        assert b"".join(table.tokens[i] for i in ids) == text.encode()
    for i in default_tokenizer.eos_token_ids:
        assert i in table.eos
    special = default_tokenizer.encode("<|im_start|>", add_special_tokens=False)
    assert len(special) == 1 and table.tokens[special[0]] is None


def test_token_table_reads_sentencepiece_tokens():
    """Without a byte-level decoder: `<0xHH>` is that byte, `▁` a space, an added token its
    text, a special token None."""
    from tokenizers import AddedToken, models
    from tokenizers import Tokenizer as Backend

    from tiny_llm.constrain.tokens import token_bytes
    from tiny_llm.tokenizer import Tokenizer

    backend = Backend(models.WordLevel({"<0x0A>": 0, "▁hello": 1, "hi": 2, "<0xC3>": 3, "ÿ": 4}, unk_token="hi"))
    backend.add_tokens([AddedToken("<tool>", special=False)])
    backend.add_special_tokens(["</s>"])
    assert token_bytes(Tokenizer(backend, eos_tokens=["</s>"])) == [
        b"\n", b" hello", b"hi", b"\xc3", "ÿ".encode(), b"<tool>", None]


@contextlib.contextmanager
def expansion_budget(lines: int):
    """Fail, rather than run for ever, once stack expansion has run `lines` lines of code."""
    count = 0

    def on_line(frame, event, arg):
        nonlocal count
        count += 1
        if count > lines:
            raise AssertionError(f"stack expansion ran more than {lines} lines")
        return on_line

    def on_call(frame, event, arg):
        return on_line if frame.f_code is Automaton._expand.__code__ else None

    sys.settrace(on_call)
    try:
        yield
    finally:
        sys.settrace(None)


def test_rows_of_optional_items_expand_once_each():
    # 40 optional items in a row: 2**40 ways to skip them, each stack expanded once. That
    # takes under 50,000 lines of `_expand`; expanding every way would take about 2**40.
    with expansion_budget(200_000):
        g = Grammar.from_gbnf('root ::= "{" ' + "ws? " * 40 + '"}"\nws ::= | " " | "\\n"\n')
        assert g.accepts("{}") and g.accepts("{" + " \n" * 20 + "}")
        assert not g.accepts("{" + " " * 41 + "}")


def test_long_chains_of_optional_items_do_not_recurse_deeply():
    g = Grammar.from_gbnf('root ::= (" "?){0,600} "b"')
    assert g.accepts(" " * 600 + "b") and g.accepts("b")
    assert not g.accepts(" " * 601 + "b")


def test_lone_surrogates_are_rejected():
    g = Grammar.from_gbnf("root ::= .")
    assert g.accepts("é") and not g.accepts("\ud800") and not g.accepts_prefix("\udc00")


def test_byte_level_decoders_inside_a_sequence(default_tokenizer):
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders

    from tiny_llm.tokenizer import Tokenizer

    backend = Backend.from_str(default_tokenizer.backend.to_str())
    backend.decoder = decoders.Sequence([decoders.ByteLevel()])
    tokenizer = Tokenizer(backend, eos_tokens=["<|im_end|>"])
    table = TokenTable.from_tokenizer(tokenizer)
    text = ' héllo {"a": 1}\n'
    assert b"".join(table.tokens[i] for i in tokenizer.encode(text)) == text.encode()
