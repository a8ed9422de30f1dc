"""Writing the composed model as one ``.onnx`` file, one weight at a time.

Serialising a whole :class:`onnx.ModelProto` holds every weight twice beside the model (the
proto's copy and its bytes). Here the graph is serialised without its weights' bytes, and each
initializer is then appended as its own ``TensorProto`` record (:mod:`onnxsample._wire`: a
message's fields may come in any order), so the file parses to the same model and at most one
weight is copied at a time. Weights mapped from the export's external data are read from their
files as they are written.
"""

from __future__ import annotations

from typing import BinaryIO

import onnx
import onnx_ir as ir

from onnxsample._wire import GRAPH_INITIALIZER, MODEL_GRAPH, TENSOR_RAW_DATA, key, varint
from onnxsample.errors import ModelError

__all__ = ["write_single_file"]


def write_single_file(model: ir.Model, file: BinaryIO) -> onnx.ModelProto:
    """Write `model` with every weight inside it to `file`; returns the model's proto in which
    weights still mapped from external files are references (for the checker, which needs no
    weight bytes)."""
    for graph in model.graphs():  # subgraphs' initializers are few and small: carried inline
        if graph is not model.graph:
            _load_external(graph)
    proto = ir.to_proto(model)
    records = [_initializer_record(t, model.graph) for t in proto.graph.initializer]
    header = onnx.ModelProto()
    header.CopyFrom(proto)
    del header.graph.initializer[:]
    graph_bytes = header.graph.SerializeToString()
    header.ClearField("graph")
    graph_size = len(graph_bytes) + sum(
        len(key(GRAPH_INITIALIZER)) + len(varint(r.size)) + r.size for r in records
    )
    file.write(header.SerializeToString())
    file.write(key(MODEL_GRAPH) + varint(graph_size) + graph_bytes)
    for record in records:
        file.write(key(GRAPH_INITIALIZER) + varint(record.size))
        record.write(file)
    return proto


class _Record:
    """One initializer's ``TensorProto`` bytes: its fields, then (for a weight read from a file)
    its ``raw_data`` field, produced only when written."""

    def __init__(self, fields: bytes, tensor: ir.TensorProtocol | None = None) -> None:
        self.fields, self.tensor = fields, tensor
        self.data_size = tensor.nbytes if tensor is not None else 0
        self.size = len(fields)
        if tensor is not None:
            self.size += len(key(TENSOR_RAW_DATA)) + len(varint(self.data_size)) + self.data_size

    def write(self, file: BinaryIO) -> None:
        file.write(self.fields)
        if self.tensor is not None:
            data = self.tensor.tobytes()
            if len(data) != self.data_size:  # its file changed under us
                raise ModelError(
                    f"weight {self.tensor.name!r} read {len(data)} bytes from its file, "
                    f"{self.data_size} expected"
                )
            file.write(key(TENSOR_RAW_DATA) + varint(len(data)))
            file.write(data)


def _initializer_record(tensor: onnx.TensorProto, graph: ir.Graph) -> _Record:
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return _Record(tensor.SerializeToString())
    fields = onnx.TensorProto()
    fields.CopyFrom(tensor)
    fields.ClearField("external_data")
    fields.ClearField("data_location")
    return _Record(fields.SerializeToString(), graph.initializers[tensor.name].const_value)


def _load_external(graph: ir.Graph) -> None:
    for value in graph.initializers.values():
        if isinstance(value.const_value, ir.ExternalTensor):
            (value.const_value,) = ir.external_data.convert_tensors_from_external(
                [value.const_value]
            )
