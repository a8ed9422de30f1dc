"""Which ONNX Runtime build is installed, checked once at import time.

`onnxruntime` and `onnxruntime-gpu` install the same `onnxruntime` module. With neither we cannot run
anything; with both, whichever was installed last wins file by file and the CUDA provider silently
disappears. Both cases are reported with the extra to install instead of failing later.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from onnxsample.errors import RuntimeUnavailable

_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu")


def installed_runtimes() -> list[str]:
    """The ONNX Runtime distributions installed in this environment, by package name."""
    found = []
    for name in _DISTRIBUTIONS:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found.append(name)
    return found


def check_runtime() -> None:
    """Raise :class:`RuntimeUnavailable` unless exactly one ONNX Runtime build is importable."""
    if importlib.util.find_spec("onnxruntime") is None:
        raise RuntimeUnavailable(
            "onnxsample needs ONNX Runtime, which is not installed: "
            "pip install 'onnxsample[cpu]' (or 'onnxsample[gpu]' on a machine with CUDA)"
        )
    found = installed_runtimes()
    if len(found) > 1:
        raise RuntimeUnavailable(
            "both onnxruntime and onnxruntime-gpu are installed; they share one module and CUDA "
            "disappears from the providers. Keep one: 'pip uninstall -y onnxruntime' for GPU use, "
            "or 'pip uninstall -y onnxruntime-gpu' for CPU use"
        )
