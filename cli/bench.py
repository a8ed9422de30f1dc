"""`onnxsample bench`: the end-to-end benchmark against the peers (``benchmarks/e2e.py``).

A thin front: it checks the flags, runs the script from the source checkout with this interpreter,
then (unless ``--no-report``) regenerates ``docs/benchmarks.md`` and ``docs/benchmarks.png``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from onnxsample.errors import InvalidParameter, OnnxSampleError

# The engines of benchmarks/e2e.py (kept in step by tests/benchmarks/test_e2e.py).
ENGINES = (
    "onnxsample",
    "onnxsample-gqa-fp32",
    "onnxsample-gguf-a0",
    "onnxsample-gguf-a4",
    "onnxsample-genai-graph",
    "optimum",
    "genai",
    "transformers",
    "llamacpp",
)
MODES = ("greedy", "sampled")


def benchmarks_dir() -> Path:
    """``benchmarks/`` of the source checkout this package runs from (absent in a wheel install)."""
    folder = Path(__file__).resolve().parent.parent / "benchmarks"
    if not (folder / "e2e.py").is_file():
        raise OnnxSampleError(
            f"no benchmarks folder at {folder}: `onnxsample bench` runs from a source checkout "
            "(git clone, then pip install -e .), not from an installed wheel"
        )
    return folder


def _names(flag: str, text: str, allowed: tuple[str, ...]) -> str:
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [n for n in names if n not in allowed]
    if not names or bad:
        raise InvalidParameter(
            f"{flag} takes a comma-separated subset of {','.join(allowed)}, got {text!r}"
        )
    return ",".join(names)


def _ints(flag: str, text: str) -> str:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise InvalidParameter(f"{flag} takes comma-separated integers >= 1, got {text!r}")
    return ",".join(map(str, values))


def bench(
    engines: Annotated[
        str, typer.Option(help="Comma-separated engines: " + ",".join(ENGINES) + ".")
    ] = ",".join(ENGINES),
    batch: Annotated[str, typer.Option(help="Comma-separated batch sizes.")] = "1,8",
    threads: Annotated[str, typer.Option(help="Comma-separated intra-op thread counts.")] = "1,2",
    modes: Annotated[str, typer.Option(help="greedy, sampled, or both.")] = "greedy,sampled",
    repeats: Annotated[int, typer.Option(help="Repetitions of each configuration.")] = 3,
    new_tokens: Annotated[int, typer.Option(help="Tokens generated per sequence.")] = 128,
    report: Annotated[
        bool,
        typer.Option(help="Regenerate docs/benchmarks.md and docs/benchmarks.png afterwards."),
    ] = True,
) -> None:
    """Benchmark decode against optimum, onnxruntime-genai, transformers (and llama.cpp): JSON to
    stdout and benchmarks/results/e2e.json. Runs from a source checkout; takes ~20 min by default."""
    args = [
        "--engines",
        _names("--engines", engines, ENGINES),
        "--batch",
        _ints("--batch", batch),
        "--threads",
        _ints("--threads", threads),
        "--modes",
        _names("--modes", modes, MODES),
    ]
    if repeats < 1:
        raise InvalidParameter(f"--repeats must be >= 1, got {repeats}")
    if new_tokens < 2:
        raise InvalidParameter(f"--new-tokens must be >= 2, got {new_tokens}")
    args += ["--repeats", str(repeats), "--new-tokens", str(new_tokens)]
    folder = benchmarks_dir()
    code = _call([sys.executable, str(folder / "e2e.py"), *args], folder.parent)
    if code == 0 and report:
        code = _call([sys.executable, str(folder / "report.py")], folder.parent)
    if code:
        raise typer.Exit(code)


def _call(argv: list[str], cwd: Path) -> int:
    """The benchmark's exit status; a SIGTERM or Ctrl-C that ends this command is passed on to it
    as a SIGTERM, so that it stops its own engines and servers (subprocess.call would SIGKILL it)."""
    with subprocess.Popen(argv, cwd=cwd) as child:
        try:
            return child.wait()
        except BaseException:
            child.terminate()
            child.wait()
            raise
