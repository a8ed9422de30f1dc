"""Writing the composed model as one ``.onnx`` file, one weight at a time.

Serialising a whole :class:`onnx.ModelProto` holds every weight twice beside the model (the
proto's copy and its bytes), so composing a 1 GB export took 3 GB. Here the graph is serialised
without its weights' bytes, and each initializer is then appended as its own ``TensorProto``
record: protobuf's wire format lets a message's fields come in any order, so the file is the same
model, byte-compatible with any reader, and at most one weight is copied at a time. Weights mapped
from the export's external data are read from their files as they are written.
"""

from __future__ import annotations

from typing import BinaryIO

import onnx
import onnx_ir as ir

__all__ = ["write_single_file"]

_LENGTH_DELIMITED = 2
_GRAPH = 7  # ModelProto.graph
_INITIALIZER = 5  # GraphProto.initializer
_RAW_DATA = 9  # TensorProto.raw_data


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
        len(_tag(_INITIALIZER)) + len(_varint(r.size)) + r.size for r in records
    )
    file.write(header.SerializeToString())
    file.write(_tag(_GRAPH) + _varint(graph_size) + graph_bytes)
    for record in records:
        file.write(_tag(_INITIALIZER) + _varint(record.size))
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
            self.size += len(_tag(_RAW_DATA)) + len(_varint(self.data_size)) + self.data_size

    def write(self, file: BinaryIO) -> None:
        file.write(self.fields)
        if self.tensor is not None:
            data = self.tensor.tobytes()
            if len(data) != self.data_size:
                raise ValueError(
                    f"initializer {self.tensor.name!r}: {len(data)} bytes, expected {self.data_size}"
                )
            file.write(_tag(_RAW_DATA) + _varint(len(data)))
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


def _tag(field: int) -> bytes:
    return _varint(field << 3 | _LENGTH_DELIMITED)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
