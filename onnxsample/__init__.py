"""onnxsample: LLM sampling inside the ONNX graph.

Samplers are onnxscript subgraphs whose parameters are per-slot runtime tensors; the composer splices a
sampler chain after an exported model's ``logits`` so that one ONNX Runtime session runs model and
sampling together.
"""

from __future__ import annotations

from onnxsample._ort import check_runtime as _check_runtime

_check_runtime()

from onnxsample.errors import (  # noqa: E402
    ExportError,
    InvalidParameter,
    ModelError,
    OnnxSampleError,
    RuntimeUnavailable,
)

__version__ = "0.1.0"

__all__ = [
    "ExportError",
    "InvalidParameter",
    "ModelError",
    "OnnxSampleError",
    "RuntimeUnavailable",
    "__version__",
]
