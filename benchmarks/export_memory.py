"""What an export (or a composition) costs: its peak memory and time beside the source's size, JSON.

    python benchmarks/export_memory.py [SOURCE ...] [--command compose] [--option ARG ...]
        [--repeats 3] [--old-site DIR [--old-label TEXT]] [--output FILE]

Each SOURCE (a GGUF file or an HF folder; default: the embedded SmolLM2 GGUF) is exported by
``onnxsample export SOURCE -o TMP -f --verify-tokens 0`` plus the ``--option`` arguments (for
instance ``--option=--device --option=cuda``) in a process of its own, ``--repeats`` times: the
process's peak resident set (its ``ru_maxrss``, which counts the mapped source's pages it
touched) and its wall time, median, min and max; the source's bytes and the export's
(``model.onnx`` and ``model.onnx.data``), and the peak over the source's bytes.

With ``--command compose`` each SOURCE is an export folder, composed by ``onnxsample compose
SOURCE -o TMP/composed.onnx`` plus the options (output ``benchmarks/results/compose_memory.json``);
the output's bytes are the composed file's. ``--one-file`` first re-saves each export as one
``model.onnx`` holding every weight (as optimum writes a model under 2 GB; output
``benchmarks/results/compose_memory_one_file.json``), its row named ``NAME (one file)``.

With ``--old-site DIR`` (another onnxsample installed there, e.g. a previous release:
``pip install --no-deps --target DIR onnxsample==X``) each source is exported by that package
too, alternated with this checkout's, and each row gets ``vs_old``: this checkout's median peak
and time over the other's.
An editable install (``pip install -e``) puts an import hook before every import, which
slows the exporter's thousands of imports: to compare times, run this checkout installed too
(``PYTHONPATH=DIR2 python benchmarks/export_memory.py ...`` from outside the checkout).

JSON to stdout and ``--output`` (default ``benchmarks/results/export_memory.json``), with the
machine, the versions and the load average.
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

from _harness.machine import emit, load_average, run_record
from _harness.script import RESULTS, logger, parser

from onnxsample.exporters.embedded import embedded_gguf


def _bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


_OUTPUTS = {
    "export": ["model/model.onnx", "model/model.onnx.data"],
    "compose": ["composed.onnx", "composed.onnx.data"],
}


def export_once(
    source: Path, options: list[str], site: str | None, command: str = "export"
) -> dict:
    """One export (or composition) in a new process: its peak RSS (MB), wall seconds and the
    output's bytes."""
    out = Path(tempfile.mkdtemp(prefix="export-memory-"))
    argv = [sys.executable, *(["-P"] if site else []), "-m", "onnxsample", command, str(source)]
    if command == "export":
        argv += ["-o", str(out / "model"), "-f", "--verify-tokens", "0", *options]
    else:
        argv += ["-o", str(out / "composed.onnx"), *options]
    env = {**os.environ, "PYTHONPATH": site} if site else None
    try:
        with open(out / "log", "wb") as said:
            start = time.perf_counter()
            child = subprocess.Popen(argv, env=env, stdout=said, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(child.pid, 0)
            wall = time.perf_counter() - start
            child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        if child.returncode != 0:
            tail = (out / "log").read_text(errors="replace")[-2000:]
            raise SystemExit(f"the {command} of {source} failed:\n{tail}")
        weights = [out / name for name in _OUTPUTS[command]]
        return {
            "peak_mb": round(usage.ru_maxrss / 1024, 1),
            "seconds": round(wall, 2),
            "export_bytes": sum(p.stat().st_size for p in weights if p.is_file()),
        }
    finally:
        shutil.rmtree(out, ignore_errors=True)


def one_file(folder: Path, into: Path) -> Path:
    """A copy of the export `folder` in `into` whose model.onnx holds every weight (re-saved by
    a process of its own: a child's peak counts its parent's resident set at the fork)."""
    copy = into / f"{folder.name} (one file)"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.data", "composed.onnx*"))
    resave = "import onnx, sys; onnx.save(onnx.load(sys.argv[1]), sys.argv[2])"
    subprocess.run(
        [sys.executable, "-c", resave, str(folder / "model.onnx"), str(copy / "model.onnx")],
        check=True,
    )
    return copy


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(
    source: Path,
    options: list[str],
    repeats: int,
    old_site: str | None,
    log,
    command: str = "export",
) -> dict:
    """`repeats` runs of `command` on `source` by this checkout (and by `old_site`'s package,
    alternated)."""
    sides = {"ours": None, **({"old": old_site} if old_site else {})}
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for i in range(repeats):
        for side, site in sides.items():
            runs[side].append(export_once(source, options, site, command))
            log(f"{source.name} {' '.join(options)} {side} #{i + 1}: {runs[side][-1]}")
    size = _bytes(source)
    row: dict = {"source": source.name, "options": options, "source_bytes": size}
    for side, done in runs.items():
        peak = _summary([r["peak_mb"] for r in done])
        row[side] = {
            "peak_mb": peak,
            "seconds": _summary([r["seconds"] for r in done]),
            "export_bytes": done[-1]["export_bytes"],
            "peak_over_source": round(peak["median"] * 2**20 / size, 2),
        }
    if old_site:
        row["vs_old"] = {
            key: round(row["ours"][key]["median"] / row["old"][key]["median"], 3)
            for key in ("peak_mb", "seconds")
        }
    return row


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument(
        "sources", nargs="*", type=Path, help="GGUF files or HF folders (compose: export folders)"
    )
    p.add_argument("--command", choices=sorted(_OUTPUTS), default="export")
    p.add_argument("--option", action="append", default=[], help="an argument of export")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--old-site", help="a folder holding another onnxsample to compare with")
    p.add_argument("--old-label", help="what --old-site holds, for the report (default: its path)")
    p.add_argument("--one-file", action="store_true", help="compose: each export as one file")
    p.add_argument("--output", type=Path, help="default: benchmarks/results/COMMAND_memory.json")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats takes at least 1")
    if args.command == "compose" and not args.sources:
        p.error("compose measures export folders: name at least one")
    if args.one_file and args.command != "compose":
        p.error("--one-file re-saves export folders: it goes with --command compose")
    suffix = "_one_file" if args.one_file else ""
    output = args.output or RESULTS / f"{args.command}_memory{suffix}.json"
    log = logger("export_memory")
    load_before = load_average()
    sources = args.sources or [embedded_gguf()]
    with tempfile.TemporaryDirectory(prefix="one-file-") as scratch:
        if args.one_file:
            sources = [one_file(s, Path(scratch)) for s in sources]
        rows = [
            measure(s, args.option, args.repeats, args.old_site, log, args.command) for s in sources
        ]
    emit(
        {
            "benchmark": f"{args.command}_memory",
            "command": args.command,
            "repeats": args.repeats,
            "old_site": args.old_site,
            "old_label": args.old_label or args.old_site,
            "results": rows,
            "run": run_record(load_before, "onnxsample", "onnx-ir", "onnxruntime", "numpy"),
        },
        output,
        f"{args.command}_memory",
    )


if __name__ == "__main__":
    main()
