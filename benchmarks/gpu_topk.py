"""ONNX Runtime's TopK on the device: what selecting a sampler's candidates costs, by k, rows and
vocabulary, and in stages over slices of the row.

    python benchmarks/gpu_topk.py [--vocab 49152,262144] [--slots 1,64] [--calls 50]
        [--provider cuda] [--output FILE]

One model per form, on normal logits (σ 2.5) bound on the device: ``kK`` is one ``TopK`` of K over
the row; ``gG-kK,kK`` first takes the K largest of every slice of G logits (the row padded with
−inf to a multiple of G), then the K largest of those: the same values and ids, since every one of
the row's K largest is among its slice's. ``us_busy`` is the kernels' time a call (torch's profiler
over CUPTI, where torch is there), ``us_wall`` a call's wall time with its launches. JSON to stdout
and ``--output`` (default ``benchmarks/results/gpu_topk.json``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from _harness.cupti import device_activity
from _harness.machine import emit, gpus, machine, versions
from _harness.script import RESULTS, ints, logger, parser

FORMS = {
    "k4096": [(None, 4096)],
    "k1024": [(None, 1024)],
    "k256": [(None, 256)],
    "k64": [(None, 64)],
    "k32": [(None, 32)],
    "k16": [(None, 16)],
    "g1024-k256,k256": [(1024, 256), (None, 256)],
    "g1024-k256,g1024-k256,k256": [(1024, 256), (1024, 256), (None, 256)],
    "g1024-k64,k64": [(1024, 64), (None, 64)],
    "g1024-k64,g1024-k64,k64": [(1024, 64), (1024, 64), (None, 64)],
    "g4096-k1024,k1024": [(4096, 1024), (None, 1024)],
    "g8192-k4096,k4096": [(8192, 4096), (None, 4096)],
    "g1024-k32,k32": [(1024, 32), (None, 32)],
}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--vocab", default="49152,262144", help="row lengths (comma-separated)")
    p.add_argument("--slots", default="1,64", help="rows (comma-separated)")
    p.add_argument("--calls", type=int, default=50, help="timed calls a form")
    p.add_argument("--provider", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--output", type=Path, default=RESULTS / "gpu_topk.json")
    args = p.parse_args(argv)
    args.vocab, args.slots = ints(args.vocab, "vocab"), ints(args.slots, "slots")
    return args


def model(rows: int, vocab: int, stages: list[tuple[int | None, int]]) -> tuple[bytes, str]:
    """A model of `stages` (slice length or None for the row, k) over x [rows, vocab]: its bytes
    and the name of its output, the last stage's values [rows, k]."""
    from onnx import TensorProto
    from onnx import helper as h

    nodes, inits = [], []

    def const(name: str, values: list, kind=TensorProto.INT64) -> str:
        inits.append(h.make_tensor(name, kind, [len(values)] if len(values) > 1 else [1], values))
        return name

    cur, width = "x", vocab
    for i, (group, k) in enumerate(stages):
        slices = 1
        if group is not None and group < width:
            pad = (-width) % group
            if pad:
                ninf = h.make_tensor(f"ninf{i}", TensorProto.FLOAT, [], [-np.inf])
                inits.append(ninf)
                nodes.append(h.make_node("Pad", [cur, const(f"pads{i}", [0, 0, 0, pad]),
                                                 f"ninf{i}"], [f"p{i}"]))  # fmt: skip
                cur, width = f"p{i}", width + pad
            nodes.append(h.make_node("Reshape", [cur, const(f"g{i}", [-1, group])], [f"r{i}"]))
            cur, slices = f"r{i}", width // group
        nodes.append(h.make_node("TopK", [cur, const(f"k{i}", [k])], [f"v{i}", f"i{i}"], axis=1))
        nodes.append(
            h.make_node("Reshape", [f"v{i}", const(f"o{i}", [rows, slices * k])], [f"y{i}"])
        )
        cur, width = f"y{i}", slices * k
    graph = h.make_graph(
        nodes,
        "topk",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [rows, vocab])],
        [h.make_tensor_value_info(cur, TensorProto.FLOAT, None)],
        inits,
    )
    built = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=9)
    return built.SerializeToString(), cur


def _kernel_us(run) -> float | None:
    """The kernels' summed time while `run()` runs, or None without torch or a GPU."""
    try:
        _, seen = device_activity(run)
    except ImportError:
        return None
    return sum(us for (cat, _), (_, us) in seen.items() if cat == "kernel") or None


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    log = logger("gpu_topk")
    import onnxruntime as ort

    provider = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}[args.provider]
    rng = np.random.default_rng(0)
    results = {}
    for vocab in args.vocab:
        for rows in args.slots:
            x = (rng.standard_normal((rows, vocab)) * 2.5).astype(np.float32)
            for name, stages in FORMS.items():
                if stages[-1][1] > vocab:
                    continue
                blob, last = model(rows, vocab, stages)
                session = ort.InferenceSession(blob, providers=[provider])
                value = ort.OrtValue.ortvalue_from_numpy(x, args.provider, 0)
                binding = session.io_binding()
                binding.bind_ortvalue_input("x", value)
                binding.bind_output(last, args.provider)

                def calls(n: int = args.calls, s=session, b=binding) -> None:
                    for _ in range(n):
                        s.run_with_iobinding(b)
                    b.synchronize_outputs()

                calls(3)  # warm-up
                start = time.perf_counter()
                calls()
                wall = (time.perf_counter() - start) / args.calls * 1e6
                busy = _kernel_us(calls)
                row = {"us_wall": round(wall, 1)}
                if busy is not None:
                    row["us_busy"] = round(busy / args.calls, 1)
                results[f"V{vocab} S{rows} {name}"] = row
                log(f"V={vocab} S={rows} {name}: {row}")
    emit(
        {
            "benchmark": "gpu-topk",
            "machine": machine(),
            "gpus": gpus(),
            "provider": args.provider,
            "versions": versions("onnxruntime", "onnxruntime-gpu", "torch"),
            "settings": {"vocab": args.vocab, "slots": args.slots, "calls": args.calls},
            "results": results,
        },
        args.output,
        "gpu_topk",
    )


if __name__ == "__main__":
    main()
