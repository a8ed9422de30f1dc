"""Composing is reproducible: the same export and options give the same bytes in every process,
whatever its string hashing (onnxscript orders a multi-variable ``if``'s outputs by a ``set``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Seeds under which the two If nodes with several outputs come out in different orders.
SEEDS = ("1", "2")


@pytest.mark.parametrize(
    "options",
    [[], ["--static"], ["--prompt-logprobs", "--top-logprobs", "2", "--max-bias", "4"]],
    ids=["branching", "static", "echo"],
)
def test_composing_twice_writes_the_same_bytes(tiny_gqa_export, tmp_path, options):
    written = []
    for seed in SEEDS:
        out = tmp_path / f"composed-{seed}.onnx"
        argv = [sys.executable, "-m", "onnxsample", "compose", str(tiny_gqa_export.output)]
        subprocess.run(
            [*argv, "-o", str(out), "--max-slots", "2", *options],
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=True,
            capture_output=True,
            timeout=300,
        )
        written.append(out.read_bytes())
    assert written[0] == written[1]
