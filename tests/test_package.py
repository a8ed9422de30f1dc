"""Packaging: the import layout and the runtime check."""

from __future__ import annotations

import subprocess
import sys

import pytest

import onnxsample


@pytest.mark.parametrize("module", ["onnxsample.graphs", "onnxsample.exporters", "onnxsample.cli"])
def test_subpackages_import_under_onnxsample(module):
    __import__(module)
    assert sys.modules[module].__name__ == module


def test_public_names_are_curated():
    assert "InvalidParameter" in onnxsample.__all__
    assert all(hasattr(onnxsample, name) for name in onnxsample.__all__)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("sys.modules['onnxruntime'] = None\nimport onnxsample", "pip install 'onnxsample[cpu]'"),
        (
            "import onnxsample._ort as o\n"
            "o.installed_runtimes = lambda: ['onnxruntime', 'onnxruntime-gpu']\n"
            "o.check_runtime()",
            "both onnxruntime and onnxruntime-gpu are installed",
        ),
    ],
)
def test_runtime_check_names_the_extra(setup, message):
    body = "\n".join("    " + line for line in setup.splitlines())
    code = f"import sys\ntry:\n{body}\nexcept ImportError as e:\n    print(e)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert message in proc.stdout, proc.stdout + proc.stderr


def test_running_a_composed_model_imports_no_graph_builder():
    """`import onnxsample` and the engine load neither onnxscript (graph building) nor the
    exporter stack; compose and friends load on first use."""
    code = (
        "import sys, onnxsample, onnxsample.engine, onnxsample.cli;"
        "print(sorted(m for m in ('onnxscript', 'onnx_ir', 'sympy', 'torch', 'transformers',"
        " 'optimum') if m in sys.modules));"
        "onnxsample.compose; print('onnxscript' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "True"], out.stdout + out.stderr
