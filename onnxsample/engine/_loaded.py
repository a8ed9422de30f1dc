"""A composed model opened for the engine: its session on a device, the sampler contract it was
composed with, what its folder says (tokenizer, stop ids, context length), and how many
sequences it runs together. Every check of the model and of the options that depend on it
(``cuda_graph``, ``row_buckets``) is made here, before the engine starts a thread.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from onnxsample._gguf_file import is_gguf
from onnxsample.engine import _session
from onnxsample.engine._model_info import ModelInfo
from onnxsample.engine._session import (
    captured_by_default,
    check_cuda_graph,
    create_session,
    input_names,
    warn_if_cpu_shaped,
)
from onnxsample.errors import InvalidParameter, ModelError
from onnxsample.metadata import ComposedMetadata, composed_metadata
from onnxsample.text import check_chat_template

__all__ = ["LoadedModel", "load_model"]

log = logging.getLogger(__name__)

_PAST = "past_key_values."
# The call of onnxruntime.InferenceSession that initialises a session once it has read the model.
_INITIALIZE = "initialize_session"


@dataclass(frozen=True)
class LoadedModel:
    """A composed model's session and what the engine reads beside it."""

    path: Path
    session: Any  # onnxruntime.InferenceSession
    device: str
    meta: ComposedMetadata
    info: ModelInfo
    cuda_graph: bool  # decode steps replayed as captured CUDA graphs
    pasts: dict[str, Any]  # the past_key_values inputs, by name
    inputs: set[str]  # every input name, with the initializers a feed may override
    concurrency: int  # sequences that can run together


def load_model(
    path: Path,
    *,
    provider: str,
    threads: int | None,
    optimization: str,
    cuda_graph: bool | None,
    row_buckets: bool,
    speculative: str | None,
    tokenizer: Path | None,
    chat_template: str | None = None,
) -> LoadedModel:
    """Open `path` as :class:`~onnxsample.Engine` documents its arguments (`tokenizer` None: the
    model's folder; `chat_template` in place of the folder's); a bad model, template or
    combination it cannot run raises a typed error."""
    if chat_template is not None:
        check_chat_template(chat_template)  # before the model's load, not after
    if path.is_dir():
        raise ModelError(
            f"{path} is a folder: give its composed model ({path / 'composed.onnx'}), or compose "
            f"one with onnxsample.prepare({str(path)!r})"
        )
    if not path.is_file():
        raise ModelError(f"no such composed model: {path}")
    if is_gguf(path):
        raise ModelError(
            f"{path} is a GGUF file: run what onnxsample.prepare({str(path)!r}) exports and "
            "composes of it (or `onnxsample export` it)"
        )
    if cuda_graph is None:
        cuda_graph = captured_by_default(path, provider, speculative)
    if cuda_graph:
        if provider == "cpu":
            raise InvalidParameter("cuda_graph needs the CUDA provider (provider='cuda')")
        check_cuda_graph(composed_metadata(path), path.name)
    elif not row_buckets:
        raise InvalidParameter(
            "row_buckets=False needs cuda_graph: an uncaptured step runs the model over the "
            "running sequences only"
        )
    session, device, info = _session_and_info(
        lambda: create_session(
            path, provider, threads=threads, optimization=optimization, cuda_graph=cuda_graph
        ),
        tokenizer if tokenizer is not None else path.parent,
    )
    meta = ComposedMetadata.from_session(session)
    if meta is None:
        raise ModelError(
            f"{path.name} is not a composed model: run `onnxsample compose` on it first"
        )
    if cuda_graph and device not in _session.GRAPH_DEVICES:
        raise InvalidParameter(f"cuda_graph needs the CUDA provider; the session runs on {device}")
    if isinstance(info, Exception):  # a bad folder, reported after a bad model as before
        raise info
    if chat_template is not None:
        info = replace(info, tokenizer=info.tokenizer.with_chat_template(chat_template))
    inputs = {i.name: i for i in session.get_inputs()}
    pasts = {name: i for name, i in inputs.items() if name.startswith(_PAST)}
    if device == "cuda":
        warn_if_cpu_shaped(meta, pasts, path)
    if meta.kv_layout == "gqa":
        concurrency = meta.max_slots
    else:
        # Left-padded batches need explicit positions (optimum's layout).
        concurrency = meta.max_slots if "position_ids" in inputs else 1
        if concurrency == 1 and meta.max_slots > 1:
            log.info("%s has no position_ids input: one sequence at a time", path.name)
    return LoadedModel(
        path,
        session,
        device,
        meta,
        info,
        bool(cuda_graph),
        pasts,
        input_names(session),
        concurrency,
    )


def _session_and_info(create, folder: Path) -> tuple[Any, str, ModelInfo | Exception]:
    """`create()`'s session and device, and the folder's :class:`ModelInfo` (or the error reading
    it), made at the same time.

    ONNX Runtime reads the model holding the GIL, then initialises the session (graph
    optimisation, prepacking) without it; the tokenizer's backend holds the GIL while it reads its
    file. Gemma 3's 262k-token tokenizer and its session take more than a second each, so the
    session is made on a thread of its own and the tokenizer read here while it initialises: on
    two cores the load takes the model's reading and the longer of the other two, not their sum.
    Read while the model is read, the tokenizer would only make it wait. The initialising call is
    seen by the worker's profile hook; where the interpreter reports no such call (CPython
    3.12.0-3.12.4 report none for extension methods), the tokenizer is read after the session.
    A session that fails is reported without reading the tokenizer.
    """
    reading_done = threading.Event()
    made: list = []

    def make() -> None:
        before = sys.getprofile()

        def watch(frame, event: str, arg) -> None:  # this thread's calls until the one we wait for
            if event == "c_call" and getattr(arg, "__name__", "") == _INITIALIZE:
                sys.setprofile(before)
                reading_done.set()
            elif before is not None:
                before(frame, event, arg)

        sys.setprofile(watch)
        try:
            made.append(create())
        except BaseException as exc:  # re-raised on the caller's thread
            made.append(exc)
        finally:
            sys.setprofile(before)
            if not reading_done.is_set():
                log.debug("the session was made before the tokenizer was read: no overlap")
                reading_done.set()

    def read() -> ModelInfo | Exception:  # an error is reported after the model's own
        try:
            return ModelInfo.read(folder)
        except Exception as exc:
            return exc

    worker = threading.Thread(target=make, name="onnxsample-session", daemon=True)
    worker.start()
    try:
        reading_done.wait()
        info = None if made else read()  # still initialising: its failure, if any, comes after
    finally:
        worker.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    session, device = made[0]
    return session, device, read() if info is None else info
