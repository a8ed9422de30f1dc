"""A GGUF's transformers config is read without the tokenizer's arrays (transformers parses each
of their strings in Python): the same config as transformers reads from the whole header, the
vocabulary's size counted where the header names none."""

from __future__ import annotations

import _llama_cpp_models as models
import pytest
from transformers import AutoConfig

from onnxsample.exporters._gguf_reader import fast_gguf_reader
from onnxsample.exporters.gguf import gguf_config


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
