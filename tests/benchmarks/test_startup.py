"""benchmarks/startup.py: a cold engine and a cold llama-server on the same file, each timed from
its process's start to a model ready for a request and to its first token; the report's table."""

from __future__ import annotations

import _llama_cpp_models as models


def test_a_row_times_both_cold_starts(bench, llama_cpp, tmp_path) -> None:
    startup = bench("startup")
    path = models.gguf("llama", "Q4_0", llama_cpp)
    row = startup.measure(str(path), 2, 1, None, tmp_path)
    assert (row["file"], row["file_bytes"], row["threads"]) == (path.name, path.stat().st_size, 2)
    assert row["composed_bytes"] > 0
    for side in ("ours", "llama-server"):
        ready, first = row[side]["ready"]["median"], row[side]["first_token"]["median"]
        assert 0 < ready <= first, side
    assert "old" not in row


def test_the_report_puts_both_beside_each_other(bench) -> None:
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
                "ours": side(3.0, 3.2),
                "llama-server": side(0.6, 0.8),
                "old": side(5.0, 5.2),
            }
        ],
        "run": {
            "machine": {"cpu": "a CPU", "cpus": 2},
            "load_average_before": [0.5],
            "load_average_after": [0.9],
        },
    }
    text = "\n".join(report.startup_section(data))
    assert "*Before*: the previous commit" in text
    assert "| `model.gguf` | 241 | 347 | 3.00 (2.90–3.10) | 0.60 (0.50–0.70) | 5.00× |" in text
    assert "| 5.00 (4.90–5.10) | 5.20 (5.10–5.30) |" in text
    assert "before and after the runs: 0.5–0.9" in text
    assert report.startup_section(None) == []
