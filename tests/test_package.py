"""Packaging: the import layout and the runtime check."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import onnxsample


@pytest.mark.parametrize("module", ["onnxsample.graphs", "onnxsample.exporters", "onnxsample.cli"])
def test_subpackages_import_under_onnxsample(module):
    __import__(module)
    assert sys.modules[module].__name__ == module


PUBLIC = [
    "Completion",
    "ComposedMetadata",
    "Constraint",
    "ContextExceeded",
    "Engine",
    "EngineClosed",
    "ExportError",
    "GenerationError",
    "Generator",
    "InvalidParameter",
    "ModelError",
    "OnnxSampleError",
    "OutOfMemory",
    "PromptProgress",
    "QueueFull",
    "Request",
    "RuntimeUnavailable",
    "SamplerChain",
    "SamplingParams",
    "StreamEvent",
    "Timings",
    "Tokenizer",
    "__version__",
    "build_sampler_model",
    "compose",
    "composed_metadata",
    "inspect_model",
    "pack_sampling_params",
    "prepare",
    "sampler_feeds",
]
# Module paths users import (README, docs), each with a name it must give.
PATHS = [
    ("onnxsample.composer", "compose"),
    ("onnxsample.engine", "Engine"),
    ("onnxsample.engine", "Generator"),
    ("onnxsample.exporters", "export"),
    ("onnxsample.graphs", "build_chain_function"),
    ("onnxsample.serve", "create_app"),
    ("onnxsample.serve.replicas", "build_application"),
    ("onnxsample.text", "Tokenizer"),
]


def test_the_public_api_is_what_it_was():
    assert sorted(onnxsample.__all__) == PUBLIC
    assert callable(onnxsample.compose) and onnxsample.compose.__module__.startswith(
        "onnxsample.composer"
    )


@pytest.mark.parametrize(("module", "name"), PATHS)
def test_documented_module_paths_import(module, name):
    assert hasattr(__import__(module, fromlist=[name]), name)


def test_prepare_stays_the_function_when_its_module_is_imported_first():
    """`onnxsample.prepare` shares its module's name: importing the module must not leave the
    package's attribute pointing at the module."""
    code = "import onnxsample.prepare, onnxsample; print(callable(onnxsample.prepare))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True"], out.stdout + out.stderr


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


ROOT = Path(__file__).resolve().parents[1]
# Each room and the parts of the package it may import (besides itself); "contract" is the shared
# top: chain, params, metadata, errors, and its private helpers (_wire: protobuf's wire format,
# which metadata reads with; _memory: the heap trim; _process: whether a process runs;
# _gguf_file: whether a file is a GGUF).
# docs/design.md draws the same picture.
_CONTRACT = {
    "chain", "constraint", "params", "metadata", "errors", "_wire", "_memory", "_process",
    "_gguf_file",
}  # fmt: skip
_ALLOWED = {
    "onnxsample/text": {"errors"},
    "onnxsample/engine": _CONTRACT | {"text"},
    "onnxsample/composer": _CONTRACT | {"graphs"},
    "onnxsample/serve": _CONTRACT | {"engine", "text"},
    "graphs": {"chain", "graphs"},
    # a GGUF's tokenizer is written from its metadata and read back as the runtime reads it
    "exporters": {"errors", "text", "_process", "_gguf_file"},
}
_ROOM_NAME = {"graphs": "graphs", "exporters": "exporters"}


def _imported_parts(folder: Path) -> dict[str, set[str]]:
    """`onnxsample.X` for every X each module of `folder` imports (at any depth in the module)."""
    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                parts = name.split(".")
                if parts[0] == "onnxsample" and len(parts) > 1:
                    found.setdefault(parts[1], set()).add(path.relative_to(ROOT).as_posix())
    return found


@pytest.mark.parametrize("room", sorted(_ALLOWED))
def test_imports_point_one_way(room):
    """The engine never imports the composer nor the composer the engine; text needs only errors."""
    own = _ROOM_NAME.get(room, room.split("/")[-1])
    used = _imported_parts(ROOT / room)
    stray = {part: files for part, files in used.items() if part not in _ALLOWED[room] | {own}}
    assert not stray, f"{room} imports beyond its room: {stray}"
