"""The :class:`~onnxsample.Engine`'s own options, checked before its model loads, and the
positions a sequence may hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from onnxsample.engine._model_info import context_length
from onnxsample.errors import InvalidParameter

__all__ = ["UNBOUNDED", "check_ahead", "check_threads", "checked_options", "positions_limit"]

UNBOUNDED = 2**62  # the positions of a model that names no context, given no max_len


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


def check_threads(threads: Any) -> None:
    """:class:`InvalidParameter` unless `threads` (ONNX Runtime's intra-op threads) is None or an
    integer >= 1."""
    if threads is not None and (
        not isinstance(threads, int) or isinstance(threads, bool) or threads < 1
    ):
        raise InvalidParameter(f"threads must be an integer >= 1, got {threads!r}")


def check_ahead(model: Path, *, threads: Any, max_len: Any, prefill_chunk: Any) -> None:
    """What an engine of `model` refuses of these options, checked where none is loaded (the
    builder of replicas, which would each fail to start): bad numbers, a `max_len` past the
    model's context."""
    checked_options(model, max_len, None, prefill_chunk)
    check_threads(threads)
    positions_limit(context_length(model.parent), max_len)


def positions_limit(context: int | None, max_len: int | None) -> int:
    """The positions a sequence may hold: `max_len`, at most the model's `context` (its rotary
    tables end there: a larger one is refused, as vLLM refuses it, not cut to the context)."""
    if max_len is not None and context is not None and max_len > context:
        raise InvalidParameter(
            f"max_len must be at most the model's context ({context} positions), got {max_len}"
        )
    return min(x for x in (context, max_len, UNBOUNDED) if x)
