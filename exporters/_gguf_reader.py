"""`gguf.GGUFReader`, parsed in a fraction of the time on large vocabularies.

gguf's reader makes two numpy views per string of a string array (its length and its bytes) and
every view of its `np.memmap` runs Python-level hooks: Llama 3's 128k tokens and merges take
~10 s, Gemma's 262k tokens longer, and transformers' GGUF config reads the whole header once more.
:class:`FastGGUFReader` builds the same fields (the same parts, data indices and types) from a plain
ndarray view of the same map and walks string arrays with `struct`: a second or less.
:func:`fast_gguf_reader` lends it, and tensor-name maps made once, to code that constructs
`gguf.GGUFReader` itself (transformers' `load_gguf_checkpoint`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import struct
import sys
from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np
from gguf import GGUFValueType

__all__ = [
    "VOCABULARY_SIZES",
    "FastGGUFReader",
    "HeaderReader",
    "TruncatedGGUF",
    "array_length",
    "config_gguf_reader",
    "fast_gguf_reader",
]

_U64 = struct.Struct("<Q")


class TruncatedGGUF(ValueError):
    """The file ends before its header, or before a tensor's data, does: what was cut off, where
    it would end and the file's size (the message is the reason, without the file's name)."""

    def __init__(self, part: str, end: int, size: int) -> None:
        self.part, self.end, self.size = part, end, size
        if part == "tensor data":
            message = f"its tensor data ends at byte {end} but the file has {size} bytes"
        else:
            message = f"the header ends before its {part} does (the file has {size} bytes)"
        super().__init__(message)


class FastGGUFReader(gguf.GGUFReader):
    """A `gguf.GGUFReader` whose fields and tensors equal the original's, read faster.

    A short file raises :class:`TruncatedGGUF` before anything past its end is read, where
    `gguf.GGUFReader` raises what numpy raises on a short view (or, for tensor data, reads on
    and fails reshaping it): the header's end is checked at each read, and every tensor's data
    end before any tensor is made."""

    _part = "metadata"  # the part of the header being read: what a short read cut off

    def _get(
        self, offset: int, dtype: Any, count: int = 1, override_order: Any = None
    ) -> np.ndarray:
        flat = self.__dict__.get("_flat")
        if flat is None:  # a plain view of the map gguf opened: the same bytes, no hooks
            flat = self._flat = self.data.view(np.ndarray)
        count = int(count)
        itemsize = np.dtype(dtype).itemsize
        if offset + itemsize * count > len(flat):
            raise TruncatedGGUF(self._part, offset + itemsize * count, len(flat))
        arr = flat[offset : offset + itemsize * count].view(dtype=dtype)[:count]
        order = self.byte_order if override_order is None else override_order
        return arr if order == "I" else arr.view(arr.dtype.newbyteorder(order))

    def _steps_over(self, key: bytes) -> bool:
        """Whether the items of the array under `key` are stepped over: the field keeps its types
        and its length (:func:`array_length`), and no items."""
        return False

    def _get_str(self, offset: int) -> tuple[np.ndarray, np.ndarray]:
        length, text = super()._get_str(offset)
        self._key = text  # while fields are built: the key whose value is read next
        return length, text

    def _get_field_parts(
        self, orig_offs: int, raw_type: int
    ) -> tuple[int, list[np.ndarray], list[int], list[GGUFValueType]]:
        if raw_type != GGUFValueType.ARRAY or self.byte_order != "I" or sys.byteorder != "little":
            return super()._get_field_parts(orig_offs, raw_type)
        self._get(0, np.uint8)  # makes the plain view
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        count, item = int(alen[0]), GGUFValueType(raw_itype[0])
        parts: list[np.ndarray] = [raw_itype, alen]
        offs = orig_offs + 12
        if self._steps_over(bytes(self._key)) and (
            item == GGUFValueType.STRING or item in self.gguf_scalar_to_np
        ):
            offs = self._past_items(offs, item, count)
            return offs - orig_offs, parts, [], [GGUFValueType.ARRAY] + [item] * (count > 0)
        if item == GGUFValueType.STRING:
            flat, u64 = self._flat, np.dtype(np.uint64)
            buffer = memoryview(flat)
            for _ in range(count):
                if offs + 8 > len(flat):
                    raise TruncatedGGUF(self._part, offs + 8, len(flat))
                (size,) = _U64.unpack_from(buffer, offs)
                if offs + 8 + size > len(flat):
                    raise TruncatedGGUF(self._part, offs + 8 + size, len(flat))
                parts += [flat[offs : offs + 8].view(u64), flat[offs + 8 : offs + 8 + size]]
                offs += 8 + size
            data = list(range(3, len(parts), 2))
        elif (nptype := self.gguf_scalar_to_np.get(item)) is not None:
            values = self._get(offs, nptype, count)
            parts += [values[i : i + 1] for i in range(count)]
            offs += values.nbytes
            data = list(range(2, len(parts)))
        else:  # arrays of arrays
            return super()._get_field_parts(orig_offs, raw_type)
        types = [GGUFValueType.ARRAY] + [item] * (count > 0)
        return offs - orig_offs, parts, data, types

    def _past_items(self, offs: int, item: GGUFValueType, count: int) -> int:
        """The offset after `count` items of type `item` from `offs`, none of them read."""
        flat = self._flat
        if item == GGUFValueType.STRING:
            buffer, unpack = memoryview(flat), _U64.unpack_from
            for _ in range(count):
                if offs + 8 > len(flat):
                    raise TruncatedGGUF(self._part, offs + 8, len(flat))
                offs += 8 + unpack(buffer, offs)[0]
                if offs > len(flat):
                    raise TruncatedGGUF(self._part, offs, len(flat))
            return offs
        offs += count * np.dtype(self.gguf_scalar_to_np[item]).itemsize
        if offs > len(flat):
            raise TruncatedGGUF(self._part, offs, len(flat))
        return offs

    def _build_tensor_info(self, offs: int, count: int) -> tuple[int, list]:
        self._part = "tensor table"
        try:
            return super()._build_tensor_info(offs, count)
        finally:
            self._part = "metadata"

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        """Every tensor's data inside the file, checked before gguf makes a view of any (a file
        without tensors may end before the data's alignment, as llama.cpp's vocabularies do)."""
        end = 0
        for field in fields:
            dims, raw_type, offset = field.parts[3], field.parts[4], field.parts[5]
            try:
                block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(raw_type[0])]
            except (ValueError, KeyError):
                continue  # gguf names the unknown type
            n_bytes = int(np.prod(dims, dtype=np.uint64)) * type_size // block
            end = max(end, start_offs + int(offset[0]) + n_bytes)
        if end > len(self.data):
            raise TruncatedGGUF("tensor data", end, len(self.data))
        super()._build_tensors(start_offs, fields)


def array_length(field) -> int:
    """How many items an array field holds, read or stepped over: the count written after its
    key, the key's type and the items' type (an array of arrays counts its arrays)."""
    return int(field.parts[4][0])


class HeaderReader(FastGGUFReader):
    """A :class:`FastGGUFReader` that steps over the items of every array: a file's scalars and
    tensor table, for the questions asked before a cached export is reused (0.1 s for Gemma 3's
    file, where its 262k tokens and their scores and types took a second)."""

    def _steps_over(self, key: bytes) -> bool:
        return True


class _WithoutVocabulary(FastGGUFReader):
    """A :class:`FastGGUFReader` without the tokenizer's arrays (tokens, scores, types, merges):
    a config needs none of them but the vocabulary's size (:data:`VOCABULARY_SIZES`), and
    transformers parses every string of every array it is given, one Python call each (3 s for
    Gemma 3's 262k tokens)."""

    def __init__(self, path, mode: str = "r") -> None:
        super().__init__(path, mode)
        arch = self.fields.get("general.architecture")
        named = arch is not None and f"{arch.contents()}.vocab_size" in self.fields
        tokens = self.fields.get(_VOCABULARY + "tokens")
        if tokens is not None and not named:
            VOCABULARY_SIZES[os.path.realpath(path)] = array_length(tokens)
        for name in [n for n, f in self.fields.items() if n.startswith(_VOCABULARY)]:
            if self.fields[name].types[:1] == [GGUFValueType.ARRAY]:
                del self.fields[name]

    def _steps_over(self, key: bytes) -> bool:
        return key.startswith(_VOCABULARY_KEY)


_VOCABULARY = "tokenizer.ggml."
_VOCABULARY_KEY = _VOCABULARY.encode()
# real path → tokens, of the files _WithoutVocabulary read whose header names no vocabulary size
VOCABULARY_SIZES: dict[str, int] = {}


@contextlib.contextmanager
def config_gguf_reader() -> Iterator[None]:
    """:func:`fast_gguf_reader`, its readers without the tokenizer's arrays (for a config: set
    its vocabulary size from :data:`VOCABULARY_SIZES` where the header has none)."""
    with fast_gguf_reader():
        gguf.GGUFReader = _WithoutVocabulary
        yield


@contextlib.contextmanager
def fast_gguf_reader() -> Iterator[None]:
    """`gguf.GGUFReader` is :class:`FastGGUFReader` inside the block, and
    `gguf.get_tensor_name_map` gives one map per (architecture, layers), made once (for libraries
    that import them at call time, as transformers' GGUF loader does: it asks for the map once per
    module of the model, each a new map of every tensor name of every layer: 397 of them for the
    135M SmolLM2, most of its load's time)."""
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = FastGGUFReader
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
