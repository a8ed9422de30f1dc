"""Every family and mix as llama.cpp's own tools write them, held to llama.cpp on the same file.

The files (tests/_llama_cpp_models.py): tiny random models of every family we export, with their
real tokenizers, converted by llama.cpp's convert_hf_to_gguf.py and quantised by llama-quantize to
F16, Q8_0, Q6_K, Q5_K_M, Q4_K_M and Q4_0, and for Llama 2 and Qwen2 also to Q3_K_M, Q2_K,
IQ4_XS, IQ4_NL, Q4_1 and Q5_1 (the other types we transplant), and for Llama 3 and Phi-3 to BF16.
For each file:

- every tensor we transplant de-quantises to `gguf.quants.dequantize`'s numbers, bit for bit;
- `onnxsample export FILE` (every option default) keeps the file's own blocks, within the size
  bound of its mix (:data:`SIZE`), and decodes as llama-server: the teacher-forced comparison of
  test_gguf_llama_cpp.py and _llama_cpp.py (likely tokens' logprobs within its TOL, llama.cpp's
  greedy token wherever its top two are apart, the same greedy tokens until the first near-tie).

For each family, the export's tokenizer gives llama.cpp's ids on the hard strings of
tests/_hard_texts.py and the family's chat markup, with BOS and without (the tokenizer comes from
the metadata, which every mix of a family shares: test_llama_cpp_models.py checks that).
"""

from __future__ import annotations

import gc
from pathlib import Path

import _llama_cpp_models as models
import gguf
import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from _exports import export_beside
from _hard_texts import hard_corpus
from _llama_cpp import (
    FLAT_TOL,
    TOL,
    LlamaServer,
    compare_with_llama_cpp,
)

from onnxsample.exporters import export
from onnxsample.exporters._gguf_quant import QuantizedWeight, from_gguf
from onnxsample.exporters._gguf_reader import FastGGUFReader
from onnxsample.exporters._gqa_graph import ExternalData
from onnxsample.exporters._weights import read_gguf
from onnxsample.exporters.gguf import inspect_gguf
from onnxsample.exporters.gqa import build_gqa_model, write_gqa
from onnxsample.text import Tokenizer

pytestmark = pytest.mark.slow
MIXES = ("F16", *models.MIXES)
CASES = [(f, m) for f in models.FAMILIES for m in MIXES]
CASES += [(f, m) for f in models.MORE_FAMILIES for m in models.MORE_MIXES]
CASES += [("llama3", "BF16"), ("phi3", "BF16")]  # bfloat16 values, stored as bfloat16
# The weights' bytes on disk over the GGUF's tensor bytes, at most, as measured: 5- and 6-bit codes
# as bit planes and fp16 scales as fp16, rebuilt when the session loads (exporters/_store.py); K-quant
# scales (d * sc) and minimums float32 (exact: fp16 would round them); F16 weights as fp16, BF16
# ones as bfloat16, and a tied float LM head over its embedding's table. The rotary tables (positions x rotary dims, float32: 33
# MB for Llama 3's 131k positions, most of a tiny model, a few percent of a real one) are left out:
# the GGUF has none.
SIZE = {
    "F16": 1.01,
    "BF16": 1.01,
    "Q8_0": 1.01,
    "Q6_K": 1.23,
    "Q5_K_M": 1.26,
    "Q4_K_M": 1.28,
    "Q4_0": 1.23,
}
# The other types cost more: Q2_K and Q3_K take 4-bit codes in blocks of 16 with float32 scales
# (and Q2_K's minimums), IQ4_NL and IQ4_XS 8-bit codes (a 16-value table); Llama's 32k vocabulary
# makes them most of its file, Qwen2's Q6_K embedding most of its.
SIZE |= {"Q3_K_M": 1.42, "Q2_K": 1.78, "IQ4_XS": 1.61, "IQ4_NL": 1.52, "Q4_1": 1.22, "Q5_1": 1.22}
SIZE |= {"IQ3_S": 1.42}  # its codes as 5 bit planes, fp32 scales a block of 32
ROWS = 4096


@pytest.fixture(scope="module", params=CASES, ids=[f"{f}-{m}" for f, m in CASES])
def made(request, llama_cpp):
    """(family, mix, the file llama.cpp's tools made, our default export of it)."""
    family, mix = request.param
    path = models.gguf(family, mix, llama_cpp)
    return family, mix, path, export_beside(path, mix)


def test_every_tensor_dequantizes_as_gguf(made):
    """Every matrix (of an embedding, its first ROWS rows: rows are independent blocks)."""
    _, mix, path, _ = made
    types = set()
    for t in FastGGUFReader(str(path)).tensors:
        if len(t.shape) != 2 or t.tensor_type.name in ("F32",):
            continue
        types.add(t.tensor_type.name)
        data = np.asarray(t.data)[:ROWS]
        w = from_gguf(data, t.tensor_type.name, int(t.shape[0]), name=t.name)
        ours = w.dequantize() if isinstance(w, QuantizedWeight) else w
        reference = gguf.quants.dequantize(data, t.tensor_type).reshape(ours.shape)
        assert np.array_equal(ours, reference.astype(np.float32)), t.name
    assert types
    if mix in models.MORE_MIXES:  # the type the mix stands for is among them
        assert models.MORE_MIXES[mix] in types, (mix, types)


@pytest.mark.parametrize(("mix", "half"), [("F16", np.float16), ("BF16", ml_dtypes.bfloat16)])
@pytest.mark.parametrize("family", ["llama3", "phi3"])
def test_a_half_files_matrices_are_read_as_the_file_holds_them(family, mix, half, llama_cpp):
    """fp16 or bfloat16, not float32 copies (half an export's memory); Phi-3's fused tensors split
    apart and Llama's Q/K rows put back keep the file's type. Norms are float32."""
    path = models.gguf(family, mix, llama_cpp)
    _, weights = read_gguf(path, inspect_gguf(path).metadata, quantized=True)
    read = {(np.ndim(w), np.asarray(w).dtype) for w in weights.values()}
    assert read == {(1, np.dtype(np.float32)), (2, np.dtype(half))}, read


def _weight_bytes(model: Path) -> int:
    """The bytes of `model`'s initializers on disk (external data or inline), rotary tables aside."""
    proto = onnx.load(str(model), load_external_data=False)
    return sum(
        next((int(e.value) for e in t.external_data if e.key == "length"), len(t.raw_data))
        for t in proto.graph.initializer
        if not t.name.startswith("rotary")
    )


def test_the_export_keeps_the_files_blocks(made):
    _, mix, path, result = made
    manifest = result.manifest
    assert (manifest["layout"], manifest["precision"]) == ("gqa", "gguf")
    theirs = sum(t.n_bytes for t in FastGGUFReader(str(path)).tensors)
    ours = _weight_bytes(Path(result.output) / "model.onnx")
    assert ours <= SIZE[mix] * theirs, (ours / theirs, mix)


def test_the_export_decodes_as_llama_server(made, llama_cpp):
    _, _, path, result = made
    with LlamaServer(llama_cpp, path) as server:
        prompt = server.tokenize("The capital of France is")
        found = compare_with_llama_cpp(Path(result.output) / "model.onnx", server, prompt, 16)
    assert found["compared"] >= 12, found
    assert found["worst"] <= TOL, found
    assert found["flat"] <= FLAT_TOL, found  # Gemma 2's fixture has no likely token at any step
    assert found["agree"] == found["decisive"], found
    assert found["same"] >= found["close"], found


# Far from the start the rotary embedding's details show: Llama 3.1+'s files carry rope_freqs, which
# divide its low frequencies by up to 32. At position 20 that moves no logprob by 0.1; at 840, by 5.
FAR = " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 60)


@pytest.mark.parametrize("family", models.FAMILIES)
def test_far_positions_decode_as_llama_server(family, llama_cpp):
    """Every token llama-server lists (its top 8, however unlikely: a tiny random model with
    Llama 3's 128k vocabulary has no likely one) after a prompt of some 840 tokens."""
    path = models.gguf(family, "Q8_0", llama_cpp)
    result = export_beside(path, "Q8_0")
    with LlamaServer(llama_cpp, path) as server:
        prompt = server.tokenize(FAR)
        assert len(prompt) > 800, len(prompt)
        found = compare_with_llama_cpp(
            Path(result.output) / "model.onnx", server, prompt, 3, likely=-np.inf
        )
    assert found["compared"] >= 2, found  # steps llama-server gave numbers for
    assert found["worst"] <= TOL, found
    assert found["agree"] == found["decisive"], found


def test_llama3_files_turn_as_their_hf_folder(llama_cpp):
    """The Llama 3 file's rope_freqs (what the converter made of the HF folder's llama3 scaling)
    give the folder's rotary frequencies: in the export, and in the verify step's reference, which
    transformers' GGUF loader makes without them. The optimum layout, which exports that loader's
    model, refuses the file."""
    from onnxsample.errors import ExportError
    from onnxsample.exporters._weights import read_hf
    from onnxsample.exporters.gguf import check_architecture, gguf_model

    path = models.gguf("llama3", "Q8_0", llama_cpp)
    info = inspect_gguf(path)
    spec, _ = read_gguf(path, info.metadata, quantized=True)
    hf_spec, _ = read_hf(models.hf_folder("llama3", llama_cpp))
    np.testing.assert_allclose(spec.inv_freq(), hf_spec.inv_freq(), rtol=1e-6)
    reference = gguf_model(path, info).model.rotary_emb.inv_freq.numpy()
    np.testing.assert_allclose(reference, spec.inv_freq(), rtol=1e-6)
    with pytest.raises(ExportError, match=r"leaves out its rope_freqs\.weight"):
        check_architecture(info, optimum=True, what=path.name)


@pytest.mark.parametrize("family", models.FAMILIES)
def test_the_export_tokenizes_as_llama_cpp(family, llama_cpp):
    path = models.gguf(family, "Q4_K_M", llama_cpp)
    tokenizer = Tokenizer.from_folder(export_beside(path, "Q4_K_M").output)
    corpus = [*hard_corpus(tokenizer), models.CHAT[family]]
    with LlamaServer(llama_cpp, path) as server:
        wrong = [
            (text, bos, want, got)
            for text in corpus
            for bos in (True, False)
            if (got := tokenizer.encode(text, add_special_tokens=bos))
            != (want := server.tokenize(text, bos=bos))
        ]
    assert not wrong, f"{len(wrong)} of {2 * len(corpus)} differ, first: {wrong[0]}"


@pytest.mark.parametrize("family", ["llama3", "qwen2", "gemma3", "phi3"])
def test_an_export_holds_a_layers_blocks_at_a_time(family, llama_cpp, tmp_path, monkeypatch):
    """A linear weight is read from the file when the graph takes it, and what the graph stores
    goes to the external data file at once (exporters/_gqa_graph.py's ExternalData): the export
    never holds every tensor's blocks, only the embedding's and one layer's (the live
    QuantizedWeight objects, counted at each stored initializer); Phi-3's fused tensors are
    read and split apart when the graph takes the first of their parts."""
    path = models.gguf(family, "Q4_K_M", llama_cpp)
    matrices = sum(len(t.shape) == 2 for t in FastGGUFReader(str(path)).tensors)
    live, store = [], ExternalData.tensor

    def counted(self, array, name):
        live.append(sum(isinstance(o, QuantizedWeight) for o in gc.get_objects()))
        return store(self, array, name)

    monkeypatch.setattr(ExternalData, "tensor", counted)
    export(path, tmp_path / "out", verify_tokens=0)
    assert matrices > 6 and live and max(live) <= 6, (matrices, live)  # can fail
    assert sorted(p.name for p in (tmp_path / "out").glob("model.*")) == [
        "model.onnx",
        "model.onnx.data",
    ]


def test_weights_written_as_made_save_as_weights_held_in_memory(llama_cpp, tmp_path):
    """The same bytes, model and external data, whether the weights went to the data file as the
    graph made them (write_gqa) or were held in memory until ir.save wrote them."""
    path = models.gguf("llama3", "Q4_K_M", llama_cpp)
    metadata = inspect_gguf(path).metadata
    held, written = tmp_path / "held", tmp_path / "written"
    held.mkdir()
    spec, weights = read_gguf(path, metadata, quantized=True)
    ir.save(build_gqa_model(spec, weights), held / "model.onnx", external_data="model.onnx.data")
    spec, weights = read_gguf(path, metadata, quantized=True)
    write_gqa(spec, weights, written / "model.onnx")
    for name in ("model.onnx", "model.onnx.data"):
        assert (held / name).read_bytes() == (written / name).read_bytes(), name
    assert sorted(p.name for p in written.iterdir()) == ["model.onnx", "model.onnx.data"]
