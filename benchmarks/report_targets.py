"""The "Against the targets" section of docs/benchmarks.md: onnxsample's decode against
onnxruntime-genai and optimum, batch-1 decode and quality against llama.cpp (from e2e.json), and the
sampling share of a decode step (from sampling_overhead.json). Standard library only."""

from __future__ import annotations

from _harness.tables import DASH, num, table, times
from report_e2e import OURS, by_key, configs, decode, noisy, quality_of

TARGET_GENAI, TARGET_OPTIMUM, TARGET_SHARE = 1.0, 1.5, 0.01
TARGET_LLAMACPP, TARGET_QUALITY = 1.0, 0.03  # batch-1 decode vs llama.cpp; |Δ mean logprob|


def targets_section(e2e: dict | None, overhead: dict | None) -> list[str]:
    """Each target, met (✅) or not (❌), per configuration."""
    lines = [
        "## Against the targets",
        "",
        f"Targets: onnxsample decode tok/s ≥ {TARGET_GENAI:g}× onnxruntime-genai (fp32) and ≥ "
        f"{TARGET_OPTIMUM:g}× optimum + host sampling; sampling ≤ {TARGET_SHARE:.0%} of a decode "
        "step at batch 1.",
        "",
    ]
    if e2e:
        lines += ["Decode tok/s medians; ⚠ where either side had a disturbed repetition.", ""]
        head = ["threads", "batch", "mode", "onnxsample / genai", "onnxsample / optimum"]
        lines += [*table(head, "rrlrr", _peer_rows(e2e)), ""]
        lines += llamacpp_targets(e2e)
    if overhead:
        for r in overhead["results"]:
            if r["batch"] != 1:
                continue
            share = r["share"]["in_graph_sampler_alone"]
            lines.append(
                f"- batch 1, {r['threads']} thread(s): the full in-graph chain alone takes "
                f"{share:.2%} of a decode step {'✅' if share <= TARGET_SHARE else '❌'}; "
                f"host-side numpy sampling of copied logits takes {r['share']['host_numpy']:.2%} "
                f"of the plain model's step."
            )
        lines.append("")
    return lines


def _peer_rows(e2e: dict) -> list[list[str]]:
    rows, cells = by_key(e2e["results"]), []
    for threads, batch, mode in configs(e2e["results"]):
        base = rows.get(("onnxsample", threads, batch, mode))
        if not base:
            continue
        row = [threads, batch, mode]
        for peer, target in (("genai", TARGET_GENAI), ("optimum", TARGET_OPTIMUM)):
            other = rows.get((peer, threads, batch, mode))
            if not other:
                row.append(DASH)
                continue
            ratio = decode(base) / decode(other)
            disturbed = noisy(base["decode_tokens_per_s"]) or noisy(other["decode_tokens_per_s"])
            mark = ("✅" if ratio >= target else "❌") + (" ⚠" if disturbed else "")
            row.append(f"{times(ratio)} {mark}")
        cells.append(row)
    return cells


def llamacpp_targets(e2e: dict) -> list[str]:
    """The issue's target: batch-1 decode ≥ llama.cpp's, at a quality within 0.03 of fp32."""
    rows = by_key(e2e["results"])
    batch_1 = [(t, m) for t, b, m in configs(e2e["results"]) if b == 1]
    ours = [e for e in OURS if any(k[0] == e and k[2] == 1 for k in rows)]
    if not batch_1 or not ours:
        return []
    lines = [
        f"Against llama.cpp at batch 1: decode tok/s ≥ {TARGET_LLAMACPP:g}× llama.cpp's, with a "
        f"quality (mean log-prob of the fp32 reference's greedy tokens) within {TARGET_QUALITY:g} "
        "of fp32's. ✅ both met, ❌ not (the reason after it), ⚠ a disturbed repetition.",
        "",
    ]
    cells = []
    for threads, mode in batch_1:
        llama = rows.get(("llamacpp", threads, 1, mode))
        for name in ours:
            r = rows.get((name, threads, 1, mode))
            if r is None:
                continue
            delta = (quality_of(e2e, name) or {}).get("delta_vs_fp32")
            ratio = decode(r) / decode(llama) if decode(llama) else None
            misses = []
            if ratio is None:
                misses.append("no llama.cpp run")
            elif ratio < TARGET_LLAMACPP:
                misses.append("slower")
            if delta is None:
                misses.append("no quality score")
            elif abs(delta) > TARGET_QUALITY:
                misses.append("quality")
            mark = "✅" if not misses else "❌ " + ", ".join(misses)
            disturbed = noisy(r["decode_tokens_per_s"]) or bool(
                llama and noisy(llama["decode_tokens_per_s"])
            )
            mark += " ⚠" if disturbed else ""
            cells.append(
                [
                    threads,
                    mode,
                    name,
                    num(decode(r), 1, group=True),
                    times(ratio),
                    num(delta, 4, "+"),
                    mark,
                ]
            )
    head = ["threads", "mode", "engine", "decode tok/s", "/ llama.cpp", "quality Δ vs fp32"]
    return [*lines, *table([*head, "target"], "rllrrrl", cells), ""]
