"""The serve tests' fixtures: the tiny model composed for serving (four slots, two slots, and with
draft tokens), a real server on 127.0.0.1 for each module (its `port`), an `openai` client of it,
and the export of a GGUF file that llama.cpp's own converter wrote (`fim_export`), for the tests
held to llama-server."""

from __future__ import annotations

import shutil
from pathlib import Path

import openai
import pytest
from _exports import export_cached
from _fim_model import fim_gguf
from _http import served

from onnxsample.composer import compose


@pytest.fixture(scope="session")
def models(tiny_gqa_export, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("serve")
    for path in tiny_gqa_export.output.iterdir():  # the tokenizer and configs beside the models
        if path.suffix in (".json", ".jinja"):
            shutil.copy(path, folder)
    options = {"top_logprobs": 3, "max_bias": 2, "prompt_logprobs": True, "allowed_tokens": True}
    return {
        "four": compose(tiny_gqa_export.output, None, folder / "four.onnx", max_slots=4, **options),
        "two": compose(tiny_gqa_export.output, None, folder / "two.onnx", max_slots=2, **options),
        "drafts": compose(
            tiny_gqa_export.output, None, folder / "drafts.onnx", draft_tokens=4, **options
        ),
    }


@pytest.fixture(scope="module")
def port(models):
    with served(models["four"], "--threads", "1", "--served-model-name", "tiny") as server:
        yield server.port


@pytest.fixture(scope="module")
def client(port) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def fim_export(llama_cpp) -> Path:
    """The export of a tiny Qwen2 GGUF with Qwen2.5's FIM tokens (tests/_fim_model.py)."""
    path = fim_gguf(llama_cpp)
    return export_cached(path, path.with_name(path.stem + "-onnx"), verify_tokens=0).output
