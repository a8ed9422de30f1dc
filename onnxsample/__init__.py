"""onnxsample: LLM sampling inside the ONNX graph.

Samplers are onnxscript subgraphs whose parameters are per-slot runtime tensors; the composer splices a
sampler chain after an exported model's ``logits`` so that one ONNX Runtime session runs model and
sampling together.
"""

from __future__ import annotations

from onnxsample._ort import check_runtime as _check_runtime

_check_runtime()

from onnxsample.chain import SamplerChain  # noqa: E402
from onnxsample.composer import compose, composed_metadata  # noqa: E402
from onnxsample.errors import (  # noqa: E402
    ExportError,
    InvalidParameter,
    ModelError,
    OnnxSampleError,
    RuntimeUnavailable,
)
from onnxsample.generator import Completion, Generator, StreamEvent, Timings  # noqa: E402
from onnxsample.inspection import inspect_model  # noqa: E402
from onnxsample.metadata import ComposedMetadata  # noqa: E402
from onnxsample.params import SamplingParams, pack_sampling_params  # noqa: E402
from onnxsample.prepare import prepare  # noqa: E402
from onnxsample.sampler_model import build_sampler_model, sampler_feeds  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Completion",
    "ComposedMetadata",
    "ExportError",
    "Generator",
    "InvalidParameter",
    "ModelError",
    "OnnxSampleError",
    "RuntimeUnavailable",
    "SamplerChain",
    "SamplingParams",
    "StreamEvent",
    "Timings",
    "__version__",
    "build_sampler_model",
    "compose",
    "composed_metadata",
    "inspect_model",
    "pack_sampling_params",
    "prepare",
    "sampler_feeds",
]
