"""The install a deployment takes: `pip install onnxsample[cpu]` alone, no torch, no transformers.

A fresh virtual environment (kept in artifacts/cache/, keyed by pyproject.toml and constraints.txt;
the package itself is reinstalled each session) runs compose, inspect and run on an export made
elsewhere, and says which extra to install for what it lacks.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "artifacts" / "cache"

pytestmark = pytest.mark.slow


def _key() -> str:
    blob = b"".join((ROOT / name).read_bytes() for name in ("pyproject.toml", "constraints.txt"))
    return hashlib.sha256(blob + sys.version.encode()).hexdigest()[:12]


@pytest.fixture(scope="session")
def runtime_venv(tmp_path_factory) -> Path:
    """A venv with `.[cpu]` from the constraints; the package installed as a wheel, not editable."""
    venv = CACHE / f"runtime-venv-{_key()}"
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if not (venv / ".complete").is_file():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([*pip, "-c", str(ROOT / "constraints.txt"), f"{ROOT}[cpu]"], check=True)
        (venv / ".complete").touch()
    build = tmp_path_factory.mktemp("wheel-build")  # a copy: the build writes into the tree
    shutil.copytree(
        ROOT,
        build / "src",
        ignore=shutil.ignore_patterns(".venv*", "artifacts", ".git", "*.egg-info", "build"),
    )
    subprocess.run([*pip, "--no-deps", "--force-reinstall", str(build / "src")], check=True)
    return venv


def _run(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["ONNXSAMPLE_CACHE"] = str(cwd / "cache")
    return subprocess.run(
        [str(venv / "bin" / "onnxsample"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_runtime_installs_without_the_exporter_stack(runtime_venv):
    code = (
        "import importlib.util as u, sys, onnxsample;"
        "print([m for m in ('torch', 'transformers', 'optimum', 'netron') if u.find_spec(m)]);"
        "print([m for m in ('onnxruntime', 'tokenizers', 'jinja2') if not u.find_spec(m)]);"
        "print(onnxsample.__file__)"
    )
    out = subprocess.run(
        [str(runtime_venv / "bin" / "python"), "-c", code],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    )
    missing, present, where = out.stdout.splitlines()
    assert missing == "[]" and present == "[]"
    assert str(runtime_venv) in where  # the installed wheel, not this checkout


def test_compose_inspect_and_run_on_an_export_made_elsewhere(
    runtime_venv, tiny_gqa_export, tmp_path
):
    folder = tmp_path / "export"
    shutil.copytree(tiny_gqa_export.output, folder)
    composed = folder / "c.onnx"
    done = _run(runtime_venv, "compose", str(folder), "-o", str(composed), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    done = _run(runtime_venv, "inspect", str(composed), cwd=tmp_path)
    assert done.returncode == 0 and "sampler chain" in done.stdout, done.stderr
    done = _run(
        runtime_venv, "run", str(composed), "-p", "Hello", "-n", "6", "--json", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert '"finish_reason"' in done.stdout and "decode" in done.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["export", "-o", "out"], "exporting needs the export extra"),
        (["run", "-p", "hi"], "pip install 'onnxsample[export]'"),  # the embedded model: an export
        (["inspect", "MODEL", "--netron", "--no-browser"], "pip install 'onnxsample[viz]'"),
        (["serve", "MODEL"], "pip install 'onnxsample[serve]'"),
    ],
)
def test_what_the_runtime_lacks_names_the_extra(
    runtime_venv, tiny_gqa_export, tmp_path, argv, message
):
    argv = [str(tiny_gqa_export.model_path) if a == "MODEL" else a for a in argv]
    done = _run(runtime_venv, *argv, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_the_gpu_extra_brings_what_the_cuda_provider_loads(runtime_venv, tmp_path):
    """`pip install onnxsample[gpu]` in a fresh venv: onnxruntime-gpu with the CUDA 13 runtime,
    cuBLAS and cuDNN 9 (the sampler's float reductions need cuDNN), and never onnxruntime itself.
    Resolved by pip (a dry run: the ~2 GB of NVIDIA wheels are not downloaded)."""
    import json

    report = tmp_path / "report.json"
    pip = [str(runtime_venv / "bin" / "python"), "-m", "pip", "install", "-q", "--dry-run"]
    subprocess.run(
        [
            *pip,
            "--ignore-installed",
            "--disable-pip-version-check",
            "--report",
            str(report),
            "-c",
            str(ROOT / "constraints.txt"),
            f"{ROOT}[gpu]",
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    wanted = {"onnxruntime-gpu", "nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cudnn-cu13"}
    assert wanted <= names, sorted(names)
    assert "onnxruntime" not in names
