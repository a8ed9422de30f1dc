"""The GPU export with the file's blocks (`export --device cuda --precision gguf`) of GGUF files in
llama.cpp's K-quant mixes on the simulated CUDA device: every block type's MatMulNBits (4 and 8
bits, blocks of 16 and 32, the minimums' correction) and the embedding gathered from its blocks (a
Floor/Sub nibble split, since CUDA has no BitShift kernel) run on the CUDA provider with no copy to
the host, and the engine decodes through the composed model without an ONNX Runtime error.

What only a GPU shows stays out of reach here: on CUDA the scales and minimums are fp16, so a
K-quant's sub-block scale d * sc (exact in float32) is rounded once (relative error <= 2**-11,
tests/exporters/test_gguf_quant.py bounds the product); its numbers need `scripts/cuda_check.sh`."""

from __future__ import annotations

from pathlib import Path

import pytest
from cuda_sim.conftest import CHAIN_OPTIONS, _composed
from cuda_sim.test_placement import STATIC_SHAPE_NODES, shape_nodes_off_cuda

pytestmark = pytest.mark.cuda_sim


@pytest.fixture(scope="module")
def kquant_gpu(real_gguf_gpu_export) -> dict[str, Path]:
    """The real Gemma 3 270M Q4_K_M (Q5_0, Q4_K, Q6_K, Q8_0) exported for CUDA with its blocks,
    composed static."""
    from onnxsample.composer import compose

    result = real_gguf_gpu_export
    assert (result.manifest["layout"], result.manifest["precision"]) == ("gqa", "gguf")
    static = _composed(
        compose,
        result.output,
        result.output / "composed-static.onnx",
        dict(static=True, **CHAIN_OPTIONS),
    )
    return {"folder": result.output, "static": static}


def test_every_block_type_runs_on_cuda(device, kquant_gpu):
    report = device.probe("placement", kquant_gpu["static"])
    assert report["providers"][0] == "CUDAExecutionProvider"
    assert report["compute_off_cuda"] == [], report["compute_off_cuda"]
    assert report["unknown"] == []
    assert shape_nodes_off_cuda(report) == STATIC_SHAPE_NODES
    assert report["memcpy"] == [], report["memcpy"]


def test_the_engine_decodes_a_k_quant_file_on_cuda(device, kquant_gpu):
    report = device.probe(
        "engine", kquant_gpu["static"], "whole", "--tokenizer", kquant_gpu["folder"]
    )
    assert report["device"] == "cuda"
    assert report["failure"] is None
    assert "Error" not in report["stderr"], report["stderr"][-2000:]
    assert report["tokens"] == 10 and report["finish"] == "length"
