"""The examples of the documentation: every ```bash and ```python block of README.md and docs/*.md.

A block runs unless the line right before its fence says why it cannot, as
``<!-- example: not run (REASON) -->`` with a REASON from :data:`REASONS`. Blocks of other
languages (``text``, ``json``, ``console``...) are shown, not run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REASONS = ("needs an NVIDIA GPU", "installs packages", "needs several machines")
RUN = ("bash", "python")
_FENCE = re.compile(r"^```(\w*)\s*$")
_DIRECTIVE = re.compile(r"^<!-- example: not run \((?P<reason>[^)]*)\) -->$")
# A bash block that is only this starts a server that lives until the page's next one or its end.
SERVE = re.compile(r"^onnxsample serve\b.*--port 8080\b")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text and why it does not run (if so)."""

    page: str
    line: int  # the opening fence's line, 1-based
    language: str
    code: str
    not_run: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def serves(self) -> bool:
        return (
            self.language == "bash"
            and bool(SERVE.match(self.code.strip()))
            and (len(self.code.strip().splitlines()) == 1)
        )


def pages() -> list[Path]:
    """README.md and the site's pages, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of `page`, in order."""
    name = page.relative_to(ROOT).as_posix()
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        start, language = i, opened.group(1)
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            i += 1
        directive = _DIRECTIVE.match(lines[start - 1].strip()) if start else None
        code = "\n".join(lines[start + 1 : i]) + "\n"
        reason = directive.group("reason") if directive else None
        found.append(Block(name, start + 1, language, code, reason))
        i += 1
    return found


def runnable(page: Path) -> list[Block]:
    """The blocks of `page` that run."""
    return [b for b in blocks(page) if b.language in RUN and b.not_run is None]
