"""scripts/parts.sh: a folder cut into parts of a bounded size, put back together elsewhere and
checked file by file."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "parts.sh"
MIB = 1 << 20


def _run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A file of 2.5 parts, one of nearly a part, small ones, one in a subfolder."""
    rng = random.Random(7)
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "big.whl").write_bytes(rng.randbytes(5 * MIB // 2))
    (src / "near.whl").write_bytes(rng.randbytes(MIB - 1000))
    (src / "small.whl").write_bytes(rng.randbytes(3000))
    (src / "sub" / "notes.txt").write_text("a file in a subfolder\n")
    return src


@pytest.mark.parametrize("damage", [None, "a piece missing", "a piece damaged"])
def test_the_parts_give_the_folder_back_or_name_the_wrong_file(folder, tmp_path, damage):
    parts = tmp_path / "parts"
    split = _run("split", folder, parts, 1)
    assert split.returncode == 0, split.stderr
    for part in parts.iterdir():  # each part at most the size asked, its checksums aside
        files = [f for f in part.rglob("*") if f.is_file() and f.name != "SHA256SUMS"]
        assert files and sum(f.stat().st_size for f in files) <= MIB, part
    there = tmp_path / "there"  # the parts copied over in another order
    for i, part in enumerate(sorted(parts.iterdir(), reverse=True)):
        shutil.copytree(part, there / f"arrived-{i}")
    pieces = sorted(there.rglob("big.whl.piece.*"))
    assert len(pieces) == 3
    if damage == "a piece missing":
        pieces[1].unlink()
    elif damage == "a piece damaged":
        with open(pieces[1], "r+b") as f:
            f.seek(100)
            f.write(bytes([f.read(1)[0] ^ 1]))
    join = _run("join", there, tmp_path / "back")
    if damage is None:
        assert join.returncode == 0, join.stderr
        for f in folder.rglob("*"):
            if f.is_file():
                assert (tmp_path / "back" / f.relative_to(folder)).read_bytes() == f.read_bytes()
    else:
        assert join.returncode == 1
        assert "big.whl: FAILED" in join.stdout + join.stderr
        assert "missing or damaged" in join.stderr


def test_splitting_into_a_folder_that_exists_is_refused(folder, tmp_path):
    os.makedirs(tmp_path / "parts")
    done = _run("split", folder, tmp_path / "parts", 1)
    assert done.returncode == 1 and "exists" in done.stderr
