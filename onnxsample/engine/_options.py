"""The :class:`~onnxsample.Engine`'s own options, checked before its model loads, and the
positions a sequence may hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from onnxsample.errors import InvalidParameter

__all__ = ["checked_options", "positions_limit"]


def checked_options(model: Any, max_len: Any, max_queue: Any, prefill_chunk: Any) -> int | None:
    """:class:`InvalidParameter` for a `model` that is not a path or a bad number; the prefill
    chunk to use (0, as ``--prefill-chunk 0``, is None: whole prompts at once)."""
    if not isinstance(model, (str, Path)):
        raise InvalidParameter(
            f"model must be the path of a composed .onnx file (onnxsample.prepare() makes one), "
            f"got {model!r}"
        )
    if type(prefill_chunk) is int and prefill_chunk == 0:
        prefill_chunk = None
    for name, value, low in (
        ("max_len", max_len, 2),
        ("max_queue", max_queue, 0),
        ("prefill_chunk", prefill_chunk, 1),
    ):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < low
        ):
            raise InvalidParameter(f"{name} must be None or an integer >= {low}, got {value!r}")
    return prefill_chunk


def positions_limit(context: int | None, max_len: int | None) -> int:
    """The positions a sequence may hold: `max_len`, at most the model's `context` (its rotary
    tables end there: a larger one is refused, as vLLM refuses it, not cut to the context)."""
    if max_len is not None and context is not None and max_len > context:
        raise InvalidParameter(
            f"max_len must be at most the model's context ({context} positions), got {max_len}"
        )
    return min(x for x in (context, max_len, 2**62) if x)
