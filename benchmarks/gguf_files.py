"""GGUF files as people download them: our export of the file against llama-server on the same file.

    python benchmarks/gguf_files.py                                      # both files, 1 and 2 threads
    python benchmarks/gguf_files.py --models gemma3 --threads 2 --batch 1 --new-tokens 32 --repeats 1
    python benchmarks/gguf_files.py --models path/to/file.gguf                 # any GGUF file
    python benchmarks/gguf_files.py --models smollm2:Q4_0,smollm2:Q6_K --output \
        benchmarks/results/gguf_mixes.json           # the embedded file in llama-quantize's mixes
    python benchmarks/gguf_files.py --models llama256:Q4_K_M,llama256:Q4_0 --output \
        benchmarks/results/gguf_k_quants.json        # K-quants as 1B-and-up models have them

Models (``gguf_models.py``): ``smollm2`` (the embedded file), ``gemma3`` (Gemma 3 270M Q4_K_M
from the hub), ``llama256`` (a Llama-shaped random model whose rows are multiples of 256, so its
K-quant mixes are K-quants), ``NAME:MIX`` (that file re-quantised to MIX by llama.cpp's own
``llama-quantize``, made once into artifacts/gguf-mixes) or any GGUF file. Ours: ``onnxsample export
FILE`` (the default: the file's own blocks, int8 activations), composed with the full sampler
chain and run by ``onnxsample.Generator`` (IOBinding, 8 slots). The peer: llama-server built from the llama-cpp-python sdist
(``make llama-cpp``), 8 parallel slots, on the same file and the same number of threads.

Both get the same prompt ids (llama-tokenize's, checked against ours), decode greedily with end-of-sequence ignored (ours: a logit bias of
-100 on every EOS id) for ``--new-tokens`` tokens, ``--batch`` sequences at once (llama-server: that
many concurrent ``/completion`` requests, continuous batching). Decode tok/s: every sequence's
tokens after the first over the decode time (ours: the engine's decode calls; llama-server: the
longest request's ``predicted_ms``); prompt tok/s: batch x prompt tokens over the prefill time
(llama-server: each request's ``prompt_per_second``, summed). The median and the spread over
``--repeats`` runs after a warm-up round (a run of each engine), the engines alternating; ratios
ours / llama-server in the same run. Our engine is alive only for its own runs (ONNX Runtime's
threads spin between calls and would starve llama-server's), after a warm-up run of the same
length (a new session's first pass through each cache length allocates); llama-server's idle
threads sleep.

``--no-repack`` adds a second peer, llama-server with ``--no-repack``: on an x86 CPU with AVX2
llama.cpp re-lays Q4_0, Q4_K and IQ4_NL weights at load into interleaved rows its own matrix-vector
kernels read (its ``CPU_REPACK`` buffer; Q4_1, Q5_x, Q6_K and Q8_0 stay as the file has them). The
second peer shows how much of llama-server's speed on a file is that repacking, which no ONNX
Runtime kernel does (ratio_no_repack = ours ÷ that peer).

``--profile`` adds, per model and thread count, where one of our batch-1 decode steps goes (ONNX
Runtime's profiler over 32 steps of the composed graph: the LM head, the sampler chain, the GGUF
minimums' corrections, the rest of the model), so a 262k vocabulary's share is measured, not guessed.
Output: stdout and ``--output`` (``benchmarks/results/gguf_files.json``) with the load average.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

from _harness.machine import emit, load_average, run_record
from _harness.script import RESULTS, ROOT, ints, logger, parser
from gguf_models import built_llama_cpp, gguf_path

sys.path.insert(0, str(ROOT / "tests"))  # _llama_cpp.py: where llama.cpp is built, llama-server

import _llama_cpp

log = logger("gguf_files")
# The peers: llama-server's name in the JSON, its extra options, the key of ours over it.
PEER = ("llama-server", (), "ratio")
NO_REPACK = ("llama-server-no-repack", ("--no-repack",), "ratio_no_repack")
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def _ours(path: Path, name: str):
    """Our export of `path` (made once into artifacts/bench-gguf-NAME) and its composed graph."""
    import onnxsample
    from onnxsample.errors import ExportError
    from onnxsample.exporters import export

    out = ROOT / "artifacts" / f"bench-gguf-{name}"
    try:
        result = export(path, out, verify_tokens=0)
    except ExportError as exc:  # an export of an older exporter: made anew
        if "different export" not in str(exc):
            raise
        result = export(path, out, verify_tokens=0, force=True)
    return result.output, onnxsample.prepare(result.output)


def _export_bytes(folder: Path) -> int:
    """The export on disk: the model, its weights and tokenizer, not the composed one-file copy."""
    return sum(f.stat().st_size for f in folder.iterdir() if not f.name.startswith("composed"))


def _run_ours(gen, ids: list[int], batch: int, new_tokens: int) -> dict:
    import onnxsample

    bias = {int(i): -100.0 for i in gen.eos_ids}
    params = [onnxsample.SamplingParams(temperature=0.0, logit_bias=bias)] * batch
    gen.generate([ids] * batch, params, max_new_tokens=new_tokens)
    t = gen.last_timings
    decoded = t.generated_tokens - batch
    return {
        "decode_tok_s": decoded / t.decode_s,
        "prompt_tok_s": batch * len(ids) / t.prefill_s,
    }


def _run_llama(server: _llama_cpp.LlamaServer, ids: list[int], batch: int, new_tokens: int) -> dict:
    body = {
        "prompt": ids,
        "n_predict": new_tokens,
        "temperature": 0.0,
        "top_k": 1,
        "cache_prompt": False,
        "ignore_eos": True,
    }
    with concurrent.futures.ThreadPoolExecutor(batch) as pool:
        outs = list(pool.map(lambda _: server.post("/completion", body), range(batch)))
    timings = [o["timings"] for o in outs]
    decoded = sum(t["predicted_n"] - 1 for t in timings)
    return {
        "decode_tok_s": decoded / (max(t["predicted_ms"] for t in timings) / 1e3),
        "prompt_tok_s": sum(t["prompt_per_second"] for t in timings),
    }


def _summary(runs: list[dict], key: str) -> dict:
    values = [r[key] for r in runs]
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1),
            "max": round(max(values), 1)}  # fmt: skip


def _profile(folder: Path, vocab: int, threads: int, calls: int = 32) -> dict:
    """Where a batch-1 decode step goes, ms per step: the plain export's one-token call (past of
    256 positions) under ONNX Runtime's profiler, its nodes summed as the LM head, the GGUF
    minimums' corrections and the rest of the model; and the full sampler chain's standalone
    model for one slot of the vocabulary, timed on its own."""
    import numpy as np
    import onnxruntime as ort

    from onnxsample import SamplingParams
    from onnxsample.composer.sampler_model import sampler_feeds, sampler_session

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    options.profile_file_prefix = str(RESULTS / "gguf-profile")
    session = ort.InferenceSession(
        str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    past = 256
    feed = {
        "input_ids": np.array([[42]], np.int64),
        "attention_mask": np.ones((1, past + 1), np.int64),
    }
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            feed[i.name] = np.zeros((1, i.shape[1], past, i.shape[3]), np.float32)
    for _ in range(calls):
        session.run(["logits"], feed)
    trace = Path(session.end_profiling())
    parts: dict[str, float] = {}
    for e in json.loads(trace.read_text()):
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        if name.startswith("lm_head"):
            part = "lm_head"
        elif "/BlockSum/" in name or "/MinsMatMul" in name or "/AddMins" in name:
            part = "gguf_minimums"
        else:
            part = "rest_of_model"
        parts[part] = parts.get(part, 0.0) + e["dur"] / 1e3 / calls
    trace.unlink(missing_ok=True)
    chain = "penalties,logit_bias,temperature,top_k,top_p,min_p,dist"
    sampler = sampler_session(chain, vocab, 1, threads=threads, check=False, max_bias=16)
    logits = np.random.default_rng(0).normal(0, 2, (2, vocab)).astype(np.float32)
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    feeds = sampler_feeds(chain, logits, [params], uniform=[0.5], max_bias=16)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        sampler.run(None, feeds)
        times.append(time.perf_counter() - start)
    parts["sampler_chain"] = statistics.median(times) * 1e3
    total = sum(parts.values())
    return {
        "ms_per_step": {k: round(v, 3) for k, v in sorted(parts.items())},
        "share": {k: round(v / total, 3) for k, v in sorted(parts.items())},
    }


def _cell(
    composed: Path, servers: dict, ratios: dict, ids: list[int], threads: int, batch: int, args
) -> dict:
    """One (threads, batch) cell: every engine's runs, alternating, and ours over each peer
    (`ratios`: a peer's name -> the key of that ratio)."""
    import onnxsample

    runs: dict[str, list[dict]] = {"onnxsample": [], **{peer: [] for peer in servers}}
    for r in range(args.repeats + 1):  # the first round warms up
        for who in list(runs)[:: 1 if r % 2 == 0 else -1]:
            if who == "onnxsample":  # alive only for its own runs: ONNX Runtime's threads
                # spin between calls and would starve llama-server's. A warm-up as long as the
                # run: a new session's first pass over each cache length allocates (the embedded
                # model decodes 10-18% slower), as llama-server, alive all along, did long before
                with onnxsample.Generator(composed, threads=threads) as gen:
                    _run_ours(gen, ids, batch, args.new_tokens)
                    run = _run_ours(gen, ids, batch, args.new_tokens)
            else:
                run = _run_llama(servers[who], ids, batch, args.new_tokens)
            if r:
                runs[who].append(run)
    cell: dict = {"threads": threads, "batch": batch}
    for key in ("decode_tok_s", "prompt_tok_s"):
        cell[key] = {who: _summary(found, key) for who, found in runs.items()}
        ours = cell[key]["onnxsample"]["median"]
        for peer, key_ratio in ratios.items():
            cell[key][key_ratio] = round(ours / cell[key][peer]["median"], 2)
    return cell


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--models", default="smollm2,gemma3")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--no-repack", action="store_true", help="also time llama-server --no-repack")
    p.add_argument("--output", default=str(RESULTS / "gguf_files.json"))
    args = p.parse_args()
    built = built_llama_cpp()
    import onnxsample

    load_before = load_average()
    report = {"run": None, "new_tokens": args.new_tokens, "repeats": args.repeats, "models": {}}
    for name in args.models.split(","):
        path = gguf_path(name)
        name = path.stem if name.endswith(".gguf") or ":" in name else name
        folder, composed = _ours(path, name)
        ids = onnxsample.Tokenizer.from_folder(folder).encode(PROMPT)
        ids_llama = built.tokenize(path, PROMPT)
        entry = {
            "gguf": path.name,
            "gguf_mb": round(path.stat().st_size / 2**20, 1),
            "export_mb": round(_export_bytes(folder) / 2**20, 1),
            "prompt_tokens": len(ids),
            "same_prompt_ids": ids == ids_llama,
            "cells": [],
        }
        peers = [PEER, NO_REPACK] if args.no_repack else [PEER]
        ratios = {peer: ratio for peer, _, ratio in peers}
        for threads in ints(args.threads, "--threads"):
            with contextlib.ExitStack() as stack:
                servers = {
                    peer: stack.enter_context(
                        _llama_cpp.LlamaServer(
                            built, path, threads=threads, ctx=8 * 512, slots=8, args=extra
                        )
                    )
                    for peer, extra, _ in peers
                }
                for batch in ints(args.batch, "--batch"):
                    cell = _cell(composed, servers, ratios, ids, threads, batch, args)
                    log(f"{name} t={threads} b={batch}: {cell}")
                    entry["cells"].append(cell)
            if args.profile:
                vocab = json.loads((folder / "onnxsample.json").read_text())["model"]["vocab_size"]
                entry.setdefault("profile", {})[str(threads)] = _profile(folder, vocab, threads)
        report["models"][name] = entry
    report["run"] = run_record(load_before, "onnxruntime", "onnxsample")
    emit(report, args.output, "gguf_files")


if __name__ == "__main__":
    main()
