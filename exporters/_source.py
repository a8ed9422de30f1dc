"""Resolve what the user named as a model source: nothing (the embedded model), a folder, or a GGUF."""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from onnxsample._gguf_file import is_gguf
from onnxsample.errors import ExportError
from onnxsample.exporters import _fs
from onnxsample.exporters.embedded import EMBEDDED_NAME, embedded_gguf

SourceKind = Literal["embedded", "gguf", "hf"]

# Something like "HuggingFaceTB/SmolLM2-135M-Instruct": a hub id, not a path on this machine.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# A part of a split GGUF as llama.cpp names them (gguf-split, convert_hf_to_gguf.py --split-max-*):
# PREFIX-00001-of-00003.gguf; llama.cpp opens the first and finds the others by name.
_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# Files that make up a Hugging Face model folder's content (weights, config, tokenizer).
_HF_CONTENT = ("*.json", "*.safetensors", "*.bin", "*.model", "*.txt", "*.jinja", "*.py")
# How long a file's timestamps must have stood still before the hash is taken for them to tell a
# later change apart: a write lands on the clock's current tick (a few ms on Linux, 2 s on FAT),
# so a change made in the tick the file was read in could leave every timestamp as it was.
_SETTLED_NS = 50_000_000
_SETTLED_NS_COARSE = 2_000_000_000  # a file system with whole-second timestamps


@dataclass(frozen=True)
class Fingerprint:
    """What a source holds: the sha256 of its content, and the `stamp` of its files when they
    were hashed (path, then per file: name, size, mtime, ctime, inode, device), or None when a
    file had changed too recently for its timestamps to be trusted later."""

    sha256: str
    stamp: list[Any] | None


@dataclass(frozen=True)
class Source:
    """A resolved model source."""

    kind: SourceKind
    path: Path
    name: str
    parts: tuple[Path, ...] = ()  # a split GGUF's files, `path` first; () for one file or a folder

    def digest(self, recorded: Mapping[str, Any] | None = None) -> Fingerprint:
        """The sha256 of the source: the GGUF file, or the sorted content files of an HF folder.

        `recorded` is what an export's manifest says of its source (``sha256`` and ``stamp``): when
        the files' stamp is the recorded one, no byte of them has been written since they were
        hashed (a write moves the ctime, which neither ``touch`` nor ``cp -p`` can set back), and
        the recorded sha256 is taken without reading gigabytes again. Git trusts its index the
        same way."""
        files = self._files()
        stamp = self._stamp(files)
        if recorded and recorded.get("stamp") == stamp and recorded.get("sha256"):
            return Fingerprint(str(recorded["sha256"]), stamp)
        started = time.time_ns()
        h = hashlib.sha256()
        named = self.path.is_dir()  # an HF folder's files are hashed with their names
        for file in files:
            if named:
                h.update(file.name.encode() + b"\0")
            _hash_file(h, file)
        # Windows' ctime is the creation time, which a rewrite leaves as it was: trust no stamp
        settled = (
            os.name == "posix"
            and self._stamp(files) == stamp
            and all(
                started - max(mtime, ctime) > _settling(mtime, ctime)
                for _name, _size, mtime, ctime, _ino, _dev in stamp[1:]
            )
        )
        return Fingerprint(h.hexdigest(), stamp if settled else None)

    def size(self) -> int:
        """Bytes of the source's files: the GGUF's (all its parts), or the whole folder's."""
        if self.path.is_dir():
            return _fs.folder_size(self.path)
        return sum(p.stat().st_size for p in self.parts or (self.path,))

    def _files(self) -> list[Path]:
        if self.path.is_file():
            return list(self.parts or (self.path,))
        return sorted({p for pattern in _HF_CONTENT for p in self.path.glob(pattern)})

    def _stamp(self, files: list[Path]) -> list[Any]:
        try:
            stats = [(file.name, file.stat()) for file in files]
        except OSError as exc:
            raise ExportError(f"{self.path}: {exc.strerror or exc}: {exc.filename}") from exc
        return [
            os.path.realpath(self.path),  # a link's target: two links to one file, one stamp
            *([n, s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino, s.st_dev] for n, s in stats),
        ]

    def to_json(self) -> dict:
        parts = {"parts": [p.name for p in self.parts]} if self.parts else {}
        return {"kind": self.kind, "path": str(self.path), "name": self.name, **parts}


def _settling(*times_ns: int) -> int:
    if all(t % 1_000_000_000 == 0 for t in times_ns):
        return _SETTLED_NS_COARSE
    return _SETTLED_NS


def _hash_file(h: hashlib._Hash, path: Path) -> None:
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)


def resolve_source(source: str | Path | None) -> Source:
    """Turn a CLI/API source argument into a :class:`Source`, or raise a one-line :class:`ExportError`."""
    if source is None or str(source) == "":
        return Source("embedded", embedded_gguf(), EMBEDDED_NAME)
    path = Path(source).expanduser()
    if not path.exists():
        if _HUB_ID.match(str(source)) and not str(source).startswith((".", "/")):
            raise ExportError(
                f"{source!r} is not a local path: only local model folders and .gguf files are "
                "accepted (model ids that need a hub download are not supported)"
            )
        raise ExportError(f"no such file or folder: {path}")
    # absolute, its links kept: a hub cache's snapshots/REV/NAME.gguf links to blobs/HASH, and the
    # name (the export's, a split file's parts) is the link's
    path = path.absolute()
    if path.is_dir():
        if not (path / "config.json").is_file():
            gguf = " (a folder, not a .gguf file)" if path.suffix.lower() == ".gguf" else ""
            raise ExportError(
                f"{path} is not a Hugging Face model folder{gguf}: config.json is missing"
            )
        return Source("hf", path, path.name)
    if not is_gguf(path):  # as llama.cpp, the magic bytes say what a file is, not its name
        try:
            path.open("rb").close()
        except OSError as exc:
            raise ExportError(f"cannot read {path}: {exc.strerror or exc}") from None
        if path.suffix.lower() != ".gguf":
            raise ExportError(f"{path} is neither a model folder nor a .gguf file")
        raise ExportError(f"{path.name} is not a GGUF file (it does not start with 'GGUF')")
    parts = split_parts(path)
    return Source("gguf", path, _SPLIT.match(path.name)["prefix"] if parts else path.stem, parts)


def split_parts(path: Path, count: int | None = None) -> tuple[Path, ...]:
    """The files of a split GGUF named by its first part (``PREFIX-00001-of-00003.gguf``), first
    to last; () for a GGUF that is one file. As for llama.cpp, a file is split when its header
    says so (``split.count``, read here unless `count` gives it) and its parts are found by name:
    a whole file named like a part is one file. Naming another part, or a part that is missing,
    is a one-line :class:`ExportError`."""
    match = _SPLIT.match(path.name)
    if match is None or int(match["count"]) < 2:
        return ()
    if count is None:
        from onnxsample.exporters.gguf import split_count

        count = split_count(path)
    if count < 2:
        return ()
    number, count = int(match["no"]), int(match["count"])
    parts = tuple(
        path.with_name(f"{match['prefix']}-{i:05d}-of-{match['count']}{path.suffix}")
        for i in range(1, count + 1)
    )
    if number != 1:
        raise ExportError(
            f"{path.name} is part {number} of {count} of a split GGUF: name its first part, "
            f"{parts[0].name}"
        )
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise ExportError(
            f"{path.name} is the first of {count} parts of a split GGUF, and "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing beside it"
        )
    return parts
