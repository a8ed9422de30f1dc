"""The chart of docs/benchmarks.md (docs/benchmarks.png): decode tokens/s per engine and
configuration (from e2e.json) beside the sampling share of a decode step (from
sampling_overhead.json). Imports matplotlib when it draws."""

from __future__ import annotations

from pathlib import Path

from report_e2e import ORDER, by_key, configs, quality_of
from report_targets import TARGET_SHARE


def chart(e2e: dict | None, overhead: dict | None, path: Path) -> bool:
    """Draw what there is into `path`; False (and nothing drawn) where there are no results."""
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
        rows, shown = by_key(e2e["results"]), configs(e2e["results"])
        engines = [e for e in ORDER if any(k[0] == e for k in rows)]
        width = 0.8 / max(len(engines), 1)
        for i, engine in enumerate(engines):
            xs, ys, lo, hi = [], [], [], []
            for c, (threads, batch, mode) in enumerate(shown):
                r = rows.get((engine, threads, batch, mode))
                if r is None:
                    continue
                d = r["decode_tokens_per_s"]
                xs.append(c + (i - (len(engines) - 1) / 2) * width)
                ys.append(d["median"])
                lo.append(d["median"] - d["min"])
                hi.append(d["max"] - d["median"])
            score = quality_of(e2e, engine) or {}
            delta = score.get("delta_vs_fp32")
            label = ("onnxsample fp32-optimum" if engine == "onnxsample" else engine) + (
                f" (Δq {delta:+.3f})" if delta is not None else ""
            )
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=label)
        ax.set_xticks(range(len(shown)))
        ax.set_xticklabels([f"t{t} b{b}\n{m}" for t, b, m in shown], fontsize=8)
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
