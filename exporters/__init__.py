"""Exporters: a model source (HF folder, GGUF file, the embedded SmolLM2) to ONNX with a KV cache.

One source kind per module (:mod:`.hf`, :mod:`.gguf`, :mod:`.embedded`); :func:`export` ties them
together and writes a manifest (`onnxsample.json`) beside `model.onnx`.
"""

from onnxsample.exporters._export import STAGES, ExportResult, export
from onnxsample.exporters._manifest import MANIFEST_NAME, read_manifest
from onnxsample.exporters._options import PRECISIONS
from onnxsample.exporters._source import Source, resolve_source
from onnxsample.exporters.embedded import embedded_gguf

__all__ = [
    "MANIFEST_NAME",
    "PRECISIONS",
    "STAGES",
    "ExportResult",
    "Source",
    "embedded_gguf",
    "export",
    "read_manifest",
    "resolve_source",
]
