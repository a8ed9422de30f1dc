"""What the runtime reads beside a composed model: its tokenizer, stop tokens and context length.

An export folder holds ``tokenizer.json`` (and the chat template), ``generation_config.json``,
``config.json`` and our manifest ``onnxsample.json``; an onnxruntime-genai folder holds
``genai_config.json``. EOS/EOG ids are the union of what they list; the context length comes from the
manifest, else the model config, else genai's ``context_length``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from onnxsample.errors import ModelError
from onnxsample.text.tokenizer import Tokenizer


@dataclass(frozen=True)
class ModelInfo:
    """The tokenizer, the ids that end a sequence, and the context length (None when unknown)."""

    tokenizer: Tokenizer
    eos_ids: frozenset[int]
    context_length: int | None

    @classmethod
    def read(cls, folder: Path) -> ModelInfo:
        if not folder.is_dir():
            raise ModelError(f"no such tokenizer folder: {folder}")
        tokenizer = Tokenizer.from_folder(folder)
        ids: set[int] = set()
        manifest = _json(folder / "onnxsample.json")
        ids.update(manifest.get("tokens", {}).get("eos_token_ids", []))
        for name in ("generation_config.json", "config.json"):
            eos = _json(folder / name).get("eos_token_id")
            ids.update([eos] if isinstance(eos, int) else eos or [])
        eos = _json(folder / "genai_config.json").get("model", {}).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else eos or [])
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        return cls(tokenizer, frozenset(int(i) for i in ids), context_length(folder))


def context_length(folder: Path) -> int | None:
    """The context length the files in `folder` give (the manifest's, the model config's, genai's),
    None when none does."""
    context = _json(folder / "onnxsample.json").get("model", {}).get("max_position_embeddings")
    context = context or _json(folder / "config.json").get("max_position_embeddings")
    context = context or _json(folder / "genai_config.json").get("model", {}).get("context_length")
    return int(context) if context else None


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}
