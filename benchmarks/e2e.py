"""End-to-end decode against the peers: same prompt, same machine, same run, engines alternated.

    python benchmarks/e2e.py                                   # the issue's matrix, 3 repeats
    python benchmarks/e2e.py --engines onnxsample-gguf-a4,llamacpp --batch 1 --threads 2
    python benchmarks/e2e.py --new-tokens 16 --repeats 1 --output /tmp/e2e.json   # a quick smoke run

Engines (each in its own worker process, see ``benchmarks/e2e_worker.py``, loaded once). Our runtime,
``onnxsample.Generator`` (composed model with ``onnxsample run``'s options: 8 slots, IOBinding,
sampling in the graph), on four exports of the embedded SmolLM2-135M-Instruct GGUF, made here on
first use into ``--cache`` (``export()`` reuses an up-to-date one; composing likewise):

- ``onnxsample``: optimum's layout, fp32 (attention as plain ops, the cache grown by concatenation);
- ``onnxsample-gqa-fp32``: our GroupQueryAttention layout, fp32 (one shared KV buffer);
- ``onnxsample-gguf-a0`` / ``onnxsample-gguf-a4``: the gqa layout with the GGUF's own Q4_1/Q8_0
  blocks transplanted (MatMulNBits), accuracy level 0 (float compute, exact) / 4 (int8 activations,
  like llama.cpp);
- ``onnxsample-genai-graph``: the same runtime on onnxruntime-genai's builder model (fp32 GQA), to
  separate the runtime from the graph (``onnxsample-gqa`` is accepted as its old name).

Peers: ``optimum`` (the fp32 optimum export through ``ORTModelForCausalLM.generate``, sampling on the
host), ``genai`` (onnxruntime-genai, its builder's fp32 model, from ``.venv-genai``),
``transformers`` (``generate`` on torch CPU, fp32), ``llamacpp`` (llama-cpp-python on the original
Q4_1 GGUF, from ``.venv-llamacpp``). An engine that cannot start (or whose model cannot be exported)
is recorded as skipped, with its error, and the others go on; a batch size an engine refuses is
recorded as unavailable.

For each thread count all workers are started, warmed up (one short request per batch size), then
every repetition runs every (batch, mode) configuration on every engine, the engine order rotating
from one repetition to the next. Results: the median and the min-max spread over the repetitions of
decode tokens/s (all sequences' tokens after the first / decode time), prefill tokens/s (batch ×
prompt tokens / time to first token), time to first token, and the worker's peak RSS (which includes
loading the model; VmHWM).

Quality, per engine: the mean log-probability its model gives the fp32 reference's greedy tokens
(``--quality-tokens``, 64) after the benchmark prompt, teacher forced; the reference is the fp32 gqa
export, decoded greedily by ONNX Runtime. ONNX models are scored here, before any worker starts (the
plain ``model.onnx`` of each export; genai's builder model for genai); transformers and llama.cpp
(a second ``Llama`` with ``logits_all=True``) score in their worker after their timed runs.
The JSON goes to stdout and to ``--output`` (``benchmarks/results/e2e.json``).

This script is the command line and the report; the parts: ``e2e_models.py`` (the engines and the
exports they run), ``e2e_quality.py`` (the scores of ONNX models), ``e2e_pool.py`` (the worker
processes and the runs), ``e2e_results.py`` (rates, medians, the engines' entries).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _harness.machine import RUNTIME_PACKAGES, created, emit, load_average, run_record
from _harness.script import RESULTS, ROOT, ints, logger, parser
from e2e_models import ALIASES, ENGINES, REFERENCE, prepare_models
from e2e_pool import measure
from e2e_quality import METHOD, reference_tokens, score_onnx
from e2e_results import aggregate, finish_engines

MODES = ("greedy", "sampled")
MESSAGE = (
    "Explain in a few short paragraphs how a refrigerator keeps food cold, "
    "and why its back feels warm."
)
SAMPLED_DOC = (
    "temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repetition penalty 1.1 "
    "(genai has no min-p: it runs without it; llama.cpp applies the repetition penalty to the last "
    "64 tokens, the others to prompt + output)"
)
EOS_DOC = (
    "every sequence generates exactly the requested tokens: onnxsample biases the EOS id by -100 "
    "(logit_bias), transformers and optimum pass min_new_tokens, genai min_length, llama.cpp a "
    "logits processor that sets the EOS logit to -inf"
)


def _names(
    text: str, allowed: tuple[str, ...], what: str, aliases: dict[str, str] | None = None
) -> list[str]:
    aliases = aliases or {}
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [n for n in names if n not in allowed and n not in aliases]
    if not names or bad:
        raise SystemExit(
            f"--{what} takes a comma-separated subset of {','.join(allowed)}, got {text!r}"
        )
    return list(dict.fromkeys(aliases.get(n, n) for n in names))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: engines (old names mapped), batch sizes, threads and modes as
    lists."""
    p = parser(__doc__)
    p.add_argument("--engines", default=",".join(ENGINES), help="comma-separated engines")
    p.add_argument("--batch", default="1,8", help="batch sizes")
    p.add_argument("--threads", default="1,2", help="intra-op threads (torch threads for torch)")
    p.add_argument("--modes", default="greedy,sampled", help="greedy and/or sampled")
    p.add_argument("--repeats", type=int, default=3, help="repetitions of each configuration")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens generated per sequence")
    p.add_argument("--warmup-tokens", type=int, default=8, help="tokens of each warm-up request")
    p.add_argument("--message", default=MESSAGE, help="the user message (chat template applied)")
    p.add_argument(
        "--cache",
        default=str(ROOT / "artifacts/cache/bench-e2e"),
        help="where the exports (one folder per variant) and composed models are kept",
    )
    p.add_argument("--hf", default=str(ROOT / "artifacts/cache/smollm2-hf-export/hf"))
    p.add_argument("--genai-model", default=str(ROOT / "artifacts/cache/genai-smollm2-fp32"))
    p.add_argument("--genai-python", default=str(ROOT / ".venv-genai/bin/python"))
    p.add_argument("--llamacpp-python", default=str(ROOT / ".venv-llamacpp/bin/python"))
    p.add_argument("--gguf", default=None, help="default: the embedded model's GGUF")
    p.add_argument(
        "--quality-tokens",
        type=int,
        default=64,
        help="greedy fp32 tokens the quality score is computed on (0: no quality scores)",
    )
    p.add_argument("--output", default=str(RESULTS / "e2e.json"), help="'' to write nothing")
    p.add_argument("--note", default="", help="a remark stored with the results")
    args = p.parse_args(argv)
    args.engines = _names(args.engines, ENGINES, "engines", ALIASES)
    args.batch = ints(args.batch, "batch")
    args.threads = ints(args.threads, "threads")
    args.modes = _names(args.modes, MODES, "modes")
    if args.repeats < 1 or args.new_tokens < 2 or args.warmup_tokens < 2:
        raise SystemExit("--repeats must be >= 1, --new-tokens and --warmup-tokens >= 2")
    if args.quality_tokens < 0:
        raise SystemExit("--quality-tokens must be >= 0")
    return args


def prompt_ids(model: str | Path, message: str) -> list[int]:
    """The embedded model's chat template applied to the message: what every engine is given."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    if tokenizer.convert_ids_to_tokens(2) != "<|im_end|>":
        raise SystemExit("this benchmark expects SmolLM2's tokenizer (EOS <|im_end|> = id 2)")
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=True
    )
    return [int(i) for i in ids]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.gguf is None:
        args.gguf = _embedded_gguf()
    log = logger("e2e")
    began = time.time()
    engines: dict[str, dict] = {}
    models = prepare_models(args, engines, log)
    reference = models["__reference__"]
    ids = prompt_ids(reference["tokenizer"], args.message)
    quality: dict[str, dict] = {}
    tokens: list[int] = []
    ref_score = None
    if args.quality_tokens:
        threads = max(args.threads)
        log(f"quality: {args.quality_tokens} greedy tokens of {reference['model']}")
        tokens = reference_tokens(reference["model"], ids, args.quality_tokens, threads)
        from onnxsample.exporters._verify import mean_logprob

        ref_score = round(mean_logprob(reference["model"], ids, tokens, threads=threads), 4)
        quality.update(score_onnx(models, ids, tokens, threads, log))
    prepared_s = round(time.time() - began, 1)
    load_before = load_average()
    began = time.time()
    runs = measure(args, ids, log, models, engines, quality, tokens)
    finish_engines(engines, args.engines, quality if args.quality_tokens else None, ref_score)
    report = {
        "benchmark": "e2e",
        "created": created(),
        "duration_s": round(time.time() - began, 1),
        "prepare_s": prepared_s,
        **run_record(load_before, *RUNTIME_PACKAGES),
        "settings": {
            "message": args.message,
            "prompt_tokens": len(ids),
            "new_tokens": args.new_tokens,
            "batch": args.batch,
            "batch_composition": "the same prompt B times; sampled rows seeded seed+i where the "
            "engine has per-sequence seeds (onnxsample), one seed per batch otherwise",
            "threads": args.threads,
            "modes": args.modes,
            "sampled": SAMPLED_DOC,
            "eos": EOS_DOC,
            "repeats": args.repeats,
            "warmup_tokens": args.warmup_tokens,
            "order": "engines alternate within each repetition; the order rotates per repetition",
            "note": args.note,
        },
        "quality": {
            "method": METHOD,
            "reference": REFERENCE,
            "reference_model": str(reference["model"]),
            "tokens": tokens,
            "reference_logprob": ref_score,
        }
        if args.quality_tokens
        else None,
        "engines": engines,
        "results": aggregate(runs),
        "runs": runs,
    }
    emit(report, args.output, "e2e")
    return report


def _embedded_gguf() -> str:
    try:
        from onnxsample.exporters import embedded_gguf

        return str(embedded_gguf())
    except Exception:
        return ""


if __name__ == "__main__":
    main()
