"""Engine — Hugging Face hub: repo ids, resolved to a local directory (downloaded if need be).

Tests: tests/test_progress.py
"""

import os
from pathlib import Path


def looks_like_repo_id(name: str) -> bool:
    """Whether `name` reads as a Hugging Face repo id (`owner/name`), not a local path."""
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~")) and "\\" not in name


def download(repo_id: str) -> Path:
    """The local snapshot of `repo_id` (config, weights, tokenizer files), downloaded unless
    it is cached; with `HF_HUB_OFFLINE` set only the cache is read."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(
            repo_id,
            allow_patterns=["*.json", "*.safetensors", "*.jinja", "tokenizer.model"],
            local_files_only=offline,
        )
    except Exception as e:
        raise FileNotFoundError(
            f"cannot get Hugging Face repo {repo_id!r}: it is not in the local cache and "
            f"could not be downloaded ({type(e).__name__})"
        ) from None
    return Path(path)
