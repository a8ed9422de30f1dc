"""The GPU export (`export --device cuda`): fp16 GroupQueryAttention graphs, checked on the CPU
provider (which has the fp16 kernels) against the fp32 export; and what it refuses."""

from __future__ import annotations

from collections import Counter

import onnx
import pytest

from onnxsample.errors import ExportError, InvalidParameter
from onnxsample.exporters import export
from onnxsample.exporters._options import export_name
from onnxsample.exporters._verify import mean_logprob, ort_greedy

PROMPT = [1, 504, 3458, 314, 260, 1000, 77, 9]


def _ops_and_kv(path) -> tuple[Counter, int]:
    model = onnx.load(str(path), load_external_data=False)
    past = next(i for i in model.graph.input if i.name.startswith("past_key_values."))
    return Counter(n.op_type for n in model.graph.node), past.type.tensor_type.elem_type


def test_the_gpu_export_is_fp16_gqa(tiny_gpu_export, tiny_gqa_export):
    manifest = tiny_gpu_export.manifest
    assert (manifest["layout"], manifest["precision"], manifest["device"]) == (
        "gqa",
        "fp16",
        "cuda",
    )
    assert manifest["accuracy_level"] == 0  # CUDA has no int8-activation path
    assert manifest["io"]["kv_cache"]["dtype"] == "float16"
    ops, kv = _ops_and_kv(tiny_gpu_export.model_path)
    assert kv == onnx.TensorProto.FLOAT16 and ops["GroupQueryAttention"] == 2
    assert manifest["verify"]["ok"], manifest["verify"]
    assert manifest["verify"]["lossy"] == "fp16 activations"


def test_greedy_tokens_and_quality_follow_the_fp32_export(tiny_gpu_export, tiny_gqa_export):
    """On the CPU provider; what a GPU should roughly reproduce."""
    reference = ort_greedy(tiny_gqa_export.model_path, PROMPT, 24)
    assert ort_greedy(tiny_gpu_export.model_path, PROMPT, 24) == reference
    fp32 = mean_logprob(tiny_gqa_export.model_path, PROMPT, reference)
    fp16 = mean_logprob(tiny_gpu_export.model_path, PROMPT, reference)
    assert abs(fp16 - fp32) < 0.01, (fp16, fp32)


def test_default_folder_name_says_cuda():
    assert export_name("m", "gqa", "gguf", 0, "cuda") == "m-gqa-gguf-cuda"
    assert export_name("m", "gqa", "gguf", 4) == "m-gqa-gguf-a4"


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"layout": "optimum"}, ExportError, "drop --layout optimum"),
        ({"precision": "fp32"}, ExportError, "no fp32 kernel"),
        ({"precision": "gguf"}, ExportError, "give a .gguf source"),
        ({"device": "tpu"}, InvalidParameter, "device must be one of cpu, cuda, got 'tpu'"),
    ],
)
def test_refused(tiny_hf, tmp_path, options, error, message):
    with pytest.raises(error, match=message):
        export(tiny_hf, tmp_path / "out", **{"device": "cuda", **options})
    assert not (tmp_path / "out").exists()


def test_a_cpu_export_is_not_taken_for_a_gpu_one(tiny_hf, tiny_gqa_export, tmp_path):
    """Same source, layout and weights, other device: not reused, and no silent overwrite."""
    out = tmp_path / "same"
    export(tiny_hf, out, layout="gqa", precision="fp16", verify_tokens=0)
    with pytest.raises(ExportError, match="different export"):
        export(tiny_hf, out, device="cuda", verify_tokens=0)


# The embedded Q4_1 GGUF for the GPU: by default its weights de-quantised to fp16 (one GEMM a
# projection), with --precision gguf its blocks as fp16 MatMulNBits (Q4_1's minimum added back per
# block). (fixture, precision, MatMulNBits nodes, MatMul nodes)
EMBEDDED_GPU = [
    ("embedded_gpu_export", "fp16", 0, 4 * 30 + 1),
    ("embedded_gpu_blocks_export", "gguf", 4 * 30 + 1, 4 * 30),  # the Q8_0 LM head too; minimums
]


@pytest.mark.integration
@pytest.mark.parametrize(("fixture", "precision", "nbits", "matmuls"), EMBEDDED_GPU)
def test_embedded_gpu_export_follows_the_fp32_export(
    request, embedded_gqa_exports, fixture, precision, nbits, matmuls
):
    """Greedy tokens and quality as the fp32 export's, on the CPU, in either weight form."""
    result = request.getfixturevalue(fixture)
    assert (result.manifest["precision"], result.manifest["device"]) == (precision, "cuda")
    ops, kv = _ops_and_kv(result.model_path)
    assert kv == onnx.TensorProto.FLOAT16
    assert (ops["MatMulNBits"], ops["MatMul"]) == (nbits, matmuls)
    assert ops["GroupQueryAttention"] == 30
    fp32 = embedded_gqa_exports["fp32"].model_path
    from transformers import AutoTokenizer

    from onnxsample.exporters._verify import prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(embedded_gqa_exports["fp32"].output)
    ids = prompt_ids(tokenizer, "Explain in a few sentences why the sky is blue.")
    reference = ort_greedy(fp32, ids, 64)
    gpu = ort_greedy(result.model_path, ids, 64)
    same = next((i for i, (a, b) in enumerate(zip(gpu, reference, strict=True)) if a != b), 64)
    assert same >= 32, f"fp16 greedy diverges at token {same}"
    score = mean_logprob(result.model_path, ids, reference)
    assert abs(score - mean_logprob(fp32, ids, reference)) <= 0.03


@pytest.mark.parametrize(
    ("params", "precision", "device", "expected"),
    [
        (135_000_000, "auto", "cuda", "fp16"),  # kernel-bound: one GEMM a projection
        (1_000_000_000, "auto", "cuda", "fp16"),
        (1_000_000_001, "auto", "cuda", "gguf"),  # bandwidth-bound: the blocks' bytes
        (135_000_000, "gguf", "cuda", "gguf"),  # asked for
        (135_000_000, "auto", "cpu", "gguf"),
    ],
)
def test_the_gpu_export_of_a_small_gguf_takes_fp16_weights(params, precision, device, expected):
    from pathlib import Path

    from onnxsample.exporters._options import resolve_options
    from onnxsample.exporters._source import Source
    from onnxsample.exporters.gguf import GGUFInfo

    info = GGUFInfo("llama", Counter({"Q4_K": 10}), params, {}, {"blk.0.w": "Q4_K"})
    src = Source("gguf", Path("model.gguf"), "model")
    assert resolve_options(src, info, "llama", "auto", precision, device) == ("gqa", expected)


@pytest.fixture(scope="module")
def real_gguf_float_export(real_gguf):
    """The real Q4_K_M file exported for the CPU computing in float (accuracy level 0)."""
    from _exports import export_cached
    from conftest import CACHE

    out = CACHE / "gemma3-270m-q4_k_m-a0"
    return export_cached(real_gguf, out, accuracy_level=0, verify_tokens=0)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("fixture", "precision"),
    [("real_gguf_gpu_fp16_export", "fp16"), ("real_gguf_gpu_export", "gguf")],
)
def test_gemma_gpu_export_keeps_its_residual_stream_in_float32(
    request, real_gguf_float_export, fixture, precision
):
    """Gemma 3 270M's residual stream passes fp16's 65504 by its 8th layer, so an fp16 export
    whose residual were fp16 decoded NaN from the first token. Kept in float32, the GPU export (on
    the CPU provider) gives the float CPU export's greedy tokens for the same Q4_K_M file."""
    real_gguf_export = real_gguf_float_export
    result = request.getfixturevalue(fixture)
    assert result.manifest["precision"] == precision
    ops, kv = _ops_and_kv(result.model_path)
    assert kv == onnx.TensorProto.FLOAT16 and ops["SkipSimplifiedLayerNormalization"] == 0
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(result.output / "tokenizer.json"))
    ids = [2, *tokenizer.encode("The capital of France is", add_special_tokens=False).ids]
    reference = ort_greedy(real_gguf_export.model_path, ids, 24)
    gpu = ort_greedy(result.model_path, ids, 24)
    same = next((i for i, (a, b) in enumerate(zip(gpu, reference, strict=True)) if a != b), 24)
    assert same >= 16, f"diverges at token {same}: {gpu} against {reference}"
    score = mean_logprob(result.model_path, ids, reference)
    assert abs(score - mean_logprob(real_gguf_export.model_path, ids, reference)) <= 0.01
