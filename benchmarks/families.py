"""Decode speed of our gqa export against optimum's layout, for each family's tiny random model.

    python benchmarks/families.py                                  # 7 families, 128 tokens, 3 runs
    python benchmarks/families.py --families llama,gemma2 --repeats 1 --new-tokens 32   # quick

For each family (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2, Gemma 3): the tiny random model the
tests build (tests/_family_models.py: 2 layers, hidden 64, SmolLM2's 49k vocabulary; Mistral, Phi-3
and Gemma with their sliding windows, Phi-3 with LongRoPE, Gemma with its soft-caps), cached under
artifacts/cache/, exported fp32 in our GroupQueryAttention layout and in ``--layout optimum``, each
composed with the default sampler chain (2 slots) and run by :class:`onnxsample.Engine` on
``--threads`` ONNX Runtime threads: greedy, one request of a 12-token prompt, ``--new-tokens``
tokens (end-of-sequence ignored; fewer where the gqa export's context is shorter: Phi-3's LongRoPE
export stops at its original 64 positions, so both of its layouts decode 52). Decode tokens/s is the tokens after the first over the time of
the decode calls; the median of ``--repeats`` runs (engines alternate within each repetition), and
gqa / optimum. A family whose optimum export fails keeps its error in the report.

The models are tiny, so the numbers weigh per-step overhead (graph size, the cache's layout and
copies, the attention kernels' fixed cost) rather than matmul speed: they compare layouts, not
what a real model of the family decodes at. Output: stdout and ``--output``
(``benchmarks/results/families.json``), with the load average before and after.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from _harness.machine import emit, load_average, run_record
from _harness.script import RESULTS, ROOT, logger, parser

sys.path.insert(0, str(ROOT / "tests"))  # the tests' tiny models: conftest.py, _family_models.py

FAMILIES = {  # family: the tiny model of tests/_family_models.py ("llama": conftest's)
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
}
LAYOUTS = ("gqa", "optimum")
log = logger("families")


def _parse():
    p = parser(__doc__)
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--output", type=Path, default=RESULTS / "families.json")
    return p.parse_args()


def _tiny_llama() -> Path:
    import conftest

    folder = conftest.CACHE / f"tiny-llama-{conftest._tiny_key()}" / "hf"
    if not (folder / "config.json").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        conftest._build_tiny_hf(folder)
    return folder


def _composed(folder: Path, layout: str) -> Path:
    """`folder`'s fp32 export in `layout` (cached beside it), composed with 2 slots."""
    from _harness.workload import compose_cached

    from onnxsample.errors import ExportError
    from onnxsample.exporters import export

    output = folder.parent / f"bench-{layout}-fp32"  # not the tests' cached exports
    options = dict(layout=layout, precision="fp32", verify_tokens=0)
    try:
        export(folder, output, **options)
    except ExportError as exc:
        if "different export" not in str(exc):
            raise
        export(folder, output, force=True, **options)
    return compose_cached(output, output / "composed-bench.onnx", None, max_slots=2)


def _run(engine, ids: list[int], new_tokens: int) -> tuple[float, int]:
    """(decode tokens/s, tokens generated) of one greedy request."""
    from onnxsample import SamplingParams

    before = engine.stats()
    params = SamplingParams(temperature=0, ignore_eos=True)
    done = engine.submit(ids, params, max_new_tokens=new_tokens).result(timeout=900)
    decode_s = engine.stats().decode_s - before.decode_s
    return (len(done.token_ids) - 1) / decode_s, len(done.token_ids)


def main() -> None:
    args = _parse()
    from _family_models import PROMPT, cached

    from onnxsample import Engine

    loads = load_average()
    tiny = _tiny_llama()
    results = {}
    for family in args.families.split(","):
        name = FAMILIES[family]
        folder = tiny if name == "llama" else cached(name, tiny)
        row: dict = {"model": name}
        engines = {}
        for layout in LAYOUTS:
            try:
                engines[layout] = Engine(
                    _composed(folder, layout), threads=args.threads, prefix_reuse=False
                )
            except Exception as exc:  # optimum's exporter may not take a family
                row[f"{layout}_error"] = f"{type(exc).__name__}: {exc}"[:400]
                log(f"{family} {layout}: {row[f'{layout}_error']}")
        # the gqa export's context (Phi-3's LongRoPE: original_max_position_embeddings, 64 here)
        # bounds both layouts' requests, so they decode the same number of tokens
        manifest = json.loads((folder.parent / "bench-gqa-fp32" / "onnxsample.json").read_text())
        context = int(manifest["model"]["max_position_embeddings"])
        new_tokens = min(args.new_tokens, context - len(PROMPT))
        row["new_tokens"] = new_tokens
        rates: dict[str, list[float]] = {layout: [] for layout in engines}
        tokens: dict[str, int] = {}
        for engine in engines.values():  # warm-up: session, first-call allocations
            _run(engine, PROMPT, 8)
        for repeat in range(args.repeats):
            for layout, engine in engines.items():
                rate, tokens[layout] = _run(engine, PROMPT, new_tokens)
                rates[layout].append(rate)
                log(f"{family} {layout} run {repeat + 1}: {rates[layout][-1]:.1f} tok/s")
        for layout, engine in engines.items():
            engine.close()
            row[layout] = {
                "decode_tokens_per_s": round(statistics.median(rates[layout]), 1),
                "runs": [round(r, 1) for r in rates[layout]],
                "tokens": tokens[layout],
            }
        if len(engines) == 2:
            row["gqa_vs_optimum"] = round(
                row["gqa"]["decode_tokens_per_s"] / row["optimum"]["decode_tokens_per_s"], 2
            )
        results[family] = row
    emit(
        {
            "benchmark": "families",
            **run_record(loads, "onnxsample", "onnxruntime", "transformers", "optimum-onnx"),
            "settings": {
                "threads": args.threads,
                "new_tokens": args.new_tokens,
                "repeats": args.repeats,
                "prompt_tokens": len(PROMPT),
                "precision": "fp32",
                "composed": "default chain, 2 slots, greedy (temperature 0), ignore_eos",
            },
            "results": results,
        },
        args.output,
        "families",
    )


if __name__ == "__main__":
    main()
