"""Where a decode step's time goes on a real GPU, and whether a sequence's tokens follow its row
bucket.

    python benchmarks/gpu_kernels.py [--model artifacts/smollm2-135m-instruct-gqa-fp16-cuda]
        [--max-slots 64] [--batch 1,8] [--provider cuda] [--output FILE]

Needs torch beside onnxruntime-gpu: its profiler (Kineto over CUPTI) records every kernel and copy
the process runs, ONNX Runtime's included, captured CUDA graphs' nodes too. ``--provider cpu``
runs the uncaptured engines only, with no kernels to record (the test suite's check of the script).

- ``steps``: per decode step, by engine and batch, the difference between two runs that differ only
  in length (17 and 81 new tokens, after a warm-up that captures the graphs), divided by the extra
  steps: kernels, copies, the GPU's busy time (the kernels' durations summed) against the wall time
  of a step (``Engine.stats()``), and the kernels that take most of it. Engines as in
  ``benchmarks/gpu.py``: ``static-cuda-graph`` (sampled: temperature 0.8, top-k 40, top-p 0.95,
  min-p 0.05), ``static-cuda-graph-greedy``, ``branching`` (uncaptured) and
  ``plain-host-sampling`` (the model alone, uncaptured, numpy sampling).
- ``buckets``: greedy, 64 tokens each for 8 chat prompts, every prompt alone (row bucket 1) and then
  the 8 queued together in groups of 2, 4 and 8 (buckets 2, 4, 8), on the static greedy chain
  (8 slots) with CUDA graphs, with CUDA graphs and ``row_buckets=False`` (every step binds all 8
  slots) and uncaptured: how many sequences keep their tokens alone, and where the others leave.

JSON to stdout and ``--output`` (default ``benchmarks/results/gpu_kernels.json``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _harness.cupti import device_activity
from _harness.machine import emit, gpus, load_average, machine, versions
from _harness.script import RESULTS, ints, logger, parser
from _harness.workload import compose_cached, trip_message
from gpu import COMPOSE, GREEDY, MODEL, InGraph, PlainHost

SHORT, LONG = 17, 81
PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a Python function that reverses a string.",
    "What is the capital of France?",
    "List three uses of a paperclip.",
    "Summarise the plot of Hamlet in two sentences.",
    "How do I boil an egg?",
    "Translate 'good morning' into Spanish and French.",
    "Why do cats purr?",
]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--model", type=Path, default=MODEL, help="GQA export folder (--device cuda)")
    p.add_argument("--max-slots", type=int, default=64, help="slots composed")
    p.add_argument("--batch", default="1,8", help="batch sizes of the steps (comma-separated)")
    p.add_argument("--provider", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--output", type=Path, default=RESULTS / "gpu_kernels.json")
    args = p.parse_args(argv)
    args.batch = ints(args.batch, "batch")
    if max(args.batch) > args.max_slots:
        p.error(f"--max-slots {args.max_slots} is below the largest batch {max(args.batch)}")
    return args


def _per_step(engine, ids: list[int], batch: int) -> dict:
    engine.run(ids, batch, 8, seed=0)  # kernels, allocations, capture
    short, a = device_activity(lambda: engine.run(ids, batch, SHORT, seed=1))
    long, b = device_activity(lambda: engine.run(ids, batch, LONG, seed=1))
    steps = long["decode_steps"] - short["decode_steps"]
    diff = {k: [b[k][0] - a.get(k, [0, 0.0])[0], b[k][1] - a.get(k, [0, 0.0])[1]] for k in b}
    wall_ms = (long["ms_per_step"] * long["decode_steps"]) - (
        short["ms_per_step"] * short["decode_steps"]
    )

    def total(cat: str, i: int) -> float:
        return sum(v[i] for (c, _), v in diff.items() if c == cat) / steps

    kernels = sorted(((v[1], v[0], n) for (c, n), v in diff.items() if c == "kernel"), reverse=True)
    busy_us = total("kernel", 1)
    return {
        "steps": steps,
        "wall_ms_per_step": round(wall_ms / steps, 3),
        "kernels_per_step": round(total("kernel", 0), 1),
        "copies_per_step": round(total("gpu_memcpy", 0) + total("gpu_memset", 0), 1),
        "kernel_us_per_step": round(busy_us, 1),
        "copy_us_per_step": round(total("gpu_memcpy", 1) + total("gpu_memset", 1), 1),
        "gpu_busy_share": round(busy_us / (1000 * wall_ms / steps), 3) if wall_ms > 0 else None,
        "top_kernels": [
            {
                "name": name[:120],
                "per_step": round(n / steps, 2),
                "us_per_step": round(us / steps, 1),
                "share": round(us / steps / busy_us, 3) if busy_us else None,
            }
            for us, n, name in kernels[:15]
        ],
    }


def _greedy_tokens(
    path: Path, cuda_graph: bool, groups: int, provider: str = "cuda", row_buckets: bool = True
) -> list[list[int]]:
    """The 8 prompts' greedy tokens, queued together `groups` at a time."""
    from onnxsample import Engine, SamplingParams

    params = SamplingParams(**GREEDY, ignore_eos=True)
    out: list[list[int]] = []
    with Engine(
        path, provider=provider, cuda_graph=cuda_graph, row_buckets=row_buckets, prefix_reuse=False
    ) as engine:
        for start in range(0, len(PROMPTS), groups):
            prepared = [
                engine.prepare(p, params, 64, None, True, None, i)
                for i, p in enumerate(PROMPTS[start : start + groups])
            ]
            out += [r.result(timeout=600).token_ids for r in engine.enqueue(prepared)]
    return out


def _buckets(path: Path, provider: str, log) -> dict:
    found = {}
    for name, cuda_graph, buckets in (
        ("cuda_graph", True, True),
        ("cuda_graph-no-row-buckets", True, False),
        ("uncaptured", False, True),
    ):
        if cuda_graph and provider != "cuda":
            continue
        alone = _greedy_tokens(path, cuda_graph, 1, provider, buckets)
        rows = {}
        for groups in (2, 4, 8):
            got = _greedy_tokens(path, cuda_graph, groups, provider, buckets)
            leaves = [
                next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), None)
                for x, y in zip(got, alone, strict=True)
            ]
            rows[f"bucket={groups}"] = {
                "same_as_alone": sum(i is None for i in leaves),
                "sequences": len(leaves),
                "first_difference_at": [i for i in leaves if i is not None],
            }
        found[name] = rows
        log(f"buckets {name}: {rows}")
    return found


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    log = logger("gpu_kernels")
    folder, slots = args.model, args.max_slots
    static = compose_cached(
        folder, folder / f"composed-bench-static-s{slots}.onnx", None, max_slots=slots,
        static=True, **COMPOSE,
    )  # fmt: skip
    plain = {k: v for k, v in COMPOSE.items() if k != "max_bias"}
    greedy = compose_cached(
        folder, folder / f"composed-bench-greedy-static-s{slots}.onnx", "", max_slots=slots,
        static=True, **plain,
    )  # fmt: skip
    branching = compose_cached(
        folder, folder / f"composed-bench-branching-s{slots}.onnx", None, max_slots=slots,
        **COMPOSE,
    )  # fmt: skip
    loads = [load_average()]
    on = args.provider
    engines = {}
    if on == "cuda":
        engines["static-cuda-graph"] = InGraph(static, on, cuda_graph=True)
        engines["static-cuda-graph-greedy"] = InGraph(greedy, on, cuda_graph=True, sampling=GREEDY)
    engines["branching"] = InGraph(branching, on)
    engines["plain-host-sampling"] = PlainHost(folder, on)
    ids = engines["branching"].engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": trip_message(0, 0)}], add_generation_prompt=True
    )
    steps = {}
    for batch in args.batch:
        for name, engine in engines.items():
            steps.setdefault(f"batch={batch}", {})[name] = row = _per_step(engine, ids, batch)
            log(
                f"batch {batch} {name}: {row['kernels_per_step']} kernels, "
                f"{row['kernel_us_per_step']} us busy of {row['wall_ms_per_step']} ms"
            )
    for engine in engines.values():
        engine.close()
    loads.append(load_average())
    small = compose_cached(
        folder, folder / "composed-bench-greedy-static-s8.onnx", "", max_slots=8, static=True,
        **plain,
    )  # fmt: skip
    buckets = _buckets(small, on, log)
    loads.append(load_average())
    emit(
        {
            "benchmark": "gpu-kernels",
            "machine": machine(),
            "gpus": gpus(),
            "load_average": loads,
            "versions": versions("onnxsample", "onnxruntime-gpu", "torch"),
            "device": engines["branching"].device,
            "settings": {
                "model": str(folder),
                "provider": on,
                "max_slots": slots,
                "batch": args.batch,
                "runs": [SHORT, LONG],
            },
            "steps": steps,
            "buckets": buckets,
        },
        args.output,
        "gpu_kernels",
    )


if __name__ == "__main__":
    main()
