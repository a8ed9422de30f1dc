"""Writing an export folder safely: staged next to the target, moved into place only when complete."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Collection, Iterator
from pathlib import Path

from onnxsample._process import alive
from onnxsample.errors import ExportError

log = logging.getLogger(__name__)


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


def check_kept(output: Path, kept: Collection[str], written: Collection[str]) -> None:
    """Refuse to write an export over a file of `output` that no export wrote there (`kept`)."""
    clash = sorted(set(kept) & set(written))
    if clash:
        raise ExportError(
            f"{output} holds {', '.join(clash)}, which no export wrote there and this export "
            "would replace; --force replaces an export's own files only: move them or choose "
            "another folder"
        )


_OWNER = ".owner"


@contextlib.contextmanager
def staged_folder(output: Path, own: Collection[str] = ()) -> Iterator[Path]:
    """A temporary folder beside `output`; on success it replaces `output`, on failure it vanishes.

    Of what `output` held, only the names in `own` (the files an export wrote there) go: every
    other entry (a user's notes, a composed model) is moved into the new folder. One that the new
    export would write over is an error, and then nothing changes.

    A process killed mid-export (no `finally` runs) leaves its staging folder behind: the next
    export of the same output removes those whose process is gone (each records its pid). Killed
    after `output` was moved aside, it leaves that folder, the entries it kept included, as
    ``.NAME.old-*`` beside it."""
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
        kept = [p.name for p in output.iterdir() if p.name not in own] if output.exists() else []
        check_kept(output, kept, {p.name for p in stage.iterdir()})
        old = None
        if output.exists():
            old = output.with_name(f".{output.name}.old-{stage.name.split('.')[-2]}")
            output.rename(old)
        stage.rename(output)
        if old is not None and _move_back(old, output, kept):
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)


def _move_back(old: Path, output: Path, names: list[str]) -> bool:
    """Move the entries `names` of the replaced folder `old` into `output`; False (and `old` is
    kept, with a warning) if one cannot be moved."""
    for name in names:
        try:
            (old / name).rename(output / name)
        except OSError as exc:
            log.warning(
                "%s could not be moved back into %s (%s): it is in %s", name, output, exc, old
            )
            return False
    return True


def _remove_abandoned(output: Path) -> None:
    """Staging folders of `output` left by processes that no longer run."""
    for stage in output.parent.glob(f".{output.name}.*.partial"):
        try:
            pid = int((stage / _OWNER).read_text())
        except (OSError, ValueError):
            continue  # not ours to judge (an older layout, or one being created)
        if not alive(pid):
            shutil.rmtree(stage, ignore_errors=True)
