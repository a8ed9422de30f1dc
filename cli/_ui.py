"""Terminal output shared by the commands: consoles, stage progress, sizes."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

# Results go to stdout; progress, logs and errors to stderr so that stdout stays parseable.
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


class ReaderGone(BaseException):
    """stdout's reader went (``| head``): the command ends quietly with 141, as SIGPIPE ends a
    process (not an OSError: click and typer would make it status 1)."""


def write(text: str) -> None:
    """`text` on stdout as it is, at once (a pipe reads an answer as it comes); no markup, emoji
    codes or control characters rewritten, as a console would."""
    if sys.stdout is None:  # started with stdout closed (>&-): nobody reads it
        raise ReaderGone
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise ReaderGone from None


# The stages' labels: an export's (exporters.STAGES) and a composition's (composer.STAGES), as
# `export` and `compose` show them; `run` and `serve`, which may take both first, prefix the
# composition's.
EXPORT_LABELS = {
    "check": "Checking the source",
    "load": "Loading the tokenizer and weights",
    "export": "Writing the ONNX graph with a KV cache",
    "verify": "Verifying greedy tokens against transformers",
}
COMPOSE_LABELS = {
    "read": "Loading and checking the model",
    "splice": "Splicing the sampler chain after the logits",
    "check-gather": "Checking the gather before the LM head",
    "save": "Saving and checking the composed model",
}
PREPARE_LABELS = EXPORT_LABELS | {
    k: f"Composing: {v[0].lower()}{v[1:]}" for k, v in COMPOSE_LABELS.items()
}


def human_bytes(n: int | float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


@contextlib.contextmanager
def stages(labels: dict[str, str]) -> Iterator:
    """A progress display with one spinner line per stage; yields the `progress(stage)` callback."""
    progress = Progress(
        SpinnerColumn(finished_text="[green]✓"),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )
    current: list[TaskID] = []

    def advance(stage: str) -> None:
        if current:
            progress.update(current[-1], total=1, completed=1)
        current.append(progress.add_task(labels.get(stage, stage), total=None))

    progress.start()
    try:
        yield advance
    except BaseException:
        # The error line that follows is all the user needs, and its first line: the stages are
        # wiped (on a terminal), and Progress.stop() is not called, which off a terminal (a pipe,
        # a log file) ends with an empty line.
        progress.live.transient = True
        progress.live.stop()
        raise
    if current:
        progress.update(current[-1], total=1, completed=1)
    progress.stop()
