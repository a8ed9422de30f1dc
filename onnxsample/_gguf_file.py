"""Whether a file is a GGUF: its magic bytes say so, whatever its name (as llama.cpp reads one)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["GGUF_MAGIC", "is_gguf"]

GGUF_MAGIC = b"GGUF"


def is_gguf(path: Path) -> bool:
    """Whether `path` is a readable file that starts with GGUF's magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:  # a folder, or not readable
        return False
