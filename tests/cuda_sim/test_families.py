"""The GPU export (`export --device cuda`: fp16 GroupQueryAttention) of every gqa family's tiny
model on the simulated CUDA device: sliding windows (Mistral, Qwen2's use_sliding_window, Phi-3's
window, Gemma's sliding layers), partial rotary (Phi-4-mini), per-head Q/K norms, biases, Gemma's
soft-caps (GroupQueryAttention's `softcap`, and Div/Tanh/Mul on the logits) all run on the CUDA
provider, and the engine decodes through the composed model without an ONNX Runtime error. The
numbers of the window and the partial rotary are held to transformers on the CPU kernel
(tests/exporters/test_export_families.py); the simulated device computes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from _family_models import FAMILIES, cached
from cuda_sim.conftest import CHAIN_OPTIONS, _composed
from cuda_sim.test_placement import STATIC_SHAPE_NODES, shape_nodes_off_cuda

pytestmark = pytest.mark.cuda_sim


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_gpu(request, tiny_hf) -> dict[str, Path]:
    """A family's GPU export, composed static with the full chain (as gpu_models' "static")."""
    from onnxsample.composer import compose
    from onnxsample.exporters import export

    folder = cached(request.param, tiny_hf)
    output = folder.parent / "gqa-cuda"
    try:
        result = export(folder, output, device="cuda", verify_tokens=0)
    except Exception as exc:  # an older export in the cache folder
        if "different export" not in str(exc):
            raise
        result = export(folder, output, device="cuda", verify_tokens=0, force=True)
    assert (result.manifest["layout"], result.manifest["precision"]) == ("gqa", "fp16")
    composed = _composed(
        compose,
        result.output,
        result.output / "composed-static.onnx",
        dict(static=True, **CHAIN_OPTIONS),
    )
    return {"name": request.param, "folder": result.output, "static": composed}


def test_every_compute_node_of_the_family_runs_on_cuda(device, family_gpu):
    report = device.probe("placement", family_gpu["static"])
    assert report["providers"][0] == "CUDAExecutionProvider"
    assert report["compute_off_cuda"] == [], report["compute_off_cuda"]
    assert report["unknown"] == []
    assert shape_nodes_off_cuda(report) == STATIC_SHAPE_NODES
    assert report["memcpy"] == [], report["memcpy"]


def test_the_engine_decodes_the_family_on_cuda(device, family_gpu):
    report = device.probe(
        "engine", family_gpu["static"], "whole", "--tokenizer", family_gpu["folder"]
    )
    assert report["device"] == "cuda"
    assert report["failure"] is None
    assert "Error" not in report["stderr"], report["stderr"][-2000:]
    assert report["tokens"] == 10 and report["finish"] == "length"
