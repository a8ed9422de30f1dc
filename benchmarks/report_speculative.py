"""The speculative-decoding section of docs/benchmarks.md, from benchmarks/results/speculative.json
(written by benchmarks/speculative.py). Standard library only."""

from __future__ import annotations


def _v(row: dict | None, key: str, digits: int = 1) -> str:
    value = (row or {}).get(key)
    return "—" if value is None else f"{value:.{digits}f}"


def _x(row: dict | None, base: dict | None) -> str:
    a, b = (row or {}).get("decode_tokens_per_s"), (base or {}).get("decode_tokens_per_s")
    return "" if not a or not b else f" ({a / b:.2f}×)"


def speculative_section(data: dict | None) -> list[str]:
    if not data:
        return []
    settings = data.get("settings", {})
    ks = sorted(
        {
            int(name.removeprefix("onnxsample-k"))
            for key, threads in data["results"].items()
            if key.startswith("threads=")
            for workload in threads.values()
            for table in workload.values()
            for name in table
            if name.startswith("onnxsample-k")
        }
    )
    lines = [
        "## Speculative decoding",
        "",
        "`python benchmarks/speculative.py`: greedy decoding of three chat requests on the "
        "embedded model (gguf-a4 export, as `onnxsample run` uses it), stopping at "
        f"end-of-sequence or {settings.get('new_tokens')} tokens; batch B = B copies submitted "
        "together. *off*: plain decoding; *K=k*: `--speculative ngram --draft-tokens k "
        f"--ngram {settings.get('ngram')}`. llama.cpp: llama-cpp-python on the same token ids "
        "(batch 1), plain and with its prompt-lookup decoding (`LlamaPromptLookupDecoding`, k "
        "drafts). Decode tokens/s (medians of the repetitions; × = against *off*), the share of "
        "drafted tokens kept, and tokens per model call (decoded tokens ÷ calls). Prompt tokens: "
        + ", ".join(f"{w} {n}" for w, n in settings.get("prompt_tokens", {}).items())
        + ".",
        "",
    ]
    for threads, workloads in data["results"].items():
        if not threads.startswith("threads="):
            continue
        head = ["workload", "batch", "off"] + [f"K={k}" for k in ks]
        head += [f"kept K={k}" for k in ks] + [f"tok/call K={k}" for k in ks]
        head += ["llama.cpp", *(f"llama.cpp lookup {k}" for k in ks)]
        lines += [
            f"**{threads.replace('=', ' ')}**",
            "",
            "| " + " | ".join(head) + " |",
            "|---|---:" + "|---:" * (len(head) - 2) + "|",
        ]
        for workload, batches in workloads.items():
            for batch, table in batches.items():
                off = table.get("onnxsample-off")
                peer = table.get("llamacpp")
                cells = [workload, batch.removeprefix("batch="), _v(off, "decode_tokens_per_s")]
                cells += [
                    _v(table.get(f"onnxsample-k{k}"), "decode_tokens_per_s")
                    + _x(table.get(f"onnxsample-k{k}"), off)
                    for k in ks
                ]
                cells += [_v(table.get(f"onnxsample-k{k}"), "acceptance", 2) for k in ks]
                cells += [_v(table.get(f"onnxsample-k{k}"), "tokens_per_call", 2) for k in ks]
                cells.append(_v(peer, "decode_tokens_per_s"))
                cells += [
                    _v(table.get(f"llamacpp-lookup{k}"), "decode_tokens_per_s")
                    + _x(table.get(f"llamacpp-lookup{k}"), peer)
                    for k in ks
                ]
                lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    loads = [entry[0] for entry in data.get("load_average", [])]
    if loads:
        lines += [f"Load average (1 min) during the run: {min(loads)}–{max(loads)}.", ""]
    skipped = data["results"].get("skipped")
    if skipped:
        lines += [f"Not run: {', '.join(f'{k} ({v})' for k, v in skipped.items())}.", ""]
    return lines
