"""The sampling-overhead section of docs/benchmarks.md, from
benchmarks/results/sampling_overhead.json (written by benchmarks/sampling_overhead.py): the time of a
decode step per variant, and the share sampling takes in the graph and on the host. Standard library
only."""

from __future__ import annotations

from _harness.tables import DASH, num, run_section, table


def overhead_section(data: dict | None) -> list[str]:
    """How the run was made and its table of step times and shares."""
    lines = run_section("## Sampling overhead", data, "sampling_overhead.py")
    if data is None:
        return lines
    s = data["settings"]
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
    ]
    head = ["batch", "threads", "graph full", "graph greedy", "graph_run (8 slots)"]
    head += ["plain forward", "+ numpy sampling", "numpy argmax", "sampler alone"]
    head += ["in-graph share", "host share"]
    rows = []
    for r in data["results"]:
        t, sh = r["step_ms"], r["share"]
        run8 = _ms(t["graph_run_8_slots"], 2) if "graph_run_8_slots" in t else DASH
        rows.append(
            [
                r["batch"],
                r["threads"],
                _ms(t["graph_full"], 2),
                _ms(t["graph_greedy"], 2),
                run8,
                _ms(t["plain_forward"], 2),
                _ms(t["host_sampling_full"], 2),
                _ms(t["host_sampling_greedy"], 3),
                _ms(t["sampler_alone_full"], 3),
                f"{sh['in_graph_sampler_alone']:.2%}",
                f"{sh['host_numpy']:.2%}",
            ]
        )
    return [*lines, *table(head, "r" * 11, rows), ""]


def _ms(value: float, digits: int) -> str:
    return num(value, digits, group=True)
