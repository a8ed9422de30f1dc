"""Turn the benchmark JSON into docs/benchmarks.md (tables) and docs/benchmarks.png (chart).

    python benchmarks/report.py          # reads benchmarks/results/{e2e,sampling_overhead}.json

Either file may be missing; its section then says how to produce it. Nothing here measures anything.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

ENGINE_LABELS = {
    "onnxsample": "onnxsample (in-graph sampling)",
    "onnxsample-gqa": "onnxsample on genai's builder model (GQA), batch 1",
    "optimum": "optimum ORTModelForCausalLM (host sampling)",
    "genai": "onnxruntime-genai (fp32)",
    "transformers": "transformers generate (torch)",
    "llamacpp": "llama.cpp (llama-cpp-python, Q4_1)",
}
ORDER = list(ENGINE_LABELS)
TARGET_GENAI, TARGET_OPTIMUM, TARGET_SHARE = 1.0, 1.5, 0.01


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _fmt(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}"


NOISY = 0.75  # a repetition below 75 % of the median: something else probably ran


def _noisy(stat: dict) -> bool:
    return stat["min"] < NOISY * stat["median"]


def _cell(stat: dict, digits: int = 1, mark: bool = False) -> str:
    text = (
        f"{_fmt(stat['median'], digits)} ({_fmt(stat['min'], digits)}–{_fmt(stat['max'], digits)})"
    )
    return text + (" ⚠" if mark and _noisy(stat) else "")


def _configs(rows: list[dict]) -> list[tuple[int, int, str]]:
    return sorted({(r["threads"], r["batch"], r["mode"]) for r in rows})


def _by_key(rows: list[dict]) -> dict[tuple, dict]:
    return {(r["engine"], r["threads"], r["batch"], r["mode"]): r for r in rows}


def _machine_lines(data: dict) -> list[str]:
    m = data["machine"]
    return [
        f"- machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory_gb']} GB, {m['platform']}, "
        f"Python {m['python']}",
        f"- run {data['created']}; load average (1/5/15 min) before "
        f"{'/'.join(map(str, data['load_average_before']))}, after "
        f"{'/'.join(map(str, data['load_average_after']))}",
    ]


def e2e_section(data: dict | None) -> list[str]:
    lines = ["## End-to-end decode", ""]
    if data is None:
        return [*lines, "No results yet: run `python benchmarks/e2e.py`.", ""]
    s = data["settings"]
    lines += _machine_lines(data)
    lines += [
        f"- prompt: the chat template applied to “{s['message']}” = {s['prompt_tokens']} tokens; "
        f"{s['new_tokens']} new tokens per sequence; batch {s['batch']} ({s['batch_composition']})",
        f"- threads {s['threads']} (ORT intra-op threads; torch threads for transformers); "
        f"{s['repeats']} repetitions after a {s['warmup_tokens']}-token warm-up; {s['order']}",
        f"- greedy, and sampled: {s['sampled']}",
        f"- end of sequence: {s['eos']}",
    ]
    if s.get("note"):
        lines.append(f"- note: {s['note']}")
    lines += ["", "Engines:", ""]
    for name in ORDER:
        info = data["engines"].get(name)
        if info is None:
            continue
        label = ENGINE_LABELS[name]
        if info["status"] != "ok":
            lines.append(f"- {label}: **skipped** — {info['reason']}")
            continue
        vers = ", ".join(f"{k} {v}" for k, v in info.get("versions", {}).items())
        extra = ""
        if "use_io_binding" in info:
            extra = f"; use_io_binding={info['use_io_binding']} (optimum's default on CPU)"
        for batch, reason in info.get("unavailable", {}).items():
            extra += f"; not run at batch {batch}: {reason}"
        lines.append(f"- {label}: {vers}{extra}")
    lines += [
        "",
        "Median (min–max) over the repetitions. Decode tok/s counts every sequence's tokens after "
        "the first, over the time from the first token to the last; prefill tok/s is batch × prompt "
        "tokens / time to first token; peak RSS is the worker process's, loading included. "
        "“vs onnxsample” is the engine's decode tok/s over onnxsample's in the same configuration. "
        f"⚠: a repetition ran below {NOISY:.0%} of the median (likely another job on the machine; "
        "trust the median, not the minimum).",
        "",
        "| threads | batch | mode | engine | decode tok/s | vs onnxsample | prefill tok/s | TTFT ms "
        "| peak RSS MB |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    rows = _by_key(data["results"])
    for threads, batch, mode in _configs(data["results"]):
        base = rows.get(("onnxsample", threads, batch, mode))
        for name in ORDER:
            r = rows.get((name, threads, batch, mode))
            if r is None:
                continue
            ratio = "—"
            if base:
                ratio = f"{r['decode_tokens_per_s']['median'] / base['decode_tokens_per_s']['median']:.2f}×"
            tokens = r["tokens_per_sequence"]
            flag = "" if tokens == [s["new_tokens"]] else f" ⚠ tokens {tokens}"
            lines.append(
                f"| {threads} | {batch} | {mode} | {name}{flag} | {_cell(r['decode_tokens_per_s'], mark=True)} "
                f"| {ratio} | {_cell(r['prefill_tokens_per_s'], 0)} | {_cell(r['ttft_ms'], 0)} "
                f"| {_fmt(r['peak_rss_mb'], 0)} |"
            )
    return [*lines, ""]


def targets_section(e2e: dict | None, overhead: dict | None) -> list[str]:
    lines = [
        "## Against the targets",
        "",
        f"Targets: onnxsample decode tok/s ≥ {TARGET_GENAI:g}× onnxruntime-genai (fp32) and ≥ "
        f"{TARGET_OPTIMUM:g}× optimum + host sampling; sampling ≤ {TARGET_SHARE:.0%} of a decode "
        "step at batch 1.",
        "",
    ]
    if e2e:
        lines += [
            "Decode tok/s medians; ⚠ where either side had a disturbed repetition.",
            "",
            "| threads | batch | mode | onnxsample / genai | onnxsample / optimum |",
            "|---:|---:|---|---:|---:|",
        ]
        rows = _by_key(e2e["results"])
        for threads, batch, mode in _configs(e2e["results"]):
            base = rows.get(("onnxsample", threads, batch, mode))
            if not base:
                continue
            cells = []
            for peer, target in (("genai", TARGET_GENAI), ("optimum", TARGET_OPTIMUM)):
                other = rows.get((peer, threads, batch, mode))
                if not other:
                    cells.append("—")
                    continue
                ratio = (
                    base["decode_tokens_per_s"]["median"] / other["decode_tokens_per_s"]["median"]
                )
                noisy = _noisy(base["decode_tokens_per_s"]) or _noisy(other["decode_tokens_per_s"])
                mark = ("✅" if ratio >= target else "❌") + (" ⚠" if noisy else "")
                cells.append(f"{ratio:.2f}× {mark}")
            lines.append(f"| {threads} | {batch} | {mode} | {cells[0]} | {cells[1]} |")
        lines.append("")
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


def overhead_section(data: dict | None) -> list[str]:
    lines = ["## Sampling overhead", ""]
    if data is None:
        return [*lines, "No results yet: run `python benchmarks/sampling_overhead.py`.", ""]
    s = data["settings"]
    lines += _machine_lines(data)
    lines += [
        f"- {s['prompt_tokens']}-token prompt, {s['steps']} decode steps per loop (first "
        f"{s['skipped_steps']} left out), {s['repeats']} repetitions, variants alternated",
        f"- chain: {s['chain']}",
        f"- graph_full: {s['graph_full']}; graph_run: {s['graph_run']}; host: {s['host']}",
        "",
        "Median milliseconds per decode step. *Sampler alone* is the standalone sampler model of "
        "the full chain on `[slots + 1, V]` logits; *share* = sampler alone / graph_full step, and "
        "host numpy sampling (copy included) / the plain model's whole step.",
        "",
        "| batch | threads | graph full | graph greedy | graph_run (8 slots) | plain forward "
        "| + numpy sampling | numpy argmax | sampler alone | in-graph share | host share |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["results"]:
        t, sh = r["step_ms"], r["share"]
        run8 = _fmt(t["graph_run_8_slots"], 2) if "graph_run_8_slots" in t else "—"
        lines.append(
            f"| {r['batch']} | {r['threads']} | {_fmt(t['graph_full'], 2)} "
            f"| {_fmt(t['graph_greedy'], 2)} | {run8} | {_fmt(t['plain_forward'], 2)} "
            f"| {_fmt(t['host_sampling_full'], 2)} | {_fmt(t['host_sampling_greedy'], 3)} "
            f"| {_fmt(t['sampler_alone_full'], 3)} | {sh['in_graph_sampler_alone']:.2%} "
            f"| {sh['host_numpy']:.2%} |"
        )
    return [*lines, ""]


def chart(e2e: dict | None, overhead: dict | None, path: Path) -> bool:
    if e2e is None and overhead is None:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in (e2e, overhead) if p is not None]
    widths = [3, 1][: len(panels)] if len(panels) == 2 else [1]
    fig, axes = plt.subplots(
        1, len(panels), figsize=(13, 4.5), gridspec_kw={"width_ratios": widths}, squeeze=False
    )
    axes = list(axes[0])
    if e2e is not None:
        ax = axes.pop(0)
        rows, configs = _by_key(e2e["results"]), _configs(e2e["results"])
        engines = [e for e in ORDER if any(k[0] == e for k in rows)]
        width = 0.8 / max(len(engines), 1)
        for i, engine in enumerate(engines):
            xs, ys, lo, hi = [], [], [], []
            for c, (threads, batch, mode) in enumerate(configs):
                r = rows.get((engine, threads, batch, mode))
                if r is None:
                    continue
                d = r["decode_tokens_per_s"]
                xs.append(c + (i - (len(engines) - 1) / 2) * width)
                ys.append(d["median"])
                lo.append(d["median"] - d["min"])
                hi.append(d["max"] - d["median"])
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=engine)
        ax.set_xticks(range(len(configs)))
        ax.set_xticklabels([f"t{t} b{b}\n{m}" for t, b, m in configs], fontsize=8)
        ax.set_ylabel("decode tokens/s (all sequences)")
        ax.set_title(f"End-to-end decode, {e2e['settings']['new_tokens']} new tokens")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    if overhead is not None:
        ax = axes.pop(0)
        results = overhead["results"]
        labels = [f"b{r['batch']} t{r['threads']}" for r in results]
        xs = range(len(results))
        graph = [100 * r["share"]["in_graph_sampler_alone"] for r in results]
        host = [100 * r["share"]["host_numpy"] for r in results]
        ax.bar([x - 0.2 for x in xs], graph, 0.4, label="in graph (sampler alone)")
        ax.bar([x + 0.2 for x in xs], host, 0.4, label="host numpy (copied logits)")
        ax.axhline(100 * TARGET_SHARE, color="grey", linestyle="--", linewidth=1)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel("% of a decode step")
        ax.set_title("Sampling share of a decode step")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


READING = [
    "## Reading the numbers",
    "",
    "- `onnxsample` and `optimum` run the same `model.onnx` (optimum's export: attention as plain "
    "ops, the KV cache concatenated into a new `present.*` every step); they differ in where "
    "sampling runs (in the graph vs transformers' processors in torch) and in IOBinding. `genai` runs "
    "its builder's graph of the same weights (GroupQueryAttention, past and present sharing one "
    "buffer), so onnxsample vs genai mixes the runtime with the model graph. `onnxsample-gqa` runs "
    "onnxsample on genai's graph (one sequence at a time, as the Generator runs that layout) to "
    "separate the two.",
    "- At batch 1 the forward pass is nearly the whole step, so no sampler can make a step much "
    "faster than the forward pass alone (see *plain forward* below): a speed-up over optimum is "
    "bounded by the share of its step that host-side sampling takes.",
    "- The e2e `onnxsample` engine runs `onnxsample run`'s graph (8 slots, top logprobs 20, 16 "
    "logit-bias entries); *graph_run* vs *graph full* (slots = batch) below shows what its idle "
    "slots and extra outputs cost a decode step.",
    "- llama.cpp runs the original Q4_1 weights (4-bit), not fp32: it is the engine users pick on "
    "a CPU, not a same-precision comparison.",
    "",
]


def render(e2e: dict | None, overhead: dict | None, png_name: str | None) -> str:
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python benchmarks/report.py` from `benchmarks/results/*.json`; do not edit "
        "by hand. Reproduce from a fresh clone:",
        "",
        "```bash",
        "make run                                           # .venv, the export of the embedded model",
        "make genai-model                                   # .venv-genai and genai's fp32 model",
        ".venv/bin/python benchmarks/e2e.py                 # or: .venv/bin/onnxsample bench",
        ".venv/bin/python benchmarks/sampling_overhead.py",
        ".venv/bin/python benchmarks/report.py",
        "```",
        "",
        "llama.cpp is optional: `python3 -m venv .venv-llamacpp && .venv-llamacpp/bin/pip install "
        "llama-cpp-python` (it compiles llama.cpp, several minutes); without it the engine is "
        "skipped with the reason. Numbers come from a shared 2-core machine: compare ratios within "
        "one run, and read the load average beside them.",
        "",
    ]
    if png_name:
        lines += [f"![decode tokens/s and sampling share]({png_name})", ""]
    lines += targets_section(e2e, overhead)
    lines += READING
    lines += e2e_section(e2e)
    lines += overhead_section(overhead)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--e2e", default=str(HERE / "results/e2e.json"))
    p.add_argument("--sampling", default=str(HERE / "results/sampling_overhead.json"))
    p.add_argument("--md", default=str(ROOT / "docs/benchmarks.md"))
    p.add_argument("--png", default=str(ROOT / "docs/benchmarks.png"))
    args = p.parse_args(argv)
    e2e, overhead = _load(Path(args.e2e)), _load(Path(args.sampling))
    md, png = Path(args.md), Path(args.png)
    drawn = chart(e2e, overhead, png)
    md.parent.mkdir(parents=True, exist_ok=True)
    name = str(png.relative_to(md.parent)) if drawn and png.parent == md.parent else str(png)
    md.write_text(render(e2e, overhead, name if drawn else None))
    print(f"wrote {md}" + (f" and {png}" if drawn else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
