"""The benchmark tests' loader: :func:`bench` gives a script or module of benchmarks/ as a module."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    """Load benchmarks/NAME.py (or a dotted module of benchmarks/, ``_harness.tables``) as a module,
    leaving sys.path as it was (the scripts import their siblings and the harness as top-level
    modules, as they do when run from benchmarks/)."""
    saved = list(sys.path)
    sys.path.insert(0, str(BENCH))
    try:
        if "." in name:
            return importlib.import_module(name)
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = saved


@pytest.fixture
def bench() -> Callable[[str], ModuleType]:
    """``bench("report")``: benchmarks/report.py as a module; ``bench("_harness.tables")``."""
    return _load


@pytest.fixture
def bench_dir() -> Path:
    """The benchmarks/ folder."""
    return BENCH
