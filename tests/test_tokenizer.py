"""Tokenizer: chat templates, end-of-sequence ids, and streaming detokenization."""

import json

import pytest

from tiny_llm.tokenizer import StreamingDetokenizer, Tokenizer

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Name a colour."},
]


@pytest.mark.parametrize("messages", [MESSAGES, MESSAGES[1:2]])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(default_tokenizer, reference_default_model, messages, add_generation_prompt):
    """Our jinja rendering of the model's template equals Hugging Face's."""
    tokenizer = default_tokenizer
    ref = reference_default_model.tokenizer
    ours = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    theirs = ref.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    assert ours == theirs


def test_encoding_matches_transformers(default_tokenizer, reference_default_model):
    """Token ids equal those of the transformers tokenizer mlx-lm builds from the same files."""
    tokenizer = default_tokenizer
    ref = reference_default_model.tokenizer
    for text in ["Hello, world!", "  two spaces\tand a tab", "数字 12345 and 3.14", "<|im_start|>user\nhi<|im_end|>"]:
        assert tokenizer.encode(text) == ref.encode(text)


@pytest.mark.parametrize("text", ["plain words and spaces", "Grüße 世界 🙂🙂 naïve café", "line\n\n  indented\t"])
def test_streaming_detokenizer_never_emits_half_a_character(default_tokenizer, text):
    """Fed one token at a time, the segments join to the text and none holds U+FFFD."""
    tokenizer = default_tokenizer
    detok = StreamingDetokenizer(tokenizer)
    segments = []
    for token in tokenizer.encode(text):
        detok.add_token(token)
        segments.append(detok.last_segment)
    detok.finalize()
    segments.append(detok.last_segment)
    assert all("\ufffd" not in s for s in segments)
    assert "".join(segments) == text == detok.text


def test_streaming_detokenizer_holds_back_an_incomplete_character(default_tokenizer):
    """A multi-byte character split over byte tokens appears only once it is complete."""
    tokenizer = default_tokenizer
    tokens = tokenizer.encode("🙂")
    assert len(tokens) > 1  # the emoji is several byte-level tokens
    detok = StreamingDetokenizer(tokenizer)
    for token in tokens[:-1]:
        detok.add_token(token)
        assert detok.last_segment == ""
    detok.add_token(tokens[-1])
    assert detok.last_segment == "🙂"


def test_directory_tokenizer_collects_eos_ids_from_every_config(default_model_dir, tmp_path):
    """eos ids come from tokenizer_config.json, generation_config.json and config.json."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_text((default_model_dir / name).read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 1}))
    tokenizer = Tokenizer.from_directory(tmp_path)
    assert tokenizer.eos_token_ids == {0, 1, 2}


def test_a_tokenizer_file_is_parsed_once_per_version(default_model_dir, tmp_path):
    """Loading the same tokenizer.json again shares its parsed backend; a changed file is
    read again, and a broken one is refused each time it is loaded."""
    (tmp_path / "tokenizer.json").write_text((default_model_dir / "tokenizer.json").read_text())
    first, again = Tokenizer.from_directory(tmp_path), Tokenizer.from_directory(tmp_path)
    assert again.backend is first.backend and again is not first
    config = json.loads((tmp_path / "tokenizer.json").read_text())
    config["added_tokens"].append({"id": 49152, "content": "<extra>", "single_word": False, "lstrip": False,
                                   "rstrip": False, "normalized": False, "special": True})
    (tmp_path / "tokenizer.json").write_text(json.dumps(config))
    changed = Tokenizer.from_directory(tmp_path)
    assert changed.backend is not first.backend
    assert (changed.vocab_size, first.vocab_size) == (49153, 49152)
    (tmp_path / "tokenizer.json").write_text("{not json")
    for _ in range(2):
        with pytest.raises(ValueError, match="is not a readable tokenizer file"):
            Tokenizer.from_directory(tmp_path)


def test_missing_tokenizer_file_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no tokenizer.json"):
        Tokenizer.from_directory(tmp_path)


def test_template_errors_are_value_errors(default_tokenizer):
    """raise_exception() inside a template becomes a ValueError with its message."""
    tokenizer = default_tokenizer
    broken = Tokenizer(tokenizer.backend, chat_template="{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ValueError, match="chat template error: roles must alternate"):
        broken.apply_chat_template(MESSAGES)
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(tokenizer.backend).apply_chat_template(MESSAGES)
