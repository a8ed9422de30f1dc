"""The Llama names of the exporter before it read other families, kept for code that imports them.

The spec is :class:`~onnxsample.exporters.families.DecoderSpec` (``LlamaSpec`` is the same class),
the readers are in :mod:`._weights`, and the Llama family is
:mod:`onnxsample.exporters.families.llama`.
"""

from __future__ import annotations

from typing import Any

from onnxsample.exporters._weights import read_gguf, read_hf
from onnxsample.exporters.families import DecoderSpec
from onnxsample.exporters.families.llama import FAMILY

__all__ = [
    "LLAMA_GGUF_ARCHITECTURES",
    "LLAMA_HF_TYPES",
    "LlamaSpec",
    "hf_spec",
    "read_gguf",
    "read_hf",
]

LlamaSpec = DecoderSpec
LLAMA_HF_TYPES = FAMILY.hf_types
LLAMA_GGUF_ARCHITECTURES = FAMILY.gguf_architectures


def hf_spec(config: dict[str, Any], what: str) -> DecoderSpec:
    """The spec of an HF Llama `config.json`."""
    if config.get("model_type") not in LLAMA_HF_TYPES:
        from onnxsample.errors import ExportError

        raise ExportError(f"{what} is not a Llama-family model; use --layout optimum")
    return FAMILY.hf_spec(config, what)
