"""Protobuf's wire format, the little of it that reads and writes an ONNX file piece by piece.

A composed model is one ``ModelProto`` holding every weight. Parsing or serialising it whole holds
the weights in memory once more (twice, with the bytes), so the parts that need only the graph, or
write the weights one at a time, walk the records themselves: a record is a varint key (field
number << 3 | wire type) and its value, and a message's fields may come in any order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    import onnx

__all__ = [
    "GRAPH_INITIALIZER",
    "LENGTH_DELIMITED",
    "MODEL_GRAPH",
    "TENSOR_RAW_DATA",
    "FileBytes",
    "key",
    "read_varint",
    "read_with_weight_refs",
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
_TENSOR_EXTERNAL = 13  # TensorProto.external_data
_TENSOR_LOCATION = 14  # TensorProto.data_location
_EXTERNAL = 1  # TensorProto.EXTERNAL


def read_without_weights(path: Path) -> onnx.ModelProto:
    """`path`'s model with its graph's initializers reduced to their name, type, shape and
    external-data reference: their bytes are skipped, not read (:class:`FileBytes`), so a
    file holding hundreds of MB of weights costs the graph's size. ``ValueError`` or ``OSError``
    (or protobuf's ``DecodeError``) when the file is no ONNX model."""

    def without_data(data, start: int, end: int) -> bytes:
        return b"".join(
            data[part_start:part_end]
            for number, _, part_start, _, part_end in records(data, start, end)
            if number not in _TENSOR_DATA
        )

    return _read_initializers_as(path, without_data)


def read_with_weight_refs(path: Path, *, min_bytes: int = 1024) -> onnx.ModelProto:
    """`path`'s model with every graph initializer whose ``raw_data`` holds at least `min_bytes`
    turned into an external-data reference to those bytes in `path` itself (its file name, their
    offset and length): the same model, read at the graph's cost, whose weights a reader maps from
    the file as it would an export's data file. Errors as :func:`read_without_weights`."""
    location = _entry(b"location", path.name.encode())

    def as_reference(data, start: int, end: int) -> bytes:
        parts = list(records(data, start, end))
        raw = [
            (value, part_end)
            for number, _, _, value, part_end in parts
            if number == TENSOR_RAW_DATA
        ]
        if len(raw) != 1 or raw[0][1] - raw[0][0] < min_bytes:
            return bytes(data[start:end])
        ((value, part_end),) = raw
        kept = b"".join(
            data[part_start:part_stop]
            for number, _, part_start, _, part_stop in parts
            if number not in _TENSOR_DATA and number not in (_TENSOR_EXTERNAL, _TENSOR_LOCATION)
        )
        refs = (
            location,
            _entry(b"offset", str(value).encode()),
            _entry(b"length", str(part_end - value).encode()),
        )
        return (
            kept
            + b"".join(key(_TENSOR_EXTERNAL) + varint(len(r)) + r for r in refs)
            + varint(_TENSOR_LOCATION << 3)
            + varint(_EXTERNAL)
        )

    return _read_initializers_as(path, as_reference)


def _read_initializers_as(path: Path, rewrite) -> onnx.ModelProto:
    """`path`'s model with each graph initializer's record value replaced by
    rewrite(data, value start, record end), the file read as :class:`FileBytes`."""
    import onnx

    with open(path, "rb") as f:
        data = FileBytes(f)
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
                tensor = rewrite(data, inner_value, inner_end)
                graph += key(GRAPH_INITIALIZER) + varint(len(tensor)) + tensor
            out += key(MODEL_GRAPH) + varint(len(graph)) + graph
    return onnx.ModelProto.FromString(bytes(out))


def _entry(name: bytes, value: bytes) -> bytes:
    """A ``StringStringEntryProto`` (key 1, value 2)."""
    return key(1) + varint(len(name)) + name + key(2) + varint(len(value)) + value


class FileBytes:
    """An open file's bytes, indexed and sliced as a ``bytes`` object is, read by ``pread`` as
    they are asked for: walking the records between a file's weights reads those records, where
    a memory map would map whole runs of the weights' pages around each one (the kernel maps a
    cached file by large folios). An empty file is refused (``ValueError``): no model is empty."""

    _BLOCK = 1 << 16

    def __init__(self, file: BinaryIO) -> None:
        self._fd = file.fileno()
        self._size = os.fstat(self._fd).st_size
        if not self._size:
            raise ValueError("the file is empty")
        self._start, self._block = 0, b""

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: int | slice) -> int | bytes:
        if isinstance(index, slice):
            start, stop, _ = index.indices(self._size)
            return self._read(start, max(stop - start, 0))
        if not 0 <= index < self._size:
            raise IndexError(index)
        if not self._start <= index < self._start + len(self._block):
            self._start = index
            self._block = self._read(index, min(self._BLOCK, self._size - index))
        return self._block[index - self._start]

    def _read(self, start: int, size: int) -> bytes:
        parts, got = [], 0
        while got < size:
            part = os.pread(self._fd, size - got, start + got)
            if not part:
                raise ValueError("truncated")
            parts.append(part)
            got += len(part)
        return b"".join(parts)


def records(data, pos: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, record start, value start, record end) of every record in
    data[pos:end] (a ``bytes``, ``bytearray`` or :class:`FileBytes`), in order, without copying a value: a
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
