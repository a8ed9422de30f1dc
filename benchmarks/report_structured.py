"""The structured-output section of docs/benchmarks.md, from benchmarks/results/structured.json
(written by benchmarks/structured.py). Standard library only."""

from __future__ import annotations

from _harness.tables import load_line, num, table, times

_RATE = "decode_tokens_per_s"
_ENGINES = ("mask-off", "mask-on", "exact-off", "exact-k8")


def structured_section(data: dict | None) -> list[str]:
    """The engine table (free text and a JSON schema per engine and batch), the HTTP table against
    llama-server and the mask-filling cost (nothing where there are no results)."""
    if not data:
        return []
    results = data["results"]
    lines = [
        "## Structured output",
        "",
        "`python benchmarks/structured.py`: greedy chat answers on the embedded model (gguf-a4, "
        "as `onnxsample run` uses it), free text and the same model asked for a JSON record "
        "constrained by a schema (names, an enum, a bounded array, an integer, a boolean). "
        "*mask-off*: composed without `sampler.allowed`; *mask-on*: with it (the default); "
        "*exact-off* / *exact-k8*: the `--attention exact` export without and with speculative "
        "decoding (a constrained request drafts the tokens its grammar forces). Decode tokens/s "
        "(median of the repetitions), TTFT, tokens per model call; *cost*: mask-on ÷ mask-off on "
        "free text (the mask unused); *json ÷ free*: the JSON answer's rate against free text's on "
        "the same engine.",
        "",
    ]
    loads = [v[0] for v in data.get("load_average", []) if v]
    for threads, workloads in results.get("engine", {}).items():
        head = ["batch", "workload", *_ENGINES, "cost", "json ÷ free", "TTFT json / free (ms)"]
        rows = []
        for batch in workloads.get("free", {}):
            for workload in ("free", "json"):
                cells = workloads.get(workload, {}).get(batch, {})
                rates = [num(cells.get(e, {}).get(_RATE), 1) for e in _ENGINES]
                calls = cells.get("exact-k8", {}).get("tokens_per_call")
                if calls:
                    rates[-1] += f" ({calls} tok/call)"
                cost = cells.get("mask-on", {}).get("mask_cost")
                versus = cells.get("mask-on", {}).get("json_vs_free")
                ttft = ""
                if workload == "json":
                    free = workloads["free"][batch].get("mask-on", {}).get("ttft_ms")
                    ttft = f"{num(cells.get('mask-on', {}).get('ttft_ms'))} / {num(free)}"
                rows.append(
                    [
                        batch.split("=")[1],
                        workload,
                        *rates,
                        times(cost) if cost else "",
                        times(versus) if versus else "",
                        ttft,
                    ]
                )
        lines += [f"### Engine, {threads.replace('=', ' ')}", ""]
        lines += table(head, "rl" + "r" * (len(head) - 2), rows)
        lines.append("")
    http = results.get("http")
    if http:
        lines += [
            f"### `onnxsample serve` against llama-server ({http.get('threads')} threads)",
            "",
            "The schema sent as `response_format` to both (llama-server compiles it to its "
            "grammar), streaming clients in a closed loop.",
            "",
        ]
        head = ["workload", "clients", "engine", "tok/s", "TTFT p50 (ms)", "ITL p50 / p99 (ms)"]
        rows = []
        for workload in ("free", "json"):
            for clients, cell in http.get(workload, {}).items():
                for engine, r in cell.items():
                    rate = num(r.get("tokens_per_s"), 1)
                    if r.get("vs_llama_server"):
                        rate += f" ({times(r['vs_llama_server'])})"
                    rows.append(
                        [
                            workload,
                            clients.split("=")[1],
                            engine,
                            rate,
                            num(r.get("ttft_ms_p50")),
                            f"{num(r.get('itl_ms_p50'), 1)} / {num(r.get('itl_ms_p99'), 1)}",
                        ]
                    )
        lines += table(head, "lrlrrr", rows)
        lines.append("")
        for name, why in http.get("skipped", {}).items():
            lines += [f"{name} skipped: {why}", ""]
    masks = results.get("masks")
    if masks:
        parts = [
            f"{k.split('=')[1]} constrained slots {num(v['fill_us_per_step_p50'])} µs "
            f"(p99 {num(v['fill_us_per_step_p99'])} µs)"
            for k, v in masks.items()
        ]
        lines += ["Filling the masks on the host, per step: " + "; ".join(parts) + ".", ""]
    if (line := load_line(loads)) is not None:
        lines += [line, ""]
    return lines
