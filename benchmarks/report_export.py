"""The export and compose sections of docs/benchmarks.md: the peak memory and time of
`onnxsample export` and `onnxsample compose` (export_memory*.json and compose_memory.json from
benchmarks/export_memory.py). Standard library only."""

from __future__ import annotations

from _harness.tables import num, table, times

_MB = 1e6


_SECTIONS = {
    "export": (
        "## Exporting: peak memory and time",
        "`python benchmarks/export_memory.py SOURCE ... [--option ARG] --old-site DIR`: each "
        "source exported by `onnxsample export SOURCE --verify-tokens 0` (and the options) in a "
        "process of its own",
        ("source", "export"),
    ),
    "compose": (
        "## Composing: peak memory and time",
        "`python benchmarks/export_memory.py --command compose FOLDER ... --old-site DIR`: each "
        "export folder composed by `onnxsample compose FOLDER` (the full chain, 8 slots, the "
        "LM-head check included) into one file, in a process of its own",
        ("export", "composed"),
    ),
}


def export_section(reports: list[dict | None], command: str = "export") -> list[str]:
    """One row per source and options, this checkout's run of `command` beside `--old-site`'s
    where the report has it: one table per older package compared with (nothing without
    results)."""
    reports = [r for r in reports if r]
    if not reports:
        return []
    title, how, names = _SECTIONS[command]
    lines = [
        title,
        "",
        f"{how}, median (min–max) of {reports[0].get('repeats')} runs; the peak resident set "
        "counts the interpreter, its libraries and the pages of the mapped source it touched; "
        "MB are 10⁶ bytes.",
        "",
    ]
    groups: dict[str | None, list[dict]] = {}
    for report in reports:
        old = (
            (report.get("old_label") or report.get("old_site")) if report.get("old_site") else None
        )
        groups.setdefault(old, []).append(report)
    for old, group in groups.items():
        if old:
            lines += [f"*Before*: {old}, alternated with this version's runs.", ""]
        lines += [*_table(group, bool(old), names), ""]
    loads = [
        x
        for r in reports
        for x in (r["run"]["load_average_before"][0], r["run"]["load_average_after"][0])
    ]
    m = reports[0]["run"]["machine"]
    lines += [
        f"Machine: {m['cpu']}, {m['cpus']} cores. Load average (1 min) before and after the runs: "
        f"{min(loads)}–{max(loads)}.",
        "",
    ]
    return lines


def _table(reports: list[dict], old: bool, names: tuple[str, str]) -> list[str]:
    source, output = names
    head = [source, "options", f"{source} MB", f"{output} MB", "peak MB", f"peak ÷ {source}"]
    head.append("seconds")
    if old:
        head += ["peak before", "seconds before", "peak ratio", "time ratio"]
    rows = []
    for report in reports:
        for r in report.get("results", []):
            ours, before = r["ours"], r.get("old")
            cells = [
                f"`{r['source']}`",
                " ".join(r["options"]) or "—",
                num(r["source_bytes"] / _MB),
                num(ours["export_bytes"] / _MB),
                _spread(ours["peak_mb"], 1.048576),
                times(ours["peak_over_source"]),
                _spread(ours["seconds"], 1, 1),
            ]
            if old:
                cells += [
                    _spread(before["peak_mb"], 1.048576) if before else "—",
                    _spread(before["seconds"], 1, 1) if before else "—",
                    times(r.get("vs_old", {}).get("peak_mb")),
                    times(r.get("vs_old", {}).get("seconds")),
                ]
            rows.append(cells)
    return table(head, "llrrrrr" + "rrrr" * old, rows)


def _spread(values: dict, scale: float, digits: int = 0) -> str:
    """``median (min–max)``, each times `scale`."""
    median, low, high = (num(values[k] * scale, digits) for k in ("median", "min", "max"))
    return f"{median} ({low}–{high})"
