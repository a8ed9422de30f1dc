"""The `onnxsample` command line: one module per command, errors printed in one place (:func:`main`)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import typer

from onnxsample.cli import _options as opt
from onnxsample.cli._ui import ReaderGone, err
from onnxsample.cli.bench import bench
from onnxsample.cli.compose import compose
from onnxsample.cli.export import export
from onnxsample.cli.inspect import inspect
from onnxsample.cli.run import run
from onnxsample.cli.serve import serve

__all__ = ["app", "main"]

app = typer.Typer(
    name="onnxsample",
    help="LLM sampling inside the ONNX graph: export a model, compose a sampler chain after its "
    "logits, run it with ONNX Runtime, serve it over OpenAI's API, inspect the result.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(verbose: opt.Verbose = False) -> None:
    if verbose:
        from rich.logging import RichHandler

        logging.basicConfig(
            level=logging.INFO,
            format="%(message)s",
            handlers=[RichHandler(console=err, show_path=False)],
        )


app.command(no_args_is_help=False)(export)
app.command(no_args_is_help=True)(compose)
app.command(no_args_is_help=True)(inspect)
app.command(no_args_is_help=True)(run)
app.command(no_args_is_help=False)(serve)
app.command(no_args_is_help=False)(bench)


class _Terminated(BaseException):
    """SIGTERM (`kill`, `timeout`, `docker stop`), raised where the command is so that what it
    was writing is cleaned up as for Ctrl-C (an export's staging folder, a partial composition)."""


def _terminate(_signum: int, _frame: object) -> None:
    raise _Terminated


def main(argv: list[str] | None = None) -> None:
    """Entry point: run a command; any error a user can cause becomes one line and exit status 1;
    Ctrl-C ends it with status 130, SIGTERM with 143, each after the command's own clean-up; a
    closed stdout (``| head``) with 141, quietly, as SIGPIPE ends a process.
    (`serve` hands both signals to its server while it serves.)"""
    from onnxsample.errors import OnnxSampleError

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        code = app(args=argv, prog_name="onnxsample", standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except ReaderGone:  # stdout's reader went (`| head`): quietly, as SIGPIPE ends llama-cli
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        sys.exit(141)
    except typer.TyperException as exc:  # usage errors: unknown option, bad value, ...
        _error(exc.format_message())
    except (typer.Abort, KeyboardInterrupt):
        err.print("[red]interrupted[/]")
        sys.exit(130)
    except _Terminated:
        err.print("[red]terminated[/]")
        sys.exit(143)
    except OnnxSampleError as exc:
        _error(str(exc))
    finally:
        if main_thread and previous is not None:  # None: a handler set outside Python
            signal.signal(signal.SIGTERM, previous)
    if code == 130:  # typer returns a KeyboardInterrupt as this status
        err.print("[red]interrupted[/]")
    sys.exit(code if isinstance(code, int) else 0)


def _error(message: str) -> None:
    """The one place errors reach the user: `error: <one line>` on stderr, exit status 1."""
    from rich.markup import escape

    line = escape(" ".join(message.split()))  # "onnxsample[export]" is text, not markup
    err.print(f"[red]error:[/] {line}", markup=True, highlight=False, soft_wrap=True)
    sys.exit(1)
