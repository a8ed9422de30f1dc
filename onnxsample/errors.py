"""The typed errors of onnxsample.

Every error a user can cause derives from :class:`OnnxSampleError` and carries a one-line message that
says what was wrong and, where there is one, the allowed range. The CLI prints that line and exits 1.
"""

from __future__ import annotations

__all__ = [
    "ContextExceeded",
    "EngineClosed",
    "ExportError",
    "GenerationError",
    "InvalidParameter",
    "ModelError",
    "OnnxSampleError",
    "OutOfMemory",
    "QueueFull",
    "RuntimeUnavailable",
]


class OnnxSampleError(Exception):
    """Base class of every error onnxsample raises on bad input or an unusable environment."""


class InvalidParameter(OnnxSampleError, ValueError):
    """A sampling parameter or option is outside its allowed range."""


class ContextExceeded(InvalidParameter):
    """The prompt's `prompt_tokens` do not fit the `context` positions a sequence may hold (the
    model's context or ``max_len``); the server answers it as llama-server does
    (``exceed_context_size_error``, ``n_prompt_tokens``, ``n_ctx``) with OpenAI's code
    ``context_length_exceeded``."""

    def __init__(self, message: str, prompt_tokens: int, context: int) -> None:
        super().__init__(message)
        self.prompt_tokens, self.context = prompt_tokens, context


class ExportError(OnnxSampleError):
    """A model source cannot be exported (missing, unsupported, or the output cannot be written)."""


class ModelError(OnnxSampleError):
    """An ONNX model cannot be used (no logits, unsafe external data, name collision, ...)."""


class RuntimeUnavailable(OnnxSampleError, ImportError):
    """ONNX Runtime is missing, doubly installed, or lacks the requested execution provider."""


class QueueFull(OnnxSampleError):
    """Every slot is busy and the engine's waiting queue holds ``max_queue`` requests (HTTP 429)."""


class EngineClosed(OnnxSampleError):
    """The engine was closed (or its thread stopped); it takes no more requests."""


class GenerationError(OnnxSampleError):
    """A request failed while it ran (the engine keeps serving the others)."""


class OutOfMemory(GenerationError, MemoryError):
    """The KV cache (or another buffer) for a request could not be allocated."""


def check_unicode(text: str, what: str) -> None:
    """InvalidParameter for `what`, a string that is not valid Unicode: a lone surrogate (JSON
    allows "\\ud800"), which no tokenizer or grammar reads and no response can carry. For the
    package's own modules, not the API."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidParameter(
            f"{what} is not valid Unicode: a lone surrogate U+{ord(text[exc.start]):04X} "
            f"at character {exc.start}"
        ) from None


def check_count(name: str, value: object, low: int, high: int | None = None) -> None:
    """InvalidParameter unless `value` is an integer (not a bool: True == 1 in Python) in
    [low, high] (no bound above when `high` is None). For the package's own modules, not the API."""
    import numbers

    whole = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not whole or value < low or (high is not None and value > high):
        within = f"an integer >= {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidParameter(f"{name} must be {within}, got {value!r}")


def count(name: str, value: object, low: int, high: int | None = None) -> int:
    """`value` as a Python int once :func:`check_count` passes it (a numpy integer becomes one:
    onnx's shapes take nothing else). For the package's own modules, not the API."""
    check_count(name, value, low, high)
    return int(value)  # type: ignore[call-overload]


def check_flag(name: str, value: object) -> bool:
    """`value` as a bool; InvalidParameter unless it is one (``1`` or ``"no"`` would be read
    one way and recorded another). For the package's own modules, not the API."""
    import numpy as np

    if not isinstance(value, (bool, np.bool_)):
        raise InvalidParameter(f"{name} must be True or False, got {value!r}")
    return bool(value)


def first_line(exc: BaseException) -> str:
    """The first line of `exc`'s message (its type's name where it has none): how another
    library's error is quoted in one of ours. For the package's own modules, not the API."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
