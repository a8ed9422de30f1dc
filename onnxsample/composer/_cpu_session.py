"""ONNX Runtime CPU sessions that the composer runs on a graph while it builds one (the LM-head
check, the weight codes widened once), over weights left where they are."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import onnx_ir as ir

__all__ = ["cpu_session", "data_folders"]


def data_folders(tensors: Iterable[ir.TensorProtocol | None]) -> set[Path]:
    """The folders of the external data files `tensors` are mapped from (none for tensors held in
    memory). A session reads them in place from one folder; from more, the caller copies them in."""
    return {Path(t.base_dir) for t in tensors if isinstance(t, ir.ExternalTensor)}


def cpu_session(graph: bytes, folder: Path | None, *, optimize: bool = True):
    """A CPU session over a serialised model whose external tensors ONNX Runtime maps from their
    files in `folder`, as it does for a model loaded from that folder: no copy of the weights goes
    into the graph, and a graph with more than 2 GB of them can run."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only (the LM-head check's sampler.logprobs default)
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if folder is not None:
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", str(folder)
        )
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
