"""Engine — the models behind an agent (`core.Model`): the in-process engine, an OpenAI-compatible endpoint, or a script.

    EngineModel(model, tokenizer)                      # grammar-enforced actions, pages kept across steps
    EndpointModel("http://127.0.0.1:8000/v1")          # tiny-llm serve or any OpenAI-compatible server
    ScriptedModel([Action("read", {"path": "a.py"}), {"tool": "finish", "args": {"summary": "done"}}])

Each turns a conversation (chat messages) and the action schema into one `Proposal`: the
text of one action and its token counts.

Tests: tests/test_week4_day3.py, tests/test_week4_day1.py, tests/test_week4_day4.py
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from ..defaults import MAX_TOKENS, PAGE_SIZE, PREFIX_CACHE_BYTES, TEMPERATURE
from .actions import action_text
from .core import Action, Proposal

if TYPE_CHECKING:
    from ..constrain import Grammar
    from ..model import CachedModel
    from ..prefix_cache import PrefixCache
    from ..tokenizer import Tokenizer

__all__ = ["EndpointModel", "EngineModel", "ScriptedModel", "count_tokens", "grammar_for", "text_tokens"]


def text_tokens(text: str) -> int:
    """A tokenizer-free estimate of a text's tokens: four bytes a token, rounded up."""
    return (len(text.encode("utf-8")) + 3) // 4


def count_tokens(messages: Sequence[dict]) -> int:
    """A tokenizer-free estimate of a conversation's tokens: `text_tokens` of each message's
    content, plus four tokens of chat template per message."""
    return sum(text_tokens(m["content"]) + 4 for m in messages)


class ScriptedModel:
    """A model that says what a test tells it to: the items of `actions` in turn, or
    `actions(messages)` each step (a function of the conversation, e.g. of the observations).
    An item is an `Action`, a dict (dumped as JSON) or raw text (sent as is, valid or not).
    Token counts are `count_tokens`'s estimates. Running out of script is a model error.

    `start`: the items a run proposed before (a resumed run: the "proposal" events of its
    log), skipped, so the first call says item `start`."""

    def __init__(self, actions: Sequence[Action | dict | str] | Callable[[list[dict]], Action | dict | str], *,
                 start: int = 0):
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"start must be an integer >= 0, got {start!r}")
        if callable(actions) and start:
            raise ValueError("start skips items of a list of actions; a function of the conversation has none")
        self._script = None if callable(actions) else list(actions)
        self._next = actions if callable(actions) else None
        self.start = start
        self.calls: list[list[dict]] = []  # the messages of each call, copied

    def propose(self, messages: list[dict], schema: dict, *, seed: int | None = None) -> Proposal:
        self.calls.append([dict(m) for m in messages])
        if self._script is not None:
            index = self.start + len(self.calls) - 1
            if index >= len(self._script):
                before = f" ({self.start} proposed before the run resumed)" if self.start else ""
                raise IndexError(f"the script has {len(self._script)} actions and call {len(self.calls)} asks for "
                                 f"another{before}")
            item = self._script[index]
        else:
            item = self._next(messages)
        if isinstance(item, Action):
            text = action_text(item)
        elif isinstance(item, dict):
            text = json.dumps(item, ensure_ascii=False)
        elif isinstance(item, str):
            text = item
        else:
            raise TypeError(f"a scripted action is an Action, a dict or a str, got {type(item).__name__}")
        return Proposal(text, count_tokens(messages), text_tokens(text), 0)


def grammar_for(schema: dict) -> Grammar:
    """The grammar of `schema`, compiled once per schema (and so its token masks, which the
    grammar keeps, are shared by every model and step that use it)."""
    return _compiled(json.dumps(schema, ensure_ascii=False))  # key order matters: properties come in order


@lru_cache(maxsize=32)
def _compiled(schema_text: str) -> Grammar:
    from ..constrain import Grammar

    return Grammar.from_json_schema(json.loads(schema_text))


class EngineModel:
    """The in-process engine: the chat template turns the messages into a prompt, and
    `stream_generate` decodes under the grammar of the action schema, so every proposal is
    an action that parses and validates (unless it runs out of `max_tokens`).

    The conversation's pages stay in a prefix cache across steps (`prefix_cache=True`: one
    of the default budget, once week 3 days 2 and 3 are done; a `PrefixCache` to share one,
    e.g. between the branches of a fork; False: none). Each step's prompt starts with the
    previous step's prompt and reply, so only the new part is prefilled: the observation and
    what came since. Where the new prompt's text starts with the last prompt and reply, their
    tokens are reused as they were generated (a re-encoding could split the reply otherwise,
    and the cache would match less). `Proposal.cached_tokens` counts the prompt tokens taken
    from the cache."""

    def __init__(self, model: CachedModel, tokenizer: Tokenizer, *, max_tokens: int = MAX_TOKENS,
                 temperature: float = TEMPERATURE, prefix_cache: bool | PrefixCache = True):
        from ..sampler import SamplingParams
        from ..sampler.checks import check_int

        self.model, self.tokenizer = model, tokenizer
        self.max_tokens = check_int("max_tokens", max_tokens, minimum=1)
        SamplingParams(temperature=temperature)  # checks it now, not at the first step
        self.temperature = temperature
        self.prefix_cache = self._prefix_cache(prefix_cache)
        self._last: tuple[str, list[int]] | None = None  # the last prompt and reply: text, tokens

    def _prefix_cache(self, choice) -> PrefixCache | None:
        from ..generate import cached_loop_implemented
        from ..model import Model, heads_share
        from ..paged_cache import PagePool, paged_cache_implemented
        from ..prefix_cache import PrefixCache, prefix_cache_implemented

        if isinstance(choice, PrefixCache):
            return choice
        if not isinstance(choice, bool):
            raise ValueError(f"prefix_cache must be True, False or a PrefixCache, got {choice!r}")
        if not choice or not isinstance(self.model, Model):
            return None
        # Before the cache's days (and the KV cache's) are done, each step prefills it all.
        if not (cached_loop_implemented() and paged_cache_implemented() and prefix_cache_implemented()):
            return None
        return PrefixCache(PagePool(PAGE_SIZE, heads_share=heads_share(self.model)), PREFIX_CACHE_BYTES)

    @property
    def context_tokens(self) -> int | None:
        """The model's context in tokens (None: not stated)."""
        from ..model import Configured

        return self.model.args.max_position_embeddings if isinstance(self.model, Configured) else None

    def count_tokens(self, messages: list[dict]) -> int:
        """The prompt tokens of `messages` under the chat template."""
        return len(self.tokenizer.encode(self.tokenizer.apply_chat_template(messages)))

    def prompt(self, messages: list[dict]) -> list[int]:
        """The prompt's tokens: the last prompt and reply as they were, then the rest encoded,
        when the text continues them; the whole text encoded otherwise."""
        return self._tokens(self.tokenizer.apply_chat_template(messages))

    def _tokens(self, text: str) -> list[int]:
        if self._last is not None and text.startswith(self._last[0]):
            seen, tokens = self._last
            return tokens + self.tokenizer.encode(text[len(seen):], add_special_tokens=False)
        return self.tokenizer.encode(text)

    def propose(self, messages: list[dict], schema: dict, *, seed: int | None = None) -> Proposal:
        from ..generate import stream_generate
        from ..sampler import SamplingParams

        text = self.tokenizer.apply_chat_template(messages)
        prompt = self._tokens(text)
        params = SamplingParams(temperature=self.temperature, seed=seed, grammar=grammar_for(schema))
        pieces, tokens, last = [], [], None
        for last in stream_generate(self.model, self.tokenizer, prompt, self.max_tokens, params=params,
                                    prefix_cache=self.prefix_cache):
            pieces.append(last.text)
            tokens.append(last.token)
        reply = "".join(pieces)
        shown = tokens[:-1] if last.finish_reason == "stop" else tokens  # the end token is not text
        self._last = (text + reply, prompt + shown)
        return Proposal(reply, last.prompt_tokens, len(tokens), last.cached_tokens)


class EndpointModel:
    """Any OpenAI-compatible chat completions endpoint (`tiny-llm serve`, vLLM, llama.cpp's
    server ...) through the `openai` client: each proposal asks for `response_format`
    json_schema with the action schema (strict), so a server that enforces schemas returns
    valid actions; `parse_action` checks them anyway. `base_url` is the API's root, e.g.
    `http://127.0.0.1:8000/v1`; `seed` goes with each request. Usage's `cached_tokens`
    (`prompt_tokens_details`) is reported when the server gives it."""

    def __init__(self, base_url: str, model: str = "default", api_key: str = "none", max_tokens: int = MAX_TOKENS,
                 *, temperature: float = TEMPERATURE, timeout: float = 600.0):
        try:
            import openai
        except ImportError:
            raise ValueError("EndpointModel needs the openai package (pip install openai)") from None
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {base_url!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        self.model, self.max_tokens, self.temperature = model, max_tokens, temperature
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=1)

    def propose(self, messages: list[dict], schema: dict, *, seed: int | None = None) -> Proposal:
        response = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=self.max_tokens, temperature=self.temperature,
            response_format={"type": "json_schema", "json_schema": {"name": "action", "schema": schema, "strict": True}},
            **({} if seed is None else {"seed": seed}),
        )
        text = response.choices[0].message.content or ""
        usage = response.usage
        if usage is None:
            return Proposal(text)
        details = getattr(usage, "prompt_tokens_details", None)
        cached = (getattr(details, "cached_tokens", None) or 0) if details is not None else 0
        return Proposal(text, usage.prompt_tokens or 0, usage.completion_tokens or 0, cached)
