"""Regular expressions to GBNF: the grammar accepts exactly what `re.fullmatch(p, s, re.ASCII)`
accepts, the printed expressions stay stable, and every unsupported or malformed pattern raises
a `ValueError` that names the construct and its position.

The language check is exhaustive: every string up to a small length over an alphabet chosen
for the pattern, plus a few non-ASCII characters (2- to 4-byte UTF-8).
"""

import itertools
import re

import pytest

from tiny_llm.constrain import Grammar
from tiny_llm.constrain.regex import regex_to_gbnf, regex_to_gbnf_expression

NON_ASCII = ("é", "中", "😀", "\u2028", "\x85", "é中😀")

# (pattern, alphabet, longest string): every string over the alphabet up to that length.
CASES = [
    # literals, concatenation, alternation (with empty alternatives)
    ("abc", "abc", 5),
    ("a|b|", "abc", 4),
    ("(|b)c", "bcx", 5),
    ("(ab|a)(bc|c)?", "abc", 6),
    # quantifiers, lazy forms, {m} {m,} {m,n} {,n}
    ("a*b+c?", "abc", 6),
    ("(ab)*", "ab", 8),
    ("(?:ab|c){2,3}", "abc", 7),
    ("a{2}b{2,}", "ab", 8),
    ("a{,2}b{1,3}?", "ab", 8),
    ("a*?b+?c??", "abc", 6),
    ("x{0}y{1}", "xy", 3),
    # a "{" that starts no quantifier is a literal; "{,}" is "*"
    ("a{x|a{}|{a|a{2,3", "a{x}2,3", 5),
    ("x{,}", "x{,}", 4),
    # repeated bodies that match the empty string
    ("(a|)*", "ab", 6),
    ("(a?b?)*c", "abc", 6),
    ("(a*)*b", "ab", 6),
    ("(a*b*)+", "abc", 6),
    ("(a?){2,3}", "ab", 7),
    ("(a?b?){2}", "ab", 7),
    ("()*x()+", "x", 3),
    # character classes
    ("[a-c]+", "abcd", 4),
    ("[^ab]", "abc\n", 2),
    ("[]a]|[^]a]", "]ab", 2),
    ("[a-][-b]", "ab-c", 4),
    (r"[\d_]+", "09_a", 5),
    (r"[^\s,]", " ,a\n\t", 2),
    (r"[\Wa]", "ab0_!", 2),
    (r"[^\W\d]", "a0_!Z", 2),
    (r"[^\d\s]", "0 a\n", 2),
    (r"[\s\S]|[^\s\S]x", "a\nx", 2),
    (r"[\\\]\[^-]+", "\\]^-[a", 3),
    (r"[\x00-\x1f\x7f]|[\b]", "\x00\x1f\x7f\x08 a", 1),
    # class escapes and "."
    (r"\d\D", "0a", 3),
    (r"\w\W", "a!_", 3),
    (r"\s+\S", " \t\n\x0b\x0c\ra", 3),
    ("a.b", "ab\n", 3),
    (".*", "a\n\r", 4),
    # escapes
    (r"\.|\*|\+|\?|\(|\)|\[|\]|\{|\}|\||\\|\^|\$|\/|\-|\,|\é", ".*+?()[]{}|\\^$/-,é", 2),
    (r"\(\\\)\[", "()\\[", 4),
    (r"\n\t|\r\f|\v\0\a", "\n\t\r\x0c\x0b\x00\x07", 3),
    (r"\0\012|\08|\1234", "\x00\n8\x534", 3),
    (r"\x41\u00e9\U0001F600\101\N{EM DASH}", "Aé😀—a", 5),
    (r"\x414|\u00e9e|[\101-\103]", "ABCD4ée", 2),
    (r"\u2028\x85|[\u200b-\u200d\x80]", "\u2028\x85\u200b\u200c\u200d\u200e\x80 ", 2),
    ('"[\\\\"]*', '"\\a', 4),
    # anchors at the very start and end, named groups
    ("^(a|b)*c$", "abc", 6),
    ("(?P<x>a)(b|c)", "abc", 3),
    # non-ASCII literals and classes
    ("é+中?", "é中a", 3),
    ("[é-ë]😀|[^😀]", "éêë😀a", 2),
    (r"[^\U0010FFFE]", "a\U0010FFFE\U0010FFFF", 2),
]


def strings(alphabet: str, longest: int) -> list[str]:
    return ["".join(chars) for n in range(longest + 1) for chars in itertools.product(alphabet, repeat=n)]


@pytest.mark.parametrize("pattern, alphabet, longest", CASES, ids=[case[0] for case in CASES])
def test_same_language_as_re_fullmatch(pattern, alphabet, longest):
    grammar = Grammar.from_regex(pattern)
    regex = re.compile(pattern, re.ASCII)
    texts = strings(alphabet, longest) + list(NON_ASCII)
    expected = {text: regex.fullmatch(text) is not None for text in texts}
    assert any(expected.values()) and not all(expected.values())  # the texts tell languages apart
    wrong = [text for text in texts if grammar.accepts(text) != expected[text]]
    assert not wrong, f"{pattern!r} -> {regex_to_gbnf(pattern)!r} disagrees with re on {wrong[:10]!r}"


@pytest.mark.parametrize("pattern, matches, rejects", [
    (".", ["é", "中", "😀", "\x85", "\u2028", "\r"], ["\n", "", "ab"]),
    ("[^ab]", ["é", "中", "😀", "\n"], ["a", "b"]),
    (r"\W", ["é", "中", "😀", " ", "\n"], ["a", "_", "0"]),
    (r"\S", ["é", "中", "😀", "\x85", "\u2028"], [" ", "\n", "\x0b"]),  # ASCII \s only
    (r"\D", ["é", "٣", "😀"], ["0", "9"]),  # "٣" is a Unicode digit, not an ASCII one
    (r"[^\W\d]", ["a", "Z", "_"], ["é", "0", "-"]),
])
def test_non_ascii_characters(pattern, matches, rejects):
    grammar = Grammar.from_regex(pattern)
    for text in matches:
        assert re.fullmatch(pattern, text, re.ASCII) and grammar.accepts(text), text
    for text in rejects:
        assert not re.fullmatch(pattern, text, re.ASCII) and not grammar.accepts(text), text


@pytest.mark.parametrize("pattern, expression", [
    ("abc", '"abc"'),
    ("[a-c]+", "[a-c]+"),
    ("a|b|c", "[a-c]"),
    ("[ab]|[d-e]|[g-i]", "[abdeg-i]"),
    ("(ab)(c)d|ab|(?:ab)", '"abcd" | "ab"'),
    ("x{0}y{1}z{0,0}", '"y"'),
    ("\u2028+[\x85-\x86]", r'"\u2028"+ [\x85\x86]'),
    (".", r"[^\x0A]"),
    (r"\d{2,4}-\w*", '[0-9]{2,4} "-" [0-9A-Z_a-z]*'),
    (r"\s", r"[\x09-\x0D ]"),
    ("ab*(c|de)?", '"a" "b"* ("c" | "de")?'),
    ("(ab){3}x{2,}y{,4}", '"ab"{3} "x"{2,} "y"{0,4}'),
    ("a|", '"a" | ""'),
    ("(a|)*", '"a"*'),
    ("(a?){2,3}", '"a"{0,3}'),
    ("(a*)*", '"a"*'),
    ("^(?P<x>ab)+?$", '"ab"+'),
    (r'[^"\\]', r'[^"\x5C]'),
    (r"[\Wa]", "[^0-9A-Z_b-z]"),
    (r"[\s\S]", r"[\x00-\U0010FFFF]"),
    (r"[^\s\S]", r"[^\x00-\U0010FFFF]"),
    ('"\\\\\n\x7f', r'"\"\\\n\x7F"'),
    ("a{x", '"a{x"'),
    ("😀+[😀-😂]", '"😀"+ [😀-😂]'),
])
def test_expression_text(pattern, expression):
    assert regex_to_gbnf_expression(pattern) == expression


def test_whole_grammar():
    assert regex_to_gbnf("[a-c]+") == "root ::= [a-c]+\n"


@pytest.mark.parametrize("pattern, message", [
    (r"a(b)\1", r"backreferences are not supported \(position 4 in"),
    ("(?P<x>a)(?P=x)", r"backreferences are not supported \(position 8 in"),
    ("a(?=b)", r"lookaround assertions are not supported \(position 1 in"),
    ("(?!b)a", r"lookaround assertions are not supported \(position 0 in"),
    ("(?<=a)b", r"lookaround assertions are not supported \(position 0 in"),
    ("a(?<!a)b", r"lookaround assertions are not supported \(position 1 in"),
    (r"\bx", r"word boundaries \(\\b, \\B\) are not supported \(position 0 in"),
    (r"a\B", r"word boundaries \(\\b, \\B\) are not supported \(position 1 in"),
    (r"\Aa", r"string anchors \(\\A, \\Z\) are not supported \(position 0 in"),
    (r"a\Z", r"string anchors \(\\A, \\Z\) are not supported \(position 1 in"),
    ("(?i)a", r"inline flags are not supported \(position 0 in"),
    ("a(?s:.)", r"inline flags are not supported \(position 1 in"),
    ("ab(?-i:c)", r"inline flags are not supported \(position 2 in"),
    ("a*+", r"possessive quantifiers are not supported \(position 1 in"),
    ("ab{2}+", r"possessive quantifiers are not supported \(position 2 in"),
    (r"\p{L}", r"Unicode property escapes \(\\p, \\P\) are not supported \(position 0 in"),
    ("x(?>a)", r"atomic groups are not supported \(position 1 in"),
    ("(a)(?(1)b|c)", r"conditional groups are not supported \(position 3 in"),
    ("(?#note)a", r"comment groups are not supported \(position 0 in"),
    ("a^", r"'\^' anchors are not supported except at the start of the pattern \(position 1 in"),
    ("$a", r"'\$' anchors are not supported except at the end of the pattern \(position 0 in"),
    ("(a$)", r"'\$' anchors are not supported except at the end of the pattern \(position 2 in"),
])
def test_unsupported_constructs(pattern, message):
    with pytest.raises(ValueError, match=message) as error:
        regex_to_gbnf(pattern)
    assert repr(pattern) in str(error.value)


@pytest.mark.parametrize("pattern, message", [
    ("(a", r"missing \), unterminated subpattern \(position 0 in"),
    ("a)", r"unbalanced parenthesis \(position 1 in"),
    ("[ab", r"unterminated character set \(position 0 in"),
    ("x[]", r"unterminated character set \(position 1 in"),
    ("*a", r"nothing to repeat \(position 0 in"),
    ("a|+", r"nothing to repeat \(position 2 in"),
    ("^{2}", r"nothing to repeat \(position 1 in"),
    ("a**", r"multiple repeat \(position 2 in"),
    ("a{2}{3}", r"multiple repeat \(position 4 in"),
    ("x[z-a]", r"bad character range \(position 2 in"),
    (r"[\d-z]", r"bad character range \(position 1 in"),
    ("a{3,1}", r"min repeat greater than max repeat \(position 1 in"),
    ("a{4294967295}", r"repetition count 4294967295 is above the limit of 10000 \(position 1 in"),
    (r"\x4", r"incomplete escape \\x4 \(position 0 in"),
    ("a\\", r"trailing backslash \(position 1 in"),
    (r"\q", r"bad escape \\q \(position 0 in"),
    (r"[\8]", r"bad escape \\8 \(position 1 in"),
    (r"\477", r"octal escape value \\477 outside of range"),
    (r"\N{NO SUCH NAME}", r"undefined character name 'NO SUCH NAME' \(position 0 in"),
    ("(?P<1>a)", r"bad character in group name '1' \(position 0 in"),
    ("(?P<x>a)(?P<x>b)", r"redefinition of group name 'x' \(position 8 in"),
    ("(?Q)", r"unknown extension \?Q \(position 0 in"),
])
def test_malformed_patterns(pattern, message):
    with pytest.raises((re.error, OverflowError)):
        re.compile(pattern)
    with pytest.raises(ValueError, match=message):
        regex_to_gbnf(pattern)


@pytest.mark.parametrize("pattern, count", [("a{0,1000000}", 1000000), ("(ab){10001}", 10001), ("x{3,10001}", 10001)])
def test_repetition_counts_have_a_limit(pattern, count):
    """Python accepts these; each repeated copy would become grammar rules, so counts above
    10,000 are refused with the position, instead of compiling for minutes."""
    re.compile(pattern)
    with pytest.raises(ValueError, match=rf"repetition count {count} is above the limit of 10000 \(position"):
        regex_to_gbnf(pattern)
    assert Grammar.from_regex(pattern.replace(str(count), "10000")).accepts_prefix("")


@pytest.mark.parametrize("pattern", [b"a+", None, 3])
def test_pattern_must_be_a_str(pattern):
    with pytest.raises(ValueError, match=f"pattern must be a str, got {type(pattern).__name__}"):
        regex_to_gbnf(pattern)


@pytest.mark.parametrize("pattern", [r"[^\s\S]", r"ab[^\s\S]", r"(a[^\s\S])+", r"x(?:[^\d\D]|[^\w\W])"])
def test_a_pattern_that_matches_nothing_is_refused(pattern):
    """Python compiles these, but no text fully matches them: refused when compiled, not
    when the first token finds nothing to allow."""
    assert not any(re.fullmatch(pattern, t) for t in ["", "a", "ab", "aa", "x", "xa", "ab\n"])
    with pytest.raises(ValueError, match=re.escape(f"regex: {pattern!r} matches no text")):
        Grammar.from_regex(pattern)


def test_a_branch_that_matches_nothing_is_never_entered():
    g = Grammar.from_regex(r"a|b[^\s\S]")
    assert g.accepts("a") and not g.accepts_prefix("b")


def test_groups_nest_at_most_100_deep():
    """Deeper nesting used to end in RecursionError; 100 levels still compile."""
    assert Grammar.from_regex("(" * 100 + "a" + ")" * 100).accepts("a")
    for depth in (101, 300):
        re.compile("(" * depth + "a" + ")" * depth)
        with pytest.raises(ValueError, match=r"groups are nested more than 100 deep \(position 100 in"):
            Grammar.from_regex("(" * depth + "a" + ")" * depth)


@pytest.mark.parametrize("pattern, alphabet", [
    ("ab", "abx"), ("^ab", "abx"), ("ab$", "abx"), ("^a|b$", "abx"), ("^(a|b)+$", "abx"), (r"a\|b", "ab|"),
    (r"[|]a|b\$", "ab|$"), ("(a+)+$", "ab"), ("a.b", "ab\u2028"), ("", "ab"), ("^$", "ab"),
])
def test_a_search_automaton_finds_what_re_search_finds(pattern, alphabet):
    """`DFA.from_search` (the agent's search, a JSON Schema `pattern`): a match anywhere, the
    anchors per top-level branch, checked on every string over the alphabet up to length 5."""
    from tiny_llm.constrain.automata import DFA
    from tiny_llm.constrain.regex import search_branches

    dfa = DFA.from_search(pattern)
    for n in range(6):
        for chars in itertools.product(alphabet, repeat=n):
            text = "".join(chars)
            assert dfa.accepts(text) == bool(re.search(pattern, text, re.ASCII)), (pattern, text)
    assert search_branches(r"^a|[|]b\$|(c|d)$") == [(True, "a", False), (False, r"[|]b\$", False),
                                                    (False, "(c|d)", True)]
