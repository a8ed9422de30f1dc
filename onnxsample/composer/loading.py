"""Loading ONNX models we did not write, safely.

External data is where a model file can reach outside itself: every tensor stored outside the
`.onnx` names a file and a byte range. Before any of those bytes are read, each location must be a
relative path inside the model's folder (no absolute path, no `..`, no symbolic link on the way, no
hard link) and each range must lie within its file. Only then is the model loaded (with onnx-ir,
which maps external data lazily) and checked with `onnx.checker` (`full_check`, path-based so that
models over 2 GB work).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from onnxsample._wire import read_with_weight_refs, read_without_weights
from onnxsample.errors import ModelError, first_line

__all__ = ["check_external_data", "check_model", "load_model", "read_proto"]

log = logging.getLogger(__name__)

_EXTERNAL = onnx.TensorProto.EXTERNAL


def read_proto(path: Path, *, weights: bool = True, as_refs: bool = False) -> onnx.ModelProto:
    """The model's protobuf without any external data, or a :class:`ModelError` saying why not.
    Without `weights`, the initializers inside the file are read without their bytes too
    (:func:`onnxsample._wire.read_without_weights`): a composed file's graph alone. With
    `as_refs`, they are references to their bytes in the file
    (:func:`onnxsample._wire.read_with_weight_refs`)."""
    if not path.is_file():
        raise ModelError(f"no such model file: {path}")
    try:
        if as_refs:
            return read_with_weight_refs(path)
        if not weights:
            return read_without_weights(path)
        return onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise ModelError(
            f"{path} is not a readable ONNX model (truncated or not ONNX): {exc}"
        ) from exc


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    yield from _node_tensors(graph.node)


def _node_tensors(nodes) -> Iterator[onnx.TensorProto]:
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def _all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    yield from _tensors(model.graph)
    for function in model.functions:
        yield from _node_tensors(function.node)


def _nbytes(tensor: onnx.TensorProto) -> int | None:
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError):
        return None
    count = 1
    for d in tensor.dims:
        count *= d
    return count * itemsize


def check_external_data(
    model: onnx.ModelProto, folder: Path, *, own: Path | None = None
) -> list[Path]:
    """Validate every external-data reference of `model` against `folder`; returns the files used.
    A reference to `own` (the model's file, as :func:`onnxsample._wire.read_with_weight_refs`
    makes them) reads the model's own bytes: only its bounds are checked."""
    root = folder.resolve()
    files: dict[str, Path] = {}
    for tensor in _all_tensors(model):
        if tensor.data_location != _EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        what = f"tensor {tensor.name!r} points to external data {location!r}"
        if not location:
            raise ModelError(f"tensor {tensor.name!r} is external but names no file")
        if own is not None and location == own.name:
            _check_bounds(tensor, info, own.stat().st_size, what)
            continue
        if os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in location:
            raise ModelError(f"{what}: absolute paths are refused; it must lie inside {root}")
        parts = Path(location.replace("\\", "/")).parts
        if ".." in parts:
            raise ModelError(f"{what}: '..' is refused; it must lie inside {root}")
        path = root
        for part in parts:
            path = path / part
            if path.is_symlink():
                raise ModelError(f"{what}: {path} is a symbolic link, which is refused")
        if not path.resolve().is_relative_to(root):
            raise ModelError(f"{what}: it resolves outside {root}")
        if not path.is_file():
            raise ModelError(f"{what}: {path} does not exist or is not a file")
        stat = path.stat()
        if stat.st_nlink > 1:
            raise ModelError(
                f"{what}: {path} is hard-linked ({stat.st_nlink} links), which is refused"
            )
        _check_bounds(tensor, info, stat.st_size, what)
        files[location] = path
    return sorted(set(files.values()))


def _check_bounds(tensor: onnx.TensorProto, info: dict[str, str], size: int, what: str) -> None:
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else _nbytes(tensor)
    except ValueError as exc:
        raise ModelError(f"{what}: bad offset or length ({exc})") from exc
    if offset < 0 or (length is not None and (length < 0 or offset + length > size)):
        raise ModelError(
            f"{what}: bytes {offset}..{offset + (length or 0)} lie beyond the file's end "
            f"({size} bytes)"
        )


# Ops ONNX Runtime registers in the default domain although the ONNX standard has no such op;
# onnxruntime-genai's model builder writes them there.
ORT_DEFAULT_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization"})


def _checkable(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy the checker can judge on structure alone.

    External initializers become graph inputs of the same type (their bytes were vetted by
    :func:`check_external_data`, and the checker cannot find them from a bare proto); ORT's own
    default-domain ops move to `com.microsoft`; intermediate `value_info` annotations, which some
    exporters write stale, are dropped (shape inference recomputes them).
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    external = [t for t in graph.initializer if t.data_location == _EXTERNAL]
    for tensor in external:
        graph.input.append(
            onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
        )
    kept = [t for t in graph.initializer if t.data_location != _EXTERNAL]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.value_info[:]
    moved = False
    for node in graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type in ORT_DEFAULT_DOMAIN_OPS:
            node.domain, moved = "com.microsoft", True
    if moved and not any(o.domain == "com.microsoft" for o in copy.opset_import):
        copy.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return copy


def check_model(path: Path, model: onnx.ModelProto | None = None) -> None:
    """`onnx.checker` with `full_check` on the graph of `path` (weights vetted separately)."""
    model = read_proto(path) if model is None else model
    try:
        onnx.checker.check_model(_checkable(model), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ModelError(f"{path.name} fails the ONNX checker: {first_line(exc)}") from exc


def load_model(path: Path, *, check: bool = True):
    """Load `path` as an onnx-ir model after the external-data and checker gates. Weights held
    inside the file are mapped from it as external data's are (not parsed into memory), so a
    single-file model costs its graph until a weight is read. They are read from the file a
    symbolic link `path` names (a hub cache's layout); external data files must lie beside it."""
    import onnx_ir as ir

    own = path.resolve()
    proto = read_proto(own, as_refs=True)
    external = check_external_data(proto, path.parent, own=own)
    if external:
        log.info("%s keeps its weights in %s", path.name, ", ".join(p.name for p in external))
    if check:
        check_model(path, proto)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as exc:
        raise ModelError(f"onnx-ir cannot load {path}: {exc}") from exc
    ir.external_data.set_base_dir(model.graph, path.parent)
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if isinstance(tensor, ir.ExternalTensor) and tensor.location == own.name:
            tensor.base_dir = own.parent
    return model
