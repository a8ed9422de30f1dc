"""What every benchmark records beside its numbers: the machine, the load, package versions, memory,
and the JSON report itself (:func:`emit`).

Standard library only: the engine workers import it from other virtual environments.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

# What a run of our runtime depends on: the versions most reports record.
RUNTIME_PACKAGES = ("onnxsample", "onnxruntime", "numpy")


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded."""
    return [round(v, 2) for v in os.getloadavg()]


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# The vector extensions that decide which kernels llama.cpp (built -march=native) and ONNX
# Runtime's MLAS pick: the same CPU name can come with or without AVX-512.
_SIMD = ("avx2", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8")


def simd() -> list[str]:
    """Which of the vector extensions above this CPU has (empty where /proc/cpuinfo is absent)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return [f for f in _SIMD if f in flags]
    except OSError:
        pass
    return []


def machine() -> dict:
    """CPU, its vector extensions, core count, memory, OS and Python of this machine."""
    mem_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gb = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return {
        "cpu": cpu_model(),
        "simd": simd(),
        "cpus": os.cpu_count(),
        "memory_gb": mem_gb,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
    }


def gpus() -> list[str]:
    """The NVIDIA GPUs of this machine as ``nvidia-smi`` names them (name, memory, driver); empty
    where there is no nvidia-smi or it fails."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = "--query-gpu=name,memory.total,driver_version"
    try:
        out = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    lines = out.stdout.splitlines() if out.returncode == 0 else []
    return [line.strip() for line in lines if line.strip()]


def versions(*names: str) -> dict[str, str]:
    """Installed versions of the named distributions (missing ones are left out)."""
    found = {}
    for name in names:
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return found


def created() -> str:
    """Now, in UTC, to the second: when a report was made."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_record(load_before: list[float], *packages: str) -> dict:
    """The machine, the load average before the run (`load_before`) and now, and the versions of
    `packages`: the keys a report keeps beside its settings and results."""
    return {
        "machine": machine(),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "versions": versions(*packages),
    }


def peak_rss_mb() -> float:
    """This process's peak resident set size: VmHWM, the high-water mark of its own address space.

    ``getrusage(RUSAGE_SELF).ru_maxrss`` would carry over the parent's peak through fork + exec
    (Linux keeps it in the signal struct), so a lean worker started by a 400 MB orchestrator would
    report 400 MB; it is used only where /proc is missing.
    """
    value = _status_kb("VmHWM:")
    if value is None:
        value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(value / 1024, 1)


def _status_kb(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_mb() -> float:
    """This process's current resident set size."""
    value = _status_kb("VmRSS:")
    return round(value / 1024, 1) if value is not None else 0.0


def emit(report: dict, output: str | Path | None, tag: str) -> None:
    """Print a benchmark's JSON report to stdout and, when asked, keep it in `output` too."""
    text = json.dumps(report, indent=1)
    print(text)
    if output:
        out = Path(output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        print(f"[{tag}] wrote {out}", file=sys.stderr, flush=True)
