"""The end-to-end section of docs/benchmarks.md, from benchmarks/results/e2e.json (written by
benchmarks/e2e.py): the engines, the quality table and the decode table; and what the other e2e
sections read from those results (engine order and names, rows by configuration, disturbed
repetitions, quality entries). Standard library only."""

from __future__ import annotations

from pathlib import Path

from _harness.script import ROOT
from _harness.tables import DASH, num, ratio, run_section, table

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
NOISY = 0.75  # a repetition below 75 % of the median: something else probably ran


def normalise(data: dict | None) -> dict | None:
    """Older results under their engines' current names."""
    if data is None:
        return None
    data["engines"] = {ALIASES.get(k, k): v for k, v in data.get("engines", {}).items()}
    for row in data.get("results", []):
        row["engine"] = ALIASES.get(row["engine"], row["engine"])
    return data


def noisy(stat: dict) -> bool:
    """Whether a repetition ran below :data:`NOISY` of the median."""
    return stat["min"] < NOISY * stat["median"]


def configs(rows: list[dict]) -> list[tuple[int, int, str]]:
    """The (threads, batch, mode) configurations of the results, sorted."""
    return sorted({(r["threads"], r["batch"], r["mode"]) for r in rows})


def by_key(rows: list[dict]) -> dict[tuple, dict]:
    """The results by (engine, threads, batch, mode)."""
    return {(r["engine"], r["threads"], r["batch"], r["mode"]): r for r in rows}


def decode(row: dict | None) -> float | None:
    """A result's median decode tokens/s (None for no result)."""
    return row["decode_tokens_per_s"]["median"] if row else None


def quality_of(data: dict, engine: str) -> dict | None:
    """The engine's quality entry, when the run scored it."""
    return (data["engines"].get(engine) or {}).get("quality")


def _cell(stat: dict, digits: int = 1, mark: bool = False) -> str:
    low, high = num(stat["min"], digits, group=True), num(stat["max"], digits, group=True)
    text = f"{num(stat['median'], digits, group=True)} ({low}–{high})"
    return text + (" ⚠" if mark and noisy(stat) else "")


def _quality_cell(score: dict | None) -> str:
    if not score or score.get("mean_logprob") is None:
        return DASH
    delta = score.get("delta_vs_fp32")
    text = num(score["mean_logprob"], 3)
    return text + (f" ({num(delta, 3, '+')})" if delta is not None else "")


def _engine_line(name: str, info: dict) -> str:
    label = ENGINE_LABELS[name]
    if info["status"] != "ok":
        return f"- {label}: **skipped** — {info['reason']}"
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
    return f"- {label}: {vers}{extra}"


def e2e_section(data: dict | None) -> list[str]:
    """How the run was made, its engines, the quality table and the decode table."""
    lines = run_section("## End-to-end decode", data, "e2e.py")
    if data is None:
        return lines
    s = data["settings"]
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
    lines += [_engine_line(n, data["engines"][n]) for n in ORDER if n in data["engines"]]
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
    ]
    head = ["threads", "batch", "mode", "engine", "decode tok/s", "vs onnxsample", "vs llama.cpp"]
    head += ["quality", "prefill tok/s", "TTFT ms", "peak RSS MB"]
    return [*lines, *table(head, "rrllrrrrrrr", _decode_rows(data)), ""]


def _decode_rows(data: dict) -> list[list[str]]:
    rows, new_tokens = by_key(data["results"]), data["settings"]["new_tokens"]
    cells = []
    for threads, batch, mode in configs(data["results"]):
        base = rows.get(("onnxsample", threads, batch, mode))
        llama = rows.get(("llamacpp", threads, batch, mode))
        for name in ORDER:
            r = rows.get((name, threads, batch, mode))
            if r is None:
                continue
            tokens = r["tokens_per_sequence"]
            flag = "" if tokens == [new_tokens] else f" ⚠ tokens {tokens}"
            cells.append(
                [
                    threads,
                    batch,
                    mode,
                    f"{name}{flag}",
                    _cell(r["decode_tokens_per_s"], mark=True),
                    ratio(decode(r), decode(base)),
                    ratio(decode(r), decode(llama)),
                    _quality_cell(quality_of(data, name)),
                    _cell(r["prefill_tokens_per_s"], 0),
                    _cell(r["ttft_ms"], 0),
                    num(r["peak_rss_mb"], 0, group=True),
                ]
            )
    return cells


def quality_section(data: dict) -> list[str]:
    """The quality table: each engine's score of the reference's greedy tokens."""
    q = data.get("quality")
    if not q:
        return []
    lines = [
        "",
        f"Quality: {q['method']}. Reference: {q['reference']} ({len(q['tokens'])} greedy tokens), "
        f"scoring {num(q.get('reference_logprob'), 4)} itself.",
        "",
    ]
    rows = []
    for name in ORDER:
        score = quality_of(data, name)
        if score is None:
            continue
        where = score.get("scored_on") or score.get("reason", "")
        mean, delta = score.get("mean_logprob"), score.get("delta_vs_fp32")
        rows.append([name, num(mean, 4), num(delta, 4, "+"), _short(where)])
    return [*lines, *table(["engine", "mean log-prob", "Δ vs fp32", "scored on"], "lrrl", rows)]


def _short(text: str) -> str:
    """A path relative to the checkout, where it is one."""
    try:
        return f"`{Path(text).resolve().relative_to(ROOT)}`"
    except (ValueError, OSError):
        return text.replace("|", "\\|")
