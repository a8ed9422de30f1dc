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


@pytest.mark.integration
def test_embedded_gpu_export_keeps_its_4bit_blocks(embedded_gqa_exports, embedded_gpu_export):
    """The embedded Q4_1 GGUF for the GPU: the GGUF's blocks as fp16 MatMulNBits (Q4_1's minimum
    added back exactly, per block), greedy tokens and quality as the fp32 export's on the CPU."""
    result = embedded_gpu_export
    assert (result.manifest["precision"], result.manifest["device"]) == ("gguf", "cuda")
    ops, kv = _ops_and_kv(result.model_path)
    assert kv == onnx.TensorProto.FLOAT16
    assert ops["MatMulNBits"] == 4 * 30 + 1  # the Q8_0 LM head too, in fp16
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
