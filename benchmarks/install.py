"""What a deployment installs and how fast it starts: JSON.

    python benchmarks/install.py [--old-site DIR] [--repeats 5]

- the size of a fresh venv with `onnxsample[cpu]` alone and with `[cpu,export]` (both installed
  from constraints.txt; pip and setuptools included, as a user's venv has them);
- the wall time of a cold `onnxsample run COMPOSED -p hi -n 1` (a new process: imports, session,
  tokenizer, prefill, one token) in the runtime venv and in the full one;
- the time of `import onnxsample`, over an empty interpreter's start.

With ``--old-site`` (a folder holding the previous release's package) the full venv also runs the
previous release, whose runtime imported transformers for its tokenizer: the "before" column.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness.machine import emit, load_average, machine
from _harness.script import RESULTS, ROOT, parser
from _harness.workload import closed_batch_graph


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _venv(where: Path, extras: str) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    pip = [str(where / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-c", str(ROOT / "constraints.txt"), f"{ROOT}[{extras}]"], check=True)
    return where


def _median_wall(argv: list[str], repeats: int, env: dict | None = None, cwd: str = "/") -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, env=env, cwd=cwd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times), 3)


def _cold_run(python: Path, composed: Path, repeats: int, site: str | None = None) -> float:
    code = "from onnxsample.cli import main; main()"
    argv = [str(python), "-c", code, "run", str(composed), "-p", "hi", "-n", "1", "--no-stream"]
    env = {**os.environ, "PYTHONPATH": site} if site else None
    return _median_wall(argv, repeats, env, cwd=site or "/")


def _import_time(python: Path, repeats: int, site: str | None = None) -> float:
    env = {**os.environ, "PYTHONPATH": site} if site else None
    bare = _median_wall([str(python), "-c", "pass"], repeats, env, cwd=site or "/")
    full = _median_wall([str(python), "-c", "import onnxsample"], repeats, env, cwd=site or "/")
    return round(full - bare, 3)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--old-site", help="folder with the previous release's package")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--output", default=str(RESULTS / "install.json"))
    args = p.parse_args()
    composed = closed_batch_graph()  # no prompt logprobs: the previous release runs it
    report: dict = {"benchmark": "install", "model": composed.name, "repeats": args.repeats}
    with tempfile.TemporaryDirectory() as tmp:
        runtime = _venv(Path(tmp) / "cpu", "cpu")
        report["venv_mb"] = {"cpu": round(_du(runtime) / 2**20)}
        full = _venv(Path(tmp) / "full", "cpu,export")
        report["venv_mb"]["cpu,export"] = round(_du(full) / 2**20)
        shutil.rmtree(full)
        cold = _cold_run(runtime / "bin/python", composed, args.repeats)
        report["cold_run_s"] = {"runtime venv": cold}
        report["import_s"] = {"runtime venv": _import_time(runtime / "bin/python", args.repeats)}
    dev = ROOT / ".venv" / "bin" / "python"
    report["cold_run_s"]["full venv"] = _cold_run(dev, composed, args.repeats)
    report["import_s"]["full venv"] = _import_time(dev, args.repeats)
    if args.old_site:
        before = _cold_run(dev, composed, args.repeats, args.old_site)
        report["cold_run_s"]["before (full venv)"] = before
        report["import_s"]["before (full venv)"] = _import_time(dev, args.repeats, args.old_site)
    report |= {"machine": machine(), "load": load_average()}
    emit(report, args.output, "install")


if __name__ == "__main__":
    main()
