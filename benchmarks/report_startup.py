"""The start-up section of docs/benchmarks.md: from a cold process to the first token, our engine
beside llama-server on the same GGUF (startup.json from benchmarks/startup.py). Standard library
only."""

from __future__ import annotations

from _harness.tables import num, ratio, table

_MB = 1e6


def startup_section(report: dict | None) -> list[str]:
    """One row per model: ready and first-token times, ours (and an older package's) beside
    llama-server's (nothing without results)."""
    if not report:
        return []
    old = report.get("old_label") if report.get("old_site") else None
    lines = [
        "## Starting: from a cold process to the first token",
        "",
        "`python benchmarks/startup.py`: the GGUF exported and composed once beforehand (as `run` "
        "and `serve` find it in their cache); then a new process builds an `Engine` on it (the "
        "ONNX Runtime session and the tokenizer) and decodes one greedy token, against a new "
        "llama-server process (one slot) on the same file until `/health` answers, then one "
        f"`/completion` of one token; {report['results'][0]['threads']} threads, the runs "
        f"alternated, median (min–max) of {report['repeats']}, seconds from the process's start. "
        "ratio = ours ÷ llama-server.",
        "",
    ]
    if old:
        lines += [f"*Before*: {old}, alternated with this version's runs.", ""]
    head = ["model", "file MB", "composed MB", "ready, ours", "ready, llama-server", "ratio"]
    head += ["first token, ours", "first token, llama-server", "ratio"]
    if old:
        head += ["ready, before", "first token, before"]
    rows = []
    for r in report["results"]:
        ours, theirs, before = r["ours"], r["llama-server"], r.get("old")
        cells = [
            f"`{r['file']}`",
            num(r["file_bytes"] / _MB),
            num(r["composed_bytes"] / _MB),
            _spread(ours["ready"]),
            _spread(theirs["ready"]),
            ratio(ours["ready"]["median"], theirs["ready"]["median"]),
            _spread(ours["first_token"]),
            _spread(theirs["first_token"]),
            ratio(ours["first_token"]["median"], theirs["first_token"]["median"]),
        ]
        if old:
            cells += [_spread(before["ready"]), _spread(before["first_token"])]
        rows.append(cells)
    lines += [*table(head, "lrr" + "rrr" * 2 + "rr" * bool(old), rows), ""]
    if all("run_command" in r["ours"] for r in report["results"]):
        lines += [
            "`onnxsample run FILE -p PROMPT -n 1 --threads N` as a user types it, its export and "
            "composed model in its cache: seconds from the process's start to its exit (llama-server's "
            "first token above is the peer's nearest figure).",
            "",
        ]
        head = ["model", "run, ours"] + ["run, before"] * bool(old)
        rows = [
            [f"`{r['file']}`", _spread(r["ours"]["run_command"])]
            + [_spread(r["old"]["run_command"])] * bool(old)
            for r in report["results"]
        ]
        lines += [*table(head, "lr" + "r" * bool(old), rows), ""]
    run = report["run"]
    loads = [run["load_average_before"][0], run["load_average_after"][0]]
    lines += [
        f"Machine: {run['machine']['cpu']}, {run['machine']['cpus']} cores. Load average (1 min) "
        f"before and after the runs: {min(loads)}–{max(loads)}.",
        "",
    ]
    return lines


def _spread(values: dict) -> str:
    median, low, high = (num(values[k], 2) for k in ("median", "min", "max"))
    return f"{median} ({low}–{high})"
