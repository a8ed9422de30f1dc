"""The GGUF minimums' correction (Q4_1, Q5_1, Q4_K, Q5_K, Q2_K): its exact forms, timed on the CPU.

    python benchmarks/gguf_minimums.py [--layers 30] [--threads 1,2] [--repeats 7]

A weight with minimums is ``w = s * q + m`` per block of 32. `MatMulNBits` multiplies by ``s * (code -
zero)`` with a uint8 zero point, so the minimums ride beside it as ``blocksum(x) @ m``: an fp32
``[n_blocks, N]`` matrix (exact; a minimum is not ``-s * zero`` for an integer zero). Each form below
computes that term for the embedded SmolLM2's four projections a layer (Q/K/V 576→960, O 576→576,
gate/up 576→3072, down 1536→576), ``--layers`` layers with weights of their own (so the weights are
read from memory, as in a decode step), one token:

- ``none``: the MatMulNBits alone, the floor (not the file's weights);
- ``reduce_sum`` (what ``onnxsample export`` emits): Reshape + ReduceSum, MatMul, Add;
- ``indicator_matmul``: the block sums as ``x @ E`` (E the 0/1 block indicator), MatMul, Add;
- ``gemm_2d``: 2-D activations, Reshape + ReduceSum, one Gemm with the MatMulNBits output as C;
- ``nbits_block_sums``: the block sums as extra MatMulNBits columns (sums of the int8 activations,
  as llama.cpp's q8_1 blocks carry them), Split, MatMul, Add;
- ``duplicated_k``: one MatMulNBits over ``[x, x]`` (a Concat), the second half's codes all 1 with
  the minimums as its scales: exact in two nodes, at twice the int8 work and twice the codes read;
- ``cached_minimums``: ``reduce_sum`` with one minimums matrix per projection shape, shared by every
  layer so that it stays in cache (not the file's weights): the same nodes without reading the
  minimums from memory, which splits the correction's cost into its bytes and its nodes;
- ``float_zero_points``: one MatMulNBits with float zero points ``-m / s`` (not bit-exact either:
  ONNX Runtime takes its dequantise-then-sgemm path), timed over its own ``--slow-layers``.

The forms alternate within each repetition (a pause between sessions, so one's spinning threads do
not slow the next); reported per layer (µs, median and spread) with the
correction's cost over ``none`` and each form's time over ``reduce_sum``'s, plus the load average.
"""

from __future__ import annotations

import json

import numpy as np
from _harness.machine import emit, load_average, run_record
from _harness.measure import summary
from _harness.projections import (
    BLOCK,
    PROJECTIONS,
    Graph,
    Timed,
    forms_parser,
    layers_model,
    time_forms,
)
from _harness.script import ints, logger

FORMS = (
    "none",
    "reduce_sum",
    "indicator_matmul",
    "gemm_2d",
    "nbits_block_sums",
    "duplicated_k",
    "cached_minimums",
    "float_zero_points",
)


def _projection(
    g: Graph, x: str, k: int, n: int, form: str, rank: int, rng, accuracy: int = 4
) -> tuple[str, np.ndarray]:
    """y = x @ w.T, ``w = s * (code - 8) + m`` for random codes, scales and minimums, in `form`;
    returns y's name and w (float32 [N, K])."""
    nb = k // BLOCK
    codes = rng.integers(0, 256, (n, nb, BLOCK // 2), dtype=np.uint8)
    scales = (rng.random((n, nb), dtype=np.float32) * 0.01).astype(np.float32)
    mins = (rng.random((nb, n), dtype=np.float32) - 0.5).astype(np.float32) * 0.1
    if form == "cached_minimums":  # the same minimums for every layer's projection of this shape
        mins = (np.random.default_rng([k, n]).random((nb, n), np.float32) - 0.5) * 0.1
    attrs = {"K": k, "N": n, "bits": 4, "block_size": BLOCK, "accuracy_level": accuracy}
    unpacked = np.stack([codes & 15, codes >> 4], axis=-1).reshape(n, nb, BLOCK).astype(np.float32)
    weight = (scales[..., None] * (unpacked - 8) + mins.T[..., None]).reshape(n, k)

    def nbits(inputs: list[str], **extra) -> str:
        return g.op("MatMulNBits", [x, *inputs], **(attrs | extra))[0]

    def block_sums() -> str:
        shape = [0] * (rank - 1) + [nb, BLOCK]
        blocks = g.op("Reshape", [x, g.const(np.array(shape, np.int64))])[0]
        return g.op("ReduceSum", [blocks, g.const(np.array([-1], np.int64))], keepdims=0)[0]

    if form == "float_zero_points":
        zeros = (8 - mins.T / scales).astype(np.float32)
        return nbits([g.const(codes), g.const(scales.ravel()), g.const(zeros.ravel())]), weight
    if form == "nbits_block_sums":  # nb extra output columns: 1 over block b, 0 elsewhere
        ones = np.zeros((nb, nb, BLOCK // 2), np.uint8)
        ones[np.arange(nb), np.arange(nb)] = 0x99  # code 9 - zero 8 = 1, both nibbles
        unit = np.eye(nb, dtype=np.float32)
        both = nbits(
            [
                g.const(np.concatenate([codes, ones])),
                g.const(np.concatenate([scales, unit]).ravel()),
            ],
            N=n + nb,
        )
        y, sums = g.op("Split", [both, g.const(np.array([n, nb], np.int64))], 2, axis=-1)
        return g.op("Add", [y, g.op("MatMul", [sums, g.const(mins)])[0]])[0], weight
    if form == "duplicated_k":  # [x, x] @ [s * (code - 8); m * (9 - 8)]: both halves' blocks
        twice = g.op("Concat", [x, x], axis=-1)[0]
        ones = np.full_like(codes, 0x99)  # code 9 - zero 8 = 1, both nibbles
        both = g.op(
            "MatMulNBits",
            [
                twice,
                g.const(np.concatenate([codes, ones], axis=1)),
                g.const(np.concatenate([scales, mins.T], axis=1).ravel()),
            ],
            **(attrs | {"K": 2 * k}),
        )[0]
        return both, weight
    y = nbits([g.const(codes), g.const(scales.ravel())])
    if form == "none":
        return y, weight
    if form == "gemm_2d":
        return g.op("Gemm", [block_sums(), g.const(mins), y])[0], weight
    if form == "indicator_matmul":
        indicator = np.zeros((k, nb), np.float32)
        indicator[np.arange(k), np.arange(k) // BLOCK] = 1
        sums = g.op("MatMul", [x, g.const(indicator)])[0]
    else:
        sums = block_sums()
    m = g.shared((k, n), mins) if form == "cached_minimums" else g.const(mins)
    return g.op("Add", [y, g.op("MatMul", [sums, m])[0]])[0], weight


def projection_model(form: str, accuracy: int = 4, seed: int = 0) -> tuple[bytes, np.ndarray]:
    """One Q/K/V projection (576 -> 960) in `form` and the weight it multiplies by, [N, K]."""
    g = Graph()
    rank = 2 if form == "gemm_2d" else 3
    _, k, n = PROJECTIONS[0]
    y, weight = _projection(g, "x", k, n, form, rank, np.random.default_rng(seed), accuracy)
    return g.serialize(form, k, y, rank), weight


def _model(form: str, layers: int) -> bytes:
    rank = 2 if form == "gemm_2d" else 3
    return layers_model(
        lambda g, x, k, n, rng: _projection(g, x, k, n, form, rank, rng)[0], layers, rank
    )


def main(argv: list[str] | None = None) -> None:
    p = forms_parser(__doc__, "gguf_minimums")
    p.add_argument("--slow-layers", type=int, default=2, help="layers for float_zero_points")
    args = p.parse_args(argv)
    log = logger("gguf_minimums")
    load_before = load_average()
    rows = []
    for threads in ints(args.threads, "threads"):
        forms = {}
        for form in FORMS:
            slow = form == "float_zero_points"
            layers = args.slow_layers if slow else args.layers
            rank = 2 if form == "gemm_2d" else 3
            forms[form] = Timed(_model(form, layers), layers, 2 if slow else args.calls, rank)
        times = time_forms(forms, threads, args.repeats)
        row = {"threads": threads, "us_per_layer": {f: summary(t, 1) for f, t in times.items()}}
        floor = row["us_per_layer"]["none"]["median"]
        ours = row["us_per_layer"]["reduce_sum"]["median"]
        row["correction_us_per_layer"] = {
            f: round(row["us_per_layer"][f]["median"] - floor, 1) for f in FORMS if f != "none"
        }
        row["vs_reduce_sum"] = {
            f: round(row["us_per_layer"][f]["median"] / ours, 2) for f in FORMS if f != "none"
        }
        log(json.dumps(row))
        rows.append(row)
    report = {
        "benchmark": "gguf_minimums",
        "projections": [list(p) for p in PROJECTIONS],
        "layers": args.layers,
        "results": rows,
        "run": run_record(load_before, "onnxruntime"),
    }
    emit(report, args.output, "gguf_minimums")


if __name__ == "__main__":
    main()
