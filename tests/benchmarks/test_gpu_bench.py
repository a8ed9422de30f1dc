"""benchmarks/gpu.py on the CPU: its report on the tiny GQA export (the CUDA-graph engine skipped),
the host sampler's filters, and the plain decode loop against the engine (greedy, token for token)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def test_the_report_has_every_engine_and_ratio(bench, tiny_gqa_export, tmp_path: Path) -> None:
    gpu = bench("gpu")
    out = tmp_path / "gpu.json"
    model = str(tiny_gqa_export.output)
    small = ["--batch", "1,2", "--new-tokens", "4", "--repeats", "1"]
    gpu.main(["--provider", "cpu", "--model", model, *small, "--output", str(out)])
    report = json.loads(out.read_text())
    assert report["benchmark"] == "gpu-decode" and report["device"] == "cpu"
    assert {"onnxsample", "onnxruntime", "numpy"} <= set(report["versions"])
    assert len(report["load_average"]) == 2 and report["settings"]["max_slots"] == 2
    assert report["settings"]["prompt_tokens"] > 20
    for name in ("static-cuda-graph", "static-cuda-graph-greedy"):
        assert "cuda" in report["skipped"][name]
    assert set(report["results"]) == {"batch=1", "batch=2"}
    for batch, table in report["results"].items():
        b = int(batch.split("=")[1])
        assert list(table) == [
            "branching", "static-cuda-graph", "static-cuda-graph-greedy", "plain-host-sampling",
            "transformers",
        ]  # fmt: skip
        assert (
            set(table["static-cuda-graph"]) == set(table["static-cuda-graph-greedy"]) == {"skipped"}
        )
        assert table["transformers"] == {"skipped": "no --transformers"}
        assert "vs_branching" not in table["branching"]
        for name in ("branching", "plain-host-sampling"):
            row = table[name]
            assert row["decoded_tokens"] == 3 * b and row["decode_steps"] >= 3
            for key in ("decode_tokens_per_s", "ms_per_step", "ttft_ms"):
                assert row[key]["n"] == 1 and 0 < row[key]["min"] <= row[key]["max"]
        ratios = table["plain-host-sampling"]["vs_branching"]
        assert set(ratios) == {"decode_tokens_per_s", "ms_per_step", "ttft_ms"}
        assert all(v > 0 for v in ratios.values())


def test_transformers_decodes_the_gguf_it_is_given(bench) -> None:
    """The transformers peer: the embedded GGUF de-quantised by transformers, B rows decoding
    exactly the tokens asked for (EOS suppressed), timed as generate(N) less generate(1)."""
    from onnxsample.exporters.embedded import embedded_gguf

    peer = bench("gpu_engines").Transformers(embedded_gguf(), "cpu")
    row = peer.run([1, 504, 3458, 282], batch=2, new_tokens=3, seed=0)
    assert row["decoded_tokens"] == 4 and row["decode_steps"] == 2
    assert row["decode_tokens_per_s"] > 0 and row["ttft_ms"] > 0
    assert "cpu" in peer.device and "float32" in peer.device


def test_host_sampling_keeps_to_its_filters(bench) -> None:
    engines = bench("gpu_engines")
    rng = np.random.default_rng(0)
    logits = np.full((3, 1000), -10.0, np.float32)
    logits[0, 7] = 10.0  # one token holds nearly all the mass: top-p and min-p keep it alone
    logits[1, :50] = np.linspace(0, 1, 50)  # 50 close scores: top-k keeps the best 40
    # 20 tokens at 1/30 of token 3's probability: 40% of the mass, so top-p keeps them all, but
    # each is under min-p (0.05 of the best)
    logits[2, 3] = 5.0
    logits[2, 10:30] = 5.0 - 0.8 * np.log(30)
    drawn = np.stack([engines.host_sample(logits, rng) for _ in range(200)])
    assert (drawn[:, 0] == 7).all() and (drawn[:, 2] == 3).all()
    assert drawn[:, 1].min() >= 10 and drawn[:, 1].max() <= 49
    assert len(set(drawn[:, 1])) > 20


def test_the_plain_loop_decodes_what_the_engine_decodes(bench, tiny_gqa_export, monkeypatch):
    """top-k 1 in the host sampler is greedy: the plain loop's tokens are the engine's."""
    import onnxsample as osx

    gpu = bench("gpu")
    folder = tiny_gqa_export.output
    composed = gpu.compose_cached(
        folder, folder / "composed-bench-branching-s2.onnx", None, max_slots=2, **gpu.COMPOSE
    )
    with osx.Engine(composed, provider="cpu", threads=1) as engine:
        ids = engine.tokenizer.encode("The weather in the mountains")
        greedy = osx.SamplingParams(temperature=0, ignore_eos=True)
        want = [engine.submit(ids, greedy, max_new_tokens=8).result().token_ids for _ in range(2)]
    plain = bench("gpu_engines").PlainHost(folder, "cpu")
    monkeypatch.setitem(gpu.SAMPLED, "top_k", 1)
    plain.run(ids, 2, 8, seed=0)
    assert plain.generated.tolist() == [list(t) for t in want]


def test_the_sampler_alone_is_built_then_timed_with_its_profile(bench, tmp_path: Path) -> None:
    """benchmarks/gpu_sampler.py: `build` writes what `run` needs, `run` times both chains and sums
    the profiler's node times (on the CPU here, so without the CUDA-graph replay)."""
    sampler = bench("gpu_sampler")
    folder, out = tmp_path / "models", tmp_path / "gpu_sampler.json"
    sampler.main(["build", str(folder), "--slots", "2,3", "--vocab", "1000"])
    assert sorted(p.name for p in folder.glob("*.onnx")) == [
        "branching-s2.onnx",
        "branching-s3.onnx",
        "static-s2.onnx",
        "static-s3.onnx",
    ]
    run = ["run", str(folder), "--provider", "cpu", "--calls", "2", "--profile-calls", "1"]
    sampler.main([*run, "--output", str(out)])
    report = json.loads(out.read_text())
    assert report["settings"] == {"slots": [2, 3], "vocab": 1000}
    assert set(report["results"]) == {"branching-s2", "static-s2", "branching-s3", "static-s3"}
    for row in report["results"].values():
        assert 0 < row["min_ms"] <= row["ms_per_call"] and "cuda_graph_ms_per_call" not in row
        assert row["ms_per_call_by_op"] and all(v >= 0 for v in row["ms_per_call_by_op"].values())
        assert row["ms_per_call_by_node"]


def test_llama_cpp_runs_beside_on_the_same_gguf(
    bench, llama_cpp, embedded_gqa_exports, tmp_path: Path
) -> None:
    """With --llama-batched-bench, llama.cpp decodes the GGUF the export came from at each batch
    size, and every engine of ours gets its ratio (here on the CPU build)."""
    gpu = bench("gpu")
    out = tmp_path / "gpu.json"
    model = str(embedded_gqa_exports["gguf-a4"].output)
    peer = str(llama_cpp.tool("llama-batched-bench"))
    small = ["--batch", "1,2", "--new-tokens", "4", "--repeats", "1", "--threads", "2"]
    gpu.main(["--provider", "cpu", "--model", model, *small, "--llama-batched-bench", peer,
              "--output", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    assert report["settings"]["gguf"].endswith(".gguf") and "llama.cpp" not in report["skipped"]
    for table in report["results"].values():
        theirs = table["llama.cpp"]
        assert set(theirs) == {"decode_tokens_per_s", "ms_per_step", "prompt_tokens_per_s"}
        assert theirs["decode_tokens_per_s"]["n"] == 1 and theirs["ms_per_step"]["min"] > 0
        for name in ("branching", "plain-host-sampling"):
            assert table[name]["vs_llama_cpp"] > 0


def test_the_kernel_report_runs_its_steps_and_buckets(bench, tiny_gqa_export, tmp_path) -> None:
    """benchmarks/gpu_kernels.py on the CPU: the uncaptured engines' per-step rows (no kernels to
    record here) and the row buckets' greedy tokens, the same as alone on the CPU."""
    kernels = bench("gpu_kernels")
    out = tmp_path / "gpu_kernels.json"
    model = str(tiny_gqa_export.output)
    kernels.main(["--provider", "cpu", "--model", model, "--max-slots", "2", "--batch", "1,2",
                  "--output", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    assert report["benchmark"] == "gpu-kernels" and report["device"] == "cpu"
    assert set(report["steps"]) == {"batch=1", "batch=2"}
    for table in report["steps"].values():
        assert set(table) == {"branching", "plain-host-sampling"}
        for row in table.values():
            assert row["steps"] == 64 and row["wall_ms_per_step"] > 0
            assert row["kernels_per_step"] == 0 and row["top_kernels"] == []
    assert set(report["buckets"]) == {"uncaptured"}
    for bucket in report["buckets"]["uncaptured"].values():
        assert bucket == {"same_as_alone": 8, "sequences": 8, "first_difference_at": []}


def test_the_topk_forms_select_the_same_values(bench, tmp_path) -> None:
    """benchmarks/gpu_topk.py: every staged form selects the row's k largest values, as one TopK
    does (here on the CPU, including a row that is no multiple of the slices), and the report
    has a time for each form that fits the row."""
    import onnxruntime as ort

    topk = bench("gpu_topk")
    x = np.random.default_rng(0).standard_normal((2, 9000)).astype(np.float32)
    x[:, ::7] = 1.0  # ties
    for name, stages in topk.FORMS.items():
        if stages[-1][1] > x.shape[1]:
            continue
        blob, last = topk.model(2, x.shape[1], stages)
        session = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
        got = session.run([last], {"x": x})[0]
        np.testing.assert_array_equal(got, -np.sort(-x, axis=1)[:, : stages[-1][1]], name)
    out = tmp_path / "gpu_topk.json"
    topk.main(["--provider", "cpu", "--vocab", "9000", "--slots", "1", "--calls", "2",
               "--output", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    assert report["benchmark"] == "gpu-topk" and report["provider"] == "cpu"
    fits = [n for n, s in topk.FORMS.items() if s[-1][1] <= 9000]
    assert set(report["results"]) == {f"V9000 S1 {n}" for n in fits}
    assert all(row["us_wall"] > 0 for row in report["results"].values())
