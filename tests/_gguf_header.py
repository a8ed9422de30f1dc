"""A GGUF's header (metadata and tensor table) read fast, for the fixtures built by llama.cpp's tools."""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Header:
    """A GGUF's metadata and tensor table: ``fields`` (key -> value; arrays as lists) and
    ``tensors`` (name -> (type name, shape as GGUF orders it: the row length first))."""

    fields: dict[str, Any]
    tensors: dict[str, tuple[str, tuple[int, ...]]]


_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}


@functools.lru_cache(maxsize=16)
def read_header(path: Path) -> Header:
    """A GGUF's header, read in a fraction of a second (gguf.GGUFReader takes seconds over a 262k
    vocabulary: it makes numpy views of every string). Little-endian GGUF v2/v3 only."""
    import gguf
    import numpy as np

    with open(path, "rb") as f:
        data = memoryview(f.read(64 << 20))  # a 262k vocabulary's header is about 6 MB
    magic, version, n_tensors, n_fields = struct.unpack_from("<IIQQ", data, 0)
    if magic != gguf.GGUF_MAGIC or version < 2:
        raise ValueError(f"{path}: not a little-endian GGUF v2+ file")
    offset = 24

    def string() -> str:
        nonlocal offset
        (size,) = struct.unpack_from("<Q", data, offset)
        offset += 8 + size
        return bytes(data[offset - size : offset]).decode("utf-8")

    def value(kind: int) -> Any:
        nonlocal offset
        if kind == 8:
            return string()
        if kind == 9:
            item, count = struct.unpack_from("<IQ", data, offset)
            offset += 12
            if item in _SCALARS and item != 7:
                width = struct.calcsize(_SCALARS[item])
                items = np.frombuffer(data, "<" + _SCALARS[item], count, offset)
                offset += width * count
                return items.tolist()
            return [value(item) for _ in range(count)]
        fmt = "<" + _SCALARS[kind]
        (out,) = struct.unpack_from(fmt, data, offset)
        offset += struct.calcsize(fmt)
        return out

    fields: dict[str, Any] = {}
    for _ in range(n_fields):
        name = string()
        (kind,) = struct.unpack_from("<I", data, offset)
        offset += 4
        fields[name] = value(kind)
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    for _ in range(n_tensors):
        name = string()
        (dims,) = struct.unpack_from("<I", data, offset)
        shape = struct.unpack_from(f"<{dims}Q", data, offset + 4)
        (kind,) = struct.unpack_from("<I", data, offset + 4 + 8 * dims)
        offset += 4 + 8 * dims + 4 + 8
        tensors[name] = (gguf.GGMLQuantizationType(kind).name, tuple(shape))
    return Header(fields, tensors)
