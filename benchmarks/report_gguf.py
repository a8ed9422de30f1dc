"""The GGUF sections of docs/benchmarks.md: files and mixes against llama-server (gguf_files.json,
gguf_mixes.json from benchmarks/gguf_files.py), the forms of a weight (gguf_minimums.py,
gguf_codes.py) and llama.cpp's kernels inside ONNX Runtime (gguf_kernels.py). Standard library
only."""

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
        "`onnxsample.Generator` after a warm-up run of the same length, against llama-server (built from the llama-cpp-python sdist, 8 "
        "slots) on the same file and threads; the same prompt ids, greedy, EOS ignored, "
        f"{data.get('new_tokens')} new tokens, batch = concurrent sequences; medians, ratio = "
        "ours ÷ llama-server.",
        "",
    ]
    return lines + _models(data, "###")


def mixes_section(data: dict | None) -> list[str]:
    """The same table for one model in each of llama-quantize's mixes (nothing without
    results)."""
    if not data:
        return []
    lines = [
        "### One model in every mix llama-quantize writes",
        "",
        "`python benchmarks/gguf_files.py --models smollm2:Q4_0,smollm2:Q4_K_M,... --output "
        "benchmarks/results/gguf_mixes.json`: the embedded SmolLM2-135M file re-quantised by "
        "llama.cpp's own `llama-quantize --allow-requantize` into each mix (the same blocks "
        "re-quantised, so no better a model; the tensor types and layout are what llama.cpp "
        "writes for that mix), then as above, "
        f"{data.get('new_tokens')} new tokens.",
        "",
    ]
    return lines + _models(data, "####")


def k_quants_section(data: dict | None) -> list[str]:
    """The same table for a model whose rows are multiples of 256, in each K-quant mix (nothing
    without results)."""
    if not data:
        return []
    lines = [
        "### K-quants as the 1B-and-up models have them",
        "",
        "`python benchmarks/gguf_files.py --models llama256:Q4_K_M,llama256:Q4_0,... --output "
        "benchmarks/results/gguf_k_quants.json`: the two files above have 576- and 640-wide rows, "
        "which llama-quantize cannot split into 256-weight super-blocks, so their K-quant mixes "
        "are mostly Q5_0, Q5_1 and Q8_0. `llama256` is a Llama-shaped model of 0.19B parameters "
        "whose rows are multiples of 256 (hidden 1024, intermediate 2816, 12 layers, 16 query and "
        "4 KV heads, tied embeddings, SmolLM2's tokenizer) with random weights, written by "
        "llama.cpp's own converter and quantised by `llama-quantize` into each mix: the tensor "
        "types of a 1B-and-up model's file (Q4_K_M: Q4_K, with Q6_K for half the `attn_v` and "
        "`ffn_down` and for the tied embedding). Random weights make the text meaningless, not "
        f"the speed; then as above, {data.get('new_tokens')} new tokens. (The export on disk "
        "keeps 5- and 6-bit codes in their bits; a session widens them to the 8-bit codes "
        "`MatMulNBits` reads.)",
        "",
    ]
    return lines + _models(data, "####")


def repack_section(data: dict | None) -> list[str]:
    """Batch-1 decode against llama-server with and without its weight repacking (``gguf_files.py
    --no-repack``), one row per file and thread count (nothing without results)."""
    if not data:
        return []
    lines = [
        "### llama.cpp's weight repacking",
        "",
        "`python benchmarks/gguf_files.py --models smollm2,smollm2:Q4_0,smollm2:Q4_K_M,"
        "llama256:Q4_0,llama256:Q4_K_M --threads 1,2 --batch 1 --repeats 5 --no-repack --output "
        "benchmarks/results/gguf_repack.json`: at load, llama.cpp's CPU backend re-lays Q4_0, "
        "Q4_K and IQ4_NL weights into interleaved rows that its own AVX2 matrix-vector kernels "
        "read (the `CPU_REPACK` buffer); Q4_1, Q5_0, Q6_K and Q8_0 stay as the file has them. "
        "A second llama-server with `--no-repack` on the same file, alternating with the first and "
        "with ours, shows how much of a batch-1 decode that is (on Q4_1, which has nothing to "
        "repack, the two servers differ only by the run's noise). Ours: the export of the file as "
        "above, whose 4-bit codes `MatMulNBits` reads in its own layout; a weight with minimums "
        "(Q4_1, Q4_K) adds their correction (see the forms below). Decode tok/s, medians of the "
        "repetitions, batch 1.",
        "",
    ]
    head = ["file", "threads", "ours", "llama-server", "ratio", "--no-repack", "ratio"]
    rows = []
    for name, entry in data.get("models", {}).items():
        for c in entry["cells"]:
            d = c["decode_tok_s"]
            peer = d.get("llama-server-no-repack") or {}
            rows.append(
                [
                    f"`{name}`",
                    c["threads"],
                    num(d["onnxsample"]["median"], 1),
                    num(d["llama-server"]["median"], 1),
                    times(d["ratio"]),
                    num(peer.get("median"), 1),
                    times(d.get("ratio_no_repack")),
                ]
            )
    lines += [*table(head, "lrrrrrr", rows), ""]
    return lines + _machine_and_load(data.get("run") or {})


def _models(data: dict, heading: str) -> list[str]:
    """Each model's table (and profile), under a `heading`-level title."""
    lines: list[str] = []
    for name, entry in data.get("models", {}).items():
        lines += [
            f"{heading} {name}: `{entry['gguf']}`",
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
    return lines + _machine_and_load(data.get("run") or {})


def _machine_and_load(run: dict) -> list[str]:
    """The machine's line (llama.cpp's kernels and ours compare differently on another CPU) and
    the load's."""
    lines = []
    machine = run.get("machine") or {}
    if machine.get("cpu"):
        cpus = f", {machine['cpus']} cores" if machine.get("cpus") else ""
        simd = f" ({', '.join(machine['simd'])})" if machine.get("simd") else ""
        lines += [f"Machine: {machine['cpu']}{simd}{cpus}.", ""]
    line = load_line(
        [*(run.get("load_average_before") or [])[:1], *(run.get("load_average_after") or [])[:1]]
    )
    return lines + ([line, ""] if line else [])


_FORMS = {
    "none": "MatMulNBits alone (the floor: not the file's weights)",
    "reduce_sum": "Reshape + ReduceSum, MatMul, Add (what the export emits)",
    "indicator_matmul": "x @ 0/1 block indicator, MatMul, Add",
    "gemm_2d": "2-D: Reshape + ReduceSum, Gemm onto the MatMulNBits output",
    "nbits_block_sums": "block sums as extra MatMulNBits columns (int8 sums), Split, MatMul, Add",
    "duplicated_k": "one MatMulNBits over [x, x], the minimums as the second half's scales",
    "cached_minimums": "`reduce_sum` with minimums shared by the layers, in cache (not the file's)",
    "float_zero_points": "one MatMulNBits with float zero points (ORT dequantises every call)",
}


def minimums_section(data: dict | None) -> list[str]:
    """benchmarks/gguf_minimums.py's forms of the minimums' correction, per layer (nothing
    without results)."""
    if not data:
        return []
    shapes = ", ".join(f"{k}→{n}" for _, k, n in data.get("projections", []))
    lines = [
        "### The minimums' correction, form by form",
        "",
        "`python benchmarks/gguf_minimums.py`: a weight with minimums (Q4_1, Q5_1, Q4_K, Q5_K, "
        "Q2_K) is `s * q + m` per block; MatMulNBits multiplies by `s * (code - zero)` with an "
        "integer zero, so the exact minimums ride beside it as `blocksum(x) @ m` (an fp32 "
        "`[blocks, N]` matrix). Each form computes one token through "
        f"{data.get('layers')} layers of the embedded model's four projections ({shapes}), "
        "weights of their own (read from memory, as in a decode step), int8 activations; µs "
        "per layer (median), the correction's cost over MatMulNBits alone, and the form's time "
        "over the export's.",
        "",
    ]
    head = ["threads", "form", "µs per layer", "correction µs", "vs the export's"]
    rows = []
    for r in data.get("results", []):
        for form, label in _FORMS.items():
            t = r["us_per_layer"].get(form)
            if t is None:
                continue
            rows.append(
                [
                    r["threads"],
                    f"`{form}`: {label}",
                    f"{num(t['median'], 1)} ({num(t['min'], 1)}–{num(t['max'], 1)})",
                    num(r.get("correction_us_per_layer", {}).get(form), 1),
                    times(r.get("vs_reduce_sum", {}).get(form)),
                ]
            )
    lines += [*table(head, "rlrrr", rows), ""]
    for r in data.get("results", []):
        inexact = ("float_zero_points", "cached_minimums")
        exact = {f: v for f, v in r.get("vs_reduce_sum", {}).items() if f not in inexact}
        if exact:
            best = min(exact, key=exact.get)
            cost = r["correction_us_per_layer"]["reduce_sum"]
            share = cost / r["us_per_layer"]["reduce_sum"]["median"]
            threads = f"{r['threads']} thread" + ("s" if r["threads"] != 1 else "")
            line = (
                f"- {threads}: the correction is {num(100 * share)}% of a layer's projections; "
                f"the fastest exact form is `{best}` ({times(exact[best])} the export's)."
            )
            cached = r["correction_us_per_layer"].get("cached_minimums")
            if cached is not None:
                line += (
                    f" Of its {num(cost, 1)} µs, reading the minimums from memory is "
                    f"{num(cost - cached, 1)} (`reduce_sum` − `cached_minimums`) and its nodes "
                    f"(four a projection) the other {num(cached, 1)}."
                )
            lines.append(line)
    lines += [
        "",
        "`gemm_2d` assumes 2-D activations; the export's decoder is 3-D (batch, tokens, hidden), "
        "so a Gemm inside one projection takes a Shape and two Reshapes around it. The float "
        "zero points are `8 - m / s`: not bit-exact either (`s * (code - zero)` rounds "
        "differently from `s * q + m`). `duplicated_k` is exact (the minimums are the scales "
        "of codes that are all 1) but does the int8 work twice.",
    ]
    run = data.get("run") or {}
    line = load_line(
        [*(run.get("load_average_before") or [])[:1], *(run.get("load_average_after") or [])[:1]]
    )
    return lines + [""] + ([line, ""] if line else [])


_CODE_FORMS = {
    "Q4_0/four_bit": "4-bit codes (a reference: not a 5- or 8-bit type's weights)",
    "Q5_0/eight_bit": "8-bit codes `q + 128` (what the export emits)",
    "Q5_0/nibble_and_bit": "4-bit low nibble + 2-bit high bit, Add",
    "Q8_0/eight_bit": "8-bit codes `q + 128` (what the export emits)",
    "Q8_0/two_nibbles": "two 4-bit nibbles, one MatMulNBits over [x, x]",
}


def codes_section(data: dict | None) -> list[str]:
    """benchmarks/gguf_codes.py's forms of 5- and 8-bit codes, per layer (nothing without
    results)."""
    if not data:
        return []
    shapes = ", ".join(f"{k}→{n}" for _, k, n in data.get("projections", []))
    llama = data.get("llama_cpp_bits_per_weight", {})
    lines = [
        "### Codes wider than 4 bits, form by form",
        "",
        "`python benchmarks/gguf_codes.py`: MatMulNBits has fast int8-activation kernels for "
        "4- and 8-bit codes, so the export stores Q5_0's and Q5_1's 5-bit codes (and Q6_K's) "
        "as 8-bit ones. Each form multiplies by the file's weight `d * q` (dequantised bit for "
        "bit, tested) for one token through "
        f"{data.get('layers')} layers of the embedded model's four projections ({shapes}), "
        "weights of their own (read from memory, as in a decode step), int8 activations; µs per "
        "layer (median), the bits each form reads per weight (codes, fp32 scales and zero "
        "points) beside llama.cpp's, and the form's time over the export's.",
        "",
    ]
    head = ["threads", "type", "form", "bits read (llama.cpp)", "µs per layer", "vs the export's"]
    rows = []
    bits = data.get("bits_per_weight", {})
    for r in data.get("results", []):
        for name, label in _CODE_FORMS.items():
            t = r["us_per_layer"].get(name)
            if t is None:
                continue
            kind = name.split("/")[0]
            rows.append(
                [
                    r["threads"],
                    kind,
                    f"`{name.split('/')[1]}`: {label}",
                    f"{num(bits.get(name), 2)} ({num(llama.get(kind), 1)})",
                    f"{num(t['median'], 1)} ({num(t['min'], 1)}–{num(t['max'], 1)})",
                    times(r.get("vs_export", {}).get(name)),
                ]
            )
    lines += [*table(head, "rllrrr", rows), ""]
    for r in data.get("results", []):
        us = {name: t["median"] for name, t in r["us_per_layer"].items()}
        if "Q4_0/four_bit" not in us or "Q5_0/eight_bit" not in us:
            continue
        threads = f"{r['threads']} thread" + ("s" if r["threads"] != 1 else "")
        fastest = {
            kind: min((n for n in us if n.startswith(f"{kind}/")), key=us.get)
            for kind in ("Q5_0", "Q8_0")
        }
        lines.append(
            f"- {threads}: the fastest exact form is `{fastest['Q5_0'].split('/')[1]}` for Q5_0 "
            f"and `{fastest['Q8_0'].split('/')[1]}` for Q8_0; a Q5_0 layer takes "
            f"{times(us['Q5_0/eight_bit'] / us['Q4_0/four_bit'])} a 4-bit one's time, reading "
            f"{times(bits['Q5_0/eight_bit'] / bits['Q4_0/four_bit'])} its bits (llama.cpp's Q5_0 "
            f"reads {times(llama['Q5_0'] / llama['Q4_0'])} its Q4_0's)."
        )
    lines.append("")
    run = data.get("run") or {}
    line = load_line(
        [*(run.get("load_average_before") or [])[:1], *(run.get("load_average_after") or [])[:1]]
    )
    return lines + ([line, ""] if line else [])


def kernels_section(data: dict | None) -> list[str]:
    """benchmarks/gguf_kernels.py: a decode step with llama.cpp's dot products (a custom op)
    against MatMulNBits on the same export (nothing without results)."""
    if not data:
        return []
    lines = [
        "### llama.cpp's own kernels inside ONNX Runtime",
        "",
        "`python benchmarks/gguf_kernels.py`: is a kernel that reads the GGUF's blocks as they "
        "are (no fp32 scale and block sum per block, no separate minimums' correction) what a "
        "batch-1 step lacks? `benchmarks/native/ggml_matmul.cc` is a custom op that multiplies "
        "by a tensor's raw rows with ggml's own `from_float` and `vec_dot` (llama.cpp's CPU "
        "kernels for weights it has not repacked), over ONNX Runtime's threads; every linear "
        "layer of the export becomes one. One decode step (one token over 256 past positions, the "
        "plain model), median ms, and its parts from ONNX Runtime's profiler: the linear layers "
        "(with the minimums' correction), the LM head, the rest.",
        "",
    ]
    lines += _kernel_rows(data)
    return lines + _machine_and_load(data.get("run") or {})


def _kernel_rows(data: dict) -> list[str]:
    """gguf_kernels.py's table, one row per model, thread count and form, and its logits line."""
    head = ["model", "threads", "form", "step ms", "linear", "lm_head", "rest", "ggml ÷ ours"]
    rows = []
    for name, entry in data.get("models", {}).items():
        for cell in entry.get("cells", []):
            for form, label in (("matmulnbits", "MatMulNBits (the export)"), ("ggml", "ggml")):
                part = cell[form]["profile_ms"]
                ratio = times(cell.get("ggml_over_matmulnbits")) if form == "ggml" else ""
                rows.append(
                    [f"`{name}`", cell["threads"], label, num(cell[form]["step_ms"], 2),
                     num(part["linear"], 2), num(part["lm_head"], 2), num(part["rest"], 2), ratio]
                )  # fmt: skip
    lines = [*table(head, "lrlrrrrr", rows), ""]
    for name, entry in data.get("models", {}).items():
        lines.append(
            f"- `{name}`: logits of a 16-token prompt within {num(entry['logits_max_abs_diff'], 3)} "
            f"(largest {num(entry['logits_max_abs'], 2)}), the same greedy token at "
            f"{num(100 * entry['same_greedy_tokens'], 0)}% of its positions (both int8 "
            "activations, quantised differently; a model of random weights has near-ties)."
        )
    lines.append("")
    return lines


def avx512_section(k_quants: dict | None, kernels: dict | None) -> list[str]:
    """The K-quant files and llama.cpp's kernels again on an AMD EPYC with AVX-512 VNNI, where
    llama-server is much faster at batch 1 than on the machines above (nothing without
    results)."""
    if not k_quants and not kernels:
        return []
    lines = [
        "### An AMD EPYC with AVX-512 VNNI",
        "",
        "The EPYC runs above record only the CPU's name; the Xeon of the last table has AVX-512 "
        "VNNI. On an AMD EPYC with AVX-512 VNNI and BF16 (2026-12-07), llama-server decodes "
        "`llama256-Q4_K_M` at batch 1 far faster than on the EPYC above (126 tok/s on one "
        "thread against 90), while ours is where it was or below: batch 8 stays ahead of "
        "llama-server, batch 1 falls to about half. llama.cpp is built `-march=native` (`make "
        "llama-cpp`), so its kernels, and the Q4_K rows it repacks at load, are the ones for this "
        "CPU; `MatMulNBits` reads the export's layout, 4-bit codes with an fp32 scale per block "
        "and the minimums' correction beside it. ggml's own `vec_dot` over the file's raw blocks "
        "inside ONNX Runtime (the last table) takes a third off a Q4_K_M step here, where it took "
        "little off on the Xeon: on this CPU the weight layout and the kernel that reads it, not "
        "the graph around them, are most of the gap. The same commands, "
        "`--output benchmarks/results/gguf_k_quants_epyc-avx512_2026-12-07.json` and "
        "`gguf_kernels_epyc-avx512_2026-12-07.json`:",
        "",
    ]
    if k_quants:
        lines += _models(k_quants, "####")
    if kernels:
        lines += [
            "#### llama.cpp's own kernels inside ONNX Runtime",
            "",
            "`benchmarks/gguf_kernels.py` as above: one decode step with each linear layer as "
            "`MatMulNBits` (the export) or as ggml's `vec_dot` over the file's raw blocks.",
            "",
            *_kernel_rows(kernels),
            *_machine_and_load(kernels.get("run") or {}),
        ]
    return lines
