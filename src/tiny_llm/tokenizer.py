"""Engine — tokenizers: Hugging Face `tokenizer.json` files, GGUF vocabularies, chat templates.

Tests: tests/test_constrain_grammar.py, tests/test_loader.py, tests/test_progress.py, tests/test_tokenizer.py
"""

import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import jinja2.meta
import jinja2.sandbox
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

# Pre-tokenizer split patterns of the GGUF `tokenizer.ggml.pre` values we support.
_GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GGUF_TOKEN_CONTROL, GGUF_TOKEN_USER_DEFINED = 3, 4


@functools.lru_cache(maxsize=8)
def _read_backend(path: str, size: int, mtime_ns: int) -> HFTokenizer:
    """The parsed `tokenizer.json` at `path`, kept per version of the file (its size and
    modification time): a model loaded again in one process, such as one per run of an
    evaluation, does not parse its tokenizer again (0.2 s for the default model's). The
    tokenizers of one file share this backend; tiny-llm never changes a backend it read."""
    return HFTokenizer.from_file(path)


class Tokenizer:
    """Text <-> token ids, special tokens and the chat template of one model."""

    def __init__(
        self,
        backend: HFTokenizer,
        *,
        bos_token: str | None = None,
        eos_tokens: Sequence[str] = (),
        chat_template: str | None = None,
        add_bos_token: bool = False,
    ):
        self.backend = backend
        self.bos_token = bos_token
        self.eos_token = eos_tokens[0] if eos_tokens else None
        self.chat_template = chat_template
        self.add_bos_token = add_bos_token
        ids = [backend.token_to_id(t) for t in eos_tokens]
        self.eos_token_ids: frozenset[int] = frozenset(i for i in ids if i is not None)
        self.bos_token_id = backend.token_to_id(bos_token) if bos_token else None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: Sequence[Mapping], add_generation_prompt: bool = True, *,
        tools: Sequence[Mapping] | None = None,
    ) -> str:
        """Render `messages` ([{"role": ..., "content": ...}]) with the model's template;
        `tools` (OpenAI function definitions) reach templates that read a `tools` variable."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
        env.globals["raise_exception"] = _raise_template_error
        return env.from_string(self.chat_template).render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **({"tools": list(tools)} if tools else {}),
        )

    @property
    def template_takes_tools(self) -> bool:
        """Whether the chat template renders tool definitions (it reads a `tools` variable)."""
        if not self.chat_template:
            return False
        cached = getattr(self, "_takes_tools", None)
        if cached is None or cached[0] != self.chat_template:  # parsed once per template
            env = jinja2.sandbox.ImmutableSandboxedEnvironment()
            names = jinja2.meta.find_undeclared_variables(env.parse(self.chat_template))
            self._takes_tools = cached = (self.chat_template, "tools" in names)
        return cached[1]

    def save(self, directory: Path) -> None:
        """Write `tokenizer.json` and `tokenizer_config.json` (readable by `transformers`)."""
        self.backend.save(str(directory / "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "add_bos_token": self.add_bos_token,
            "chat_template": self.chat_template,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 1 << 30,
        }
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))

    @classmethod
    def from_directory(cls, directory: Path) -> "Tokenizer":
        """Read a Hugging Face tokenizer directory (`tokenizer.json` + its configs)."""
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{directory} has no tokenizer.json")
        stat = path.stat()
        try:
            backend = _read_backend(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        except Exception as e:  # the tokenizers library raises its own Exception type
            raise ValueError(f"{path} is not a readable tokenizer file: {e}") from None
        config = _read_json(directory / "tokenizer_config.json")
        template = config.get("chat_template")
        if template is None and (directory / "chat_template.jinja").is_file():
            template = (directory / "chat_template.jinja").read_text()
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        eos = [_token_text(config.get("eos_token"))]
        # generation_config.json and config.json may name extra end-of-sequence ids.
        for extra in ("generation_config.json", "config.json"):
            value = _read_json(directory / extra).get("eos_token_id")
            for i in value if isinstance(value, list) else [value]:
                if isinstance(i, int) and backend.id_to_token(i) is not None:
                    eos.append(backend.id_to_token(i))
        return cls(
            backend,
            bos_token=_token_text(config.get("bos_token")),
            eos_tokens=list(dict.fromkeys(t for t in eos if t)),
            chat_template=template,
            add_bos_token=bool(config.get("add_bos_token", False)),
        )

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping) -> "Tokenizer":
        """Build a byte-level BPE tokenizer from GGUF `tokenizer.ggml.*` metadata."""
        kind = str(meta.get("tokenizer.ggml.model", ""))
        if kind != "gpt2":
            raise ValueError(f"unsupported GGUF tokenizer model {kind!r}: only 'gpt2' (BPE) is")
        tokens = list(meta["tokenizer.ggml.tokens"])
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        types = [int(t) for t in meta.get("tokenizer.ggml.token_type", [1] * len(tokens))]
        pre = str(meta.get("tokenizer.ggml.pre", "default"))
        patterns = {
            "smollm": [r"\p{N}", _GPT2_PATTERN],  # single digits, then GPT-2's split
            "default": [_GPT2_PATTERN], "gpt-2": [_GPT2_PATTERN],
            "qwen2": [_QWEN2_PATTERN], "llama-bpe": [_LLAMA3_PATTERN],
        }
        if pre not in patterns:
            raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r}: known {sorted(patterns)}")
        try:
            backend = HFTokenizer(models.BPE(
                vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False,
                byte_fallback=False, ignore_merges=False,
            ))
        except Exception as e:  # the tokenizers library raises a bare Exception
            raise ValueError(f"invalid GGUF vocabulary: {e}") from None
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in patterns[pre]]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([
            AddedToken(t, special=True, normalized=False)
            for t, kind in zip(tokens, types) if kind == GGUF_TOKEN_CONTROL
        ])
        backend.add_tokens([
            AddedToken(t, special=False, normalized=False)
            for t, kind in zip(tokens, types) if kind == GGUF_TOKEN_USER_DEFINED
        ])

        def token(key: str) -> str | None:
            i = meta.get(f"tokenizer.ggml.{key}_token_id")
            return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

        eos = [token("eos"), token("eot")]
        return cls(
            backend,
            bos_token=token("bos"),
            eos_tokens=list(dict.fromkeys(t for t in eos if t)),
            chat_template=meta.get("tokenizer.chat_template"),
            add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        )


def _raise_template_error(message: str):
    raise ValueError(f"chat template error: {message}")


def _token_text(token) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


def _read_json(path: Path) -> dict:
    """A JSON object from `path`, or {} when there is no such file."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} should hold a JSON object, got {type(value).__name__}")
    return value


class StreamingDetokenizer:
    """Turns tokens into text one at a time, never emitting half a character.

    Byte-level tokens can end in the middle of a UTF-8 sequence, and some tokenizers decode a
    token differently at the start of a text (a leading space dropped). So each new token is
    decoded together with the few tokens before it, and text is released only once it no
    longer ends in the replacement character U+FFFD.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.reset()

    def reset(self) -> None:
        self.tokens: list[int] = []
        self.text = ""  # everything released so far
        self.last_segment = ""  # what the last add_token / finalize released
        self._prefix = 0  # tokens[_prefix:_read] were already released
        self._read = 0

    def add_token(self, token: int) -> None:
        self.tokens.append(token)
        decode = self.tokenizer.decode
        done = decode(self.tokens[self._prefix : self._read])
        now = decode(self.tokens[self._prefix :])
        if len(now) > len(done) and not now.endswith("\ufffd"):
            self.last_segment = now[len(done) :]
            self._prefix, self._read = self._read, len(self.tokens)
        else:
            self.last_segment = ""
        self.text += self.last_segment

    def finalize(self) -> None:
        """Release whatever is left (an incomplete character shows as U+FFFD)."""
        decode = self.tokenizer.decode
        done = decode(self.tokens[self._prefix : self._read])
        now = decode(self.tokens[self._prefix :])
        self.last_segment = now[len(done) :]
        self._prefix = self._read = len(self.tokens)
        self.text += self.last_segment

    def step(self, token: int, finish: str | None) -> str:
        """The text to show for one generated `token`: an end-of-sequence token
        (`finish == "stop"`) adds nothing and releases the rest; the last token of a
        generation (`finish == "length"`) is added and everything is released."""
        if finish == "stop":
            self.finalize()
            return self.last_segment
        self.add_token(token)
        text = self.last_segment
        if finish == "length":
            self.finalize()
            text += self.last_segment
        return text
