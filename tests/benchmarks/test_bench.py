"""The benchmark plumbing: the report generator, e2e's aggregation, and `onnxsample bench`'s front.

No timing is asserted anywhere: the numbers here are synthetic.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from onnxsample.cli import main

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _module(name: str):
    """Load a benchmark script as a module, leaving sys.path as it was (the scripts extend it)."""
    saved = list(sys.path)
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = saved


def _stat(value: float) -> dict:
    return {"median": value, "min": value * 0.9, "max": value * 1.1, "n": 3}


def _score(value: float, delta: float) -> dict:
    return {"mean_logprob": value, "delta_vs_fp32": delta, "scored_on": "/x/model.onnx"}


MACHINE = {"cpu": "Test CPU", "cpus": 2, "memory_gb": 24, "platform": "Linux", "python": "3.11"}


ENGINE_TPS = (
    ("onnxsample", 20.0),
    ("onnxsample-gguf-a4", 40.0),
    ("onnxsample-gguf-a0", 24.0),
    ("genai", 25.0),
    ("optimum", 10.0),
    ("llamacpp", 32.0),
)


def _e2e() -> dict:
    results = []
    for engine, tps in ENGINE_TPS:
        for batch in (1, 8):
            if engine == "llamacpp" and batch == 8:
                continue
            results.append(
                {
                    "engine": engine,
                    "threads": 1,
                    "batch": batch,
                    "mode": "sampled",
                    "prompt_tokens": 50,
                    "tokens_per_sequence": [128],
                    "decode_tokens_per_s": _stat(tps * batch),
                    "prefill_tokens_per_s": _stat(400.0),
                    "ttft_ms": _stat(120.0),
                    "peak_rss_mb": 1234.0,
                }
            )
    return {
        "benchmark": "e2e",
        "created": "2026-11-22T05:00:00+00:00",
        "machine": MACHINE,
        "load_average_before": [0.3, 0.4, 0.5],
        "load_average_after": [1.0, 0.6, 0.5],
        "settings": {
            "message": "Hello",
            "prompt_tokens": 50,
            "new_tokens": 128,
            "batch": [1, 8],
            "batch_composition": "same prompt",
            "threads": [1],
            "modes": ["sampled"],
            "sampled": "t 0.8",
            "eos": "suppressed",
            "repeats": 3,
            "warmup_tokens": 8,
            "order": "alternated",
            "note": "",
        },
        "quality": {
            "method": "mean log-probability of the reference's greedy tokens",
            "reference": "onnxsample-gqa-fp32",
            "reference_model": "/x/gqa-fp32/model.onnx",
            "tokens": [1] * 64,
            "reference_logprob": -0.5,
        },
        "engines": {
            "onnxsample": {
                "status": "ok",
                "versions": {"onnxruntime": "1.31.1"},
                "quality": _score(-0.501, -0.001),
            },
            "onnxsample-gguf-a4": {
                "status": "ok",
                "versions": {},
                "export": {"layout": "gqa", "precision": "gguf", "accuracy_level": 4},
                "quality": _score(-0.55, -0.05),
            },
            "onnxsample-gguf-a0": {
                "status": "ok",
                "versions": {},
                "quality": _score(-0.52, -0.02),
                "unavailable": {"8": "boom"},
            },
            "onnxsample-gqa-fp32": {"status": "skipped", "reason": "export failed: disk full"},
            "genai": {"status": "ok", "versions": {"onnxruntime-genai": "0.18.0"}},
            "optimum": {"status": "ok", "versions": {}, "use_io_binding": False},
            "llamacpp": {"status": "ok", "versions": {}, "quality": _score(-0.53, -0.03)},
            "transformers": {"status": "skipped", "reason": "torch is not installed"},
        },
        "results": results,
        "runs": [],
    }


def _overhead() -> dict:
    step = {
        "graph_full": 40.0,
        "graph_greedy": 39.8,
        "plain_forward": 39.5,
        "plain_host_full": 40.5,
        "host_sampling_full": 1.0,
        "host_sampling_greedy": 0.03,
        "sampler_alone_full": 0.2,
        "graph_run_8_slots": 45.0,
    }
    share = {
        "in_graph_sampler_alone": 0.005,
        "in_graph_vs_greedy": 0.005,
        "in_graph_vs_plain_forward": 0.0125,
        "host_numpy": 0.0247,
    }
    return {
        "benchmark": "sampling_overhead",
        "created": "2026-11-22T05:10:00+00:00",
        "machine": MACHINE,
        "load_average_before": [0.3, 0.4, 0.5],
        "load_average_after": [0.9, 0.6, 0.5],
        "settings": {
            "prompt_tokens": 64,
            "steps": 32,
            "skipped_steps": 2,
            "repeats": 3,
            "chain": "full",
            "graph_full": "slots = batch",
            "graph_run": "8 slots",
            "host": "numpy",
        },
        "results": [{"batch": 1, "threads": 1, "step_ms": step, "share": share}],
    }


def test_report_writes_markdown_and_chart(tmp_path: Path) -> None:
    report = _module("report")
    (tmp_path / "e2e.json").write_text(json.dumps(_e2e()))
    (tmp_path / "so.json").write_text(json.dumps(_overhead()))
    md, png = tmp_path / "docs" / "benchmarks.md", tmp_path / "docs" / "benchmarks.png"
    report.main(
        [
            "--e2e",
            str(tmp_path / "e2e.json"),
            "--sampling",
            str(tmp_path / "so.json"),
            "--md",
            str(md),
            "--png",
            str(png),
        ]
    )
    text = md.read_text()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![decode tokens/s and sampling share](benchmarks.png)" in text
    assert "Test CPU" in text and "0.3/0.4/0.5" in text
    # onnxsample / genai = 20/25, onnxsample / optimum = 20/10
    assert "| 1 | 1 | sampled | 0.80× ❌ | 2.00× ✅ |" in text
    assert "| 1 | 8 | sampled | genai | 200.0 (180.0–220.0) | 1.25× | — | — |" in text
    assert "**skipped** — torch is not installed" in text
    assert "onnxsample fp32-gqa: **skipped** — export failed: disk full" in text
    assert "0.50% of a decode step ✅" in text


def test_report_renders_variants_quality_and_llamacpp_target() -> None:
    report = _module("report")
    text = report.render(_e2e(), None, None)
    # the main table: vs onnxsample (20), vs llama.cpp (32), quality with its delta
    assert (
        "| 1 | 1 | sampled | onnxsample-gguf-a4 | 40.0 (36.0–44.0) | 2.00× | 1.25× "
        "| -0.550 (-0.050) |" in text
    )
    assert "| 1 | 8 | sampled | onnxsample-gguf-a4 | 320.0 (288.0–352.0) | 2.00× | — |" in text
    assert "| onnxsample-gguf-a0 | -0.5200 | -0.0200 | /x/model.onnx |" in text
    assert "scoring -0.5000 itself" in text
    assert "export gqa/gguf accuracy 4" in text and "not run at batch 8: boom" in text
    # the target at batch 1: >= llama.cpp's decode, |quality delta| <= 0.03
    assert "| 1 | sampled | onnxsample-gguf-a4 | 40.0 | 1.25× | -0.0500 | ❌ quality |" in text
    assert "| 1 | sampled | onnxsample-gguf-a0 | 24.0 | 0.75× | -0.0200 | ❌ slower |" in text
    assert "| 1 | sampled | onnxsample | 20.0 | 0.62× | -0.0010 | ❌ slower |" in text
    data = _e2e()
    data["engines"]["onnxsample-gguf-a4"]["quality"]["delta_vs_fp32"] = -0.01
    assert "| 1.25× | -0.0100 | ✅ |" in report.render(data, None, None)
    del data["engines"]["onnxsample-gguf-a4"]["quality"]
    assert "| 1.25× | — | ❌ no quality score |" in report.render(data, None, None)


def test_report_reads_old_engine_names(tmp_path: Path) -> None:
    report = _module("report")
    data = _e2e()
    data["results"][0]["engine"] = "onnxsample-gqa"
    data["engines"]["onnxsample-gqa"] = {"status": "ok", "versions": {}}
    del data["quality"]
    text = report.render(report.normalise(data), None, None)
    assert "| 1 | 1 | sampled | onnxsample-genai-graph |" in text
    assert "onnxsample on genai's builder graph" in text


def test_engine_names_agree_across_the_scripts() -> None:
    e2e, worker, report = _module("e2e"), _module("e2e_worker"), _module("report")
    assert set(e2e.ENGINES) == set(worker.ENGINES) == set(report.ENGINE_LABELS)
    assert set(e2e.ENGINES) == set(importlib.import_module("onnxsample.cli.bench").ENGINES)
    assert set(e2e.ALIASES.values()) <= set(e2e.ENGINES)
    assert report.ALIASES == e2e.ALIASES
    assert set(e2e.VARIANTS) | {e2e.GENAI_GRAPH} == set(report.OURS)
    assert e2e.REFERENCE in e2e.VARIANTS
    assert e2e.VARIANTS[e2e.REFERENCE][1]["precision"] == "fp32"


def test_e2e_engine_flag_takes_variants_and_old_names() -> None:
    e2e = _module("e2e")
    args = e2e.parse_args(
        ["--engines", "onnxsample-gguf-a4, llamacpp,onnxsample-gqa,onnxsample-genai-graph"]
    )
    assert args.engines == ["onnxsample-gguf-a4", "llamacpp", "onnxsample-genai-graph"]
    assert args.quality_tokens == 64 and args.cache.endswith("bench-e2e")
    assert e2e.parse_args([]).engines == list(e2e.ENGINES)
    with pytest.raises(SystemExit, match="--quality-tokens"):
        e2e.parse_args(["--quality-tokens", "-1"])


def test_e2e_scores_each_onnx_file_once(monkeypatch) -> None:
    e2e = _module("e2e")
    verify = importlib.import_module("onnxsample.exporters._verify")
    calls = []

    def fake(path, ids, tokens, threads=None):
        calls.append(Path(path).name)
        if Path(path).name == "bad.onnx":
            raise RuntimeError("no such input\nmore")
        return -0.123456

    monkeypatch.setattr(verify, "mean_logprob", fake)
    models = {
        "onnxsample": {"scored": Path("/a/model.onnx")},
        "optimum": {"scored": Path("/a/model.onnx")},
        "genai": {"scored": Path("/g/bad.onnx")},
        "llamacpp": {"scored": None},
        "__reference__": {"model": Path("/r/model.onnx")},
    }
    scores = e2e.score_onnx(models, [1, 2], [3, 4], 1, lambda _msg: None)
    assert calls == ["model.onnx", "bad.onnx"]
    assert (
        scores["onnxsample"]
        == scores["optimum"]
        == {
            "mean_logprob": -0.1235,
            "scored_on": "/a/model.onnx",
        }
    )
    assert scores["genai"]["mean_logprob"] is None
    assert scores["genai"]["reason"] == "RuntimeError: no such input"
    assert "llamacpp" not in scores
    assert e2e._with_delta(dict(scores["onnxsample"]), -0.1)["delta_vs_fp32"] == -0.0235


def test_worker_log_softmax_matches_the_exporters() -> None:
    import numpy as np

    worker = _module("e2e_worker")
    verify = importlib.import_module("onnxsample.exporters._verify")
    logits = np.random.default_rng(0).normal(size=(5, 11)).astype(np.float32) * 10
    tokens = [0, 3, 10, 3, 7]
    assert worker._mean_logprob(logits, tokens) == pytest.approx(
        verify._mean_logprob(logits.astype(np.float64), tokens)
    )


def test_worker_serves_score_requests(monkeypatch) -> None:
    import io

    worker = _module("e2e_worker")

    class Fake(worker.Engine):
        def run(self, req: dict) -> dict:
            return {"tokens": [req["new_tokens"]], "ttft_s": 0.1, "decode_s": 0.2}

        def score(self, prompt_ids, tokens) -> float:
            return -float(len(prompt_ids) + len(tokens))

    class Unscored(Fake):
        score = worker.Engine.score

    monkeypatch.setitem(worker.ENGINES, "fake", Fake)
    monkeypatch.setitem(worker.ENGINES, "unscored", Unscored)
    requests = [
        {"prompt_ids": [1, 2], "batch": 1, "mode": "greedy", "new_tokens": 4, "seed": 0},
        {"score": {"prompt_ids": [1, 2], "tokens": [3, 4, 5]}},
        {"quit": True},
    ]
    args = worker.argparse.Namespace(threads=1, hf="", gguf="/m.gguf")
    replies = []
    for name in ("fake", "unscored"):
        lines = "".join(json.dumps(r) + "\n" for r in requests)
        monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
        out = io.StringIO()
        worker.serve(name, args, out)
        replies.append([json.loads(line) for line in out.getvalue().splitlines()])
    ready, run, score = replies[0]
    assert ready["ready"] and run["ok"] and run["tokens"] == [4] and run["prompt_tokens"] == 2
    assert score == {"ok": True, "mean_logprob": -5.0, "scored_on": "/m.gguf"}
    assert replies[1][2]["ok"] is False and replies[1][2]["unsupported"] is True


def test_report_without_results(tmp_path: Path) -> None:
    report = _module("report")
    md = tmp_path / "benchmarks.md"
    missing = str(tmp_path / "none.json")
    report.main(["--e2e", missing, "--sampling", missing, "--md", str(md), "--png", "x.png"])
    text = md.read_text()
    assert "run `python benchmarks/e2e.py`" in text and "![" not in text


def test_e2e_aggregates_median_and_spread() -> None:
    e2e = _module("e2e")
    runs = []
    for rep, decode_s in enumerate((2.0, 1.0, 4.0)):
        run = {"engine": "genai", "threads": 1, "batch": 2, "mode": "greedy", "repeat": rep}
        run.update(ok=True, prompt_tokens=10, tokens=[5, 5], ttft_s=0.1, decode_s=decode_s)
        run["peak_rss_mb"] = 100.0 + rep
        runs.append(e2e._derive(run))
    runs.append({"engine": "genai", "ok": False, "error": "boom"})
    (row,) = e2e.aggregate(runs)
    assert row["decode_tokens_per_s"] == {"median": 4.0, "min": 2.0, "max": 8.0, "n": 3}
    assert row["prefill_tokens_per_s"]["median"] == pytest.approx(200.0)
    assert row["peak_rss_mb"] == 102.0 and row["tokens_per_sequence"] == [5]


def _run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_bench_help(capsys) -> None:
    code, out, _ = _run_cli(capsys, "bench", "--help")
    assert code == 0
    assert "--engines" in out and "--new-tokens" in out


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--engines", "onnxsample,vllm", "--engines takes a comma-separated subset"),
        ("--batch", "0", "--batch takes comma-separated integers >= 1"),
        ("--threads", "two", "--threads takes comma-separated integers >= 1"),
        ("--modes", "beam", "--modes takes a comma-separated subset"),
        ("--repeats", "0", "--repeats must be >= 1"),
    ],
)
def test_bench_rejects_bad_flags(capsys, flag: str, value: str, message: str) -> None:
    code, _, err = _run_cli(capsys, "bench", flag, value)
    assert code == 1
    assert message in err and len(err.strip().splitlines()) == 1


def test_bench_outside_a_checkout(capsys, monkeypatch, tmp_path: Path) -> None:
    bench_cli = importlib.import_module("onnxsample.cli.bench")
    monkeypatch.setattr(bench_cli, "__file__", str(tmp_path / "cli" / "bench.py"))
    code, _, err = _run_cli(capsys, "bench", "--repeats", "1")
    assert code == 1
    assert "runs from a source checkout" in err


def test_report_marks_disturbed_repetitions() -> None:
    report = _module("report")
    data = _e2e()
    data["results"][0]["decode_tokens_per_s"]["min"] = 5.0  # onnxsample, batch 1: one slow repeat
    text = report.render(data, None, None)
    assert "| 1 | 1 | sampled | onnxsample | 20.0 (5.0–22.0) ⚠ |" in text
    assert "| 1 | sampled | onnxsample | 20.0 | 0.62× | -0.0010 | ❌ slower ⚠ |" in text
    assert "| 1 | 1 | sampled | 0.80× ❌ ⚠ | 2.00× ✅ ⚠ |" in text
    assert "| 1 | 8 | sampled | 0.80× ❌ | 2.00× ✅ |" in text


def _serve_row(engine: str, mode: str, clients: int, tok_s: float) -> dict:
    return {"engine": engine, "mode": mode, "clients": clients, "tokens_per_s": tok_s,
            "ttft_ms_p50": 40.0, "ttft_ms_p99": 60.0, "itl_ms_p50": 9.0, "itl_ms_p99": 20.0,
            "load_average": [1.2, 1.0, 0.9]}  # fmt: skip


@pytest.mark.parametrize(
    ("rows", "skipped", "expect"),
    [
        (
            [_serve_row("onnxsample", "greedy", 4, 300.0), _serve_row("llama-server", "greedy", 4, 200.0)],
            {},
            ["| greedy | 4 | 300 | 200 | 1.50× |"],
        ),
        (
            [_serve_row("onnxsample", "sampled", 1, 100.0),
             {"engine": "python-api", "mode": "sampled", "clients": 1, "ttft_ms_p50": 44.0,
              "itl_ms_p50": 8.5, "itl_ms_p99": 30.0}],
            {"llama-server": "not built: bash scripts/build_llama_server.sh"},
            ["| sampled | 1 | 100 | — | — |", "llama-server skipped: not built",
             "| sampled | 44.0 | 40.0 | 8.5 / 30.0 | 9.0 / 20.0 |"],
        ),
    ],
    ids=["against-llama-server", "skipped-with-python-api"],
)  # fmt: skip
def test_report_serve_section(tmp_path: Path, rows, skipped, expect) -> None:
    report = _module("report")
    (tmp_path / "serve.json").write_text(
        json.dumps({"threads": 2, "slots": 8, "new_tokens": 128, "rows": rows, "skipped": skipped})
    )
    md, missing = tmp_path / "benchmarks.md", str(tmp_path / "none.json")
    report.main(["--e2e", missing, "--sampling", missing, "--results", str(tmp_path),
                 "--md", str(md), "--png", "x.png"])  # fmt: skip
    text = md.read_text()
    assert "### `onnxsample serve` against llama-server" in text
    for line in expect:
        assert line in text


def test_report_replicas_and_proxy_sections(tmp_path: Path) -> None:
    report = _module("report")
    rows = [_serve_row("onnxsample", "greedy", 1, 100.0), _serve_row("replicas", "greedy", 1, 80.0)]
    rows[1] = {**rows[1], "ttft_ms_p50": 63.0, "itl_ms_p50": 11.5}
    for name, n in (("serve_replicas", 2), ("serve_proxy", 1)):
        (tmp_path / f"{name}.json").write_text(
            json.dumps({"threads": 2, "replicas": n, "slots": 8, "rows": rows, "skipped": {}})
        )
    md, missing = tmp_path / "benchmarks.md", str(tmp_path / "none.json")
    report.main(["--e2e", missing, "--sampling", missing, "--results", str(tmp_path),
                 "--md", str(md), "--png", "x.png"])  # fmt: skip
    text = md.read_text()
    assert "| greedy | 1 | 80 | 100 | 0.80× |" in text  # replicas first
    assert "| greedy | 40.0 | 63.0 | 9.0 | 11.5 | 23.0 ms | 2.5 ms |" in text


def test_report_renders_the_speculative_table() -> None:
    report = _module("report")

    def row(rate, **extra):
        return {"decode_tokens_per_s": rate, "ttft_ms": 10.0, "tokens": 64, **extra}

    table = {
        "onnxsample-off": row(50.0, tokens_per_call=1.0),
        "onnxsample-k4": row(100.0, tokens_per_call=2.5, acceptance=0.75),
        "llamacpp": row(40.0),
        "llamacpp-lookup4": row(44.0),
    }
    data = {
        "benchmark": "speculative",
        "load_average": [[0.5, 0.4, 0.3], [1.5, 1.0, 0.5]],
        "settings": {"new_tokens": 64, "ngram": 3, "prompt_tokens": {"code-edit": 900}},
        "results": {"threads=2": {"code-edit": {"batch=1": table}}, "skipped": {"x": "why"}},
    }
    text = "\n".join(report.render(None, None, None, {"speculative": data}).splitlines())
    assert "## Speculative decoding" in text and "code-edit 900" in text
    assert "| code-edit | 1 | 50.0 | 100.0 (2.00×) | 0.75 | 2.50 | 40.0 | 44.0 (1.10×) |" in text
    assert "Load average (1 min) during the run: 0.5–1.5." in text
    assert "Not run: x (why)." in text
