"""Time one call of the standalone sampler model against the numpy reference and transformers'
logits-processor chain (+ softmax + multinomial), and print the table as JSON.

    python benchmarks/sampler.py                      # a modest run (S 1 and 8, V 49152, 1 thread)
    python benchmarks/sampler.py --all                # S 1,8,32,64 × V 49152,128256,256000 × 1,2 threads
    python benchmarks/sampler.py --slots 1,8 --vocab 128256 --chains full --threads 1,2

Logits are synthetic but LLM-like: N(0, 2) plus a head of 20 tokens raised by 8…16, so the nucleus
of top_p 0.95 lies among the first candidates. ``top_p_flat`` draws from flat N(0, 1) logits, whose
nucleus holds most of the vocabulary: the worst case of exact top-p (a full sort of the row). Compare numbers as ratios within one run; the load
average before and after is printed with them.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from _harness.machine import emit, load_average
from _harness.measure import median_ms
from _harness.script import ints, parser

from onnxsample import SamplingParams, sampler_feeds
from onnxsample.composer.sampler_model import sampler_session
from onnxsample.reference import run_chain

FULL = "logit_bias,penalties,temperature,top_k,top_p,min_p,typical_p,dist"
CHAINS = {
    # name: (chain, params, transformers processors as (class name, argument))
    "greedy": ("", SamplingParams(temperature=0.0), []),
    "top_k": ("top_k,dist", SamplingParams(top_k=50), [("TopKLogitsWarper", 50)]),
    "top_p": ("top_p,dist", SamplingParams(top_p=0.95), [("TopPLogitsWarper", 0.95)]),
    "top_p_flat": ("top_p,dist", SamplingParams(top_p=0.95), [("TopPLogitsWarper", 0.95)]),
    "full": (
        FULL,
        SamplingParams(temperature=0.8, top_k=50, top_p=0.95, min_p=0.05, repetition_penalty=1.1),
        [
            ("RepetitionPenaltyLogitsProcessor", 1.1),
            ("TemperatureLogitsWarper", 0.8),
            ("TopKLogitsWarper", 50),
            ("TopPLogitsWarper", 0.95),
            ("MinPLogitsWarper", 0.05),
        ],
    ),
    "full_llama_order": (  # the same, the temperature after the cuts (llama.cpp's order)
        FULL,
        SamplingParams(
            temperature=0.8,
            top_k=50,
            top_p=0.95,
            min_p=0.05,
            repetition_penalty=1.1,
            temperature_last=True,
        ),
        [
            ("RepetitionPenaltyLogitsProcessor", 1.1),
            ("TopKLogitsWarper", 50),
            ("TopPLogitsWarper", 0.95),
            ("MinPLogitsWarper", 0.05),
            ("TemperatureLogitsWarper", 0.8),
        ],
    ),
}
CHAIN_DOC = {
    "greedy": "chain '' (argmax)",
    "top_k": "top_k,dist with top_k=50",
    "top_p": "top_p,dist with top_p=0.95 (exact nucleus, no top-k)",
    "top_p_flat": "top_p,dist with top_p=0.95 on flat N(0, 1) logits (full-sort fallback)",
    "full": f"{FULL} (max_bias 4), t=0.8 k=50 p=0.95 min_p=0.05 rep=1.1, 64 prompt tokens",
    "full_llama_order": "full with temperature_last (the temperature after the cuts)",
}


def _logits(rows: int, vocab: int, flat: bool = False, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if flat:
        return rng.normal(0, 1, size=(rows, vocab)).astype(np.float32)
    logits = rng.normal(0, 2, size=(rows, vocab)).astype(np.float32)
    for row in logits:
        row[rng.choice(vocab, 20, replace=False)] += np.linspace(16, 8, 20, dtype=np.float32)
    return logits


def _feeds(name: str, slots: int, vocab: int) -> dict[str, np.ndarray]:
    chain, params, _ = CHAINS[name]
    rng = np.random.default_rng(1)
    prompt = np.zeros((slots, vocab), dtype=bool)
    for row in prompt:
        row[rng.choice(vocab, 64, replace=False)] = True
    return sampler_feeds(
        chain,
        _logits(slots + 1, vocab, flat=name.endswith("_flat")),
        [params] * slots,
        uniform=rng.random(slots),
        prompt_mask=prompt,
        max_bias=4 if "logit_bias" in chain else 0,
    )


def _ort_call(name: str, slots: int, vocab: int, threads: int, feeds) -> Callable[[], object]:
    chain = CHAINS[name][0]
    max_bias = 4 if "logit_bias" in chain else 0
    session = sampler_session(chain, vocab, slots, threads=threads, check=False, max_bias=max_bias)
    return lambda: session.run(None, feeds)


def _numpy_call(name: str, feeds) -> Callable[[], object]:
    chain = CHAINS[name][0]
    max_bias = 4 if "logit_bias" in chain else 0
    return lambda: run_chain(chain, feeds, max_bias=max_bias)


def _transformers_call(name: str, feeds) -> Callable[[], object]:
    import torch
    from transformers.generation import logits_process as hf

    processors = hf.LogitsProcessorList([getattr(hf, cls)(arg) for cls, arg in CHAINS[name][2]])
    rows = torch.from_numpy(feeds["logits"][feeds["sampler.row_index"]])
    # transformers reads the prompt and output tokens as input_ids
    seen = [np.flatnonzero(m) for m in feeds.get("sampler.prompt_mask", np.zeros((len(rows), 1)))]
    width = max(1, max(len(s) for s in seen))
    input_ids = torch.tensor(
        np.array([np.resize(s, width) if len(s) else np.zeros(width, int) for s in seen])
    )
    generator = torch.Generator().manual_seed(0)

    def call():
        if name == "greedy":
            return torch.argmax(rows, dim=-1)
        scores = processors(input_ids, rows.clone())
        probs = torch.softmax(scores, dim=-1)
        return torch.multinomial(probs, 1, generator=generator)

    return call


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument("--slots", default="1,8", help="comma-separated S values")
    p.add_argument("--vocab", default="49152", help="comma-separated V values")
    p.add_argument(
        "--chains",
        default="greedy,top_k,top_p,top_p_flat,full,full_llama_order",
        help=",".join(CHAINS),
    )
    p.add_argument("--threads", default="1", help="ORT intra-op threads (and torch threads)")
    p.add_argument("--impls", default="ort,numpy,transformers")
    p.add_argument("--budget", type=float, default=0.4, help="seconds per measurement")
    p.add_argument("--all", action="store_true", help="the whole matrix of the project")
    args = p.parse_args(argv)
    if args.all:
        args.slots, args.vocab, args.threads = "1,8,32,64", "49152,128256,256000", "1,2"
    impls = args.impls.split(",")
    load_before = load_average()
    results = []
    for vocab in ints(args.vocab, "vocab"):
        for slots in ints(args.slots, "slots"):
            for name in args.chains.split(","):
                feeds = _feeds(name, slots, vocab)
                for threads in ints(args.threads, "threads"):
                    row: dict[str, object] = {
                        "chain": name,
                        "slots": slots,
                        "vocab": vocab,
                        "threads": threads,
                    }
                    if "ort" in impls:
                        call = _ort_call(name, slots, vocab, threads, feeds)
                        row["ort_ms"] = round(median_ms(call, args.budget), 4)
                    if "numpy" in impls and threads == 1:
                        call = _numpy_call(name, feeds)
                        row["numpy_ms"] = round(median_ms(call, args.budget, 3), 4)
                    if "transformers" in impls:
                        import torch

                        torch.set_num_threads(threads)
                        call = _transformers_call(name, feeds)
                        row["transformers_ms"] = round(median_ms(call, args.budget), 4)
                    if "ort_ms" in row and "transformers_ms" in row:
                        row["speedup_vs_transformers"] = round(
                            row["transformers_ms"] / row["ort_ms"],
                            2,  # type: ignore[operator]
                        )
                    results.append(row)
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "onnxruntime": ort.__version__,
            "load_average_before": load_before,
            "load_average_after": load_average(),
        },
        "chains": {name: CHAIN_DOC[name] for name in args.chains.split(",")},
        "results": results,
    }
    emit(report, None, "sampler")


if __name__ == "__main__":
    main()
