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

from report_engine import engine_section, load_results  # noqa: E402  (benchmarks/ is on the path)
from report_speculative import speculative_section  # noqa: E402

ENGINE_LABELS = {
    "onnxsample": "onnxsample fp32-optimum",
    "onnxsample-gqa-fp32": "onnxsample fp32-gqa",
    "onnxsample-gguf-a0": "onnxsample gguf-a0 (the GGUF's Q4_1/Q8_0 blocks, float compute)",
    "onnxsample-gguf-a4": "onnxsample gguf-a4 (the GGUF's blocks, int8 activations)",
    "onnxsample-genai-graph": "onnxsample on genai's builder graph (fp32 GQA)",
    "optimum": "optimum ORTModelForCausalLM (host sampling)",
    "genai": "onnxruntime-genai (fp32)",
    "transformers": "transformers generate (torch)",
    "llamacpp": "llama.cpp (llama-cpp-python, Q4_1)",
}
ORDER = list(ENGINE_LABELS)
OURS = [e for e in ORDER if e.startswith("onnxsample")]
ALIASES = {"onnxsample-gqa": "onnxsample-genai-graph"}  # names in older results
TARGET_GENAI, TARGET_OPTIMUM, TARGET_SHARE = 1.0, 1.5, 0.01
TARGET_LLAMACPP, TARGET_QUALITY = 1.0, 0.03  # batch-1 decode vs llama.cpp; |Δ mean logprob|


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


def normalise(data: dict | None) -> dict | None:
    """Older results under their engines' current names."""
    if data is None:
        return None
    data["engines"] = {ALIASES.get(k, k): v for k, v in data.get("engines", {}).items()}
    for row in data.get("results", []):
        row["engine"] = ALIASES.get(row["engine"], row["engine"])
    return data


def _quality(data: dict, engine: str) -> dict | None:
    """The engine's quality entry, when the run scored it."""
    return (data["engines"].get(engine) or {}).get("quality")


def _quality_cell(score: dict | None) -> str:
    if not score or score.get("mean_logprob") is None:
        return "—"
    delta = score.get("delta_vs_fp32")
    text = f"{score['mean_logprob']:.3f}"
    return text + (f" ({delta:+.3f})" if delta is not None else "")


def _ratio(row: dict | None, base: dict | None) -> str:
    if not row or not base or not base["decode_tokens_per_s"]["median"]:
        return "—"
    return f"{row['decode_tokens_per_s']['median'] / base['decode_tokens_per_s']['median']:.2f}×"


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
        if "export" in info:
            ex = info["export"]
            extra += f"; export {ex['layout']}/{ex['precision']}"
            if ex.get("precision") in ("int8", "int4", "gguf"):
                extra += f" accuracy {ex['accuracy_level']}"
            if ex.get("bytes"):
                extra += f", {ex['bytes'] / 2**20:,.0f} MB"
        if "use_io_binding" in info:
            extra = f"; use_io_binding={info['use_io_binding']} (optimum's default on CPU)"
        for batch, reason in info.get("unavailable", {}).items():
            extra += f"; not run at batch {batch}: {reason}"
        lines.append(f"- {label}: {vers}{extra}")
    lines += quality_section(data)
    lines += [
        "",
        "Median (min–max) over the repetitions. Decode tok/s counts every sequence's tokens after "
        "the first, over the time from the first token to the last; prefill tok/s is batch × prompt "
        "tokens / time to first token; peak RSS is the worker process's, loading included. "
        "“vs onnxsample” and “vs llama.cpp” are the engine's decode tok/s over onnxsample "
        "fp32-optimum's and over llama.cpp's in the same configuration; quality is the mean "
        "log-probability of the fp32 reference's greedy tokens (Δ to fp32's own score). "
        f"⚠: a repetition ran below {NOISY:.0%} of the median (likely another job on the machine; "
        "trust the median, not the minimum).",
        "",
        "| threads | batch | mode | engine | decode tok/s | vs onnxsample | vs llama.cpp "
        "| quality | prefill tok/s | TTFT ms | peak RSS MB |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = _by_key(data["results"])
    for threads, batch, mode in _configs(data["results"]):
        base = rows.get(("onnxsample", threads, batch, mode))
        llama = rows.get(("llamacpp", threads, batch, mode))
        for name in ORDER:
            r = rows.get((name, threads, batch, mode))
            if r is None:
                continue
            tokens = r["tokens_per_sequence"]
            flag = "" if tokens == [s["new_tokens"]] else f" ⚠ tokens {tokens}"
            lines.append(
                f"| {threads} | {batch} | {mode} | {name}{flag} "
                f"| {_cell(r['decode_tokens_per_s'], mark=True)} | {_ratio(r, base)} "
                f"| {_ratio(r, llama)} | {_quality_cell(_quality(data, name))} "
                f"| {_cell(r['prefill_tokens_per_s'], 0)} | {_cell(r['ttft_ms'], 0)} "
                f"| {_fmt(r['peak_rss_mb'], 0)} |"
            )
    return [*lines, ""]


def quality_section(data: dict) -> list[str]:
    q = data.get("quality")
    if not q:
        return []
    lines = [
        "",
        f"Quality: {q['method']}. Reference: {q['reference']} ({len(q['tokens'])} greedy tokens), "
        f"scoring {_num(q.get('reference_logprob'))} itself.",
        "",
        "| engine | mean log-prob | Δ vs fp32 | scored on |",
        "|---|---:|---:|---|",
    ]
    for name in ORDER:
        score = _quality(data, name)
        if score is None:
            continue
        where = score.get("scored_on") or score.get("reason", "")
        lines.append(
            f"| {name} | {_num(score.get('mean_logprob'))} | {_num(score.get('delta_vs_fp32'), '+')} "
            f"| {_short(where)} |"
        )
    return lines


def _num(value: float | None, sign: str = "") -> str:
    return "—" if value is None else f"{value:{sign}.4f}"


def _short(text: str) -> str:
    """A path relative to the checkout, where it is one."""
    try:
        return f"`{Path(text).resolve().relative_to(ROOT)}`"
    except (ValueError, OSError):
        return text.replace("|", "\\|")


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
    if e2e:
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


def llamacpp_targets(e2e: dict) -> list[str]:
    """The issue's target: batch-1 decode ≥ llama.cpp's, at a quality within 0.03 of fp32."""
    rows = _by_key(e2e["results"])
    configs = [(t, m) for t, b, m in _configs(e2e["results"]) if b == 1]
    ours = [e for e in OURS if any(k[0] == e and k[2] == 1 for k in rows)]
    if not configs or not ours:
        return []
    lines = [
        f"Against llama.cpp at batch 1: decode tok/s ≥ {TARGET_LLAMACPP:g}× llama.cpp's, with a "
        f"quality (mean log-prob of the fp32 reference's greedy tokens) within {TARGET_QUALITY:g} "
        "of fp32's. ✅ both met, ❌ not (the reason after it), ⚠ a disturbed repetition.",
        "",
        "| threads | mode | engine | decode tok/s | / llama.cpp | quality Δ vs fp32 | target |",
        "|---:|---|---|---:|---:|---:|---|",
    ]
    for threads, mode in configs:
        llama = rows.get(("llamacpp", threads, 1, mode))
        for name in ours:
            r = rows.get((name, threads, 1, mode))
            if r is None:
                continue
            score = _quality(e2e, name) or {}
            delta = score.get("delta_vs_fp32")
            ratio = (
                r["decode_tokens_per_s"]["median"] / llama["decode_tokens_per_s"]["median"]
                if llama and llama["decode_tokens_per_s"]["median"]
                else None
            )
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
            noisy = _noisy(r["decode_tokens_per_s"]) or bool(
                llama and _noisy(llama["decode_tokens_per_s"])
            )
            lines.append(
                f"| {threads} | {mode} | {name} | {_fmt(r['decode_tokens_per_s']['median'])} "
                f"| {'—' if ratio is None else f'{ratio:.2f}×'} | {_num(delta, '+')} "
                f"| {mark}{' ⚠' if noisy else ''} |"
            )
    return [*lines, ""]


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
            score = _quality(e2e, engine) or {}
            delta = score.get("delta_vs_fp32")
            label = ("onnxsample fp32-optimum" if engine == "onnxsample" else engine) + (
                f" (Δq {delta:+.3f})" if delta is not None else ""
            )
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=label)
        ax.set_xticks(range(len(configs)))
        ax.set_xticklabels([f"t{t} b{b}\n{m}" for t, b, m in configs], fontsize=8)
        ax.set_ylabel("decode tokens/s (all sequences)")
        ax.set_title(f"End-to-end decode, {e2e['settings']['new_tokens']} new tokens")
        ax.legend(fontsize=7, ncol=2 if len(engines) > 5 else 1)
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
    "- Every `onnxsample*` engine is the same runtime (`onnxsample.Generator`, `onnxsample run`'s "
    "composed graph) on one export of the embedded GGUF; the variant is the model: "
    "`onnxsample` = optimum's layout in fp32 (attention as plain ops, the KV cache concatenated "
    "into a new `present.*` every step), `onnxsample-gqa-fp32` = our GroupQueryAttention layout in "
    "fp32 (one shared KV buffer, written in place), `onnxsample-gguf-a0`/`-a4` = that layout with "
    "the GGUF's own Q4_1/Q8_0 blocks transplanted (MatMulNBits) at accuracy level 0 (float "
    "compute: exact) or 4 (int8 activations, as llama.cpp computes), and "
    "`onnxsample-genai-graph` = onnxruntime-genai's builder graph of the fp32 weights.",
    "- `onnxsample` and `optimum` run the same `model.onnx`; they differ in where sampling runs "
    "(in the graph vs transformers' processors in torch) and in IOBinding. `genai` runs its "
    "builder's graph, so onnxsample vs genai mixes the runtime with the model graph; "
    "`onnxsample-genai-graph` separates the two.",
    "- At batch 1 the forward pass is nearly the whole step, so no sampler can make a step much "
    "faster than the forward pass alone (see *plain forward* below): a speed-up over optimum is "
    "bounded by the share of its step that host-side sampling takes.",
    "- The e2e onnxsample engines run `onnxsample run`'s graph (8 slots, top logprobs 20, 16 "
    "logit-bias entries); *graph_run* vs *graph full* (slots = batch) below shows what its idle "
    "slots and extra outputs cost a decode step.",
    "- llama.cpp runs the original Q4_1 weights (4-bit), with int8 activations: `onnxsample-gguf-a4` "
    "is the like-for-like comparison, `onnxsample-gguf-a0` the same weights computed in float. "
    "The quality column says what each engine's arithmetic costs: the mean log-probability it "
    "gives the fp32 model's greedy tokens, against fp32's own (a drop above 0.03 misses the "
    "target).",
    "",
]


def render(
    e2e: dict | None,
    overhead: dict | None,
    png_name: str | None,
    engine: dict[str, dict | None] | None = None,
) -> str:
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python benchmarks/report.py` from `benchmarks/results/*.json`; do not edit "
        "by hand. Reproduce from a fresh clone:",
        "",
        "```bash",
        "make setup                                         # .venv",
        "make genai-model                                   # .venv-genai and genai's fp32 model",
        ".venv/bin/python benchmarks/e2e.py                 # exports its variants on first use",
        ".venv/bin/python benchmarks/sampling_overhead.py",
        ".venv/bin/python benchmarks/engine.py load   # also chunked, prefix, echo",
        "bash scripts/build_llama_server.sh                 # llama-server, for serve.py",
        ".venv/bin/python benchmarks/serve.py",
        ".venv/bin/python benchmarks/speculative.py         # llama.cpp from .venv-llamacpp",
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
    lines += engine_section(engine or {})
    lines += speculative_section((engine or {}).get("speculative"))
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--e2e", default=str(HERE / "results/e2e.json"))
    p.add_argument("--sampling", default=str(HERE / "results/sampling_overhead.json"))
    p.add_argument(
        "--results",
        default=str(HERE / "results"),
        help="engine_*.json and serve.json are read here",
    )
    p.add_argument("--md", default=str(ROOT / "docs/benchmarks.md"))
    p.add_argument("--png", default=str(ROOT / "docs/benchmarks.png"))
    args = p.parse_args(argv)
    e2e, overhead = normalise(_load(Path(args.e2e))), _load(Path(args.sampling))
    md, png = Path(args.md), Path(args.png)
    drawn = chart(e2e, overhead, png)
    md.parent.mkdir(parents=True, exist_ok=True)
    name = str(png.relative_to(md.parent)) if drawn and png.parent == md.parent else str(png)
    engine = load_results(Path(args.results))
    md.write_text(render(e2e, overhead, name if drawn else None, engine))
    print(f"wrote {md}" + (f" and {png}" if drawn else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
