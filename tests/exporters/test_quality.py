"""Integration: the quality gate of the fast exports of the embedded SmolLM2 (Q4_1 GGUF).

Quality = the mean log-probability a model assigns to the fp32 model's 64 greedy tokens. The fp32
reference is the GGUF de-quantised exactly, so an exact transplant of the GGUF's blocks scores what
fp32 scores; int8 activations (accuracy level 4, as llama.cpp computes Q4_1) may lose a little.
"""

from __future__ import annotations

import pytest

from onnxsample.exporters._verify import mean_logprob, ort_greedy, prompt_ids, torch_greedy

pytestmark = pytest.mark.integration

PROMPT = "Explain in a few sentences why the sky is blue."
TOKENS = 64
GATE = 0.03


@pytest.fixture(scope="module")
def ids(embedded_gqa_exports) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_gqa_exports["fp32"].output)
    return prompt_ids(tokenizer, PROMPT)


@pytest.fixture(scope="module")
def reference(embedded_gqa_exports, ids) -> list[int]:
    """The fp32 GQA export's greedy tokens: the tokens every variant is scored on."""
    return ort_greedy(embedded_gqa_exports["fp32"].model_path, ids, TOKENS)


@pytest.fixture(scope="module")
def fp32_score(embedded_gqa_exports, ids, reference) -> float:
    return mean_logprob(embedded_gqa_exports["fp32"].model_path, ids, reference)


def test_gqa_fp32_greedy_equals_transformers(ids, reference):
    from onnxsample.exporters import embedded_gguf
    from onnxsample.exporters.gguf import gguf_model, inspect_gguf

    path = embedded_gguf()
    assert reference == torch_greedy(gguf_model(path, inspect_gguf(path)), ids, TOKENS)


@pytest.mark.parametrize("variant", ["gguf-a0", "gguf-a4"])
def test_gguf_transplant_passes_the_quality_gate(
    embedded_gqa_exports, ids, reference, fp32_score, variant
):
    score = mean_logprob(embedded_gqa_exports[variant].model_path, ids, reference)
    assert abs(score - fp32_score) <= GATE, f"{variant}: {score:.4f} vs fp32 {fp32_score:.4f}"


def test_gguf_at_accuracy_level_0_reproduces_fp32(embedded_gqa_exports, ids, reference):
    assert ort_greedy(embedded_gqa_exports["gguf-a0"].model_path, ids, TOKENS) == reference


@pytest.mark.parametrize(
    ("variant", "linear_op", "count"),
    [
        # 4 packed projections per layer on Q4_1 blocks; the Q8_0 LM head runs as MatMulNBits only
        # at level 4 (ORT's 8-bit kernel is slow in float), else as the same values in a MatMul.
        ("gguf-a0", "MatMulNBits", 4 * 30),
        ("gguf-a4", "MatMulNBits", 4 * 30 + 1),
        ("fp32", "MatMul", 4 * 30 + 1),
    ],
)
def test_export_graph(embedded_gqa_exports, variant, linear_op, count):
    import onnx

    result = embedded_gqa_exports[variant]
    model = onnx.load(str(result.model_path), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count(linear_op) == count
    assert ops.count("GroupQueryAttention") == 30
