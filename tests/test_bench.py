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

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


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


MACHINE = {"cpu": "Test CPU", "cpus": 2, "memory_gb": 24, "platform": "Linux", "python": "3.11"}


def _e2e() -> dict:
    results = []
    for engine, tps in (("onnxsample", 20.0), ("genai", 25.0), ("optimum", 10.0)):
        for batch in (1, 8):
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
        "engines": {
            "onnxsample": {"status": "ok", "versions": {"onnxruntime": "1.31.1"}},
            "genai": {"status": "ok", "versions": {"onnxruntime-genai": "0.18.0"}},
            "optimum": {"status": "ok", "versions": {}, "use_io_binding": False},
            "llamacpp": {"status": "skipped", "reason": "llama-cpp-python is not installed"},
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
    assert "| 1 | 8 | sampled | genai | 200.0 (180.0–220.0) | 1.25× |" in text
    assert "**skipped** — llama-cpp-python is not installed" in text
    assert "0.50% of a decode step ✅" in text


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
    assert "| 1 | 1 | sampled | 0.80× ❌ ⚠ | 2.00× ✅ ⚠ |" in text
    assert "| 1 | 8 | sampled | 0.80× ❌ | 2.00× ✅ |" in text
