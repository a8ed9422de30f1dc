"""The serving-engine section of docs/benchmarks.md, from benchmarks/results/engine_*.json (written
by benchmarks/engine.py) and serve*.json (benchmarks/serve.py); :func:`load_results` also reads
speculative.json for report_speculative.py. Standard library only."""

from __future__ import annotations

from pathlib import Path

from _harness.script import RESULTS, read_json
from _harness.tables import load_line, num, ratio, table

KINDS = ("load", "chunked", "prefix", "echo")


def load_results(folder: Path = RESULTS) -> dict[str, dict | None]:
    """Every results file these sections read, by name (None where missing)."""
    names = [f"engine_{kind}" for kind in KINDS]
    names += [
        "serve",
        "serve_replicas",
        "serve_proxy",
        "speculative",
        "structured",
        "gguf_files",
        "gguf_mixes",
        "gguf_k_quants",
        "gguf_repack",
        "gguf_minimums",
        "gguf_codes",
        "gguf_kernels",
        "gguf_k_quants_epyc-avx512_2026-12-07",
        "gguf_kernels_epyc-avx512_2026-12-07",
        "export_memory",
        "export_memory_cuda",
        "export_time",
        "export_time_verify",
        "compose_memory",
        "compose_memory_one_file",
        "startup",
    ]
    found = {name: read_json(folder / f"{name}.json") for name in names}
    return {name.removeprefix("engine_"): data for name, data in found.items()}


def engine_section(results: dict[str, dict | None]) -> list[str]:
    """Every serving table there are results for (nothing where there are none)."""
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


def _pair_head(a: str, b: str) -> list[str]:
    """The columns of :func:`_pair_cells`, engine a labelled `a` and engine b `b`."""
    head = [f"{a} tok/s", f"{b} tok/s", "ratio"]
    return head + [f"{e} {what} p50 / p99" for what in ("TTFT", "ITL") for e in (a, b)]


def _pair_cells(x: dict, y: dict, itl_digits: int) -> list[str]:
    """x against y: tok/s of each, x ÷ y, TTFT p50 / p99 of each, ITL p50 / p99 of each."""
    return [
        num(x.get("tokens_per_s")),
        num(y.get("tokens_per_s")),
        ratio(x.get("tokens_per_s"), y.get("tokens_per_s")),
        _p50_p99(x, "ttft_ms", 0),
        _p50_p99(y, "ttft_ms", 0),
        _p50_p99(x, "itl_ms", itl_digits),
        _p50_p99(y, "itl_ms", itl_digits),
    ]


def _p50_p99(row: dict, what: str, digits: int) -> str:
    return f"{num(row.get(f'{what}_p50'), digits)} / {num(row.get(f'{what}_p99'), digits)}"


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
    ]
    rows = [
        [
            c["threads"],
            c["clients"],
            *_pair_cells(c.get("engine", {}), c.get("closed_batch", {}), 0),
        ]
        for c in data.get("median", [])
    ]
    lines += table(["threads", "clients", *_pair_head("engine", "closed")], "rrrrrrrrr", rows)
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
    ]
    counts = ("stream_tokens_during", "itl_ms_p50", "itl_ms_p99", "itl_ms_max")
    rows = [
        [
            "whole prompt" if chunk == "0" else chunk,
            num(m["admission_s"], 2),
            *(num(m[k]) for k in counts),
        ]
        for chunk, m in data.get("median", {}).items()
    ]
    head = ["prefill chunk", "admission s", "stream tokens meanwhile", "ITL p50 ms", "ITL p99 ms"]
    return [*lines, *table([*head, "longest gap ms"], "rrrrrr", rows), ""]


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
    ]
    rows = []
    turn = 1
    while f"reuse-turn{turn}" in med:
        r, n = med[f"reuse-turn{turn}"], med.get(f"no-reuse-turn{turn}", {})
        reused, alone = r["ttft_ms"], n.get("ttft_ms")
        rows.append(
            [
                turn,
                r["prompt_tokens"],
                r["cached_tokens"],
                num(reused, 1),
                num(alone, 1),
                ratio(alone, reused),
            ]
        )
        turn += 1
    head = ["turn", "prompt tokens", "reused", "TTFT ms, reuse", "TTFT ms, no reuse", "speed-up"]
    return [*lines, *table(head, "rrrrrr", rows), ""]


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
        f"`python benchmarks/serve.py` (llama-server from `make llama-cpp`): both "
        f"servers on the same Q4_1 GGUF (ours as its gguf-a4 export), {data.get('threads')} "
        f"threads, {data.get('slots')} slots; closed-loop clients stream OpenAI chat completions "
        f"over loopback HTTP, {data.get('new_tokens')} new tokens each, EOS ignored. *sampled* is "
        "temperature 0.8, top-k 40, top-p 0.95, min-p 0.05. Latencies in ms, measured by the "
        "client; ratio = onnxsample tok/s ÷ llama-server tok/s.",
        "",
    ]
    lines += _pair_table(rows, ("onnxsample", "onnxsample"), ("llama-server", "llama-server"))
    if any(r["engine"] == "onnxsample-spec" for r in rows):
        lines += [
            "",
            "With `--speculative ngram` (*spec*): a request decoding alone drafts every step "
            "(its n-gram draft, else its last token again); on this GroupQueryAttention export "
            "requests decoding together do not draft.",
            "",
        ]
        spec = ("onnxsample-spec", "spec")
        lines += _pair_table(rows, spec, ("llama-server", "llama-server"))
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
        ]
        api_rows = []
        for mode, a in api.items():
            o = cells.get(("onnxsample", mode, 1), {})
            ttft = [num(a.get("ttft_ms_p50"), 1), num(o.get("ttft_ms_p50"), 1)]
            api_rows.append([mode, *ttft, _p50_p99(a, "itl_ms", 1), _p50_p99(o, "itl_ms", 1)])
        head = ["mode", "python-api TTFT p50", "serve TTFT p50", "python-api ITL p50 / p99"]
        lines += table([*head, "serve ITL p50 / p99"], "lrrrr", api_rows)
    lines += _loads(rows)
    return [*lines, ""]


def _loads(rows: list[dict]) -> list[str]:
    line = load_line([r["load_average"][0] for r in rows if r.get("load_average")])
    return ["", line] if line else []


def _pair_table(rows: list[dict], a: tuple[str, str], b: tuple[str, str]) -> list[str]:
    """Engine a (name, label) against engine b per mode and client count; ratio = a ÷ b."""
    (ea, la), (eb, lb) = a, b
    cells = {(r["engine"], r["mode"], r["clients"]): r for r in rows}
    body = [
        [
            mode,
            clients,
            *_pair_cells(cells.get((ea, mode, clients), {}), cells.get((eb, mode, clients), {}), 1),
        ]
        for mode, clients in sorted({(r["mode"], r["clients"]) for r in rows if r["engine"] == ea})
    ]
    return table(["mode", "clients", *_pair_head(la, lb)], "lrrrrrrrr", body)


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
    ]
    cells = {(r["engine"], r["mode"]): r for r in data.get("rows", []) if r.get("clients") == 1}
    rows = []
    for mode in sorted({m for _, m in cells}):
        o, r = cells.get(("onnxsample", mode), {}), cells.get(("replicas", mode), {})
        added = [
            None if r.get(k) is None or o.get(k) is None else r[k] - o[k]
            for k in ("ttft_ms_p50", "itl_ms_p50")
        ]
        p50s = [num(row.get(k), 1) for k in ("ttft_ms_p50", "itl_ms_p50") for row in (o, r)]
        rows.append([mode, *p50s, *(f"{num(a, 1)} ms" for a in added)])
    head = ["mode", "one process TTFT p50", "1 replica TTFT p50", "one process ITL p50"]
    head += ["1 replica ITL p50", "added TTFT", "added per token"]
    return [*lines, *table(head, "lrrrrrr", rows)]


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
