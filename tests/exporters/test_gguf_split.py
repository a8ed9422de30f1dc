"""Split GGUF files (``PREFIX-00001-of-0000N.gguf``, as llama.cpp's converter and gguf-split
write large models): the first part names the model, as for llama.cpp, and exports to what the
same model's single file exports to."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import _llama_cpp_models as fixtures
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxsample.errors import ExportError
from onnxsample.exporters import export

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def split(llama_cpp) -> list[Path]:
    first = fixtures.split_gguf("llama3", llama_cpp)
    parts = sorted(first.parent.glob(first.name.replace("-00001-of-", "-*-of-")))
    assert len(parts) >= 2 and parts[0] == first
    return parts


def _initializers(folder: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(folder / "model.onnx"))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_the_first_part_exports_the_whole_model_as_its_single_file(llama_cpp, split, tmp_path):
    whole = export(fixtures.gguf("llama3", "F16", llama_cpp), tmp_path / "whole", verify_tokens=0)
    parted = export(split[0], tmp_path / "split")
    ours, theirs = _initializers(parted.output), _initializers(whole.output)
    assert ours.keys() == theirs.keys()
    assert all(np.array_equal(ours[k], theirs[k]) for k in ours)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (parted.output / name).read_text() == (whole.output / name).read_text(), name
    source = parted.manifest["source"]
    assert source["name"] == "llama3-F16-split"
    assert source["bytes"] == sum(p.stat().st_size for p in split)
    assert parted.manifest["verify"]["note"].startswith("skipped (transformers' GGUF loader")


def test_a_changed_part_is_a_changed_source(split, tmp_path):
    for part in split:
        shutil.copyfile(part, tmp_path / part.name)
    first = tmp_path / split[0].name
    made = export(first, tmp_path / "out", verify_tokens=0)
    last = tmp_path / split[-1].name
    last.write_bytes(last.read_bytes() + b"\0")  # a byte more after the tensors
    with pytest.raises(ExportError, match="holds a different export"):
        export(first, tmp_path / "out", verify_tokens=0)
    assert (
        made.manifest["source"]["sha256"]
        != export(first, tmp_path / "again", verify_tokens=0).manifest["source"]["sha256"]
    )


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("second part", "is part 2 of {n} of a split GGUF: name its first part, {first}"),
        ("missing part", "is the first of {n} parts of a split GGUF, and {last} is missing"),
        ("optimum layout", "the optimum layout reads a GGUF through transformers"),
    ],
)
def test_a_split_it_cannot_read_is_one_line(split, tmp_path, case, message):
    for part in split:
        shutil.copyfile(part, tmp_path / part.name)
    named, options = tmp_path / split[0].name, {}
    if case == "second part":
        named = tmp_path / split[1].name
    elif case == "missing part":
        (tmp_path / split[-1].name).unlink()
    else:
        options = {"layout": "optimum"}
    expected = message.format(n=len(split), first=split[0].name, last=split[-1].name)
    with pytest.raises(ExportError, match=re.escape(expected)):
        export(named, tmp_path / "out", verify_tokens=0, **options)
    assert not (tmp_path / "out").exists()


def test_a_whole_file_named_like_a_part_is_one_file_as_for_llama_cpp(llama_cpp, tmp_path):
    """The header decides (split.count), not the name: llama.cpp loads such a file alone, and so
    does the exporter."""
    whole = fixtures.gguf("llama3", "Q8_0", llama_cpp)
    named = tmp_path / "llama3-00001-of-00003.gguf"
    shutil.copyfile(whole, named)
    text = "Hello world"
    assert llama_cpp.tokenize(named, text) == llama_cpp.tokenize(whole, text)
    ours = export(named, tmp_path / "named", verify_tokens=0)
    theirs = export(whole, tmp_path / "whole", verify_tokens=0)
    assert ours.manifest["source"]["name"] == "llama3-00001-of-00003"
    assert "parts" not in ours.manifest["source"]
    mine, reference = _initializers(ours.output), _initializers(theirs.output)
    assert mine.keys() == reference.keys()
    assert all(np.array_equal(mine[k], reference[k]) for k in mine)


def test_inspect_describes_a_split_file_by_its_first_part(split, capsys):
    from onnxsample.cli import main
    from onnxsample.cli._ui import human_bytes

    with pytest.raises(SystemExit) as done:
        main(["inspect", str(split[0])])
        raise SystemExit(0)
    out = " ".join(capsys.readouterr().out.split())
    assert done.value.code == 0
    assert f"(GGUF, {len(split)} parts)" in out
    assert human_bytes(sum(p.stat().st_size for p in split)) in out
