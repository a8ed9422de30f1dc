"""What each benchmark script does around its measurement: where things are, its command line
(description, comma-separated integers), its progress lines on stderr, reading results back.

Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
ROOT = BENCHMARKS.parent
RESULTS = BENCHMARKS / "results"


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser described by the first paragraph of a script's docstring."""
    return argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])


def ints(text: str, flag: str) -> list[int]:
    """Comma-separated integers >= 1 given to ``--flag``; a usage error otherwise."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"--{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"--{flag} takes integers >= 1, got {text!r}")
    return values


def logger(tag: str) -> Callable[[object], None]:
    """A function that prints its argument to stderr as ``[tag] ...``, flushed."""

    def log(message: object) -> None:
        print(f"[{tag}] {message}", file=sys.stderr, flush=True)

    return log


def read_json(path: Path) -> dict | None:
    """A results file, or None where it is missing."""
    return json.loads(path.read_text()) if path.is_file() else None
