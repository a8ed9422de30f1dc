"""Our GroupQueryAttention exporter on the tiny random Llama: layout, precisions, parity, errors."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from _family_models import export_logits as _logits

from onnxsample.composer.loading import check_model
from onnxsample.errors import ExportError, InvalidParameter
from onnxsample.exporters import export
from onnxsample.exporters._verify import mean_logprob, ort_greedy, torch_greedy
from onnxsample.exporters._weights import read_hf
from onnxsample.exporters.gqa import build_gqa_model

PROMPT = [1, 504, 3458, 314, 260, 1000, 77, 9]
HALVES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}  # numpy's types of torch's


def _ops(path: Path) -> Counter:
    model = onnx.load(str(path), load_external_data=False)
    return Counter(node.op_type for node in model.graph.node)


@pytest.fixture(scope="module")
def torch_model(tiny_hf):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_hf, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=["fp16", "int8", "int4"])
def other_precision(request, tiny_hf, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"gqa-{request.param}")
    return request.param, export(
        tiny_hf, out, layout="gqa", precision=request.param, accuracy_level=0, verify_tokens=8
    )


def test_io_follows_the_gqa_contract(tiny_gqa_export):
    io = tiny_gqa_export.manifest["io"]
    names = [i["name"] for i in io["inputs"]]
    assert names[:2] == ["input_ids", "attention_mask"]
    assert "position_ids" not in names
    assert names[2:4] == ["past_key_values.0.key", "past_key_values.0.value"]
    assert [o["name"] for o in io["outputs"]][:3] == ["logits", "present.0.key", "present.0.value"]
    assert io["kv_cache"]["layout"] == "gqa"
    assert io["kv_cache"]["shape"][1:] == [2, "past_sequence_length", 16]


def test_graph_is_small_and_fused(tiny_gqa_export):
    ops = _ops(tiny_gqa_export.model_path)
    layers = tiny_gqa_export.manifest["model"]["num_layers"]
    assert ops["GroupQueryAttention"] == layers
    assert ops["SkipSimplifiedLayerNormalization"] == 2 * layers
    assert ops["MatMul"] == 4 * layers + 1  # qkv, o, gate_up, down; the LM head
    assert sum(ops.values()) <= 12 * layers + 12


def test_export_passes_the_checker(tiny_gqa_export):
    check_model(tiny_gqa_export.model_path)


def test_auto_layout_is_gqa_for_llama(tiny_gqa_export, tiny_hf, tmp_path):
    result = export(tiny_hf, tmp_path / "auto", verify_tokens=0)
    assert (result.manifest["layout"], result.manifest["precision"]) == ("gqa", "fp32")


def test_fp32_greedy_matches_transformers(tiny_gqa_export, torch_model):
    assert tiny_gqa_export.verify["ok"] is True
    assert ort_greedy(tiny_gqa_export.model_path, PROMPT, 24) == torch_greedy(
        torch_model, PROMPT, 24
    )


def test_fp32_logits_match_transformers(tiny_gqa_export, torch_model):
    import torch

    with torch.no_grad():
        ref = torch_model(input_ids=torch.tensor([PROMPT])).logits[0].numpy()
    np.testing.assert_allclose(_logits(tiny_gqa_export.model_path, PROMPT), ref, atol=1e-4)


def test_other_precisions(other_precision, tiny_gqa_export):
    precision, result = other_precision
    ops = _ops(result.model_path)
    layers = result.manifest["model"]["num_layers"]
    if precision == "fp16":
        assert result.manifest["io"]["kv_cache"]["dtype"] == "float16"
        tolerance = 2e-2
    else:
        assert ops["MatMulNBits"] == 4 * layers + 1  # the (tied) LM head is quantised too
        tolerance = {"int8": 0.05, "int4": 0.6}[precision]
    ref = _logits(tiny_gqa_export.model_path, PROMPT)
    got = _logits(result.model_path, PROMPT)
    assert np.abs(got - ref).max() < tolerance * np.abs(ref).max()


def test_quality_score_is_recorded(other_precision):
    from transformers import AutoTokenizer

    from onnxsample.exporters._verify import prompt_ids

    _, result = other_precision
    verify = result.verify
    assert verify["reference_logprob"] < 0 and verify["onnx_logprob"] < 0
    ids = prompt_ids(AutoTokenizer.from_pretrained(result.output))
    score = mean_logprob(result.model_path, ids, verify["reference"])
    assert verify["onnx_logprob"] == pytest.approx(score, abs=1e-3)


@pytest.mark.parametrize(("lossy", "parts_at"), [("int8 activations", 0), ("", 2)])
def test_verify_says_where_the_greedy_tokens_part(
    lossy, parts_at, tiny_gqa_export, tiny_hf, monkeypatch
):
    """Where the export's greedy tokens leave transformers', the verify step records how far
    transformers' own token was ahead of the export's there (a near tie is what int8 activations
    tip), and says whether the difference is expected."""
    from transformers import AutoTokenizer

    from onnxsample.exporters import _verify
    from onnxsample.exporters.hf import load_hf

    model = load_hf(tiny_hf)[0]
    tokenizer = AutoTokenizer.from_pretrained(tiny_gqa_export.output)
    ids = _verify.prompt_ids(tokenizer)
    reference = _verify.torch_greedy(model, ids, 4)
    other = [*reference[:parts_at], (reference[parts_at] + 1) % 49152, *reference[parts_at + 1 :]]
    monkeypatch.setattr(_verify, "ort_greedy", lambda *_args, **_kw: other)
    result = _verify.verify_export(tiny_gqa_export.model_path, model, tokenizer, 4, lossy=lossy)
    logits = _verify._torch_logits(model, ids, reference)[parts_at]
    gap = logits[reference[parts_at]] - logits[other[parts_at]]
    assert (result.ok, result.matched) == (False, parts_at)
    assert result.reference_gap == pytest.approx(gap, abs=1e-4)
    assert result.note == (
        f"greedy tokens agree for {parts_at} of 4, then part where transformers' token is "
        f"{gap:.2f} above the export's in logprob" + (f" (expected with {lossy})" if lossy else "")
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_checkpoint_exports_as_its_values_in_float32(dtype, tiny_hf, tmp_path):
    """An fp16 or bf16 checkpoint's matrices are read in their own two bytes a value, not as
    float32 copies (half the memory), and the export is a float32 checkpoint's of the same values,
    byte for byte."""
    import shutil

    import onnx_ir as ir
    import torch
    from safetensors.torch import load_file, save_file

    half_type = getattr(torch, dtype)
    tensors = {k: v.to(half_type) for k, v in load_file(tiny_hf / "model.safetensors").items()}
    for name, values in (("half", tensors), ("wide", {k: v.float() for k, v in tensors.items()})):
        shutil.copytree(tiny_hf, tmp_path / name)
        save_file(values, tmp_path / name / "model.safetensors", metadata={"format": "pt"})
    _, weights = read_hf(tmp_path / "half")
    read = {(w.ndim, np.dtype(w.dtype)) for w in weights.values()}
    assert read == {(1, np.dtype(np.float32)), (2, np.dtype(HALVES[dtype]))}, read
    outputs = [
        export(tmp_path / name, tmp_path / f"{name}-onnx", layout="gqa", verify_tokens=0).output
        for name in ("half", "wide")
    ]
    assert len({(out / "model.onnx.data").read_bytes() for out in outputs}) == 1
    assert len({(out / "model.onnx").read_bytes() for out in outputs}) == 1
    # matrices in the checkpoint's own two bytes a value (fp16 where that holds them, else
    # bfloat16), cast when the session loads: the float32 graph's numbers, bit for bit
    stored = onnx.load(str(outputs[0] / "model.onnx"), load_external_data=False)
    matrices = {t.name: t.data_type for t in stored.graph.initializer if len(t.dims) == 2}
    halves = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    assert {n: t for n, t in matrices.items() if "rotary" not in n and t not in halves} == {}
    plain = tmp_path / "plain" / "model.onnx"
    plain.parent.mkdir()
    ir.save(build_gqa_model(*read_hf(tmp_path / "half"), compact=False), plain,
            external_data="model.onnx.data")  # fmt: skip
    np.testing.assert_array_equal(
        _logits(outputs[0] / "model.onnx", PROMPT), _logits(plain, PROMPT)
    )


def test_building_can_consume_the_matrices(tiny_hf):
    """`consume` (the exporter's way: a float32 source is then not held twice) gives the same
    model and leaves only the vectors (norms) in the mapping."""
    import onnx_ir as ir

    spec, weights = read_hf(tiny_hf)
    kept = build_gqa_model(spec, dict(weights))
    consumed = build_gqa_model(spec, weights, consume=True)
    assert ir.to_proto(kept).SerializeToString() == ir.to_proto(consumed).SerializeToString()
    assert weights and all(np.ndim(w) == 1 for w in weights.values()), sorted(weights)


def test_request_is_part_of_the_reuse_key(tiny_gqa_export, tiny_hf):
    with pytest.raises(ExportError, match="holds a different export"):
        export(tiny_hf, tiny_gqa_export.output, layout="gqa", precision="int4")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"layout": "paged"}, InvalidParameter, "layout must be one of auto, gqa, optimum"),
        ({"accuracy_level": 2}, InvalidParameter, "accuracy_level must be 0 or 4, got 2"),
        ({"precision": "gguf"}, ExportError, "give a .gguf source"),
        (
            {"layout": "optimum", "precision": "int4"},
            ExportError,
            r"precision int4 needs --layout gqa \(optimum: fp32, fp16\)",
        ),
    ],
)
def test_invalid_combinations(tmp_path, tiny_hf, kwargs, error, message):
    with pytest.raises(error, match=message):
        export(tiny_hf, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_non_llama_models_are_refused_by_the_gqa_layout(tmp_path, tiny_hf):
    import json
    import shutil

    folder = tmp_path / "gemma"
    shutil.copytree(tiny_hf, folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "gemma"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match="the gqa layout is for Llama-family models"):
        export(folder, tmp_path / "out", layout="gqa")


def _composed_meta(result, tmp_path) -> dict:
    import onnx

    from onnxsample import compose
    from onnxsample.composer import composed_metadata

    out = compose(result.output, None, tmp_path / "c.onnx", max_slots=2, gather="lm_head")
    return composed_metadata(onnx.load(str(out), load_external_data=False))


def test_composer_moves_the_gather_before_the_fp32_lm_head(tiny_gqa_export, tmp_path):
    meta = _composed_meta(tiny_gqa_export, tmp_path)
    assert (meta.gather, meta.kv_layout) == ("lm_head", "gqa")


def test_composer_moves_the_gather_before_other_lm_heads(other_precision, tmp_path):
    """MatMulNBits heads (int8, int4) and fp16's MatMul + Cast take the gathered rows only."""
    meta = _composed_meta(other_precision[1], tmp_path)
    assert (meta.gather, meta.kv_layout) == ("lm_head", "gqa")


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_the_gqa_layout_never_imports_optimum(source, tiny_hf, tmp_path):
    """optimum (seconds to import) answers the optimum layout's questions only: a gqa export of
    a checkpoint or a GGUF, its verify step included, runs without importing it."""
    import subprocess
    import sys

    from onnxsample.exporters import embedded_gguf

    path = tiny_hf if source == "hf" else embedded_gguf()
    code = (
        "import sys\nfrom onnxsample.exporters import export\n"
        f"r = export({str(path)!r}, {str(tmp_path / 'out')!r}, layout='gqa', verify_tokens=2)\n"
        "print(r.verify['tokens'], sorted(m for m in sys.modules if m.startswith('optimum')))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[-2] == "2 []", run.stdout[-2000:]
