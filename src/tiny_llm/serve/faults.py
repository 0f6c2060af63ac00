"""Engine — failures on purpose, for the server's tests: off unless `TINY_LLM_FAULTS` is set
when the server starts.

    TINY_LLM_FAULTS=step=3,step=7     the 3rd and 7th model steps raise (as an MLX error or
                                      running out of memory would)
    TINY_LLM_FAULTS=stall=2:5         the 2nd step sleeps 5 seconds first (a stuck engine)
    TINY_LLM_FAULTS=die=4             the 4th step ends the engine thread
    TINY_LLM_FAULTS=tokenizer=BOOM    the tokenizer raises for any text that holds "BOOM"

Steps count from 1, every step the engine runs (prefill chunks and decode steps alike).

Tests: tests/test_serve_faults.py
"""

import os
import time
from dataclasses import dataclass, field

ENVIRONMENT = "TINY_LLM_FAULTS"


class EngineKilled(BaseException):
    """Ends the engine thread the way a bug outside a step would (not an `Exception`, so
    nothing on the way catches it)."""


@dataclass
class Faults:
    steps: set[int] = field(default_factory=set)  # steps that raise
    stalls: dict[int, float] = field(default_factory=dict)  # step -> seconds it sleeps first
    die: int | None = None  # the step that ends the engine thread
    tokenizer: str | None = None  # text that makes the tokenizer raise

    @classmethod
    def from_env(cls, environ=os.environ) -> "Faults":
        return cls.parse(environ.get(ENVIRONMENT, ""))

    @classmethod
    def parse(cls, spec: str) -> "Faults":
        faults = cls()
        for item in filter(None, (s.strip() for s in spec.split(","))):
            name, _, value = item.partition("=")
            try:
                if name == "step":
                    faults.steps.add(int(value))
                elif name == "stall":
                    step, _, seconds = value.partition(":")
                    faults.stalls[int(step)] = float(seconds)
                elif name == "die":
                    faults.die = int(value)
                elif name == "tokenizer" and value:
                    faults.tokenizer = value
                else:
                    raise ValueError
            except ValueError:
                raise ValueError(f"{ENVIRONMENT}: cannot read {item!r}; expected step=K, stall=K:SECONDS, "
                                 f"die=K or tokenizer=TEXT") from None
        return faults

    def __bool__(self) -> bool:
        return bool(self.steps or self.stalls or self.die is not None or self.tokenizer)

    def before_step(self, step: int) -> None:
        """Called by the engine thread before its `step`-th model step."""
        if step in self.stalls:
            time.sleep(self.stalls[step])
        if step == self.die:
            raise EngineKilled(f"injected fault: the engine thread ends at step {step}")
        if step in self.steps:
            raise RuntimeError(f"injected fault: the model step failed (step {step})")

    def wrap(self, tokenizer):
        """`tokenizer`, or one that raises on the marked text."""
        return _FaultyTokenizer(tokenizer, self.tokenizer) if self.tokenizer else tokenizer


class _FaultyTokenizer:
    def __init__(self, tokenizer, marker: str):
        self._tokenizer, self._marker = tokenizer, marker

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def _check(self, text) -> None:
        if self._marker in str(text):
            raise RuntimeError("injected fault: the tokenizer failed")

    def encode(self, text, *args, **kwargs):
        self._check(text)
        return self._tokenizer.encode(text, *args, **kwargs)

    def apply_chat_template(self, messages, *args, **kwargs):
        self._check(messages)
        return self._tokenizer.apply_chat_template(messages, *args, **kwargs)
