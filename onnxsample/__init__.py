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
from onnxsample.engine import Engine  # noqa: E402
from onnxsample.errors import (  # noqa: E402
    EngineClosed,
    ExportError,
    GenerationError,
    InvalidParameter,
    ModelError,
    OnnxSampleError,
    OutOfMemory,
    QueueFull,
    RuntimeUnavailable,
)
from onnxsample.generator import Generator  # noqa: E402
from onnxsample.inspection import inspect_model  # noqa: E402
from onnxsample.metadata import ComposedMetadata  # noqa: E402
from onnxsample.params import SamplingParams, pack_sampling_params  # noqa: E402
from onnxsample.prepare import prepare  # noqa: E402
from onnxsample.request import Completion, Request, StreamEvent, Timings  # noqa: E402
from onnxsample.sampler_model import build_sampler_model, sampler_feeds  # noqa: E402
from onnxsample.tokenizer import Tokenizer  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Completion",
    "ComposedMetadata",
    "Engine",
    "EngineClosed",
    "ExportError",
    "GenerationError",
    "Generator",
    "InvalidParameter",
    "ModelError",
    "OnnxSampleError",
    "OutOfMemory",
    "QueueFull",
    "Request",
    "RuntimeUnavailable",
    "SamplerChain",
    "SamplingParams",
    "StreamEvent",
    "Timings",
    "Tokenizer",
    "__version__",
    "build_sampler_model",
    "compose",
    "composed_metadata",
    "inspect_model",
    "pack_sampling_params",
    "prepare",
    "sampler_feeds",
]
