"""The simulated CUDA device (scripts/cuda_sim/build.sh; `make test` builds it) and the GPU exports
of the tiny model the `cuda_sim` tests run on it.

The tests run in this venv (CPU onnxruntime); each check runs `_probe.py` in the device's own venv
(onnxruntime-gpu over stand-in CUDA libraries) and reads back one JSON object.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIM = Path(os.environ.get("ONNXSAMPLE_CUDA_SIM", ROOT / ".cuda-sim"))
PROBE = Path(__file__).with_name("_probe.py")
# What the GPU tests compose: the full chain with room for every run option, on 4 slots.
CHAIN_OPTIONS = {
    "max_slots": 4,
    "top_logprobs": 3,
    "max_bias": 4,
    "prompt_logprobs": True,
    "allowed_tokens": True,
}


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    for line in (SIM / "env.sh").read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export ") :].split("#")[0].strip().partition("=")
            env[key] = value
    env.pop("PYTHONPATH", None)
    return env


class Device:
    """Runs `_probe.py` commands on the simulated device."""

    def __init__(self) -> None:
        self.python = SIM / "venv" / "bin" / "python"
        self.env = _environment()

    def probe(self, *args: str | Path, expect_ok: bool = True) -> dict:
        proc = subprocess.run(
            [str(self.python), str(PROBE), *map(str, args)],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=600,
        )
        if proc.returncode != 0 or not proc.stdout.strip():
            raise AssertionError(f"the probe failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        report = json.loads(proc.stdout)
        assert report["ok"] is expect_ok, report.get("trace") or report
        report["stderr"] = proc.stderr
        return report


@pytest.fixture(scope="session")
def device() -> Device:
    if not (SIM / "venv" / "bin" / "python").is_file() or not (SIM / "env.sh").is_file():
        pytest.skip("the simulated CUDA device is not built (make cuda-sim)")
    return Device()


@pytest.fixture(scope="session")
def gpu_models(tiny_gpu_export, tiny_gqa_export) -> dict[str, Path]:
    """The tiny model's GPU export (fp16 GQA), composed static and branching (with draft
    verification), each also greedy-only; and the CPU export (fp32 GQA) composed both ways."""
    from onnxsample.composer import compose

    folder = tiny_gpu_export.output
    variants = {
        "static": dict(static=True, **CHAIN_OPTIONS),
        "branching": dict(draft_tokens=4, **CHAIN_OPTIONS),
        "static-greedy": dict(chain="", static=True, max_slots=4),
        "branching-greedy": dict(chain="", max_slots=4),
    }
    models = {"folder": folder}
    for name, options in variants.items():
        models[name] = _composed(compose, folder, folder / f"composed-{name}.onnx", options)
    cpu = tiny_gqa_export.output
    models["cpu-shaped"] = _composed(
        compose, cpu, cpu / "composed-cuda-probe.onnx", dict(CHAIN_OPTIONS)
    )
    models["cpu-shaped-static"] = _composed(
        compose, cpu, cpu / "composed-cuda-probe-static.onnx", dict(static=True, **CHAIN_OPTIONS)
    )
    return models


def _composed(compose, source: Path, target: Path, options: dict) -> Path:
    options = dict(options)
    chain = options.pop("chain", None)
    return compose(source, chain, target, **options)
