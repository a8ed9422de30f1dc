"""What the benchmarks run: the model folders they share, composed graphs cached beside a model, ONNX
Runtime sessions, the chat request of the serving benchmarks and the sampled settings.

Standard library at import time; onnxruntime and onnxsample are imported by the functions that need
them (:func:`closed_batch_graph` also runs under the previous release's package).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .script import ROOT

# The embedded SmolLM2-135M-Instruct, as `onnxsample export` writes it: fp32 (optimum's layout),
# and the GQA layout with the GGUF's own blocks at accuracy level 4 (what `onnxsample run` uses).
EMBEDDED_FP32 = ROOT / "artifacts" / "smollm2-135m-instruct"
EMBEDDED_A4 = ROOT / "artifacts" / "smollm2-135m-instruct-gqa-gguf-a4"
# The same with `--attention exact` (the folder `onnxsample export --attention exact` writes).
EMBEDDED_A4_EXACT = ROOT / "artifacts" / "smollm2-135m-instruct-gqa-gguf-a4-exact"

# The serving benchmarks' request: a ~50-token chat prompt, 128 new tokens, EOS ignored.
MESSAGE = (
    "You are helping a friend plan a weekend trip to the mountains. Suggest a schedule for two "
    "days with hiking, food and rest, and explain briefly why each part fits."
)
NEW_TOKENS = 128
# "sampled" everywhere; the e2e engines and the sampling overhead add a repetition penalty of 1.1.
SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
REPETITION_PENALTY = 1.1


def trip_message(client: int, request: int) -> str:
    """Each request its own user message (the chat template's system prompt is shared)."""
    return f"(Trip {client}-{request}) {MESSAGE}"


def ort_session(model: Path | bytes, threads: int) -> Any:
    """A CPU ``onnxruntime.InferenceSession`` on `threads` intra-op threads (one inter-op), quiet."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def compose_cached(model: Path, out: Path, chain: str | None, **options: Any) -> Path:
    """Compose `model` (an export folder or an .onnx file) into `out` once; reuse it while it is
    newer than the model and was written by this composer with as many slots and the same
    ``static`` option (``prepare``'s own check: contract version, composer revision, slots)."""
    from onnxsample import compose
    from onnxsample.prepare import _up_to_date

    source = model / "model.onnx" if model.is_dir() else model
    if not _up_to_date(out, source, options["max_slots"], options.get("static", False)):
        out.parent.mkdir(parents=True, exist_ok=True)
        compose(model, chain, out, **options)
    return out


def closed_batch_graph(model: Path = EMBEDDED_A4) -> Path:
    """The previous release's graph (8 slots, 20 top logprobs, 16 bias entries, no prompt logprobs)
    beside `model`, composed once. The previous release runs it too, so it is checked by name only
    and composed through the top-level ``onnxsample.compose``, which both releases have."""
    path = model / "composed-closed-batch.onnx"
    if not path.is_file():
        import onnxsample

        onnxsample.compose(model, None, path, max_slots=8, top_logprobs=20, max_bias=16)
    return path
