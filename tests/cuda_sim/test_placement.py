"""Where ONNX Runtime's CUDA provider puts the composed GPU export, what it copies between host and
device, and whether it accepts the decode step for CUDA-graph capture (simulated device)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.cuda_sim

# What the GQA graph computes on the CPU by design: the mask's width, read from its shape, is
# GroupQueryAttention's `total_sequence_length`, an input the CUDA kernel takes in host memory.
STATIC_SHAPE_NODES = [["Cast", "total_sequence_length"], ["Gather", "mask_width"]]


def shape_nodes_off_cuda(report: dict) -> list[list[str]]:
    """A static chain's nodes off CUDA, less the `Concat`s that join its row count (the symbolic
    `slots`, read from a shape) into a `Reshape`'s target: every size it reads from the
    vocabulary or the candidates is folded at compose time."""
    return [[op, name] for op, name in report["off_cuda"] if op != "Concat"]


@pytest.mark.parametrize("variant", ["static", "branching", "static-greedy", "branching-greedy"])
def test_every_compute_node_runs_on_cuda(device, gpu_models, variant):
    """Off CUDA there is only shape arithmetic: nodes computed from tensor shapes and constants,
    which ORT keeps on the CPU by design."""
    report = device.probe("placement", gpu_models[variant])
    assert report["providers"][0] == "CUDAExecutionProvider"
    assert report["compute_off_cuda"] == [], report["compute_off_cuda"]
    assert report["unknown"] == []  # every node ORT placed is in the graph it optimised
    if variant.startswith("static"):
        assert shape_nodes_off_cuda(report) == STATIC_SHAPE_NODES
        assert report["memcpy"] == [], report["memcpy"]
        assert report["control_flow"] == []


def test_the_branching_chain_syncs_with_the_host(device, gpu_models):
    """What the static chain removes: the branching chain reads its If conditions back from the
    device (a copy and a stream sync each) and selects slots with NonZero."""
    report = device.probe("placement", gpu_models["branching"])
    to_host = [copy for copy in report["memcpy"] if copy[0] == "MemcpyToHost"]
    assert to_host and all("If" in copy[2:] for copy in to_host), report["memcpy"]
    assert "If" in report["control_flow"] and "NonZero" in report["control_flow"]


def test_a_cpu_shaped_export_runs_attention_on_the_cpu(device, gpu_models):
    """The reason for `export --device cuda`: CUDA's GroupQueryAttention takes fp16/bf16 only."""
    report = device.probe("placement", gpu_models["cpu-shaped"])
    off = {op for op, _ in report["compute_off_cuda"]}
    assert "GroupQueryAttention" in off, report["compute_off_cuda"]
    assert report["memcpy"], "host copies around the CPU attention"


@pytest.mark.parametrize(
    ("variant", "accepted"),
    [("static", True), ("static-greedy", True), ("branching", False)],
)
def test_cuda_graph_capture_accepted_at_session_creation(device, gpu_models, variant, accepted):
    report = device.probe("placement", gpu_models[variant], "--cuda-graph")
    assert report["created"] is accepted, report
    if not accepted:
        assert "control flow" in report["error"]
