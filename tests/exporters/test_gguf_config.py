"""A GGUF's transformers config is read without the tokenizer's arrays (transformers parses each
of their strings in Python): the same config as transformers reads from the whole header, the
vocabulary's size counted where the header names none. The header read before a cached export is
reused steps over every array's items: the same scalars, lengths and tensors."""

from __future__ import annotations

import _llama_cpp_models as models
import pytest
from gguf import GGUFValueType
from transformers import AutoConfig

from onnxsample.exporters._gguf_reader import (
    FastGGUFReader,
    HeaderReader,
    array_length,
    fast_gguf_reader,
)
from onnxsample.exporters.gguf import _scalar, gguf_config, inspect_gguf


def _whole_header(path):
    with fast_gguf_reader():
        return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)


@pytest.mark.parametrize("family", models.FAMILIES)
def test_a_config_is_the_one_transformers_reads_from_the_whole_header(family, llama_cpp):
    path = models.gguf(family, "Q4_K_M", llama_cpp)
    assert gguf_config(path).to_dict() == _whole_header(path).to_dict()


def test_the_real_files_config_counts_its_262k_tokens(real_gguf):
    config = gguf_config(real_gguf)
    assert config.vocab_size == 262144
    assert config.to_dict() == _whole_header(real_gguf).to_dict()


@pytest.mark.parametrize("family", [*models.FAMILIES, "real file"])
def test_the_header_read_before_a_cached_export_is_the_files(family, llama_cpp, real_gguf):
    """`inspect_gguf` (which decides whether a cached export is reused) steps over the items of
    every array: its scalars, the arrays' types and lengths and the tensor table are the file's,
    and so is the metadata it gives."""
    path = real_gguf if family == "real file" else models.gguf(family, "Q4_K_M", llama_cpp)
    whole, header = FastGGUFReader(str(path)), HeaderReader(str(path))
    assert list(header.fields) == list(whole.fields)
    for name, field in whole.fields.items():
        stepped = header.fields[name]
        assert stepped.types == field.types, name
        if field.types[0] == GGUFValueType.ARRAY:
            assert array_length(stepped) == array_length(field) == len(field.contents()), name
        else:
            assert stepped.contents() == field.contents(), name
    assert [_tensor(t) for t in header.tensors] == [_tensor(t) for t in whole.tensors]
    scalars = {n: _scalar(f) for n, f in whole.fields.items() if f.types[0] != GGUFValueType.ARRAY}
    assert inspect_gguf(path).metadata == {n: v for n, v in scalars.items() if v is not None}


def _tensor(t) -> tuple:
    return t.name, t.tensor_type, t.data_offset, t.n_bytes, tuple(t.shape)
