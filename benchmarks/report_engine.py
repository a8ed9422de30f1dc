"""The serving-engine section of docs/benchmarks.md, from benchmarks/results/engine_*.json
(written by benchmarks/engine.py). Standard library only."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("load", "chunked", "prefix", "echo")


def load_results(folder: Path = RESULTS) -> dict[str, dict | None]:
    found = {}
    for kind in KINDS:
        path = folder / f"engine_{kind}.json"
        found[kind] = json.loads(path.read_text()) if path.is_file() else None
    for name in ("serve", "serve_replicas", "serve_proxy", "speculative"):
        path = folder / f"{name}.json"
        found[name] = json.loads(path.read_text()) if path.is_file() else None
    return found


def _v(value, digits: int = 0) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _ratio(a, b) -> str:
    return "—" if not a or not b else f"{a / b:.2f}×"


def engine_section(results: dict[str, dict | None]) -> list[str]:
    if not any(results.values()):
        return []
    lines = [
        "## Serving engine",
        "",
        "`python benchmarks/engine.py load|chunked|prefix|echo` (each cell a fresh process; the "
        "embedded model, gguf-a4 export, 128 new tokens, EOS ignored).",
        "",
    ]
    lines += _load(results.get("load"))
    lines += _chunked(results.get("chunked"))
    lines += _prefix(results.get("prefix"))
    lines += _echo(results.get("echo"))
    lines += _serve(results.get("serve"))
    lines += _replicas(results.get("serve_replicas"), results.get("serve_proxy"))
    return lines


def _load(data: dict | None) -> list[str]:
    if not data:
        return []
    lines = [
        "### Closed-loop load on the Python API",
        "",
        "N client threads, each sending one request after another (a ~50-token chat prompt, its "
        "own user message). *closed batch* is the previous release's `Generator`: the N prompts "
        "in one `generate` call, the next batch after it. Medians of the repetitions; latencies "
        "in ms.",
        "",
        "| threads | clients | engine tok/s | closed tok/s | ratio | engine TTFT p50 / p99 | "
        "closed TTFT p50 / p99 | engine ITL p50 / p99 | closed ITL p50 / p99 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cell in data.get("median", []):
        e, c = cell.get("engine", {}), cell.get("closed_batch", {})
        lines.append(
            f"| {cell['threads']} | {cell['clients']} | {_v(e.get('tokens_per_s'))} | "
            f"{_v(c.get('tokens_per_s'))} | {_ratio(e.get('tokens_per_s'), c.get('tokens_per_s'))}"
            f" | {_v(e.get('ttft_ms_p50'))} / {_v(e.get('ttft_ms_p99'))} | "
            f"{_v(c.get('ttft_ms_p50'))} / {_v(c.get('ttft_ms_p99'))} | "
            f"{_v(e.get('itl_ms_p50'))} / {_v(e.get('itl_ms_p99'))} | "
            f"{_v(c.get('itl_ms_p50'))} / {_v(c.get('itl_ms_p99'))} |"
        )
    lines += _loads(data.get("rows", []))
    return [*lines, ""]


def _chunked(data: dict | None) -> list[str]:
    if not data:
        return []
    lines = [
        "### Inter-token latency while a 2,000-token prompt is admitted",
        "",
        "Two streams decode; a 2,000-token prompt arrives. Every gap between two tokens of a "
        "stream that overlaps the admission counts. Medians of the repetitions.",
        "",
        "| prefill chunk | admission s | stream tokens meanwhile | ITL p50 ms | ITL p99 ms | "
        "longest gap ms |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for chunk, m in data.get("median", {}).items():
        label = "whole prompt" if chunk == "0" else chunk
        lines.append(
            f"| {label} | {_v(m['admission_s'], 2)} | {_v(m['stream_tokens_during'])} | "
            f"{_v(m['itl_ms_p50'])} | {_v(m['itl_ms_p99'])} | {_v(m['itl_ms_max'])} |"
        )
    return [*lines, ""]


def _prefix(data: dict | None) -> list[str]:
    if not data:
        return []
    med = data.get("median", {})
    lines = [
        "### Prefix reuse: a 5-turn chat",
        "",
        "Each turn's time to first token; with reuse, a turn prefills only what the previous one "
        "did not leave in the slot. Medians of the repetitions.",
        "",
        "| turn | prompt tokens | reused | TTFT ms, reuse | TTFT ms, no reuse | speed-up |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    turn = 1
    while f"reuse-turn{turn}" in med:
        r, n = med[f"reuse-turn{turn}"], med.get(f"no-reuse-turn{turn}", {})
        lines.append(
            f"| {turn} | {r['prompt_tokens']} | {r['cached_tokens']} | {_v(r['ttft_ms'], 1)} | "
            f"{_v(n.get('ttft_ms'), 1)} | {_ratio(n.get('ttft_ms'), r['ttft_ms'])} |"
        )
        turn += 1
    return [*lines, ""]


def _echo(data: dict | None) -> list[str]:
    if not data:
        return []
    return [
        "### Prompt logprobs (echo)",
        "",
        f"- Asked: a {data['prompt_tokens']}-token prefill with the logprob and top 5 of every "
        f"prompt token takes {data['prefill_ms_asked']} ms against {data['prefill_ms_not_asked']} "
        f"ms without ({data['asked_cost_ratio']}×): the LM head runs on every prompt row.",
        f"- Not asked: a decode step of a graph composed with prompt logprobs takes "
        f"{data['decode_ms_per_step_graph_with']} ms against "
        f"{data['decode_ms_per_step_graph_without']} ms for one without "
        f"({data['not_asked_cost_ratio']}×, inside the noise).",
        f"- {data['threads']} threads, {data['repeats']} alternating repetitions, load "
        f"{data.get('load')}.",
        "",
    ]


def _serve(data: dict | None) -> list[str]:
    if not data:
        return []
    rows = data.get("rows", [])
    lines = [
        "### `onnxsample serve` against llama-server",
        "",
        f"`python benchmarks/serve.py` (llama-server from `scripts/build_llama_server.sh`): both "
        f"servers on the same Q4_1 GGUF (ours as its gguf-a4 export), {data.get('threads')} "
        f"threads, {data.get('slots')} slots; closed-loop clients stream OpenAI chat completions "
        f"over loopback HTTP, {data.get('new_tokens')} new tokens each, EOS ignored. *sampled* is "
        "temperature 0.8, top-k 40, top-p 0.95, min-p 0.05. Latencies in ms, measured by the "
        "client; ratio = onnxsample tok/s ÷ llama-server tok/s.",
        "",
    ]
    lines += _pair_table(rows, ("onnxsample", "onnxsample"), ("llama-server", "llama-server"))
    cells = {(r["engine"], r["mode"], r["clients"]): r for r in rows}
    for why in (data.get("skipped") or {}).values():
        lines += ["", f"llama-server skipped: {why}."]
    api = {r["mode"]: r for r in rows if r["engine"] == "python-api"}
    if api:
        lines += [
            "",
            "What HTTP + JSON add to one stream: the same chat through `Engine` in-process "
            "(*python-api*) against one client of `onnxsample serve`.",
            "",
            "| mode | python-api TTFT p50 | serve TTFT p50 | python-api ITL p50 / p99 | "
            "serve ITL p50 / p99 |",
            "|---|---:|---:|---:|---:|",
        ]
        for mode, a in api.items():
            o = cells.get(("onnxsample", mode, 1), {})
            lines.append(
                f"| {mode} | {_v(a.get('ttft_ms_p50'), 1)} | {_v(o.get('ttft_ms_p50'), 1)} | "
                f"{_v(a.get('itl_ms_p50'), 1)} / {_v(a.get('itl_ms_p99'), 1)} | "
                f"{_v(o.get('itl_ms_p50'), 1)} / {_v(o.get('itl_ms_p99'), 1)} |"
            )
    lines += _loads(rows)
    return [*lines, ""]


def _loads(rows: list[dict]) -> list[str]:
    loads = [r["load_average"][0] for r in rows if r.get("load_average")]
    if not loads:
        return []
    return ["", f"Load average (1 min) during the runs: {min(loads)}–{max(loads)}."]


def _pair_table(rows: list[dict], a: tuple[str, str], b: tuple[str, str]) -> list[str]:
    """Engine a (name, label) against engine b per mode and client count; ratio = a ÷ b."""
    (ea, la), (eb, lb) = a, b
    cells = {(r["engine"], r["mode"], r["clients"]): r for r in rows}
    lines = [
        f"| mode | clients | {la} tok/s | {lb} tok/s | ratio | {la} TTFT p50 / p99 | "
        f"{lb} TTFT p50 / p99 | {la} ITL p50 / p99 | {lb} ITL p50 / p99 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, clients in sorted({(r["mode"], r["clients"]) for r in rows if r["engine"] == ea}):
        x, y = cells.get((ea, mode, clients), {}), cells.get((eb, mode, clients), {})
        lines.append(
            f"| {mode} | {clients} | {_v(x.get('tokens_per_s'))} | {_v(y.get('tokens_per_s'))} | "
            f"{_ratio(x.get('tokens_per_s'), y.get('tokens_per_s'))} | "
            f"{_v(x.get('ttft_ms_p50'))} / {_v(x.get('ttft_ms_p99'))} | "
            f"{_v(y.get('ttft_ms_p50'))} / {_v(y.get('ttft_ms_p99'))} | "
            f"{_v(x.get('itl_ms_p50'), 1)} / {_v(x.get('itl_ms_p99'), 1)} | "
            f"{_v(y.get('itl_ms_p50'), 1)} / {_v(y.get('itl_ms_p99'), 1)} |"
        )
    return lines


def _proxy(data: dict | None) -> list[str]:
    """What Ray Serve's proxy adds to one request: one replica with all the threads against one
    process, one client."""
    if not data:
        return []
    lines = [
        "",
        f"What Ray Serve's proxy adds to a request: `--engines onnxsample replicas --replicas 1 "
        f"--concurrency 1`, one replica with all {data.get('threads')} threads against one "
        "process, one client.",
        "",
        "| mode | one process TTFT p50 | 1 replica TTFT p50 | one process ITL p50 | "
        "1 replica ITL p50 | added TTFT | added per token |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    rows = data.get("rows", [])
    cells = {(r["engine"], r["mode"]): r for r in rows if r.get("clients") == 1}
    for mode in sorted({m for _, m in cells}):
        o, r = cells.get(("onnxsample", mode), {}), cells.get(("replicas", mode), {})
        added = [
            None if r.get(k) is None or o.get(k) is None else r[k] - o[k]
            for k in ("ttft_ms_p50", "itl_ms_p50")
        ]
        lines.append(
            f"| {mode} | {_v(o.get('ttft_ms_p50'), 1)} | {_v(r.get('ttft_ms_p50'), 1)} | "
            f"{_v(o.get('itl_ms_p50'), 1)} | {_v(r.get('itl_ms_p50'), 1)} | "
            f"{_v(added[0], 1)} ms | {_v(added[1], 1)} ms |"
        )
    return lines


def _replicas(data: dict | None, proxy: dict | None = None) -> list[str]:
    if not data:
        return []
    n, threads = data.get("replicas"), data.get("threads")
    lines = [
        "### One process or Ray Serve replicas",
        "",
        f"`python benchmarks/serve.py --engines onnxsample replicas`: the same closed-loop HTTP "
        f"clients against one `onnxsample serve` process with {threads} threads and against "
        f"`onnxsample serve --replicas {n}` with the {threads} threads split between the replicas "
        "(Ray Serve's proxy in front). Both on the same cores, so this says what Serve costs "
        "here; the scaling itself needs more cores. Each replica has the graph's "
        f"{data.get('slots')} slots, so past {data.get('slots')} clients the one process queues "
        "where the replicas still decode (the TTFT gap at 16). ratio = replicas tok/s ÷ one "
        "process tok/s.",
        "",
    ]
    rows = data.get("rows", [])
    lines += _pair_table(rows, ("replicas", "replicas"), ("onnxsample", "one process"))
    lines += _proxy(proxy)
    lines += _loads(rows)
    return [*lines, ""]
