"""The speculative-decoding section of docs/benchmarks.md, from benchmarks/results/speculative.json
(written by benchmarks/speculative.py). Standard library only."""

from __future__ import annotations

from _harness.tables import load_line, num, ratio_note, table

_RATE = "decode_tokens_per_s"


def speculative_section(data: dict | None) -> list[str]:
    """Per thread count, a table of decode rates, drafts kept and tokens per call, per workload
    and batch, against plain decoding and llama.cpp (nothing where there are no results)."""
    if not data:
        return []
    settings = data.get("settings", {})
    ks = _draft_counts(data["results"])
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
        "drafted tokens kept, and tokens per model call (decoded tokens ÷ calls). *exact*: the "
        "same on the export with `--attention exact` (× its own *off*, and *off* against the "
        "GroupQueryAttention export's); *same*: whether speculation gave plain decoding's tokens "
        "(GroupQueryAttention / exact). Prompt tokens: "
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
        exact = any("exact-off" in e for batches in workloads.values() for e in batches.values())
        if exact:
            head += ["exact off", *(f"exact K={k}" for k in ks), *(f"same K={k}" for k in ks)]
        rows = [
            [
                workload,
                batch.removeprefix("batch="),
                *_cells(engines, ks),
                *(_exact_cells(engines, ks) if exact else ()),
            ]
            for workload, batches in workloads.items()
            for batch, engines in batches.items()
        ]
        lines += [f"**{threads.replace('=', ' ')}**", ""]
        lines += [*table(head, "l" + "r" * (len(head) - 1), rows), ""]
    line = load_line([entry[0] for entry in data.get("load_average", [])], "the run")
    if line:
        lines += [line, ""]
    skipped = data["results"].get("skipped")
    if skipped:
        lines += [f"Not run: {', '.join(f'{k} ({v})' for k, v in skipped.items())}.", ""]
    return lines


def _draft_counts(results: dict) -> list[int]:
    """The K values (draft tokens) of every onnxsample-kK engine in the results."""
    return sorted(
        {
            int(name.removeprefix("onnxsample-k"))
            for key, threads in results.items()
            if key.startswith("threads=")
            for workload in threads.values()
            for engines in workload.values()
            for name in engines
            if name.startswith("onnxsample-k")
        }
    )


def _cells(engines: dict, ks: list[int]) -> list[str]:
    """One workload and batch: off, each K (× off), kept, tokens per call, llama.cpp, lookups."""

    def field(name: str, key: str, digits: int = 1) -> str:
        return num((engines.get(name) or {}).get(key), digits)

    def rate(name: str, base: str) -> str:
        mine, theirs = engines.get(name) or {}, engines.get(base) or {}
        return field(name, _RATE) + ratio_note(mine.get(_RATE), theirs.get(_RATE))

    cells = [field("onnxsample-off", _RATE)]
    cells += [rate(f"onnxsample-k{k}", "onnxsample-off") for k in ks]
    cells += [field(f"onnxsample-k{k}", "acceptance", 2) for k in ks]
    cells += [field(f"onnxsample-k{k}", "tokens_per_call", 2) for k in ks]
    cells.append(field("llamacpp", _RATE))
    cells += [rate(f"llamacpp-lookup{k}", "llamacpp") for k in ks]
    return cells


def _exact_cells(engines: dict, ks: list[int]) -> list[str]:
    """The exact-attention export: off (× the GQA export's off), each K (× exact off), and whether
    each K's tokens equal plain decoding's on the GQA export and on the exact one."""
    off, gqa_off = engines.get("exact-off") or {}, engines.get("onnxsample-off") or {}
    cells = [num(off.get(_RATE), 1) + ratio_note(off.get(_RATE), gqa_off.get(_RATE))]
    for k in ks:
        row = engines.get(f"exact-k{k}") or {}
        cells.append(num(row.get(_RATE), 1) + ratio_note(row.get(_RATE), off.get(_RATE)))
    for k in ks:
        same = [
            (engines.get(name) or {}).get("same_tokens")
            for name in (f"onnxsample-k{k}", f"exact-k{k}")
        ]
        cells.append(" / ".join("–" if s is None else "yes" if s else "no" for s in same))
    return cells
