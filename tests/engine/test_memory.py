"""What an engine keeps after loading: the memory its load freed goes back to the system."""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys

import pytest

from onnxsample.composer import compose

_PROBE = """
import ctypes, ctypes.util, json, sys
import onnxsample

def anonymous_mb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024

with onnxsample.Engine(sys.argv[1], threads=1, tokenizer=sys.argv[2]) as engine:
    kept = anonymous_mb()
    ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    print(json.dumps([kept, anonymous_mb()]))
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None,
    reason="resident memory is read from /proc and the heap is glibc's",
)
def test_an_engine_keeps_no_freed_heap_after_its_load(real_gguf_export, tmp_path):
    """Loading Gemma 3 270M Q4_K_M frees ~390 MB that glibc would keep in the process's heap
    (graph optimisation's copies of the weights, the tokenizer's reading); a trim after the
    engine's own finds almost nothing left to give back."""
    model = compose(real_gguf_export.output, output=tmp_path / "composed.onnx")
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(model), str(real_gguf_export.output)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    kept, trimmed = json.loads(done.stdout.strip().splitlines()[-1])
    assert kept - trimmed < 32, f"{kept - trimmed:.0f} MB of freed heap kept after the load"
