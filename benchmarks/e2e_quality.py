"""Quality in the end-to-end benchmark: the fp32 reference's greedy tokens and the mean
log-probability each ONNX model gives them, scored here before any worker starts (transformers and
llama.cpp score in their workers: see ``e2e_pool.score_in_workers``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from _harness.workload import ort_session

METHOD = (
    "mean log-probability (natural log, per token) that the engine's model assigns to the fp32 "
    "reference's greedy continuation of the benchmark prompt, teacher forced in one pass; higher "
    "is better, and delta_vs_fp32 is the difference to the reference model's own score"
)


def reference_tokens(model: Path, ids: list[int], n: int, threads: int) -> list[int]:
    """The fp32 reference's `n` greedy tokens after the prompt (EOS not suppressed: the score
    is defined whatever the tokens are)."""
    from onnxsample.exporters._verify import ort_greedy

    return ort_greedy(model, ids, n, threads=threads)


def score_onnx(
    models: dict[str, dict],
    ids: list[int],
    tokens: list[int],
    threads: int,
    log: Callable[[str], None],
) -> dict[str, dict]:
    """engine -> {"mean_logprob", "scored_on"} (or a null score and the reason) for every engine
    whose model is an ONNX file scored here; each file is scored once."""
    from onnxsample.exporters._verify import mean_logprob

    def score(path: Path) -> float:
        if (path.parent / "genai_config.json").is_file():
            return genai_mean_logprob(path, ids, tokens, threads)
        return mean_logprob(path, ids, tokens, threads=threads)

    by_path: dict[str, dict] = {}
    scores = {}
    for engine, entry in models.items():
        path = entry.get("scored")
        if engine.startswith("__") or path is None:
            continue
        key = str(path)
        if key not in by_path:
            try:
                value = score(Path(path))
                by_path[key] = {"mean_logprob": round(value, 4), "scored_on": key}
            except Exception as exc:
                by_path[key] = {
                    "mean_logprob": None,
                    "scored_on": key,
                    "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                }
            log(f"quality: {engine}: {by_path[key]}")
        scores[engine] = dict(by_path[key])
    return scores


def genai_mean_logprob(path: Path, ids: list[int], tokens: list[int], threads: int) -> float:
    """``mean_logprob`` for onnxruntime-genai's builder model, whose past inputs leave the head size
    symbolic (``kv_cache_dim``): it is read from the ``genai_config.json`` beside the model."""
    import numpy as np

    from onnxsample.exporters._verify import _mean_logprob

    decoder = json.loads((path.parent / "genai_config.json").read_text())["model"]["decoder"]
    session = ort_session(path, threads)
    seq = np.asarray([list(ids) + list(tokens[:-1])], dtype=np.int64)
    feed = {"input_ids": seq, "attention_mask": np.ones_like(seq)}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            heads = i.shape[1] if isinstance(i.shape[1], int) else decoder["num_key_value_heads"]
            size = i.shape[3] if isinstance(i.shape[3], int) else decoder["head_size"]
            feed[i.name] = np.zeros((1, heads, 0, size), dtype=np.float32)
    logits = session.run(["logits"], feed)[0][0, len(ids) - 1 :].astype(np.float64)
    return _mean_logprob(logits, tokens)


def with_delta(score: dict, reference: float | None) -> dict:
    """`score` with its difference to the reference model's own score, where both exist."""
    value = score.get("mean_logprob")
    if value is not None and reference is not None:
        score["delta_vs_fp32"] = round(value - reference, 4)
    return score
