"""GPU decode: the sampler inside the graph (branching chain; static chain replayed as a CUDA graph)
against the plain model with sampling on the host, at batch sizes up to 64.

    python benchmarks/gpu.py [--model artifacts/smollm2-135m-instruct-gqa-fp16-cuda]
        [--batch 1,8,32,64] [--new-tokens 128] [--repeats 3] [--output FILE] [--provider cuda]
        [--max-slots N] [--llama-batched-bench PATH] [--transformers] [--gguf FILE] [--threads N]

The model is a GroupQueryAttention export (``onnxsample export --device cuda -o DIR``). Each batch
size B decodes B copies of one ~50-token chat prompt (the serving benchmarks' trip message), EOS
ignored, ``--new-tokens`` tokens each, sampled (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05;
a seed per request, one generator for the plain loop). Engines, alternated within each repetition
after a warm-up per batch:

- ``branching``: :class:`onnxsample.Engine` on the export composed with the full chain
  (``composed-bench-branching-sN.onnx`` beside it, N = ``--max-slots``, default the largest batch);
- ``static-cuda-graph``: the chain composed ``static=True``, ``Engine(cuda_graph=True)``: each decode
  step replays a captured CUDA graph over the occupied slots' row bucket (1, 2, 4… up to N rows;
  ``--provider cuda`` only; skipped otherwise);
- ``static-cuda-graph-greedy``: the same with the greedy chain (an ``ArgMax``) and temperature 0:
  the model's captured step with next to no sampler, the row to set beside llama.cpp's, which does
  not sample (``--provider cuda`` only);
- ``plain-host-sampling``: ``model.onnx`` alone, driven by the loop below: one preallocated KV
  buffer per layer bound as past and present, each prompt prefilled in its own call (as the engine
  does), then B rows per decode step, whose logits [B, V] are copied to the host and sampled with
  numpy (the same settings: top-k by argpartition, then top-p, then min-p on the 40 candidates).

- ``transformers`` (with ``--transformers``): ``generate`` of transformers on the torch beside it,
  the GGUF (``--gguf``) de-quantised by transformers' own loader to fp16 weights on the GPU (fp32 on
  the CPU), its default attention and dynamic KV cache, the same sampling settings, B copies of the
  prompt in one batch, EOS suppressed (``min_new_tokens``). Its decode time is one ``generate`` of
  ``--new-tokens`` tokens less one of a single token (the prefill and first draw), each synchronised.

- ``llama.cpp`` (with ``--llama-batched-bench PATH``): llama.cpp's ``llama-batched-bench`` on the GGUF
  the export was made from (``--gguf``, default the embedded model's): B sequences of the same
  prompt length and ``--new-tokens`` each, all layers on the GPU with ``--provider cuda``. It times
  ``llama_decode`` on random tokens, with no sampling, so it is the model's step alone: ours
  includes the sampler. Its own decode and prompt tokens/s, ``--repeats`` runs; our engines get
  ``vs_llama_cpp``, the ratio of the median decode tokens/s.

Per engine and batch: decode tokens/s (tokens after each sequence's first, over the time of the
decode calls: ``Engine.stats()`` deltas for the engines; the engine prefills the later prompts
between decode steps, so its first steps hold fewer rows), ms per decode step (decode time over
steps), time to first token (median over the B requests); median and min/max over repeats, and the
ratio of the medians against ``branching``. JSON to stdout and ``--output`` (default
``benchmarks/results/gpu.json``), with the machine, the GPUs, versions and the load average.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from _harness.machine import emit, gpus, load_average, machine, versions
from _harness.measure import summary
from _harness.script import RESULTS, ROOT, ints, logger, parser
from _harness.workload import SAMPLED, compose_cached, trip_message
from gpu_engines import InGraph, PlainHost, Transformers

MODEL = ROOT / "artifacts" / "smollm2-135m-instruct-gqa-fp16-cuda"
# The full chain with the room the serving path composes: bias entries, no logprobs, no drafts.
COMPOSE = {"top_logprobs": 0, "max_bias": 16, "prompt_logprobs": False, "draft_tokens": 0}
ENGINES = (
    "branching",
    "static-cuda-graph",
    "static-cuda-graph-greedy",
    "plain-host-sampling",
    "transformers",
)
GREEDY = {"temperature": 0.0}
KEYS = ("decode_tokens_per_s", "ms_per_step", "ttft_ms")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--model", type=Path, default=MODEL, help="GQA export folder")
    p.add_argument("--batch", default="1,8,32,64", help="batch sizes (comma-separated)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--provider", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--max-slots", type=int, help="slots composed (default: the largest batch)")
    p.add_argument("--output", type=Path, default=RESULTS / "gpu.json")
    p.add_argument("--llama-batched-bench", type=Path, help="llama.cpp's llama-batched-bench")
    p.add_argument("--transformers", action="store_true", help="also transformers' generate")
    p.add_argument("--gguf", type=Path, help="the GGUF for the peers (default: the embedded one)")
    p.add_argument("--threads", type=int, help="llama.cpp's CPU threads (its default otherwise)")
    args = p.parse_args(argv)
    if args.threads and not args.llama_batched_bench:
        p.error("--threads is llama.cpp's: it needs --llama-batched-bench")
    if args.gguf and not (args.llama_batched_bench or args.transformers):
        p.error("--gguf is the peers': it needs --llama-batched-bench or --transformers")
    args.batch = ints(args.batch, "batch")
    args.max_slots = args.max_slots or max(args.batch)
    if args.max_slots < max(args.batch):
        p.error(f"--max-slots {args.max_slots} is below the largest batch {max(args.batch)}")
    if args.new_tokens < 2 or args.repeats < 1:
        p.error("--new-tokens takes at least 2 (one decode step) and --repeats at least 1")
    return args


def _load(args: argparse.Namespace, log) -> tuple[dict, dict]:
    """The engines that run here, and the reasons of those that do not."""
    folder, slots, skipped = args.model, args.max_slots, {}
    branching = folder / f"composed-bench-branching-s{slots}.onnx"
    loaded = {
        "branching": InGraph(
            compose_cached(folder, branching, None, max_slots=slots, **COMPOSE), args.provider
        )
    }
    if args.provider == "cuda":
        static = folder / f"composed-bench-static-s{slots}.onnx"
        compose_cached(folder, static, None, max_slots=slots, static=True, **COMPOSE)
        loaded["static-cuda-graph"] = InGraph(static, args.provider, cuda_graph=True)
        greedy = folder / f"composed-bench-greedy-static-s{slots}.onnx"
        plain = {k: v for k, v in COMPOSE.items() if k != "max_bias"}  # the chain has no bias
        compose_cached(folder, greedy, "", max_slots=slots, static=True, **plain)
        loaded["static-cuda-graph-greedy"] = InGraph(
            greedy, args.provider, cuda_graph=True, sampling=GREEDY
        )
    else:
        for name in ("static-cuda-graph", "static-cuda-graph-greedy"):
            skipped[name] = f"cuda_graph needs --provider cuda (got {args.provider})"
    loaded["plain-host-sampling"] = PlainHost(folder, args.provider)
    if args.transformers:
        loaded["transformers"] = Transformers(args.gguf, args.provider)
    else:
        skipped["transformers"] = "no --transformers"
    log(f"loaded {', '.join(loaded)} on {loaded['branching'].device}; skipped {skipped or 'none'}")
    return loaded, skipped


def llama_cpp(args: argparse.Namespace, prompt_tokens: int, log) -> dict[int, list[dict]]:
    """llama-batched-bench's decode and prompt rates on `args.gguf`, by batch size: one list of
    rows per batch, one row per repetition (module doc)."""
    command = [
        str(args.llama_batched_bench),
        "-m", str(args.gguf),
        "-c", str((prompt_tokens + args.new_tokens) * max(args.batch) + 64),
        "-b", "2048", "-ub", "512",
        "-npp", str(prompt_tokens), "-ntg", str(args.new_tokens),
        "-npl", ",".join(map(str, args.batch)),
        "-ngl", "99" if args.provider == "cuda" else "0",
        "--output-format", "jsonl",
    ]  # fmt: skip
    if args.threads:
        command += ["-t", str(args.threads)]
    found: dict[int, list[dict]] = {}
    for rep in range(args.repeats):
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(
                f"llama-batched-bench failed ({done.returncode}): {done.stderr[-800:]}"
            )
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                found.setdefault(row["pl"], []).append(
                    {
                        "decode_tokens_per_s": row["speed_tg"],
                        "ms_per_step": 1000 * row["t_tg"] / row["tg"],
                        "prompt_tokens_per_s": row["speed_pp"],
                    }
                )
        log(
            f"rep {rep} llama.cpp: "
            + ", ".join(f"B={b} {r[-1]['decode_tokens_per_s']:.4g} tok/s" for b, r in found.items())
        )
    missing = set(args.batch) - set(found)
    if missing:
        raise RuntimeError(f"llama-batched-bench gave no row for batch {sorted(missing)}")
    return found


def _table(runs: list[dict], base: list[dict] | None) -> dict:
    """Median and spread of each figure; with `base` (branching's runs), the ratio of the medians."""
    out: dict = {k: summary([r[k] for r in runs], 2) for k in KEYS}
    out["decoded_tokens"], out["decode_steps"] = runs[0]["decoded_tokens"], runs[0]["decode_steps"]
    if base is not None:
        mid = {
            k: (statistics.median(r[k] for r in runs), statistics.median(r[k] for r in base))
            for k in KEYS
        }
        out["vs_branching"] = {k: round(a / b, 3) if b else None for k, (a, b) in mid.items()}
    return out


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)  # first: --help needs no onnxsample
    log = logger("gpu")
    if not (args.model / "model.onnx").is_file():
        sys.exit(f"export the model first: onnxsample export --device cuda -o {args.model}")
    import onnxruntime as ort

    if (args.llama_batched_bench or args.transformers) and args.gguf is None:
        from onnxsample.exporters.embedded import embedded_gguf

        args.gguf = embedded_gguf()
    loads = [load_average()]
    loaded, skipped = _load(args, log)
    ids = loaded["branching"].engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": trip_message(0, 0)}], add_generation_prompt=True
    )
    warm = min(4, args.new_tokens)
    for batch in args.batch:
        for engine in loaded.values():
            engine.run(ids, batch, warm, seed=0)  # kernels, allocations, the CUDA graph capture
    runs: dict[tuple[str, int], list[dict]] = {}
    for rep in range(args.repeats):
        names = list(loaded)
        names = names[rep % len(names) :] + names[: rep % len(names)]
        for batch in args.batch:
            for name in names:
                found = loaded[name].run(ids, batch, args.new_tokens, seed=1000 * (rep + 1))
                runs.setdefault((name, batch), []).append(found)
                log(
                    f"rep {rep} batch {batch} {name}: "
                    + ", ".join(f"{k} {found[k]:.4g}" for k in KEYS)
                )
        loads.append(load_average())
    device = loaded["branching"].device
    for engine in loaded.values():
        engine.close()
    peer: dict[int, list[dict]] = {}
    if not args.llama_batched_bench:
        skipped["llama.cpp"] = "no --llama-batched-bench"
    else:  # the engines' results are written whatever the peer does
        try:
            peer = llama_cpp(args, len(ids), log)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            log(f"llama.cpp: {exc}")
            skipped["llama.cpp"] = str(exc)
    results = {}
    for batch in args.batch:
        base = runs[("branching", batch)]
        table = results[f"batch={batch}"] = {}
        for name in ENGINES:
            found = runs.get((name, batch))
            if found is None:
                table[name] = {"skipped": skipped[name]}
            else:
                # the greedy row draws nothing: against the sampled branching chain a ratio
                # would mix the sampler's cost into the engine's
                compared = name not in ("branching", "static-cuda-graph-greedy")
                table[name] = _table(found, base if compared else None)
        if peer:
            rows = peer[batch]
            table["llama.cpp"] = {k: summary([r[k] for r in rows], 2) for k in rows[0]}
            theirs = statistics.median(r["decode_tokens_per_s"] for r in rows)
            for name in ENGINES:
                if (name, batch) in runs:
                    ours = statistics.median(r["decode_tokens_per_s"] for r in runs[(name, batch)])
                    table[name]["vs_llama_cpp"] = round(ours / theirs, 3)
    emit(
        {
            "benchmark": "gpu-decode",
            "machine": machine(),
            "gpus": gpus(),
            "device": device,
            "load_average": loads,
            "versions": versions(
                "onnxsample", "onnxruntime", "onnxruntime-gpu", "numpy", "torch", "transformers"
            ),
            "providers": ort.get_available_providers(),
            "settings": {
                "model": str(args.model),
                "provider": args.provider,
                "batch": args.batch,
                "new_tokens": args.new_tokens,
                "repeats": args.repeats,
                "max_slots": args.max_slots,
                "prompt_tokens": len(ids),
                "sampling": SAMPLED,
                "compose": COMPOSE,
                "llama_batched_bench": str(args.llama_batched_bench or ""),
                "gguf": str(args.gguf or ""),
            },
            "skipped": skipped,
            "results": results,
        },
        args.output,
        "gpu",
    )


if __name__ == "__main__":
    main()
