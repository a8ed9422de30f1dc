"""Prefill time of a composed model with the row gather before the LM head vs after the logits.

The composer moves the gather before the LM head so that a prefill of T tokens computes S rows of
logits instead of T; this measures what that saves. Engines alternate within each repetition so that
machine noise hits both alike; the median and the spread are reported, with the load average.

    python benchmarks/prefill_gather.py [--model artifacts/smollm2-135m-instruct] [--lengths 256 512]
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from _harness.machine import emit, load_average
from _harness.measure import summary
from _harness.script import ROOT, logger, parser
from _harness.workload import EMBEDDED_FP32, ort_session

from onnxsample.composer import compose
from onnxsample.params import SamplingParams, pack_sampling_params

CHAIN = "temperature,top_k,top_p,min_p,dist"
SLOTS = 8


def _feeds(session: ort.InferenceSession, length: int, vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {
        "input_ids": rng.integers(3, vocab, (1, length), dtype=np.int64),
        "attention_mask": np.ones((1, length), np.int64),
        "position_ids": np.arange(length, dtype=np.int64)[None],
    }
    names = {i.name: i for i in session.get_inputs()}
    for name, info in names.items():
        if name.startswith("past_key_values."):
            feeds[name] = np.zeros((1, info.shape[1], 0, info.shape[3]), np.float32)
    if "sampler.row_index" in names:
        feeds |= pack_sampling_params(
            [SamplingParams(temperature=0.8, top_k=40, seed=0)], CHAIN, SLOTS
        )
        rows = np.zeros(SLOTS, np.int64)
        rows[0] = length  # the last prompt position of the only sequence
        feeds["sampler.row_index"] = rows
        feeds["sampler.uniform"] = np.full(SLOTS, 0.5, np.float32)
    return {k: v for k, v in feeds.items() if k in names}


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument("--model", type=Path, default=EMBEDDED_FP32.relative_to(ROOT))
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 512])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", type=Path, help="also write the JSON here")
    args = p.parse_args(argv)

    log = logger("prefill_gather")
    vocab = 49152
    load_before = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        variants = {
            "plain model (full logits)": args.model / "model.onnx",
            "composed, gather before LM head": compose(
                args.model, CHAIN, Path(tmp) / "head.onnx", max_slots=SLOTS, gather="lm_head"
            ),
            "composed, gather after logits": compose(
                args.model, CHAIN, Path(tmp) / "logits.onnx", max_slots=SLOTS, gather="logits"
            ),
        }
        results = []
        for threads in args.threads:
            sessions = {name: ort_session(path, threads) for name, path in variants.items()}
            for length in args.lengths:
                feeds = {name: _feeds(s, length, vocab) for name, s in sessions.items()}
                times: dict[str, list[float]] = {name: [] for name in sessions}
                for name, s in sessions.items():  # warm-up
                    s.run(None, feeds[name])
                for _ in range(args.repeats):
                    for name, s in sessions.items():
                        start = time.perf_counter()
                        s.run(None, feeds[name])
                        times[name].append((time.perf_counter() - start) * 1000)
                row = {"threads": threads, "prompt_tokens": length}
                for name, values in times.items():
                    spread = summary(values, 2)
                    row[name] = {f"{k}_ms": spread[k] for k in ("median", "min", "max")}
                head = row["composed, gather before LM head"]["median_ms"]
                row["speedup_vs_gather_after_logits"] = round(
                    row["composed, gather after logits"]["median_ms"] / head, 3
                )
                row["speedup_vs_plain_model"] = round(
                    row["plain model (full logits)"]["median_ms"] / head, 3
                )
                results.append(row)
                log(json.dumps(row))
    report = {
        "benchmark": "prefill_gather",
        "model": str(args.model),
        "chain": CHAIN,
        "max_slots": SLOTS,
        "repeats": args.repeats,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "onnxruntime": ort.__version__,
        "cpus": os.cpu_count(),
        "results": results,
    }
    emit(report, args.out, "prefill_gather")


if __name__ == "__main__":
    main()
