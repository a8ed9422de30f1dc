"""Resolve what the user named as a model source: nothing (the embedded model), a folder, or a GGUF."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from onnxsample.errors import ExportError
from onnxsample.exporters.embedded import EMBEDDED_NAME, embedded_gguf

SourceKind = Literal["embedded", "gguf", "hf"]

# Something like "HuggingFaceTB/SmolLM2-135M-Instruct": a hub id, not a path on this machine.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_GGUF_MAGIC = b"GGUF"
# Files that make up a Hugging Face model folder's content (weights, config, tokenizer).
_HF_CONTENT = ("*.json", "*.safetensors", "*.bin", "*.model", "*.txt", "*.jinja", "*.py")


@dataclass(frozen=True)
class Source:
    """A resolved model source."""

    kind: SourceKind
    path: Path
    name: str

    def digest(self) -> str:
        """sha256 of the source: the GGUF file, or the sorted content files of an HF folder."""
        h = hashlib.sha256()
        if self.path.is_file():
            _hash_file(h, self.path)
        else:
            files = sorted({p for pattern in _HF_CONTENT for p in self.path.glob(pattern)})
            for file in files:
                h.update(file.name.encode() + b"\0")
                _hash_file(h, file)
        return h.hexdigest()

    def to_json(self) -> dict:
        return {"kind": self.kind, "path": str(self.path), "name": self.name}


def _hash_file(h: hashlib._Hash, path: Path) -> None:
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)


def resolve_source(source: str | Path | None) -> Source:
    """Turn a CLI/API source argument into a :class:`Source`, or raise a one-line :class:`ExportError`."""
    if source is None or str(source) == "":
        return Source("embedded", embedded_gguf(), EMBEDDED_NAME)
    path = Path(source).expanduser()
    if not path.exists():
        if _HUB_ID.match(str(source)) and not str(source).startswith((".", "/")):
            raise ExportError(
                f"{source!r} is not a local path: only local model folders and .gguf files are "
                "accepted (model ids that need a hub download are not supported)"
            )
        raise ExportError(f"no such file or folder: {path}")
    path = path.resolve()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ExportError(f"{path} is not a Hugging Face model folder: config.json is missing")
        return Source("hf", path, path.name)
    if path.suffix.lower() != ".gguf":
        raise ExportError(f"{path} is neither a model folder nor a .gguf file")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != _GGUF_MAGIC:
        raise ExportError(
            f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)"
        )
    return Source("gguf", path, path.stem)
