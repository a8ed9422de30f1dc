"""The markdown of docs/benchmarks.md: numbers (a dash where there is none), ratios ("1.59×", or
" (1.59×)" after a number), table rows and tables, and the load-average lines.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

DASH = "—"  # a cell with no value


def num(value: float | None, digits: int = 0, sign: str = "", group: bool = False) -> str:
    """`value` with `digits` decimals (`sign` "+": always signed; `group`: thousands separated by
    commas), or a dash for None."""
    if value is None:
        return DASH
    return f"{value:{sign}{',' if group else ''}.{digits}f}"


def times(value: float | None, digits: int = 2) -> str:
    """A factor: ``1.59×``, or a dash for None."""
    return DASH if value is None else f"{value:.{digits}f}×"


def ratio(a: float | None, b: float | None) -> str:
    """``a ÷ b`` as a factor, or a dash where either side is missing (or zero)."""
    return DASH if not a or not b else times(a / b)


def ratio_note(a: float | None, b: float | None) -> str:
    """``" (1.59×)"`` (a ÷ b) to put after a's number, or nothing where either side is missing."""
    return "" if not a or not b else f" ({times(a / b)})"


def row(cells: Iterable[object]) -> str:
    """One markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(head: Sequence[str], align: str, rows: Iterable[Iterable[object]] = ()) -> list[str]:
    """A markdown table: its head, the alignment line (`align`: one letter per column, ``l`` left,
    ``r`` right) and `rows`."""
    if len(align) != len(head):
        raise ValueError(f"{len(head)} columns, {len(align)} alignments")
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    return [row(head), rule, *(row(r) for r in rows)]


def load_line(loads: Sequence[float], during: str = "the runs") -> str | None:
    """``Load average (1 min) during the runs: lo–hi.`` from the 1-minute load averages sampled
    during a benchmark, or None where none was."""
    if not loads:
        return None
    return f"Load average (1 min) during {during}: {min(loads)}–{max(loads)}."


def run_section(title: str, data: dict | None, script: str) -> list[str]:
    """The start of a run's section: its title, then the machine and load-average lines; or, with no
    results (`data` None), the line saying which script makes them, where the section ends."""
    if data is None:
        return [title, "", f"No results yet: run `python benchmarks/{script}`.", ""]
    return [title, "", *machine_lines(data)]


def machine_lines(data: dict) -> list[str]:
    """The machine and the load average before and after, as bullets, from a report that holds
    ``machine``, ``created`` and ``load_average_before`` / ``_after``."""
    m = data["machine"]
    return [
        f"- machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory_gb']} GB, {m['platform']}, "
        f"Python {m['python']}",
        f"- run {data['created']}; load average (1/5/15 min) before "
        f"{'/'.join(map(str, data['load_average_before']))}, after "
        f"{'/'.join(map(str, data['load_average_after']))}",
    ]
