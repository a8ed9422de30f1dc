"""How many kernels a decode step of the embedded model launches on the simulated CUDA device:
libcudart's kernel launches plus the cuBLAS / cuBLASLt / cuDNN calls (each at least one kernel on
a real device), per step of one running request, uncaptured. A captured graph replays the same
kernels, and each costs a few microseconds of device time even inside a graph, so these counts
are what a small model's step costs on a GPU. Deterministic: pinned here so they cannot creep back.

Beside the count, the thread blocks the launched kernels' grids ask for (``blocks``) say how much
work they are: a static chain binds only the rows of the occupied slots, so one running request
asks the same of the device whichever number of slots was composed.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.cuda_sim, pytest.mark.integration]

# (export fixture, chain, slots composed, kernels a step at most). The GPU export's default fp16
# weights take one GEMM a projection; its Q4_1 blocks (--precision gguf) take MatMulNBits, a block
# sum, a GEMM and an Add. The static sampled chain sorts no whole row (it was 672 and 1568 kernels
# when two TopK over the vocabulary, sorted one row at a time, stood in its top-k, top-p and
# typical-p): it costs the same whatever the slots composed. Its two wide selections take two
# TopK each, over slices of the row and then over the slices' candidates (TopKSliced: 6 kernels
# more for the two, and on an H200 about 100 and 220 µs less). It was 518: top-p's candidate
# weights are now the leading ones of its wide weights (4 fewer), the draw no longer truncates
# typical-p's row again (2) and typical-p's key takes two negations less (2). Then 510: each
# inverse-CDF search counts one prefix (3 searches, 2 each), top-p gathers its wide weights from
# the row's (4), the candidates go back to id order without a negation (1), top-k's flag needs
# no test of `off` (2), and the folding drops Or(x, false) and Not(Not(x)) (4). Then 462: the
# static chain draws once, from the row cut at the floor (the candidates' draw adds the same
# weights in the same order, so the branching chain's tokens are the same either way: 31 fewer).
# Then 447: the greedy token is the argmax the row maximum is read at (1; a greedy chain reads
# the sanitised row's, 4), SelectGreedy's and the temperature's comparisons merge (1), top-p
# reads its last candidate from the wide ones (1), the penalties take one selection (2) and
# count > 0 as one cast (1), the flags of top-p and typical-p compare with −inf for off (2),
# the logprob gathers the shifted row and takes max(Σ, 1) with the lanes (2), the draw's search
# is one comparison (1) and its id one lookup (3), top-k's bounds one Clip (1), the counts' rows
# one cast (1). The greedy chain went from 329 to 323: its argmax and finite-rows pass (4) and
# the logprob (2). Then 436: the logprob is one LogSoftmax and a gather (7; 6 in the greedy
# chain, 317), typical-p's entropy reads a dropped token's log p as −FLT_MAX instead of testing
# p log p for NaN (1), top-k reads its floor from the wide logits between two −inf (2), and the
# draw counts its position as an integer (1). Then 400: a slot with typical-p on is drawn on the
# host (its set follows the row's entropy, not the logits: sorting every row by that key took 32
# kernels, typical-p or not, where its flag takes 2: 30), the draw reads the weights exp(z − max z) top-p computed instead of
# cutting the row and finding its maximum again (4), and top-k flags k > W alone, the engine
# packing a k ≥ V as 0 (2).
BUDGETS = [
    ("embedded_gpu_export", "", 8, 317),  # measured 317
    ("embedded_gpu_export", "", 64, 317),
    ("embedded_gpu_blocks_export", "", 8, 681),  # 681
    ("embedded_gpu_export", None, 8, 400),  # 400
    ("embedded_gpu_export", None, 64, 400),  # 400
]


@pytest.fixture(scope="module")
def counted(device, request, tmp_path_factory):
    """Kernels per decode step of one request, by (export fixture, chain, slots)."""
    from onnxsample.composer import compose

    found: dict[tuple, dict] = {}

    def count(fixture: str, chain: str | None, slots: int) -> dict:
        key = (fixture, chain, slots)
        if key not in found:
            folder = request.getfixturevalue(fixture).output
            target = tmp_path_factory.mktemp("kernels") / "static.onnx"
            model = compose(folder, chain, target, static=True, max_slots=slots)
            report = device.probe("engine", model, "copies", "--tokenizer", folder)
            assert report["failure"] is None
            found[key] = report["kernels_per_step"]
        return found[key]

    return count


@pytest.mark.parametrize(("fixture", "chain", "slots", "budget"), BUDGETS)
def test_a_decode_step_launches_at_most_its_budget(counted, fixture, chain, slots, budget):
    kernels = counted(fixture, chain, slots)
    assert kernels["launches"] + kernels["library"] <= budget, kernels


@pytest.mark.parametrize("chain", ["", None], ids=["greedy", "sampled"])
def test_a_step_costs_the_same_whatever_the_slots_composed(counted, chain):
    """Greedy (the chain is an ArgMax) and the default sampled chain (no whole-row sort): one
    running request asks the same of the device with 8 or 64 slots composed: the same kernels
    and the same blocks (bound to all S rows, the sampled step asked for 21,150 blocks with 8
    slots and 163,061 with 64, before the one draw; bound to the one occupied row, about 16,300
    with either)."""
    assert counted("embedded_gpu_export", chain, 8) == counted("embedded_gpu_export", chain, 64)


def test_the_sampler_calls_no_library_routine_and_copies_little(counted):
    """The sampled chain adds kernels of ONNX Runtime's own to the greedy step, and no cuBLAS or
    cuDNN call: its row maxima are the values at ``ArgMax`` (``RowMaxStatic``), where cuDNN's
    ``ReduceMax`` took 15 µs a launch on an H200 (``benchmarks/results/gpu_kernels.json``). And
    it copies on the device 3 times a step more than the greedy step: the composer drops the
    pads and slices that the known vocabulary makes no-ops (7 more copies a step before)."""
    greedy = counted("embedded_gpu_export", "", 8)
    sampled = counted("embedded_gpu_export", None, 8)
    assert sampled["library"] == greedy["library"], (greedy, sampled)
    assert sampled["d2d"] <= greedy["d2d"] + 3, (greedy, sampled)


def test_fp16_weights_halve_the_kernels_of_the_blocks(counted):
    fp16 = counted("embedded_gpu_export", "", 8)
    blocks = counted("embedded_gpu_blocks_export", "", 8)
    assert 2 * (fp16["launches"] + fp16["library"]) <= blocks["launches"] + blocks["library"]
