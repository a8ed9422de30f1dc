"""From a cold process to the first token: our engine against llama-server on the same GGUF file.

    python benchmarks/startup.py                        # gemma3 and smollm2, 2 threads, 3 runs
    python benchmarks/startup.py --models gemma3 --old-site DIR --old-label TEXT

Models as ``gguf_files.py`` names them (``gemma3``, ``smollm2``, ``llama256``, ``NAME:MIX``, a
path). Ours: the file exported and composed once beforehand (``onnxsample.prepare``, as ``run``
and ``serve`` find them in their cache), then a new Python process imports onnxsample, builds an
``Engine`` on the composed model (the ONNX Runtime session and the tokenizer) and decodes one
greedy token of a short prompt; and ``onnxsample run FILE -p PROMPT -n 1`` is timed from its
process's start to its exit (the engine's load, the check that the cached export is the file's,
one token). The peer: a new llama-server process (built from the
llama-cpp-python sdist, one slot) on the same file until ``/health`` answers, then one
``/completion`` of one token. Both with ``--threads``; *ready* is the time from the process's
start to a model that can take a request, *first token* to the first token's answer, as the
parent process measures them (the system-wide monotonic clock). The runs alternate, each side
first in turn, a second apart; medians and spreads over ``--repeats``.

``--old-site DIR`` (another onnxsample installed there, e.g. a previous commit's: ``pip install
--no-deps --target DIR .``) adds that package's engine, on the model its own ``prepare`` composes
from a copy of the same export (the same options as ours). Output: stdout and ``--output`` (``benchmarks/results/startup.json``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _harness.machine import emit, load_average, run_record
from _harness.script import RESULTS, ROOT, logger, parser
from gguf_models import built_llama_cpp, gguf_path

log = logger("startup")
PROMPT = "The capital of France is"
_SETTLE = 1.0  # seconds between runs: the previous process's exit (its unmapped pages) settles

# The child: one engine, one greedy token; it prints the monotonic clock at each point.
_PROBE = """
import json, sys, time
from pathlib import Path
import onnxsample
engine = onnxsample.Engine(Path(sys.argv[1]), threads=int(sys.argv[2]), tokenizer=Path(sys.argv[3]))
ready = time.monotonic()
greedy = onnxsample.SamplingParams(temperature=0.0)
engine.submit(sys.argv[4], greedy, max_new_tokens=1, chat=False).result()
print(json.dumps({"ready": ready, "first_token": time.monotonic()}), flush=True)
engine.close()
"""


def _ours(model: Path, folder: Path, threads: int, site: str | None) -> dict:
    env = {**os.environ, "PYTHONPATH": site} if site else None
    argv = [sys.executable, *(["-P"] if site else []), "-c", _PROBE]
    start = time.monotonic()
    done = subprocess.run(
        [*argv, str(model), str(threads), str(folder), PROMPT],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),  # not the checkout: `-P` keeps its package off the path
    )
    if done.returncode:
        raise SystemExit(f"the engine failed:\n{done.stderr[-2000:]}")
    stamps = json.loads(done.stdout.strip().splitlines()[-1])
    return {k: round(stamps[k] - start, 3) for k in ("ready", "first_token")}


# `onnxsample run` as a user types it, in a new process; its cache named by ONNXSAMPLE_CACHE.
_CLI = "import sys; from onnxsample.cli import main; sys.argv[0] = 'onnxsample'; main()"


def _run_command(path: Path, threads: int, site: str | None, cache: Path | None) -> float:
    """Seconds from a new process's start to the exit of ``onnxsample run FILE -p PROMPT -n 1``
    (the export and composed model already in its cache: the engine's load, the check that the
    cached export is the file's, the prompt, one token, the exit)."""
    env = {**os.environ, **({"PYTHONPATH": site} if site else {})}
    if cache is not None:
        env["ONNXSAMPLE_CACHE"] = str(cache)
    argv = [sys.executable, *(["-P"] if site else []), "-c", _CLI, "run", str(path)]
    argv += ["-p", PROMPT, "-n", "1", "--seed", "1", "--threads", str(threads)]
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    if done.returncode:
        raise SystemExit(f"onnxsample run failed:\n{done.stderr[-2000:]}")
    return round(time.monotonic() - start, 3)


def _llama(built, path: Path, threads: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = [str(built.tool("llama-server")), "-m", str(path), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "-t", str(threads), "-c", "4096", "-np", "1"]
    cmd += ["--no-webui", "--log-disable"]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ready = _healthy(proc, url)
        body = json.dumps({"prompt": PROMPT, "n_predict": 1, "temperature": 0.0}).encode()
        request = urllib.request.Request(
            url + "/completion", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=300) as r:
            r.read()
        first = time.monotonic()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"ready": round(ready - start, 3), "first_token": round(first - start, 3)}


def _healthy(proc: subprocess.Popen, url: str) -> float:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("llama-server exited before it was healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic()
        except OSError:
            time.sleep(0.01)
    raise SystemExit("llama-server was not healthy in 300 s")


def _summary(runs: list[dict], key: str) -> dict:
    values = [r[key] for r in runs]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _composed_by(site: str, folder: Path, scratch: Path) -> Path:
    """`folder` composed as ``run`` composes it (``prepare``) by the onnxsample installed in
    `site`, in a copy of the folder (the composed file goes beside the export)."""
    copy = scratch / folder.name
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("composed*"))
    code = "import sys, onnxsample; print(onnxsample.prepare(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-P", "-c", code, str(copy)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": site},
        cwd=tempfile.gettempdir(),
    )
    if done.returncode:
        raise SystemExit(f"{site}'s prepare failed:\n{done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def measure(name: str, threads: int, repeats: int, old_site: str | None, scratch: Path) -> dict:
    import onnxsample

    path = gguf_path(name)
    composed = onnxsample.prepare(path)
    folder = composed.parent
    sides = {"ours": (composed, None)}
    caches: dict[str, Path | None] = {"ours": None}  # ours: the user cache prepare() filled
    if old_site:
        sides["old"] = (_composed_by(old_site, folder, scratch), old_site)
        caches["old"] = scratch / f"{name}-old-cache"
        _run_command(path, threads, old_site, caches["old"])  # its export and composed model
    built = built_llama_cpp()
    runs: dict[str, list[dict]] = {side: [] for side in [*sides, "llama-server"]}
    order = [*sides, "llama-server"]
    for i in range(repeats):
        for side in order[i % len(order) :] + order[: i % len(order)]:  # each goes first in turn
            time.sleep(_SETTLE)
            if side == "llama-server":
                runs[side].append(_llama(built, path, threads))
            else:
                model, site = sides[side]
                runs[side].append(_ours(model, folder, threads, site))
                time.sleep(_SETTLE)
                runs[side][-1]["run_command"] = _run_command(path, threads, site, caches[side])
        log(f"{name} #{i + 1}: " + ", ".join(f"{k} {v[-1]}" for k, v in runs.items()))
    row = {
        "model": name,
        "file": path.name,
        "file_bytes": path.stat().st_size,
        "composed_bytes": composed.stat().st_size,
        "threads": threads,
    }
    for side, done in runs.items():
        keys = ("ready", "first_token") + (("run_command",) if side in sides else ())
        row[side] = {key: _summary(done, key) for key in keys}
    return row


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument("--models", default="gemma3,smollm2")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--old-site", help="a folder holding another onnxsample to compare with")
    p.add_argument("--old-label", help="what --old-site holds, for the report")
    p.add_argument("--output", type=Path, default=RESULTS / "startup.json")
    args = p.parse_args(argv)
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="startup-") as scratch:
        rows = [
            measure(m, args.threads, args.repeats, args.old_site, Path(scratch))
            for m in args.models.split(",")
        ]
    emit(
        {
            "benchmark": "startup",
            "prompt": PROMPT,
            "repeats": args.repeats,
            "old_site": args.old_site,
            "old_label": args.old_label or args.old_site,
            "results": rows,
            "run": run_record(load_before, "onnxsample", "onnxruntime", "tokenizers"),
        },
        args.output,
        "startup",
    )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "benchmarks"))
    main()
