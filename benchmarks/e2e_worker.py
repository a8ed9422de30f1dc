"""One engine of the end-to-end benchmark, in its own process: load the model once, then serve requests.

    python benchmarks/e2e_worker.py ENGINE --threads N [--model PATH] [--tokenizer DIR] [--hf DIR]
        [--genai DIR] [--gguf F]

Started by ``benchmarks/e2e.py`` (with the engine's own interpreter: onnxruntime-genai runs from
``.venv-genai``, llama.cpp from ``.venv-llamacpp``), which exports and composes the models first:
``--model`` is the composed ``.onnx`` for the onnxsample engines (all of them run
``onnxsample.Generator``; the variant is the model) and the fp32 optimum export folder for optimum.
Protocol, one JSON object per line:

- stdout, once loaded: ``{"ready": true, "load_s", "rss_mb", "peak_rss_mb", "versions"}`` or
  ``{"ready": false, "error"}``;
- stdin: ``{"prompt_ids": [...], "message": str, "batch": B, "mode": "greedy"|"sampled",
  "new_tokens": N, "seed": S}`` (or ``{"quit": true}``); stdout: ``{"ok": true, "prompt_tokens",
  "tokens": [per sequence], "ttft_s", "prefill_s", "decode_s", "total_s", "rss_mb", "peak_rss_mb"}``
  or ``{"ok": false, "error"}``;
- stdin: ``{"score": {"prompt_ids": [...], "tokens": [...]}}``; stdout: ``{"ok": true,
  "mean_logprob", "scored_on"}``: the mean log-probability of `tokens` after the prompt under the
  engine's own model (transformers, llama.cpp; the others are scored by the orchestrator).

Every engine gets the same prompt token ids (the embedded model's chat template applied to the same
user message), the batch is the same prompt B times (sequence i seeded with seed + i), and every
sequence is made to produce exactly N tokens by suppressing the end-of-sequence token. Time starts
when the engine is handed token ids, so tokenisation is outside the timings, except for onnxsample,
whose API takes text: its clock starts after its own tokenisation, which is checked to give the same
ids. Timings: ``ttft_s`` from the call to the first sampled token of the batch; ``prefill_s`` the
prompt's forward pass where the engine exposes it (else = ``ttft_s``); ``decode_s`` from the first
token to the last. Peak memory is the worker's VmHWM (``ru_maxrss`` would include the orchestrator's
peak, inherited through fork + exec).

This file is the protocol; the engines are ``e2e_engines.py``. Only the standard library at module
level: each engine imports its own stack when it loads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from typing import TextIO

from _harness.machine import peak_rss_mb, rss_mb
from _harness.process import protocol_stdout, sender
from _harness.script import parser
from e2e_engines import ENGINES, Engine


def serve(engine_name: str, args: argparse.Namespace, reply: TextIO) -> None:
    """Load the engine, say so on `reply`, then answer the requests on stdin until it ends or a
    request says quit."""
    send = sender(reply)
    start = time.perf_counter()
    try:
        engine = ENGINES[engine_name](args)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        send({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    info = {"ready": True, "load_s": round(time.perf_counter() - start, 2), "rss_mb": rss_mb()}
    info["peak_rss_mb"] = peak_rss_mb()
    info["versions"] = engine.versions()
    send({**info, **engine.ready_info()})
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req.get("quit"):
            break
        send(_score(engine, req["score"]) if "score" in req else _run(engine, req))


def _run(engine: Engine, req: dict) -> dict:
    try:
        result = {"ok": True, "prompt_tokens": len(req["prompt_ids"]), **engine.run(req)}
    except NotImplementedError as exc:
        result = {"ok": False, "unsupported": True, "error": str(exc)}
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result.update(rss_mb=rss_mb(), peak_rss_mb=peak_rss_mb())
    return result


def _score(engine: Engine, req: dict) -> dict:
    try:
        value = engine.score(req["prompt_ids"], req["tokens"])
    except NotImplementedError as exc:
        return {"ok": False, "unsupported": True, "error": str(exc)}
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "mean_logprob": value, "scored_on": engine.scored_on()}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("engine", choices=sorted(ENGINES))
    p.add_argument("--threads", type=int, required=True)
    p.add_argument(
        "--model", help="the composed .onnx (onnxsample engines) or export folder (optimum)"
    )
    p.add_argument("--tokenizer", help="a folder with the embedded model's tokenizer")
    p.add_argument("--hf", help="the embedded model's de-quantised HF folder")
    p.add_argument("--genai", help="onnxruntime-genai's builder output folder")
    p.add_argument("--gguf", help="the original GGUF file")
    p.add_argument(
        "--lookup", type=int, default=0, help="llamacpp: prompt-lookup decoding with K drafts"
    )
    args = p.parse_args()
    serve(args.engine, args, protocol_stdout())


if __name__ == "__main__":
    main()
