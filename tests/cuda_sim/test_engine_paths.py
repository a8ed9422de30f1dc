"""Every engine path on the CUDA provider (simulated device): no ONNX Runtime error, the copies a
decode step makes, buffers that stay where they are, and decode steps captured and replayed as
CUDA graphs. Token values are not checked here: the simulated device computes nothing (every token
reads back as 0); tests/engine/test_cuda_graph.py checks the same calls' tokens on the CPU."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.cuda_sim

SCENARIOS = [
    ("whole", "static"),
    ("whole", "branching"),
    ("chunked", "static"),
    ("chunked", "branching"),
    ("prompt-logprobs", "static"),
    ("prompt-logprobs", "branching"),
    ("penalties", "static"),
    ("penalties", "branching"),
    ("greedy", "static-greedy"),
    ("greedy", "branching-greedy"),
    ("speculative", "branching"),
    ("batch-cancel", "static"),
    ("batch-cancel", "branching"),
    ("constrained", "static"),
    ("constrained", "branching"),
]


@pytest.mark.parametrize(("scenario", "variant"), SCENARIOS)
def test_engine_path_runs(device, gpu_models, scenario, variant):
    report = device.probe(
        "engine", gpu_models[variant], scenario, "--tokenizer", gpu_models["folder"]
    )
    assert report["device"] == "cuda"
    assert report["failure"] is None
    assert "Error" not in report["stderr"], report["stderr"][-2000:]
    if scenario == "batch-cancel":
        assert report["finish"][1] == "cancelled" and report["finish"][0] == "length"
    else:
        assert report["tokens"] == 10 and report["finish"] == "length"
    if scenario == "chunked":
        assert report["prefill_calls"] >= 4  # 20 prompt tokens in chunks of 6
    if scenario == "prompt-logprobs":
        assert report["prompt_logprobs"] == 20
    if scenario == "speculative":
        assert report["drafted"] > 0, "no draft was verified"


@pytest.mark.parametrize("variant", ["static", "branching"])
def test_a_decode_step_copies_only_what_the_host_needs(device, gpu_models, variant):
    """Per decode step the host writes input_ids, attention_mask, row_index and the uniforms and
    reads next_token and the logprobs; the KV buffers, penalty counts and parameters stay on the
    device, at the same addresses from step to step."""
    report = device.probe(
        "engine", gpu_models[variant], "copies", "--tokenizer", gpu_models["folder"]
    )
    assert report["buffers_kept"]
    per_step = report["per_step"]
    if variant == "static":
        assert per_step == {"h2d": 4, "d2h": len(report["host_outputs"])}, report
    else:  # the If conditions come back, and shapes go out to device ops
        assert per_step["h2d"] > 4 and per_step["d2h"] > len(report["host_outputs"]), report


def test_decode_steps_are_captured_and_replayed(device, gpu_models):
    """A CUDA-graph engine: the session accepts capture, the first decode steps warm up and capture
    (one graph: the penalty counts are read and written in one buffer), every later one is a
    replay; prefill runs uncaptured."""
    report = device.probe(
        "engine",
        gpu_models["static"],
        "copies",
        "--cuda-graph",
        "--tokenizer",
        gpu_models["folder"],
    )
    counts = report["counters"]
    assert counts["capture_errors"] == 0
    assert counts["captures"] == 1  # one buffer for the counts: no graph per parity
    assert counts["graph_launches"] >= report["decode_steps"] - 4
    assert report["buffers_kept"]
    assert report["per_step"] == {"h2d": 4, "d2h": len(report["host_outputs"])}


def test_a_graph_per_bucket_of_occupied_rows(device, gpu_models):
    """Requests of 60, 16 and 8 tokens in slots 0, 1 and 2: the decode steps bind 4 rows, then
    2, then 1, one graph per bucket, each captured once; every other step replays one."""
    report = device.probe(
        "engine",
        gpu_models["static"],
        "buckets",
        "--cuda-graph",
        "--tokenizer",
        gpu_models["folder"],
    )
    assert report["failure"] is None
    assert report["tokens"] == [60, 16, 8]
    assert report["buckets"] == [1, 2, 4] and report["graphs"] == 3, report
    counts = report["counters"]
    assert counts["capture_errors"] == 0 and counts["captures"] == 3, report
    assert counts["graph_launches"] >= report["decode_steps"] - 2 * 3, report


def test_a_sequence_moves_down_on_the_device(device, gpu_models):
    """Requests of 3, 10 and 40 tokens in slots 0, 1 and 2: when the first ends, the third moves
    to slot 0 (its KV rows and penalty counts copied on the device by ONNX Runtime's own
    Identity kernel), so the steps bind 2 rows, then 1: a graph each."""
    report = device.probe(
        "engine",
        gpu_models["static"],
        "compact",
        "--cuda-graph",
        "--tokenizer",
        gpu_models["folder"],
    )
    assert report["failure"] is None
    assert report["tokens"] == [3, 10, 40] and report["moved"] == 1, report
    assert report["buckets"] == [1, 2, 4], report
    assert report["counters"]["capture_errors"] == 0, report


@pytest.mark.integration
@pytest.mark.parametrize("cuda_graph", [False, True], ids=["uncaptured", "cuda-graph"])
def test_kv_buffers_grow_and_shrink_under_a_running_request(
    device, embedded_gpu_export, tmp_path_factory, cuda_graph
):
    """On the embedded model (8,192 positions): a request that reserves 2,000 arrives while
    another decodes; the KV buffers are replaced (with CUDA graphs: a new decode bucket, captured
    anew) and shrink back once it has gone; the running request never notices."""
    from onnxsample.composer import compose

    folder = embedded_gpu_export.output
    model = compose(
        folder, None, tmp_path_factory.mktemp("grow") / "static.onnx", static=True, max_slots=4
    )
    flags = ["--cuda-graph"] if cuda_graph else []
    report = device.probe("engine", model, "grow", *flags, "--tokenizer", folder)
    assert report["failure"] is None
    assert report["tokens"] == 200 and report["finish"] == "length"
    small, grown, after = report["lengths"]
    assert small == after == 512 and grown > 2000
    if cuda_graph:
        assert report["counters"]["capture_errors"] == 0, report
        assert report["counters"]["captures"] >= 2  # before and after the growth


@pytest.mark.parametrize(
    ("variant", "captures"), [("static", 1), ("branching", 0), ("cpu-shaped-static", 0)]
)
def test_the_engine_captures_by_default_where_it_can(device, gpu_models, variant, captures):
    """Engine(provider="cuda") left to its default replays a static chain's decode steps, and runs
    uncaptured, without an error, a branching chain and an export whose fp32 attention stays on
    the CPU (which capture would refuse)."""
    report = device.probe(
        "engine", gpu_models[variant], "copies", "--default-graph", "--tokenizer",
        gpu_models["folder"],
    )  # fmt: skip
    assert report["failure"] is None
    assert report["counters"]["captures"] == captures
    assert (report["counters"]["graph_launches"] > 0) == (captures > 0)


def test_cuda_graph_needs_a_static_chain(device, gpu_models):
    report = device.probe(
        "engine",
        gpu_models["branching"],
        "whole",
        "--cuda-graph",
        "--tokenizer",
        gpu_models["folder"],
        expect_ok=False,
    )
    assert "InvalidParameter: cuda_graph needs a static sampler chain" in report["error"]


def test_a_cpu_shaped_export_gets_one_warning(device, gpu_models):
    report = device.probe("engine", gpu_models["cpu-shaped"], "whole")
    warnings = [line for line in report["stderr"].splitlines() if "export --device cuda" in line]
    assert len(warnings) == 1, report["stderr"][-2000:]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], "composed-static.onnx"),  # CUDA graphs by default
        (["--cuda-graph"], "composed-static.onnx"),
        (["--speculative", "ngram"], "composed.onnx"),  # verifies drafts: the branching chain
        (["--no-cuda-graph"], "composed.onnx"),
    ],
    ids=["default", "cuda-graph", "speculative", "branching"],
)
def test_run_provider_cuda_prints_only_its_json(device, tiny_gpu_export, tmp_path, flags, expected):
    """`onnxsample run FOLDER --provider cuda --json` composes for the GPU by itself (a static
    chain replayed as CUDA graphs unless told otherwise); stdout holds the JSON lines only
    (nothing from preload_dlls) and stderr no ONNX Runtime warning."""
    import json
    import shutil
    import subprocess

    folder = tmp_path / "export"
    shutil.copytree(tiny_gpu_export.output, folder, ignore=shutil.ignore_patterns("composed*"))
    cli = device.python.parent / "onnxsample"
    command = [str(cli), "run", str(folder), "--provider", "cuda", "-p", "hi", "-n", "4", "--json"]
    proc = subprocess.run(
        [*command, *flags], capture_output=True, text=True, env=device.env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = proc.stdout.splitlines()
    assert json.loads(line)["finish_reason"] == "length"
    assert "W:onnxruntime" not in proc.stderr and "warning" not in proc.stderr.lower()
    assert "cuda," in proc.stderr.splitlines()[-1]
    assert sorted(p.name for p in folder.glob("composed*.onnx")) == [expected]


@pytest.mark.parametrize("scenario", ["fallback", "fallback-gap"])
def test_the_host_fallback_moves_only_the_flagged_rows(device, gpu_models, scenario):
    """A static chain's flagged slot brings back its own row of the logits and of the penalty
    counts, and a redrawn token's count moves in that row alone: per redrawn token V floats and
    V counts to the host, and a count row each way per move; never the [S, V] buffers, nor the
    rows of an unflagged slot between flagged ones (``fallback-gap``: slots 0 and 2 of 0-2)."""
    report = device.probe(
        "engine",
        gpu_models["static"],
        scenario,
        "--cuda-graph",
        "--tokenizer",
        gpu_models["folder"],
    )
    assert report["failure"] is None
    assert report["penalties"] and report["redrawn"] >= 12, report
    if scenario == "fallback-gap":
        assert report["gaps"] > 0, report  # calls with slot 1 between flagged slots
    row = 4 * report["vocab"]  # float32 logits, int32 counts
    assert report["extra_bytes"] == {
        "d2h": report["redrawn"] * 2 * row + report["moved"] * row,
        "h2d": report["moved"] * row,
    }, report


def test_a_constrained_request_writes_its_own_mask_row(device, gpu_models):
    """Each call of a constrained request writes its own row of ``sampler.allowed`` (V bools),
    and the next request's first call resets that row: a constrained request of n tokens sends
    n - 1 rows more than a plain one after it, never the [S, V] mask."""
    report = device.probe(
        "engine",
        gpu_models["static"],
        "mask-copies",
        "--cuda-graph",
        "--tokenizer",
        gpu_models["folder"],
    )
    assert report["failure"] is None
    tokens = report["constrained_tokens"]
    assert tokens == report["plain_tokens"] == 10, report
    sent = report["h2d"]
    assert sent["constrained"] - sent["plain"] == (tokens - 1) * report["vocab"], report
