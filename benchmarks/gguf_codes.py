"""GGUF codes wider than 4 bits (Q5_0, Q8_0): their exact forms in MatMulNBits, timed on the CPU.

    python benchmarks/gguf_codes.py [--layers 30] [--threads 1,2] [--repeats 7]

MatMulNBits has fast int8-activation kernels (accuracy level 4) for 4- and 8-bit codes, and for
2-bit codes in blocks of 32 (blocks of 16 take its de-quantise-every-call path). llama.cpp's Q5_0
(and Q5_1, whose minimums ride beside it as in ``gguf_minimums.py``) has 5-bit codes, which a
session of ``onnxsample export``'s graph reads as 8-bit codes. Each form
below multiplies by the file's weight ``w = d * q`` bit for bit (in float compute) for the embedded
SmolLM2's four projections a layer (576→960, 576→576, 576→3072, 1536→576), ``--layers`` layers
with weights of their own (read from memory, as in a decode step), one token, int8 activations:

- ``Q4_0`` ``four_bit``: a 4-bit code, the reference (not the 5- or 8-bit types' weights);
- ``Q5_0`` ``eight_bit`` (what the export emits): ``q + 128``, the default zero point;
- ``Q5_0`` ``nibble_and_bit``: ``q + 16 = 16 h + l`` as a 4-bit MatMulNBits of ``l`` (zero 8,
  scale d) plus a 2-bit one of ``1 + 2 h`` (zero 2, scale 8 d), and an Add: 6 bits of codes;
- ``Q8_0`` ``eight_bit`` (what the export emits): ``q + 128``;
- ``Q8_0`` ``two_nibbles``: ``q + 128 = 16 hi + lo`` as one 4-bit MatMulNBits over ``[x, x]``
  (a Concat): ``hi`` with zero 8 and scale 16 d, ``lo`` with zero 0 and scale d.

Reported per layer (µs, median and spread), each form's bits read per weight (codes, scales and
zero points as the graph stores them; llama.cpp reads 4.5, 5.5 and 8.5) and its time over the
export's, plus the load average.
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

# (ggml type, form): the export's form of a type first.
FORMS = (
    ("Q4_0", "four_bit"),
    ("Q5_0", "eight_bit"),
    ("Q5_0", "nibble_and_bit"),
    ("Q8_0", "eight_bit"),
    ("Q8_0", "two_nibbles"),
)
# The form `onnxsample export` emits for each type.
EXPORT_FORM = {"Q4_0": "four_bit", "Q5_0": "eight_bit", "Q8_0": "eight_bit"}
# q's range per type, and the bits per weight llama.cpp reads (codes and an fp16 scale a block).
RANGES = {"Q4_0": (-8, 7), "Q5_0": (-16, 15), "Q8_0": (-128, 127)}
LLAMA_BITS = {"Q4_0": 4.5, "Q5_0": 5.5, "Q8_0": 8.5}


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes ``[..., L]`` (L a multiple of 8 / bits) packed low-first into uint8."""
    per = 8 // bits
    grouped = codes.astype(np.uint8).reshape(*codes.shape[:-1], -1, per)
    packed = np.zeros(grouped.shape[:-1], np.uint8)
    for j in range(per):
        packed |= grouped[..., j] << np.uint8(bits * j)
    return packed


def _projection(
    g: Graph, x: str, k: int, n: int, kind: str, form: str, rng, accuracy: int = 4
) -> tuple[str, np.ndarray]:
    """y = x @ w.T, ``w = d * q`` for random codes of type `kind` and fp16 scales, in `form`;
    returns y's name and w (float32 [N, K])."""
    nb = k // BLOCK
    lo, hi = RANGES[kind]
    q = rng.integers(lo, hi + 1, (n, nb, BLOCK))
    d = (rng.random((n, nb), dtype=np.float32) * 0.01).astype(np.float16).astype(np.float32)
    weight = (d[..., None] * q).reshape(n, k)
    attrs = {"K": k, "N": n, "block_size": BLOCK, "accuracy_level": accuracy}
    if form == "four_bit":
        return g.nbits(x, _pack(q + 8, 4), d, bits=4, **attrs), weight
    if form == "eight_bit":
        return g.nbits(x, (q + 128).astype(np.uint8), d, bits=8, **attrs), weight
    if form == "nibble_and_bit":  # d (l - 8) + 8 d (2 h - 1) = d (16 h + l - 16) = d q
        h, l4 = (q + 16) >> 4, (q + 16) & 15
        low = g.nbits(x, _pack(l4, 4), d, bits=4, **attrs)
        high = g.nbits(x, _pack(1 + 2 * h, 2), 8 * d, bits=2, **attrs)
        return g.op("Add", [low, high])[0], weight
    if form == "two_nibbles":  # 16 d (hi - 8) + d (lo - 0) = d (q + 128 - 128)
        u = q + 128
        codes = np.concatenate([_pack(u >> 4, 4), _pack(u & 15, 4)], axis=1)
        zeros = np.concatenate([np.full((n, nb), 8), np.zeros((n, nb))], axis=1)
        twice = g.op("Concat", [x, x], axis=-1)[0]
        scales = np.concatenate([16 * d, d], axis=1)
        return g.nbits(
            twice, codes, scales, _pack(zeros, 4), bits=4, **(attrs | {"K": 2 * k})
        ), weight
    raise ValueError(f"unknown form {form!r}")


def projection_model(
    kind: str, form: str, accuracy: int = 4, seed: int = 0
) -> tuple[bytes, np.ndarray]:
    """One Q/K/V projection (576 -> 960) of type `kind` in `form` and its weight, [N, K]; its
    input ``x`` is ``[rows, 1, 576]``."""
    g = Graph()
    _, k, n = PROJECTIONS[0]
    y, weight = _projection(g, "x", k, n, kind, form, np.random.default_rng(seed), accuracy)
    return g.serialize(f"{kind}-{form}", k, y, rows="rows"), weight


def bits_per_weight(kind: str, form: str) -> float:
    """What one Q/K/V projection in `form` stores (codes, scales, zero points) per weight, in bits."""
    g = Graph()
    _, k, n = PROJECTIONS[0]
    _projection(g, "x", k, n, kind, form, np.random.default_rng(0))
    stored = sum(np.prod(t.dims, dtype=np.int64) * (4 if t.data_type == 1 else 1) for t in g.inits)
    return round(float(stored) * 8 / (k * n), 2)


def main(argv: list[str] | None = None) -> None:
    p = forms_parser(__doc__, "gguf_codes")
    args = p.parse_args(argv)
    log = logger("gguf_codes")
    load_before = load_average()
    rows = []
    for threads in ints(args.threads, "threads"):
        forms = {}
        for kind, form in FORMS:

            def build(g, x, k, n, rng, kind=kind, form=form):
                return _projection(g, x, k, n, kind, form, rng)[0]

            model = layers_model(build, args.layers)
            forms[f"{kind}/{form}"] = Timed(model, args.layers, args.calls)
        times = time_forms(forms, threads, args.repeats)
        row = {"threads": threads, "us_per_layer": {f: summary(t, 1) for f, t in times.items()}}
        us = row["us_per_layer"]
        row["vs_export"] = {
            f"{kind}/{form}": round(
                us[f"{kind}/{form}"]["median"] / us[f"{kind}/{EXPORT_FORM[kind]}"]["median"], 2
            )
            for kind, form in FORMS
        }
        log(json.dumps(row))
        rows.append(row)
    report = {
        "benchmark": "gguf_codes",
        "projections": [list(p) for p in PROJECTIONS],
        "layers": args.layers,
        "bits_per_weight": {f"{k}/{f}": bits_per_weight(k, f) for k, f in FORMS},
        "llama_cpp_bits_per_weight": LLAMA_BITS,
        "results": rows,
        "run": run_record(load_before, "onnxruntime"),
    }
    emit(report, args.output, "gguf_codes")


if __name__ == "__main__":
    main()
