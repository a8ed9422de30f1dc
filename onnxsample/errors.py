"""The typed errors of onnxsample.

Every error a user can cause derives from :class:`OnnxSampleError` and carries a one-line message that
says what was wrong and, where there is one, the allowed range. The CLI prints that line and exits 1.
"""

from __future__ import annotations

__all__ = [
    "ExportError",
    "InvalidParameter",
    "ModelError",
    "OnnxSampleError",
    "RuntimeUnavailable",
]


class OnnxSampleError(Exception):
    """Base class of every error onnxsample raises on bad input or an unusable environment."""


class InvalidParameter(OnnxSampleError, ValueError):
    """A sampling parameter or option is outside its allowed range."""


class ExportError(OnnxSampleError):
    """A model source cannot be exported (missing, unsupported, or the output cannot be written)."""


class ModelError(OnnxSampleError):
    """An ONNX model cannot be used (no logits, unsafe external data, name collision, ...)."""


class RuntimeUnavailable(OnnxSampleError, ImportError):
    """ONNX Runtime is missing, doubly installed, or lacks the requested execution provider."""
