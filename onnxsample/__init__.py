"""onnxsample: LLM sampling inside the ONNX graph.

Samplers are onnxscript subgraphs whose parameters are per-slot runtime tensors; the composer splices a
sampler chain after an exported model's ``logits`` so that one ONNX Runtime session runs model and
sampling together.
"""

from __future__ import annotations

from onnxsample._ort import check_runtime as _check_runtime

_check_runtime()

from onnxsample.chain import SamplerChain  # noqa: E402
from onnxsample.constraint import Constraint  # noqa: E402
from onnxsample.engine import Engine  # noqa: E402
from onnxsample.engine.generator import Generator  # noqa: E402
from onnxsample.engine.request import (  # noqa: E402
    Completion,
    PromptProgress,
    Request,
    StreamEvent,
    Timings,
)
from onnxsample.errors import (  # noqa: E402
    ContextExceeded,
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
from onnxsample.metadata import ComposedMetadata, composed_metadata  # noqa: E402
from onnxsample.params import SamplingParams, pack_sampling_params  # noqa: E402

# Eager, not lazy: the function shares its module's name, and importing the module (as
# `from onnxsample.prepare import ...` does) would set the package's attribute to the module.
from onnxsample.prepare import prepare  # noqa: E402
from onnxsample.text.tokenizer import Tokenizer  # noqa: E402

__version__ = "0.1.0"

# Building graphs needs onnxscript (and through onnx-ir, sympy): ~0.8 s of imports that running a
# composed model never uses. These load on first use.
_LAZY = {
    "compose": "onnxsample.composer",
    "inspect_model": "onnxsample.composer.inspection",
    "build_sampler_model": "onnxsample.composer.sampler_model",
    "sampler_feeds": "onnxsample.composer.sampler_model",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'onnxsample' has no attribute {name!r}")


__all__ = [
    "Completion",
    "ComposedMetadata",
    "Constraint",
    "ContextExceeded",
    "Engine",
    "EngineClosed",
    "ExportError",
    "GenerationError",
    "Generator",
    "InvalidParameter",
    "ModelError",
    "OnnxSampleError",
    "OutOfMemory",
    "PromptProgress",
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
