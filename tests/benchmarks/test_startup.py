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
    assert row["ours"]["run_command"]["median"] > 0  # `onnxsample run` on the cached export
    assert "run_command" not in row["llama-server"]
    assert "old" not in row
