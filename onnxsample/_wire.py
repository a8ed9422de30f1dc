"""Protobuf's wire format, the little of it that reads and writes an ONNX file piece by piece.

A composed model is one ``ModelProto`` holding every weight. Parsing or serialising it whole holds
the weights in memory once more (twice, with the bytes), so the parts that need only the graph, or
write the weights one at a time, walk the records themselves: a record is a varint key (field
number << 3 | wire type) and its value, and a message's fields may come in any order.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

__all__ = [
    "GRAPH_INITIALIZER",
    "LENGTH_DELIMITED",
    "MODEL_GRAPH",
    "TENSOR_RAW_DATA",
    "key",
    "read_varint",
    "read_without_weights",
    "records",
    "varint",
]

LENGTH_DELIMITED = 2
MODEL_GRAPH = 7  # ModelProto.graph
GRAPH_INITIALIZER = 5  # GraphProto.initializer
TENSOR_RAW_DATA = 9  # TensorProto.raw_data
# TensorProto's data: float_data, int32_data, string_data, int64_data, raw_data, double_data,
# uint64_data
_TENSOR_DATA = frozenset({4, 5, 6, 7, 9, 10, 11})


def read_without_weights(path: Path) -> onnx.ModelProto:
    """`path`'s model with its graph's initializers reduced to their name, type, shape and
    external-data reference: their bytes are skipped, not read (the file is memory-mapped), so a
    file holding hundreds of MB of weights costs the graph's size. ``ValueError`` or ``OSError``
    (or protobuf's ``DecodeError``) when the file is no ONNX model."""
    import onnx

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        out = bytearray()
        for field, kind, start, value, end in records(data, 0, len(data)):
            if field != MODEL_GRAPH or kind != LENGTH_DELIMITED:
                out += data[start:end]
                continue
            graph = bytearray()
            for inner, inner_kind, inner_start, inner_value, inner_end in records(data, value, end):
                if inner != GRAPH_INITIALIZER or inner_kind != LENGTH_DELIMITED:
                    graph += data[inner_start:inner_end]
                    continue
                tensor = b"".join(
                    data[part_start:part_end]
                    for number, _, part_start, _, part_end in records(data, inner_value, inner_end)
                    if number not in _TENSOR_DATA
                )
                graph += key(GRAPH_INITIALIZER) + varint(len(tensor)) + tensor
            out += key(MODEL_GRAPH) + varint(len(graph)) + graph
    return onnx.ModelProto.FromString(bytes(out))


def records(data, pos: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, record start, value start, record end) of every record in
    data[pos:end] (a ``bytes``, ``bytearray`` or ``mmap``), in order, without copying a value: a
    length-delimited record's value is data[value start:record end]."""
    while pos < end:
        start = pos
        tag, pos = read_varint(data, pos)
        kind = tag & 7
        if kind == 0:
            _, value_end = read_varint(data, pos)
        elif kind in (1, 5):
            value_end = pos + (8 if kind == 1 else 4)
        elif kind == LENGTH_DELIMITED:
            length, pos = read_varint(data, pos)
            value_end = pos + length
        else:
            raise ValueError(f"unexpected wire type {kind}")
        if value_end > end:
            raise ValueError("truncated")
        yield tag >> 3, kind, start, pos, value_end
        pos = value_end
    if pos != end:
        raise ValueError("truncated")


def read_varint(data, pos: int) -> tuple[int, int]:
    """The varint at data[pos] and the position after it."""
    shift = result = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("bad varint")


def varint(n: int) -> bytes:
    """`n` (≥ 0) as a varint."""
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def key(field: int) -> bytes:
    """The key of a length-delimited record of `field`."""
    return varint(field << 3 | LENGTH_DELIMITED)
