"""The benchmarks' harness (benchmarks/_harness/): the report-table helpers, the command-line
helpers, the JSON-lines process from both ends, and the standard-library-only promise the engine
workers rely on."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def test_tables_format_numbers_ratios_and_tables(bench) -> None:
    tables = bench("_harness.tables")
    assert tables.num(None) == "—" and tables.num(1234.5, 1) == "1234.5"
    assert tables.num(1234.5, 0, group=True) == "1,234" and tables.num(0.05, 4, "+") == "+0.0500"
    assert tables.ratio(3.0, 2.0) == "1.50×" and tables.ratio(None, 2.0) == "—"
    assert tables.ratio(3.0, 0) == "—" and tables.times(None) == "—"
    assert tables.ratio_note(3.0, 2.0) == " (1.50×)" and tables.ratio_note(3.0, None) == ""
    assert tables.table(["a", "b"], "lr", [[1, "x"]]) == ["| a | b |", "|---|---:|", "| 1 | x |"]
    with pytest.raises(ValueError, match="2 columns, 1 alignments"):
        tables.table(["a", "b"], "l")
    assert tables.load_line([]) is None
    assert (
        tables.load_line([1.5, 0.5], "the run") == "Load average (1 min) during the run: 0.5–1.5."
    )


def test_script_takes_comma_separated_integers(bench) -> None:
    script = bench("_harness.script")
    assert script.ints("1, 8,", "batch") == [1, 8]
    with pytest.raises(SystemExit, match="--batch takes comma-separated integers, got 'x'"):
        script.ints("x", "batch")
    with pytest.raises(SystemExit, match="--threads takes integers >= 1"):
        script.ints("0,2", "threads")
    assert script.parser("First line\nstill the first paragraph.\n\nMore.").description == (
        "First line\nstill the first paragraph."
    )
    assert script.read_json(Path("/nonexistent/results.json")) is None


def test_json_lines_process_from_both_ends(bench, bench_dir: Path, tmp_path: Path) -> None:
    process = bench("_harness.process")
    child = tmp_path / "child.py"
    child.write_text(
        textwrap.dedent(
            f"""
            import json, sys
            sys.path.insert(0, {str(bench_dir)!r})
            from _harness.process import protocol_stdout, sender

            send = sender(protocol_stdout())
            print("library noise")  # goes to stderr, not into the protocol
            send({{"ready": True}})
            for line in sys.stdin:
                req = json.loads(line)
                if req.get("quit"):
                    break
                send({{"ok": True, "twice": 2 * req["n"]}})
            """
        )
    )
    worker = process.JsonLinesProcess([sys.executable, str(child)])
    try:
        assert worker.info == {"ready": True}
        assert worker.request({"n": 21}) == {"ok": True, "twice": 42}
    finally:
        worker.close()
    assert worker.proc.returncode == 0
    dead = process.JsonLinesProcess([sys.executable, "-c", "raise SystemExit(3)"])
    assert dead.info == {"ready": False, "ok": False, "error": "worker exited with status 3"}


def test_the_worker_imports_nothing_but_the_standard_library(bench_dir: Path) -> None:
    """e2e_worker.py runs in other virtual environments: its imports (the harness included) must
    not need numpy, onnxruntime or onnxsample until an engine loads."""
    code = (
        "import sys\n"
        "for name in ('numpy', 'onnxruntime', 'onnxsample', 'torch', 'transformers'):\n"
        "    sys.modules[name] = None  # importing it now raises ImportError\n"
        f"sys.path.insert(0, {str(bench_dir)!r})\n"
        "import e2e_worker, _harness.machine, _harness.process, _harness.script\n"
        "import _harness.tables, _harness.workload\n"
        "print(sorted(e2e_worker.ENGINES)[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "genai"


def test_measure_closed_loop_and_summaries(bench) -> None:
    measure = bench("_harness.measure")

    def one(client: int, request: int) -> tuple[float, list[float], int]:
        return 0.010 * (client + 1), [0.002, 0.004], 3

    result = measure.closed_loop(2, 3, one)
    assert (result["clients"], result["requests"], result["tokens"]) == (2, 6, 18)
    assert result["ttft_ms_p50"] == 15.0 and result["itl_ms_p99"] == 4.0

    def fails(client: int, request: int) -> tuple[float, list[float], int]:
        raise OSError("refused")

    with pytest.raises(RuntimeError, match="2 clients failed; the first: refused"):
        measure.closed_loop(2, 1, fails)
    calls = []
    assert measure.median_ms(lambda: calls.append(1), 0.0, minimum=4) >= 0.0
    assert len(calls) == 5  # the warm-up call, then `minimum`
    assert measure.summary([3.0, 1.0, 2.0], 1) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}


def test_free_guesses_are_replayed_on_the_tokens_decoding_produced(bench) -> None:
    """benchmarks/positions.py: each decode step's guess is the n-gram draft's first token, else
    the last token again; it is right when it is the token that came next."""
    positions = bench("positions")
    # prompt [1, 2, 3, 1, 2]; output 3 (from the prefill), then 1, 2, 9, 9
    found = positions._guesses([1, 2, 3, 1, 2, 3, 1, 2, 9, 9], prompt_len=5)
    # steps predict 1 (after ..2,3: draft 1, right), 2 (draft 2, right), 9 (draft 3, wrong),
    # 9 (no earlier 9: the last token again, right)
    assert found == {
        "steps": 4,
        "right": 0.75,
        "ngram_drafted": 0.75,
        "ngram_right": 0.5,
        "repeat_right": 0.25,
    }
