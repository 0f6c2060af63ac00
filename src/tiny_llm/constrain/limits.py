"""Engine — limits on repetition counts and nesting depth, shared by GBNF, regexes and schemas.

The bounds keep compiling a grammar small and fast: every repeated copy of an item becomes
rules of its own, so a count costs memory and time in proportion to it.

Tests: tests/test_constrain_numbers.py
"""

MAX_REPEAT = 10_000  # the largest repetition count in GBNF, a regex or a JSON schema
MAX_NESTING = 100  # the deepest nesting of groups in GBNF or a regex, or of schemas in a JSON schema
MAX_STATES = 10_000  # the most states of an automaton built for a JSON schema's strings or numbers
MAX_WORK = 500_000  # NFA states visited while turning one regular language into an automaton
