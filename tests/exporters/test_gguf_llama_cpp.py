"""GGUF exports held to llama.cpp on the same file: a real Q4_K_M file as people download it.

The oracle is llama.cpp itself (built from the llama-cpp-python sdist, `make llama-cpp`):
llama-tokenize for token ids, llama-server for greedy tokens and the raw distribution's logprobs.
Both sides multiply quantised weights by int8-quantised activations, in different blocks (ours:
ONNX Runtime's MatMulNBits at accuracy level 4, blocks of 32; llama.cpp: Q8_K/Q8_0 rows), so each
side's logits move from the exact product's by a few tenths of a logprob. On the real Gemma 3 270M,
for the tokens llama.cpp gives a logprob above -3 along these prompts' 24 greedy steps, the largest
|Δ logprob| measured from the exact product (our accuracy-level-0 export, which equals
transformers' fp32 on the de-quantised file within 2e-5) was 0.30 for ours and 0.33 for llama.cpp,
and 0.54 between the two (their errors can point apart). Hence:

- logprobs of llama.cpp's likely tokens agree within :data:`TOL`;
- wherever llama.cpp's top two tokens are more than 2 * :data:`TOL` apart, our greedy token is its;
- greedy decoding gives llama.cpp's tokens up to the first step where they are closer than that.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _llama_cpp import TOL, LlamaCpp, LlamaServer, compare_with_llama_cpp

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a village by the sea,",
]


@pytest.fixture(scope="module")
def real_server(llama_cpp: LlamaCpp, real_gguf: Path):
    with LlamaServer(llama_cpp, real_gguf) as server:
        yield server


def test_the_real_file_exports_its_own_blocks(real_gguf, real_gguf_export):
    """`onnxsample export FILE` picks the file's own blocks (every tensor transplantable) and the
    export on disk is at most 1.5x the file (the quantised embedding is the tied LM head's)."""
    manifest = real_gguf_export.manifest
    assert (manifest["layout"], manifest["precision"], manifest["accuracy_level"]) == (
        "gqa",
        "gguf",
        4,
    )
    folder = real_gguf_export.output
    size = sum(f.stat().st_size for f in folder.iterdir() if not f.name.startswith("composed"))
    assert size <= 1.5 * real_gguf.stat().st_size, (size, real_gguf.stat().st_size)
    assert not (folder / "tokenizer.model").exists()  # no copy of the GGUF as a "tokenizer"


@pytest.mark.parametrize("text", PROMPTS)
def test_the_real_file_decodes_as_llama_cpp(
    llama_cpp, real_gguf, real_gguf_export, real_server, text
):
    prompt = llama_cpp.tokenize(real_gguf, text)
    found = compare_with_llama_cpp(real_gguf_export.output / "model.onnx", real_server, prompt)
    assert found["worst"] <= TOL, found
    assert found["agree"] == found["decisive"] > 0, found
    assert found["same"] >= found["close"], found
