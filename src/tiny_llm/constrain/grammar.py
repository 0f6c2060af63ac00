"""Engine — `Grammar`: what generation may write, from GBNF, a JSON schema, a regex or other grammars.

A grammar is its rules (syntax trees, `gbnf.parse`'s shape), compiled once (`program`) into
the automaton that runs it byte by byte (`pushdown`). Grammars compose as grammars:
`Grammar.union` and `Grammar.concat` take the parts' rules, each part's renamed apart from
the others', and never read or splice GBNF text; the text of a composed grammar is written
from its rules when asked for.

Tests: tests/test_constrain_grammar.py, tests/test_request.py, tests/test_serve_agents.py
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from .gbnf import parse, renamed, write
from .limits import MAX_NESTING
from .program import LeftRecursionError, NoTextError, Program
from .pushdown import Automaton

__all__ = ["Automaton", "Grammar", "LeftRecursionError", "NoTextError", "SourceError", "parse"]


class SourceError(ValueError):
    """A constraint's value that is no source of a grammar at all: of the wrong type, or
    schema text that is not JSON. `what` is said of the value ("must be text, got 5"), so a
    caller writes it after its own name for the value; the message says it of `subject`."""

    def __init__(self, subject: str, what: str):
        super().__init__(f"{subject} {what}")
        self.what = what


class Grammar:
    """A compiled grammar: what constrained generation is allowed to write.

        Grammar.from_gbnf('root ::= "yes" | "no"')
        Grammar.from_json_schema({"type": "object", "properties": {"age": {"type": "integer"}}})
        Grammar.from_regex(r"\\d{3}-\\d{4}")
        Grammar.concat(Grammar.literal("<answer>"), Grammar.from_regex("[0-9]+"))

    `rules` are the syntax trees, `root` the start rule, and `gbnf` the text (also for
    schemas, regular expressions and composed grammars, so it can be read, saved and given to
    llama.cpp). `accepts(text)` tells whether a whole text is in the language,
    `accepts_prefix(text)` whether it can still be completed. Token masks for a vocabulary
    come from `tiny_llm.constrain.TokenMatcher`.
    """

    def __init__(self, gbnf: str, root: str = "root"):
        self._compile(parse(gbnf), root)
        self._gbnf = gbnf

    @classmethod
    def _of_rules(cls, rules: Mapping[str, tuple], root: str = "root") -> Grammar:
        """The grammar of syntax trees whose rule names are all defined (composition's)."""
        grammar = cls.__new__(cls)
        grammar._compile(dict(rules), root)
        grammar._gbnf = None
        return grammar

    def _compile(self, rules: dict[str, tuple], root: str) -> None:
        self.rules = rules
        self.root = root
        self.program = Program(rules, root)
        self.automaton = Automaton(self.program)
        self._matchers: dict = {}  # per token table

    @property
    def gbnf(self) -> str:
        if self._gbnf is None:
            self._gbnf = write(self.rules)
        return self._gbnf

    def __reduce__(self):
        """Pickled as its GBNF text (and compiled again when unpickled), without the masks
        its matchers have cached: how a request's grammar reaches the other ranks."""
        return (Grammar, (self.gbnf, self.root))

    @classmethod
    def from_gbnf(cls, text: str, root: str = "root") -> Grammar:
        return cls(text, root)

    @classmethod
    def from_json_schema(cls, schema, *, compact: bool = False) -> Grammar:
        """A grammar for JSON text that validates against `schema` (a dict, a boolean or JSON
        text of one; `compact`: JSON on one line); see `tiny_llm.constrain.json_schema` for
        what is supported."""
        from .json_schema import json_schema_to_gbnf

        if isinstance(schema, str):
            schema = _json(schema)
        try:
            return cls(json_schema_to_gbnf(schema, compact=compact))
        except LeftRecursionError:  # only a '$ref' can lead back without reading a character
            raise LeftRecursionError("json schema: a '$ref' leads back to a schema that holds it before any "
                                     "character of a value is read, so no JSON value ever ends") from None
        except NoTextError:
            raise NoTextError("json schema: no finite JSON value validates (every branch of a '$ref' "
                              "cycle needs another level)") from None

    @classmethod
    def from_regex(cls, pattern: str) -> Grammar:
        """A grammar for the texts `re.fullmatch(pattern, text, re.ASCII)` matches; see
        `tiny_llm.constrain.regex` for the supported syntax."""
        from .regex import regex_to_gbnf

        try:
            return cls(regex_to_gbnf(pattern))
        except NoTextError:
            raise NoTextError(f"regex: {pattern!r} matches no text") from None

    KINDS = ("grammar", "regex", "json_schema")

    @classmethod
    def from_kind(cls, kind: str, value, *, compact: bool = False) -> Grammar:
        """The grammar of a request's constraint by its kind: "grammar" (GBNF text), "regex"
        (a pattern) or "json_schema" (a schema: an object, a boolean or its JSON text, read
        once here; `compact`: JSON on one line). `SourceError` for a value of the wrong type
        or schema text that is not JSON, `ValueError` for an unknown kind or a value that
        does not compile (the message does not name the field: the caller knows its own name
        for it)."""
        if kind not in cls.KINDS:
            raise ValueError(f"a constraint's kind is one of {', '.join(cls.KINDS)}, got {kind!r}")
        if kind == "json_schema":
            if isinstance(value, str):
                value = _json(value)
            if not isinstance(value, dict | bool):
                raise SourceError("json schema", f"must be a JSON schema object, got {value!r}"[:300])
            return cls.from_json_schema(value, compact=compact)
        if compact:
            raise ValueError(f"compact is for a json_schema, not a {kind}")
        if not isinstance(value, str):
            raise SourceError(kind, f"must be text, got {value!r}"[:300])
        return cls.from_gbnf(value) if kind == "grammar" else cls.from_regex(value)

    # -- composition --

    @classmethod
    def literal(cls, text: str) -> Grammar:
        """The grammar of exactly `text`."""
        if not isinstance(text, str):
            raise ValueError(f"Grammar.literal: text must be a str, got {text!r}"[:300])
        chars = tuple(("chars", ((ord(c), ord(c)),), False) for c in text)
        return cls._of_rules({"root": ("seq", (("seq", chars),))})  # as `parse` reads root ::= "text"

    @classmethod
    def union(cls, *grammars: Grammar) -> Grammar:
        """The texts that one of `grammars` accepts."""
        refs, rules = _parts(grammars, "union")
        body = ("alt", tuple(("seq", (ref,)) for ref in refs)) if len(refs) > 1 else ("seq", tuple(refs))
        return cls._of_rules({"root": body, **rules})

    @classmethod
    def concat(cls, *grammars: Grammar) -> Grammar:
        """The texts made of a text of each of `grammars`, in their order."""
        refs, rules = _parts(grammars, "concat")
        return cls._of_rules({"root": ("seq", tuple(refs)), **rules})

    # -- matching --

    def matches_only_empty(self) -> bool:
        """Whether the empty text is the one sentence of the grammar: nothing to generate."""
        a = self.automaton
        return all(a.walk(a.start, bytes([b])) == Automaton.DEAD for b in range(256))

    def accepts(self, text: str) -> bool:
        data = text.encode(errors="surrogatepass")  # a lone surrogate is invalid UTF-8: rejected
        return self.automaton.accepting(self.automaton.walk(self.automaton.start, data))

    def accepts_prefix(self, text: str | bytes) -> bool:
        data = text.encode(errors="surrogatepass") if isinstance(text, str) else text
        return self.automaton.walk(self.automaton.start, data) != Automaton.DEAD

    def __repr__(self) -> str:
        lines = self.gbnf.strip().splitlines()
        head = lines[0] if lines else ""
        more = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
        return f"Grammar({head!r}{more})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Grammar) and (self.gbnf, self.root) == (other.gbnf, other.root)

    def __hash__(self) -> int:
        return hash((self.gbnf, self.root))


def _parts(grammars: tuple, how: str) -> tuple[list[tuple], dict[str, tuple]]:
    """References to the start rules of `grammars`, and all their rules, part i's names
    prefixed with `gi-` so that no two parts share one."""
    if not grammars or not all(isinstance(g, Grammar) for g in grammars):
        raise ValueError(f"Grammar.{how} takes one or more grammars, got {grammars!r}"[:300])
    refs, rules = [], {}
    for i, grammar in enumerate(grammars):
        prefix = f"g{i}-"
        rules.update(renamed(grammar.rules, prefix))
        refs.append(("ref", prefix + grammar.root, 0))
    return refs, rules


def _json(text: str):
    """A schema's JSON text, read (once: the compiler is handed the value)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SourceError("json schema", f"is not valid JSON: {e}") from None
    except RecursionError:
        raise SourceError("json schema", f"is JSON nested too deeply to read (the limit for a schema is "
                                         f"{MAX_NESTING} levels)") from None
