"""After an export: greedy tokens from ONNX Runtime against transformers' on the same prompt."""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from onnxsample.errors import first_line

log = logging.getLogger(__name__)

_ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
}
VERIFY_PROMPT = "What is the capital of France?"
# Memory the verify step's reference takes a parameter: transformers' fp32 weights (4 bytes) and
# what loading a GGUF holds beside them (1.31x those in all, measured on a 0.19B Q4_K_M file),
# with the export's own session beside it.
REFERENCE_BYTES_PER_PARAM = 6


@dataclass
class VerifyResult:
    """Greedy tokens of both engines; `ok` is None when the check could not run here."""

    tokens: int
    ok: bool | None
    matched: int = 0
    reference: list[int] = field(default_factory=list)
    onnx: list[int] = field(default_factory=list)
    note: str = ""
    # Quality: mean log-probability of the reference's greedy tokens under each engine.
    reference_logprob: float | None = None
    onnx_logprob: float | None = None
    # Why the export is not meant to reproduce transformers' tokens exactly ('' when it is).
    lossy: str = ""
    # Where the tokens part: how far transformers' log-probability of its own token is above that
    # of the export's token (a near tie, typically, where int8 activations tip the choice).
    reference_gap: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


def prompt_ids(tokenizer, prompt: str = VERIFY_PROMPT) -> list[int]:
    """Tokenise a user prompt as the model expects it: through the chat template when it has one."""
    if getattr(tokenizer, "chat_template", None):  # transformers' or onnxsample.text.Tokenizer
        messages = [{"role": "user", "content": prompt}]
        return [int(i) for i in tokenizer.apply_chat_template(messages, add_generation_prompt=True)]
    return [int(i) for i in tokenizer.encode(prompt)]


def ort_greedy(
    model_path: Path, ids: list[int], n: int, *, threads: int | None = None
) -> list[int]:
    """Greedy decoding of an optimum-layout export with ONNX Runtime on the CPU, KV cache fed back."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    pasts = _empty_pasts(session, 1, len(ids) + n)
    step_ids = np.asarray([ids], dtype=np.int64)
    total, tokens = len(ids), []
    for _ in range(n):
        feed = {"input_ids": step_ids, "attention_mask": np.ones((1, total), dtype=np.int64)}
        if "position_ids" in inputs:
            feed["position_ids"] = np.arange(total - step_ids.shape[1], total, dtype=np.int64)[None]
        feed.update(pasts)
        result = dict(zip(outputs, session.run(None, feed), strict=True))
        token = int(np.argmax(result["logits"][0, -1]))
        tokens.append(token)
        pasts = {name: result[name.replace("past_key_values.", "present.")] for name in pasts}
        step_ids = np.asarray([[token]], dtype=np.int64)
        total += 1
    return tokens


def _empty_pasts(session, batch: int, positions: int) -> dict[str, np.ndarray]:
    """An empty cache: no positions for optimum's layout (it grows by concatenation), a zeroed
    buffer of `positions` for a graph that reads lengths from the mask (ours: written in place)."""
    inputs = session.get_inputs()
    length = 0 if any(i.name == "position_ids" for i in inputs) else positions
    return {
        i.name: np.zeros((batch, i.shape[1], length, i.shape[3]), dtype=_ORT_DTYPES[i.type])
        for i in session.get_inputs()
        if i.name.startswith("past_key_values.")
    }


def mean_logprob(
    model_path: Path, ids: list[int], tokens: list[int], *, threads: int | None = None
) -> float:
    """Mean log-probability an export assigns to `tokens` after the prompt `ids` (teacher forced).

    The quality score of a quantised export: how likely it finds the tokens that the fp32 model
    chose greedily (higher is better; an exact transplant scores what fp32 scores).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    seq = np.asarray([list(ids) + list(tokens[:-1])], dtype=np.int64)
    feed = {"input_ids": seq, "attention_mask": np.ones_like(seq)}
    feed.update(_empty_pasts(session, 1, seq.shape[1]))
    if "position_ids" in names:
        feed["position_ids"] = np.arange(seq.shape[1], dtype=np.int64)[None]
    logits = session.run(["logits"], feed)[0][0, len(ids) - 1 :].astype(np.float64)
    return _mean_logprob(logits, tokens)


def _mean_logprob(logits: np.ndarray, tokens: list[int]) -> float:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logprobs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return float(logprobs[np.arange(len(tokens)), tokens].mean())


def available_memory() -> int | None:
    """Bytes a new allocation can take without swapping (Linux's MemAvailable); None if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def reference_out_of_reach(n_params: int) -> str:
    """Why transformers' fp32 reference of `n_params` parameters cannot be loaded here for the
    verify step (it would not fit in the memory available), or ''."""
    need = REFERENCE_BYTES_PER_PARAM * n_params
    available = available_memory()
    if available is None or need <= available:
        return ""
    return (
        f"transformers' fp32 reference needs about {need / 1e9:.1f} GB of memory, "
        f"{available / 1e9:.1f} GB are available"
    )


def torch_mean_logprob(model, ids: list[int], tokens: list[int]) -> float:
    """:func:`mean_logprob` of a transformers model."""
    return _mean_logprob(_torch_logits(model, ids, tokens), tokens)


def _torch_logits(model, ids: list[int], tokens: list[int]) -> np.ndarray:
    """A transformers model's logits (float64) for each of `tokens` after the prompt `ids`,
    teacher forced in one pass."""
    import torch

    seq = torch.tensor([list(ids) + list(tokens[:-1])], dtype=torch.long)
    with torch.no_grad():
        return model(input_ids=seq).logits[0, len(ids) - 1 :].double().numpy()


def torch_greedy(model, ids: list[int], n: int) -> list[int]:
    """Greedy decoding with transformers, one token at a time with its own KV cache."""
    import torch

    tokens, past = [], None
    step = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        for _ in range(n):
            out = model(input_ids=step, past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = int(torch.argmax(out.logits[0, -1]))
            tokens.append(token)
            step = torch.tensor([[token]], dtype=torch.long)
    return tokens


def verify_export(model_path: Path, model, tokenizer, n: int, *, lossy: str = "") -> VerifyResult:
    """Compare `n` greedy tokens; a mismatch is returned (and logged), never raised or hidden.

    `lossy` names why an export is not meant to reproduce transformers' arithmetic (re-quantised
    weights, int8 activations): its divergence is then expected, noted as such and logged at info.
    """
    ids = prompt_ids(tokenizer)
    reference = torch_greedy(model, ids, n)
    try:
        onnx_tokens = ort_greedy(model_path, ids, n)
    except Exception as exc:  # e.g. fp16 kernels the CPU provider lacks
        note = f"ONNX Runtime could not run the export on the CPU: {first_line(exc)}"
        log.warning("verify skipped: %s", note)
        return VerifyResult(n, None, reference=reference, note=note)
    matched = next(
        (i for i, (a, b) in enumerate(zip(reference, onnx_tokens, strict=True)) if a != b), n
    )
    result = VerifyResult(n, matched == n, matched, reference, onnx_tokens, lossy=lossy)
    logits = _torch_logits(model, ids, reference)
    result.reference_logprob = round(_mean_logprob(logits, reference), 4)
    result.onnx_logprob = round(mean_logprob(model_path, ids, reference), 4)
    if not result.ok:
        row = logits[matched]
        result.reference_gap = round(float(row[reference[matched]] - row[onnx_tokens[matched]]), 4)
        result.note = (
            f"greedy tokens agree for {matched} of {n}, then part where transformers' token is "
            f"{result.reference_gap:.2f} above the export's in logprob"
        )
        if lossy:
            result.note += f" (expected with {lossy})"
        level = logging.INFO if lossy else logging.WARNING
        log.log(level, "verify: %s (transformers %s, onnx %s)", result.note, reference, onnx_tokens)
    return result
