"""benchmarks/export_memory.py: each side's export (or composition) runs in a process of its own
and the report holds its peak, time and sizes; an export that fails stops the script with its own
lines."""

from __future__ import annotations

import _llama_cpp_models as models
import pytest


def test_a_row_has_each_sides_peak_time_and_sizes(bench, llama_cpp, tmp_path) -> None:
    memory = bench("export_memory")
    path = models.gguf("llama", "Q4_0", llama_cpp)
    row = memory.measure(path, [], 2, None, lambda _: None)
    assert (row["source"], row["source_bytes"]) == (path.name, path.stat().st_size)
    ours = row["ours"]
    assert 50 < ours["peak_mb"]["min"] <= ours["peak_mb"]["median"] <= ours["peak_mb"]["max"]
    assert ours["seconds"]["median"] > 0
    assert ours["export_bytes"] > path.stat().st_size / 2  # the file's own blocks
    assert ours["peak_over_source"] == round(
        ours["peak_mb"]["median"] * 2**20 / path.stat().st_size, 2
    )
    assert "old" not in row and "vs_old" not in row


def test_a_failed_export_stops_with_its_own_lines(bench, tmp_path) -> None:
    memory = bench("export_memory")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model")
    with pytest.raises(SystemExit, match="not a GGUF file"):
        memory.export_once(junk, [], None)


def test_a_composition_row_has_the_composed_files_bytes(bench, tiny_gqa_export) -> None:
    memory = bench("export_memory")
    folder = tiny_gqa_export.output
    row = memory.measure(folder, [], 1, None, lambda _: None, "compose")
    weights = (folder / "model.onnx").stat().st_size + (folder / "model.onnx.data").stat().st_size
    ours = row["ours"]
    assert ours["peak_mb"]["median"] > 50 and ours["seconds"]["median"] > 0
    assert weights < ours["export_bytes"] < 2 * weights  # one file: the weights and the chain
