"""The report generator: docs/benchmarks.md's sections and chart from synthetic results.

No timing is asserted anywhere: the numbers here are synthetic.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _stat(value: float) -> dict:
    return {"median": value, "min": value * 0.9, "max": value * 1.1, "n": 3}


def _score(value: float, delta: float) -> dict:
    return {"mean_logprob": value, "delta_vs_fp32": delta, "scored_on": "/x/model.onnx"}


MACHINE = {"cpu": "Test CPU", "cpus": 2, "memory_gb": 24, "platform": "Linux", "python": "3.11"}


def _record(benchmark: str, created: str, load_after: list[float]) -> dict:
    """What a report holds beside its settings and results (the harness's run record)."""
    return {
        "benchmark": benchmark,
        "created": created,
        "machine": MACHINE,
        "load_average_before": [0.3, 0.4, 0.5],
        "load_average_after": load_after,
    }


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
        **_record("e2e", "2026-11-22T05:00:00+00:00", [1.0, 0.6, 0.5]),
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
        **_record("sampling_overhead", "2026-11-22T05:10:00+00:00", [0.9, 0.6, 0.5]),
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


def test_report_writes_markdown_and_chart(bench, tmp_path: Path) -> None:
    report = bench("report")
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


def test_report_renders_variants_quality_and_llamacpp_target(bench) -> None:
    report = bench("report")
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


def test_report_reads_old_engine_names(bench, tmp_path: Path) -> None:
    report = bench("report")
    data = _e2e()
    data["results"][0]["engine"] = "onnxsample-gqa"
    data["engines"]["onnxsample-gqa"] = {"status": "ok", "versions": {}}
    del data["quality"]
    text = report.render(report.normalise(data), None, None)
    assert "| 1 | 1 | sampled | onnxsample-genai-graph |" in text
    assert "onnxsample on genai's builder graph" in text


def test_report_without_results(bench, tmp_path: Path) -> None:
    report = bench("report")
    md = tmp_path / "benchmarks.md"
    missing = str(tmp_path / "none.json")
    report.main(["--e2e", missing, "--sampling", missing, "--md", str(md), "--png", "x.png"])
    text = md.read_text()
    assert "run `python benchmarks/e2e.py`" in text and "![" not in text


def test_report_marks_disturbed_repetitions(bench) -> None:
    report = bench("report")
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
def test_report_serve_section(bench, tmp_path: Path, rows, skipped, expect) -> None:
    report = bench("report")
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


def test_report_replicas_and_proxy_sections(bench, tmp_path: Path) -> None:
    report = bench("report")
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


def test_report_renders_the_speculative_table(bench) -> None:
    report = bench("report")

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
    table["onnxsample-k4"]["same_tokens"] = False
    table["exact-off"] = row(45.0, tokens_per_call=1.0)
    table["exact-k4"] = row(90.0, tokens_per_call=2.5, acceptance=0.75, same_tokens=True)
    text = report.render(None, None, None, {"speculative": data})
    assert "| 40.0 | 44.0 (1.10×) | 45.0 (0.90×) | 90.0 (2.00×) | no / yes |" in text


def test_report_renders_the_minimums_forms(bench) -> None:
    gguf = bench("report_gguf")
    per_layer = {"none": 100.0, "reduce_sum": 125.0, "gemm_2d": 120.0, "float_zero_points": 900.0}
    data = {
        "layers": 30,
        "projections": [["qkv", 576, 960]],
        "results": [
            {
                "threads": 2,
                "us_per_layer": {
                    f: {"median": v, "min": v - 1, "max": v + 1} for f, v in per_layer.items()
                },
                "correction_us_per_layer": {
                    f: v - 100 for f, v in per_layer.items() if f != "none"
                },
                "vs_reduce_sum": {f: v / 125 for f, v in per_layer.items() if f != "none"},
            }
        ],
        "run": {"load_average_before": [0.5], "load_average_after": [0.7]},
    }
    text = "\n".join(gguf.minimums_section(data))
    assert "30 layers of the embedded model's four projections (576→960)" in text
    assert "| 2 | `reduce_sum`: Reshape + ReduceSum, MatMul, Add (what the export emits) " in text
    assert "| 120.0 (119.0–121.0) | 20.0 | 0.96× |" in text
    assert "| 900.0 (899.0–901.0) | 800.0 | 7.20× |" in text
    # the fastest exact form: never the float zero points, whatever their time
    assert "2 threads: the correction is 20% of a layer's projections" in text
    assert "the fastest exact form is `gemm_2d` (0.96× the export's)" in text
    assert "during the runs: 0.5–0.7" in text
    assert gguf.minimums_section(None) == []


def test_report_renders_the_code_forms(bench) -> None:
    gguf = bench("report_gguf")
    per_layer = {
        "Q4_0/four_bit": 200.0,
        "Q5_0/eight_bit": 320.0,
        "Q5_0/nibble_and_bit": 400.0,
        "Q8_0/eight_bit": 330.0,
        "Q8_0/two_nibbles": 300.0,
    }
    exported = {"Q4_0": 200.0, "Q5_0": 320.0, "Q8_0": 330.0}
    data = {
        "layers": 30,
        "projections": [["qkv", 576, 960]],
        "bits_per_weight": {
            "Q4_0/four_bit": 5.0,
            "Q5_0/eight_bit": 9.0,
            "Q5_0/nibble_and_bit": 8.0,
            "Q8_0/eight_bit": 9.0,
            "Q8_0/two_nibbles": 10.25,
        },
        "llama_cpp_bits_per_weight": {"Q4_0": 4.5, "Q5_0": 5.5, "Q8_0": 8.5},
        "results": [
            {
                "threads": 1,
                "us_per_layer": {
                    f: {"median": v, "min": v - 1, "max": v + 1} for f, v in per_layer.items()
                },
                "vs_export": {f: v / exported[f.split("/")[0]] for f, v in per_layer.items()},
            }
        ],
        "run": {"load_average_before": [0.5], "load_average_after": [0.7]},
    }
    text = "\n".join(gguf.codes_section(data))
    assert "30 layers of the embedded model's four projections (576→960)" in text
    assert "| 1 | Q5_0 | `nibble_and_bit`: 4-bit low nibble + 2-bit high bit, Add " in text
    assert "| 8.00 (5.5) | 400.0 (399.0–401.0) | 1.25× |" in text
    # the fastest form of each type, whatever the export emits; a 5-bit layer against a 4-bit one
    assert "the fastest exact form is `eight_bit` for Q5_0 and `two_nibbles` for Q8_0" in text
    assert "a Q5_0 layer takes 1.60× a 4-bit one's time, reading 1.80× its bits" in text
    assert "(llama.cpp's Q5_0 reads 1.22× its Q4_0's)" in text
    assert "during the runs: 0.5–0.7" in text
    assert gguf.codes_section(None) == []


def test_report_renders_the_k_quant_mixes(bench) -> None:
    gguf = bench("report_gguf")
    speeds = {"onnxsample": {"median": 70.0}, "llama-server": {"median": 100.0}, "ratio": 0.7}
    cell = {"threads": 1, "batch": 1, "decode_tok_s": speeds, "prompt_tok_s": speeds}
    entry = {"gguf": "llama256-Q4_K_M.gguf", "gguf_mb": 118.0, "export_mb": 151.0}
    data = {
        "new_tokens": 128,
        "models": {
            "llama256-Q4_K_M": entry
            | {"prompt_tokens": 16, "same_prompt_ids": True, "cells": [cell]},
        },
    }
    text = "\n".join(gguf.k_quants_section(data))
    assert "### K-quants as the 1B-and-up models have them" in text
    assert "#### llama256-Q4_K_M: `llama256-Q4_K_M.gguf`" in text
    assert "File 118.0 MB, export 151.0 MB (1.28×)" in text
    assert "| 1 | 1 | 70.0 | 100.0 | 0.70× |" in text
    assert gguf.k_quants_section(None) == []


def test_report_renders_llama_server_with_and_without_repacking(bench) -> None:
    gguf = bench("report_gguf")
    decode = {
        "onnxsample": {"median": 115.0},
        "llama-server": {"median": 125.0},
        "llama-server-no-repack": {"median": 100.0},
        "ratio": 0.92,
        "ratio_no_repack": 1.15,
    }
    cell = {"threads": 2, "batch": 1, "decode_tok_s": decode}
    data = {"models": {"smollm2-Q4_0": {"cells": [cell]}}, "run": _run("AMD EPYC", 0.5, 1.7)}
    text = "\n".join(gguf.repack_section(data))
    assert "### llama.cpp's weight repacking" in text
    assert "| `smollm2-Q4_0` | 2 | 115.0 | 125.0 | 0.92× | 100.0 | 1.15× |" in text
    assert "Machine: AMD EPYC, 2 cores." in text and "during the runs: 0.5–1.7" in text
    assert gguf.repack_section(None) == []


def test_report_renders_llama_cpps_kernels_beside_ours(bench) -> None:
    gguf = bench("report_gguf")
    parts = {"linear": 10.0, "lm_head": 5.0, "rest": 3.0}
    data = _kernels(2, (18.0, parts), (19.8, parts | {"linear": 11.8}), _run("Xeon", 0.5, 1.5))
    text = "\n".join(gguf.kernels_section(data))
    assert "| `m` | 2 | MatMulNBits (the export) | 18.00 | 10.00 | 5.00 | 3.00 |  |" in text
    assert "| `m` | 2 | ggml | 19.80 | 11.80 | 5.00 | 3.00 | 1.10× |" in text
    assert "the same greedy token at 88% of its positions" in text
    assert "Machine: Xeon, 2 cores." in text and "during the runs: 0.5–1.5" in text
    assert gguf.kernels_section(None) == []


def test_report_names_the_machine_of_the_gguf_files_run(bench) -> None:
    gguf = bench("report_gguf")
    speeds = {"onnxsample": {"median": 50.0}, "llama-server": {"median": 40.0}, "ratio": 1.25}
    cell = {"threads": 2, "batch": 1, "decode_tok_s": speeds, "prompt_tok_s": speeds}
    entry = {"gguf": "m.gguf", "gguf_mb": 10.0, "export_mb": 12.0, "prompt_tokens": 16}
    data = {
        "new_tokens": 128,
        "models": {"m": entry | {"same_prompt_ids": True, "cells": [cell]}},
        "run": _run("AMD EPYC", 1.0, 1.2),
    }
    text = "\n".join(gguf.gguf_section(data))
    assert "| 2 | 1 | 50.0 | 40.0 | 1.25× | 50 | 40 | 1.25× |" in text
    assert "Machine: AMD EPYC, 2 cores." in text
    assert "during the runs: 1.0–1.2" in text
    del data["run"]["machine"]
    assert "Machine:" not in "\n".join(gguf.gguf_section(data))


def test_report_renders_an_exports_peak_beside_the_old_ones(bench) -> None:
    export = bench("report_export")

    def side(peak: float, seconds: float) -> dict:
        return {
            "peak_mb": {"median": peak, "min": peak - 1, "max": peak + 1},
            "seconds": {"median": seconds, "min": seconds, "max": seconds},
            "export_bytes": 186_368_357,
            "peak_over_source": round(peak * 2**20 / 154_126_112, 2),
        }

    row = {"source": "q6.gguf", "options": [], "source_bytes": 154_126_112}
    row |= {"ours": side(642.0, 13.3), "old": side(856.0, 13.4)}
    row["vs_old"] = {"peak_mb": 0.75, "seconds": 0.993}
    run = {"machine": {"cpu": "AMD EPYC", "cpus": 2}}
    run |= {"load_average_before": [1.1, 1.0, 1.0], "load_average_after": [1.6, 1.2, 1.0]}
    data = {
        "repeats": 2,
        "old_site": "/x",
        "old_label": "0.1.0 before",
        "results": [row],
        "run": run,
    }
    text = "\n".join(export.export_section([data, None]))
    assert "## Exporting: peak memory and time" in text
    assert "*Before*: 0.1.0 before" in text
    assert "| `q6.gguf` | — | 154 | 186 | 673 (672–674) | 4.37× | 13.3 (13.3–13.3) |" in text
    assert "| 898 (897–899) | 13.4 (13.4–13.4) | 0.75× | 0.99× |" in text
    assert "before and after the runs: 1.1–1.6" in text
    assert export.export_section([None]) == []
    # a report beside another older package: a table of its own under its own label
    later = {**data, "old_label": "0.1.1 before", "results": [{**row, "source": "f16.gguf"}]}
    text = "\n".join(export.export_section([data, later]))
    first, second = text.split("*Before*: 0.1.1 before")
    assert "`q6.gguf`" in first and "`f16.gguf`" not in first
    assert "`f16.gguf`" in second and "`q6.gguf`" not in second
    assert text.count("| source | options |") == 2
    # a composition: the same table, its source an export folder and its output the composed file
    text = "\n".join(export.export_section([data], "compose"))
    assert "## Composing: peak memory and time" in text
    assert (
        "| export | options | export MB | composed MB | peak MB | peak ÷ export | seconds |" in text
    )
    assert "| `q6.gguf` | — | 154 | 186 | 673 (672–674) | 4.37× | 13.3 (13.3–13.3) |" in text


def _kernels(threads: int, ours: tuple, ggml: tuple, run: dict) -> dict:
    """gguf_kernels.py's results for one model ``m``: (step ms, profile parts) of each form."""
    cell = {
        "threads": threads,
        "matmulnbits": {"step_ms": ours[0], "profile_ms": ours[1]},
        "ggml": {"step_ms": ggml[0], "profile_ms": ggml[1]},
        "ggml_over_matmulnbits": round(ggml[0] / ours[0], 2),
    }
    entry = {"logits_max_abs_diff": 0.1, "logits_max_abs": 3.0, "same_greedy_tokens": 0.875}
    return {"models": {"m": entry | {"cells": [cell]}}, "run": run}


def _run(cpu: str, before: float, after: float) -> dict:
    """A report's run record: a 2-core machine and the 1-minute load averages."""
    return {
        "machine": {"cpu": cpu, "cpus": 2},
        "load_average_before": [before],
        "load_average_after": [after],
    }


def test_report_puts_our_start_beside_llama_servers(bench) -> None:
    report = bench("report_startup")
    spread = lambda m: {"median": m, "min": m - 0.1, "max": m + 0.1}  # noqa: E731
    side = lambda r, f: {"ready": spread(r), "first_token": spread(f)}  # noqa: E731
    data = {
        "repeats": 3,
        "old_site": "/tmp/old",
        "old_label": "the previous commit",
        "results": [
            {
                "file": "model.gguf",
                "file_bytes": 241e6,
                "composed_bytes": 347e6,
                "threads": 2,
                "ours": {**side(3.0, 3.2), "run_command": spread(3.5)},
                "llama-server": side(0.6, 0.8),
                "old": {**side(5.0, 5.2), "run_command": spread(6.0)},
            }
        ],
        "run": _run("a CPU", 0.5, 0.9),
    }
    text = "\n".join(report.startup_section(data))
    assert "*Before*: the previous commit" in text
    assert "| `model.gguf` | 241 | 347 | 3.00 (2.90–3.10) | 0.60 (0.50–0.70) | 5.00× |" in text
    assert "| 5.00 (4.90–5.10) | 5.20 (5.10–5.30) |" in text
    assert "| `model.gguf` | 3.50 (3.40–3.60) | 6.00 (5.90–6.10) |" in text  # `onnxsample run`
    assert "before and after the runs: 0.5–0.9" in text
    assert report.startup_section(None) == []


def test_report_renders_the_avx512_machine_with_its_vector_extensions(bench) -> None:
    gguf = bench("report_gguf")
    speeds = {"onnxsample": {"median": 57.0}, "llama-server": {"median": 126.0}, "ratio": 0.45}
    cell = {"threads": 1, "batch": 1, "decode_tok_s": speeds, "prompt_tok_s": speeds}
    entry = {"gguf": "m.gguf", "gguf_mb": 118.0, "export_mb": 151.0, "prompt_tokens": 16}
    run = _run("AMD EPYC", 1.1, 1.7)
    run["machine"]["simd"] = ["avx2", "avx512f", "avx512_vnni"]
    k_quants = {"models": {"m": entry | {"same_prompt_ids": True, "cells": [cell]}}, "run": run}
    parts = {"linear": 9.7, "lm_head": 4.0, "rest": 2.2}
    kernels = _kernels(1, (15.7, parts), (10.8, parts | {"linear": 6.2}), run)
    text = "\n".join(gguf.avx512_section(k_quants, kernels))
    assert "### An AMD EPYC with AVX-512 VNNI" in text
    assert "| 1 | 1 | 57.0 | 126.0 | 0.45× |" in text
    assert "| `m` | 1 | ggml | 10.80 | 6.20 | 4.00 | 2.20 | 0.69× |" in text
    assert text.count("Machine: AMD EPYC (avx2, avx512f, avx512_vnni), 2 cores.") == 2
    assert gguf.avx512_section(None, None) == []
    assert "| `m` | 1 | ggml" not in "\n".join(gguf.avx512_section(k_quants, None))


def test_the_machine_record_names_its_vector_extensions(bench) -> None:
    machine = bench("_harness.machine")
    found = machine.machine()["simd"]
    assert set(found) <= set(machine._SIMD)
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    flags = next((line for line in lines if line.startswith("flags")), "flags: ").split(":")[1]
    assert found == [f for f in machine._SIMD if f in flags.split()]
