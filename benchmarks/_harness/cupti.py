"""What the GPU ran while a function ran: every kernel and copy of the process (ONNX Runtime's, and
the nodes of captured CUDA graphs, included), by torch's profiler over CUPTI. torch is imported
when called."""

from __future__ import annotations

import collections
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def device_activity(run: Callable[[], Any]) -> tuple[Any, dict[tuple[str, str], list]]:
    """`run()`'s result, and the device's activity meanwhile: {(category, name): [count, µs]},
    category one of ``kernel``, ``gpu_memcpy``, ``gpu_memset``. Without a GPU (a CPU build of
    torch) it is empty."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        found = run()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.loads(Path(f.name).read_text())["traceEvents"]
    seen: dict = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X":
            seen[(e["cat"], e["name"])][0] += 1
            seen[(e["cat"], e["name"])][1] += float(e.get("dur", 0.0))
    return found, dict(seen)
