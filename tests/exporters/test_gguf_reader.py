"""FastGGUFReader reads every field and tensor as gguf.GGUFReader does: the same parts, data
indices, types and contents; on real files (the embedded SmolLM2, llama.cpp's vocabulary files)
and on a file with every kind of array, empty ones included."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from onnxsample.exporters import embedded_gguf
from onnxsample.exporters._gguf_reader import (
    FastGGUFReader,
    HeaderReader,
    TruncatedGGUF,
    fast_gguf_reader,
)


def _assert_same(path: Path) -> None:
    ours, theirs = FastGGUFReader(str(path)), gguf.GGUFReader(str(path))
    assert list(ours.fields) == list(theirs.fields)
    for name, a in theirs.fields.items():
        b = ours.fields[name]
        assert (b.offset, b.name, b.data, b.types) == (a.offset, a.name, a.data, a.types), name
        assert len(b.parts) == len(a.parts), name
        for x, y in zip(a.parts, b.parts, strict=True):
            assert x.dtype == y.dtype and np.array_equal(x, y), name
        assert b.contents() == a.contents(), name
    assert ours.data_offset == theirs.data_offset
    assert len(ours.tensors) == len(theirs.tensors)
    for a, b in zip(theirs.tensors, ours.tensors, strict=True):
        assert (b.name, b.tensor_type, b.n_elements, b.n_bytes, b.data_offset) == (
            a.name,
            a.tensor_type,
            a.n_elements,
            a.n_bytes,
            a.data_offset,
        )
        assert np.array_equal(b.shape, a.shape)
        assert b.data.dtype == a.data.dtype and np.array_equal(b.data, a.data), a.name


def _every_array(path: Path) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("test.strings", ["a", "", "ü 🦙", "x" * 300])
    writer.add_array("test.empty_strings", [])
    writer.add_array("test.ints", [1, -2, 3])
    writer.add_array("test.floats", [0.5, -1.25])
    writer.add_array("test.bools", [True, False, True])
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_string("test.string", "")
    writer.add_uint32("test.u32", 7)
    writer.add_tensor("w", np.arange(64, dtype=np.float32).reshape(2, 32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_embedded_gguf():
    _assert_same(embedded_gguf())


@pytest.mark.parametrize("name", ["llama-spm", "phi-3", "qwen2"])
def test_llama_cpp_vocabularies(llama_cpp, name):
    _assert_same(llama_cpp.src / "models" / f"ggml-vocab-{name}.gguf")


def test_every_kind_of_array(tmp_path):
    _assert_same(_every_array(tmp_path / "arrays.gguf"))


# Where a file is cut (from the whole file's bytes and gguf's reader of it), and what the reader
# says was cut off: a short header names its part, short tensor data where it would end.
CUTS = {
    "after the magic": (lambda whole, r: 4, "metadata"),
    "inside the counts": (lambda whole, r: 20, "metadata"),
    "inside a string array": (lambda whole, r: whole.index(b"x" * 100), "metadata"),
    "inside the tensor table": (lambda whole, r: r.tensors[0].field.offset + 5, "tensor table"),
    "before the tensor data": (lambda whole, r: r.data_offset, "tensor data"),
    "inside the tensor data": (lambda whole, r: len(whole) - 1, "tensor data"),
}


@pytest.mark.parametrize("reader", [FastGGUFReader, HeaderReader])
@pytest.mark.parametrize("cut", list(CUTS))
def test_truncated_file_names_what_was_cut_off(cut, reader, tmp_path):
    """A short file raises TruncatedGGUF before anything past its end is read (gguf's own
    reader raises numpy's errors on a short view, or fails reshaping short tensor data)."""
    path = _every_array(tmp_path / "whole.gguf")
    whole, at, part = path.read_bytes(), *CUTS[cut]
    keep = at(whole, gguf.GGUFReader(str(path)))
    (tmp_path / "cut.gguf").write_bytes(whole[:keep])
    with pytest.raises(TruncatedGGUF) as info:
        reader(str(tmp_path / "cut.gguf"))
    assert (info.value.part, info.value.size) == (part, keep)
    if part == "tensor data":
        assert (
            str(info.value)
            == f"its tensor data ends at byte {len(whole)} but the file has {keep} bytes"
        )
    else:
        assert (
            str(info.value) == f"the header ends before its {part} does (the file has {keep} bytes)"
        )


def test_lent_to_libraries():
    """Inside fast_gguf_reader(), code that constructs gguf.GGUFReader gets the fast one, and
    gguf.get_tensor_name_map one map per (architecture, layers); both are restored after."""
    name_map = gguf.get_tensor_name_map
    with fast_gguf_reader():
        assert gguf.GGUFReader is FastGGUFReader
        first = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is first
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is not first
    assert gguf.GGUFReader is not FastGGUFReader
    assert gguf.get_tensor_name_map is name_map


def test_transformers_gguf_load_makes_one_tensor_name_map(monkeypatch):
    """transformers' GGUF loader (the verify step's reference) asks for gguf's tensor-name map
    once per module of the model, each a new map naming every tensor of every layer (397 for the
    embedded SmolLM2: most of the load's time); the exporter's load makes it once."""
    from onnxsample.exporters.gguf import gguf_model, inspect_gguf

    made, init = [], gguf.TensorNameMap.__init__

    def counted(self, *args, **kwargs):
        made.append(args)
        init(self, *args, **kwargs)

    monkeypatch.setattr(gguf.TensorNameMap, "__init__", counted)
    path = embedded_gguf()
    model = gguf_model(path, inspect_gguf(path))
    assert len(list(model.modules())) > 100 and len(made) == 1, len(made)  # can fail: 397 before
