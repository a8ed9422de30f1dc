"""Writing an export folder safely: staged next to the target, moved into place only when complete."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from onnxsample.errors import ExportError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def free_bytes(path: Path) -> int:
    """Free space on the filesystem that holds `path` (its nearest existing parent)."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def check_output(output: Path) -> None:
    """Refuse outputs that can never become an export folder, before any work is done."""
    if output.exists() and not output.is_dir():
        raise ExportError(f"cannot write the export to {output}: it is a file, not a folder")
    parent = output.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ExportError(f"cannot write the export to {output}: {parent} is not a folder")


def check_disk(output: Path, need: int) -> None:
    free = free_bytes(output.parent)
    if free < need:
        raise ExportError(
            f"not enough disk space in {output.parent}: the export needs about {need / 1e9:.1f} GB, "
            f"{free / 1e9:.1f} GB are free"
        )


_OWNER = ".owner"


@contextlib.contextmanager
def staged_folder(output: Path) -> Iterator[Path]:
    """A temporary folder beside `output`; on success it replaces `output`, on failure it vanishes.

    A process killed mid-export (no `finally` runs) leaves its staging folder behind: the next
    export of the same output removes those whose process is gone (each records its pid)."""
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(output)
        stage = Path(
            tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".partial", dir=output.parent)
        )
        stage.chmod(0o777 & ~_umask())  # mkdtemp makes it private; the export is an ordinary folder
        (stage / _OWNER).write_text(str(os.getpid()))
    except OSError as exc:
        raise ExportError(f"cannot write to {output.parent}: {exc.strerror or exc}") from exc
    try:
        yield stage
        (stage / _OWNER).unlink(missing_ok=True)
        old = None
        if output.exists():
            old = output.with_name(f".{output.name}.old-{stage.name.split('.')[-2]}")
            output.rename(old)
        stage.rename(output)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)


def _remove_abandoned(output: Path) -> None:
    """Staging folders of `output` left by processes that no longer run."""
    for stage in output.parent.glob(f".{output.name}.*.partial"):
        try:
            pid = int((stage / _OWNER).read_text())
        except (OSError, ValueError):
            continue  # not ours to judge (an older layout, or one being created)
        if not _alive(pid):
            shutil.rmtree(stage, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
