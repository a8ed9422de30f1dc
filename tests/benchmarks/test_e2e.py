"""The end-to-end benchmark's plumbing (engine names, flags, quality scores, the worker protocol,
aggregation) and `onnxsample bench`'s front.

No timing is asserted anywhere: the numbers here are synthetic.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import pytest
from _cli import run_cli


def test_engine_names_agree_across_the_scripts(bench) -> None:
    e2e, models = bench("e2e"), bench("e2e_models")
    worker, engines, report = bench("e2e_worker"), bench("e2e_engines"), bench("report_e2e")
    assert set(e2e.ENGINES) == set(models.ENGINES) == set(report.ENGINE_LABELS)
    assert set(e2e.ENGINES) == set(worker.ENGINES) == set(engines.ENGINES)
    assert set(e2e.ENGINES) == set(importlib.import_module("onnxsample.cli.bench").ENGINES)
    assert set(e2e.ALIASES.values()) <= set(e2e.ENGINES)
    assert report.ALIASES == e2e.ALIASES
    assert set(models.VARIANTS) | {models.GENAI_GRAPH} == set(report.OURS) == set(models.RUNTIME)
    assert models.REFERENCE in models.VARIANTS
    assert models.VARIANTS[models.REFERENCE][1]["precision"] == "fp32"


def test_e2e_engine_flag_takes_variants_and_old_names(bench) -> None:
    e2e = bench("e2e")
    args = e2e.parse_args(
        ["--engines", "onnxsample-gguf-a4, llamacpp,onnxsample-gqa,onnxsample-genai-graph"]
    )
    assert args.engines == ["onnxsample-gguf-a4", "llamacpp", "onnxsample-genai-graph"]
    assert args.quality_tokens == 64 and args.cache.endswith("bench-e2e")
    assert e2e.parse_args([]).engines == list(e2e.ENGINES)
    with pytest.raises(SystemExit, match="--quality-tokens"):
        e2e.parse_args(["--quality-tokens", "-1"])


def test_e2e_scores_each_onnx_file_once(bench, monkeypatch) -> None:
    quality = bench("e2e_quality")
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
    scores = quality.score_onnx(models, [1, 2], [3, 4], 1, lambda _msg: None)
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
    assert quality.with_delta(dict(scores["onnxsample"]), -0.1)["delta_vs_fp32"] == -0.0235


def test_worker_log_softmax_matches_the_exporters(bench) -> None:
    import numpy as np

    engines = bench("e2e_engines")
    verify = importlib.import_module("onnxsample.exporters._verify")
    logits = np.random.default_rng(0).normal(size=(5, 11)).astype(np.float32) * 10
    tokens = [0, 3, 10, 3, 7]
    assert engines._mean_logprob(logits, tokens) == pytest.approx(
        verify._mean_logprob(logits.astype(np.float64), tokens)
    )


def test_worker_serves_score_requests(bench, monkeypatch) -> None:
    import io

    worker = bench("e2e_worker")

    class Fake(worker.Engine):
        def run(self, req: dict) -> dict:
            return {"tokens": [req["new_tokens"]], "ttft_s": 0.1, "decode_s": 0.2}

        def score(self, prompt_ids, tokens) -> float:
            return -float(len(prompt_ids) + len(tokens))

    class Unscored(Fake):
        score = worker.Engine.score

        def ready_info(self) -> dict:
            return {"use_io_binding": False}

    monkeypatch.setitem(worker.ENGINES, "fake", Fake)
    monkeypatch.setitem(worker.ENGINES, "unscored", Unscored)
    requests = [
        {"prompt_ids": [1, 2], "batch": 1, "mode": "greedy", "new_tokens": 4, "seed": 0},
        {"score": {"prompt_ids": [1, 2], "tokens": [3, 4, 5]}},
        {"quit": True},
    ]
    args = argparse.Namespace(threads=1, hf="", gguf="/m.gguf")
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
    assert "use_io_binding" not in ready and replies[1][0]["use_io_binding"] is False
    assert replies[1][2]["ok"] is False and replies[1][2]["unsupported"] is True


def test_e2e_aggregates_median_and_spread(bench) -> None:
    results = bench("e2e_results")
    runs = []
    for rep, decode_s in enumerate((2.0, 1.0, 4.0)):
        run = {"engine": "genai", "threads": 1, "batch": 2, "mode": "greedy", "repeat": rep}
        run.update(ok=True, prompt_tokens=10, tokens=[5, 5], ttft_s=0.1, decode_s=decode_s)
        run["peak_rss_mb"] = 100.0 + rep
        runs.append(results.derive(run))
    runs.append({"engine": "genai", "ok": False, "error": "boom"})
    (row,) = results.aggregate(runs)
    assert row["decode_tokens_per_s"] == {"median": 4.0, "min": 2.0, "max": 8.0, "n": 3}
    assert row["prefill_tokens_per_s"]["median"] == pytest.approx(200.0)
    assert row["peak_rss_mb"] == 102.0 and row["tokens_per_sequence"] == [5]


def test_e2e_gives_every_engine_an_entry_and_its_quality(bench) -> None:
    results = bench("e2e_results")
    engines = {
        "genai": {"status": "ok"},
        "llamacpp": {"status": "skipped", "reason": "not installed"},
    }
    quality = {"genai": {"mean_logprob": -0.6, "scored_on": "/g/model.onnx"}}
    results.finish_engines(engines, ["genai", "llamacpp", "optimum"], quality, -0.5)
    assert engines["genai"]["quality"]["delta_vs_fp32"] == -0.1
    assert engines["llamacpp"]["quality"] == {
        "mean_logprob": None,
        "reason": "engine skipped: not installed",
    }
    assert engines["optimum"]["status"] == "skipped"
    assert engines["optimum"]["reason"] == "not started"
    unscored = {"genai": {"status": "ok"}}
    results.finish_engines(unscored, ["genai"], None, None)
    assert unscored == {"genai": {"status": "ok"}}


def test_e2e_runs_rotate_the_engines_and_skip_refused_batches(bench) -> None:
    pool = bench("e2e_pool")

    class FakeWorker:
        def __init__(self, engine: str) -> None:
            self.engine, self.threads, self.seen = engine, 2, []

        def request(self, req: dict) -> dict:
            self.seen.append((req["batch"], req["mode"], req["seed"]))
            order.append(self.engine)
            tokens = [3] * req["batch"]
            return {
                "ok": True,
                "prompt_tokens": 4,
                "tokens": tokens,
                "ttft_s": 0.5,
                "decode_s": 1.0,
            }

    order: list[str] = []
    workers = [FakeWorker("a"), FakeWorker("b")]
    args = argparse.Namespace(batch=[1, 8], modes=["greedy"], repeats=2, new_tokens=3, message="")
    runs = pool.timed_runs(workers, args, [1, 2, 3, 4], {("b", 8)}, lambda _msg: None)
    # repetition 0: batch 1 a, b; batch 8 (shifted) b refused, a; repetition 1 starts shifted
    assert order == ["a", "b", "a", "b", "a", "a"]
    assert workers[1].seen == [(1, "greedy", 0), (1, "greedy", 1000)]
    assert [(r["engine"], r["batch"], r["repeat"]) for r in runs][:2] == [("a", 1, 0), ("b", 1, 0)]
    assert all(r["threads"] == 2 for r in runs) and len(runs) == 6
    assert runs[0]["decode_tps"] == 2.0 and runs[2]["decode_tps"] == 16.0  # 8 × 2 tokens / 1 s
    assert runs[0]["prefill_tps"] == 8.0  # batch 1 × 4 prompt tokens / 0.5 s


def test_bench_help(capsys) -> None:
    code, out, _ = run_cli(capsys, "bench", "--help")
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
    code, _, err = run_cli(capsys, "bench", flag, value)
    assert code == 1
    assert message in err and len(err.strip().splitlines()) == 1


def test_bench_outside_a_checkout(capsys, monkeypatch, tmp_path: Path) -> None:
    bench_cli = importlib.import_module("onnxsample.cli.bench")
    monkeypatch.setattr(bench_cli, "__file__", str(tmp_path / "cli" / "bench.py"))
    code, _, err = run_cli(capsys, "bench", "--repeats", "1")
    assert code == 1
    assert "runs from a source checkout" in err
