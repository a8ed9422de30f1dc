"""The GGUF-files section of docs/benchmarks.md, from benchmarks/results/gguf_files.json (written by
benchmarks/gguf_files.py). Standard library only."""

from __future__ import annotations

from _harness.tables import load_line, num, table, times

_PARTS = ("rest_of_model", "gguf_minimums", "lm_head", "sampler_chain")


def gguf_section(data: dict | None) -> list[str]:
    """Per model: ours against llama-server on the same file (decode and prompt tok/s, batch 1 and
    8, 1 and 2 threads) and where one of our decode steps goes (nothing without results)."""
    if not data:
        return []
    lines = [
        "## GGUF files against llama-server",
        "",
        "`python benchmarks/gguf_files.py --profile`: each GGUF exported by `onnxsample export FILE` "
        "(its own blocks, int8 activations), composed with the full chain (8 slots) and run by "
        "`onnxsample.Generator`, against llama-server (built from the llama-cpp-python sdist, 8 "
        "slots) on the same file and threads; the same prompt ids, greedy, EOS ignored, "
        f"{data.get('new_tokens')} new tokens, batch = concurrent sequences; medians, ratio = "
        "ours ÷ llama-server.",
        "",
    ]
    for name, entry in data.get("models", {}).items():
        lines += [
            f"### {name}: `{entry['gguf']}`",
            "",
            f"File {num(entry['gguf_mb'], 1)} MB, export {num(entry['export_mb'], 1)} MB "
            f"({times(entry['export_mb'] / entry['gguf_mb'])}); prompt {entry['prompt_tokens']} "
            f"tokens, the same ids as llama-tokenize: {'yes' if entry['same_prompt_ids'] else 'NO'}.",
            "",
        ]
        head = [
            "threads",
            "batch",
            "decode ours",
            "decode llama-server",
            "ratio",
            "prompt ours",
            "prompt llama-server",
            "ratio",
        ]
        rows = []
        for c in entry["cells"]:
            d, p = c["decode_tok_s"], c["prompt_tok_s"]
            rows.append(
                [
                    c["threads"],
                    c["batch"],
                    num(d["onnxsample"]["median"], 1),
                    num(d["llama-server"]["median"], 1),
                    times(d["ratio"]),
                    num(p["onnxsample"]["median"]),
                    num(p["llama-server"]["median"]),
                    times(p["ratio"]),
                ]
            )
        lines += [*table(head, "rrrrrrrr", rows), ""]
        profile = entry.get("profile") or {}
        if profile:
            head = ["threads", *(f"{p} (ms, share)" for p in _PARTS)]
            rows = [
                [
                    threads,
                    *(
                        f"{num(v['ms_per_step'].get(p), 3)} ({num(100 * v['share'].get(p, 0))}%)"
                        for p in _PARTS
                    ),
                ]
                for threads, v in profile.items()
            ]
            lines += [
                "One batch-1 decode step (the plain export's one-token call over 256 past "
                "positions, ONNX Runtime's profiler, which adds its own cost to every node; the "
                "sampler chain's standalone model timed alone):",
                "",
                *table(head, "r" * len(head), rows),
                "",
            ]
    run = data.get("run") or {}
    line = load_line(
        [*(run.get("load_average_before") or [])[:1], *(run.get("load_average_after") or [])[:1]]
    )
    return lines + ([line, ""] if line else [])
