"""Local pretrained checkpoints, read offline: what a folder holds, its tokenizer, its sizes.

A checkpoint folder is what ``save_pretrained`` writes (``config.json`` and the weights), e.g. a
copy of ``facebook/wav2vec2-base`` or ``bert-base-uncased`` taken to a machine without internet.
Nothing here downloads: every transformers call passes ``local_files_only``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = [
    "EXPECTED_MODEL_TYPE",
    "WEIGHT_FILES",
    "checkpoint_problem",
    "has_tokenizer",
    "load_tokenizer",
    "read_config",
]

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
EXPECTED_MODEL_TYPE = {"speech": "wav2vec2", "text": "bert"}


def read_config(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))


def checkpoint_problem(path: str | Path, side: str) -> str | None:
    """Why ``path`` cannot be loaded as the ``side`` ("speech" or "text") encoder, as one line
    naming the key and the fix; None when it can."""
    key = f"{side}_pretrained_path"
    folder = Path(path)
    fix = "give a folder written by save_pretrained (config.json and weights)"
    if not folder.is_dir():
        return f"{key}: {path} is not a folder; {fix}"
    if not (folder / "config.json").is_file():
        return f"{key}: {path} has no config.json; {fix}"
    try:
        config = read_config(folder)
    except (ValueError, OSError) as exc:
        return f"{key}: {path}/config.json cannot be read ({exc}); {fix}"
    kind = config.get("model_type")
    if kind != EXPECTED_MODEL_TYPE[side]:
        return (
            f"{key}: {path} holds a {kind!r} model, the {side} encoder is "
            f"{EXPECTED_MODEL_TYPE[side]!r}; point it at a {EXPECTED_MODEL_TYPE[side]} checkpoint"
        )
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        return f"{key}: {path} has no weights (none of {', '.join(WEIGHT_FILES)}); {fix}"
    return None


def has_tokenizer(path: str | Path) -> bool:
    return bool(path) and any((Path(path) / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(path: str | Path):
    """The checkpoint's own tokenizer as a ``tokenizers.Tokenizer`` (with its [CLS]/[SEP]
    post-processing) and its padding id."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if not getattr(tok, "is_fast", False):
        raise ValueError(
            f"text_pretrained_path: {path} has no fast tokenizer (tokenizer.json or vocab.txt)"
        )
    return tok.backend_tokenizer, int(tok.pad_token_id or 0)
