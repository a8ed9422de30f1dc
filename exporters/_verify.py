"""After an export: greedy tokens from ONNX Runtime against transformers' on the same prompt."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

_ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
}
VERIFY_PROMPT = "What is the capital of France?"


@dataclass
class VerifyResult:
    """Greedy tokens of both engines; `ok` is None when the check could not run here."""

    tokens: int
    ok: bool | None
    matched: int = 0
    reference: list[int] = field(default_factory=list)
    onnx: list[int] = field(default_factory=list)
    note: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def prompt_ids(tokenizer, prompt: str = VERIFY_PROMPT) -> list[int]:
    """Tokenise a user prompt as the model expects it: through the chat template when it has one."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}]
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        return [int(i) for i in ids]
    return [int(i) for i in tokenizer(prompt).input_ids]


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
    pasts = {}
    for name, info in inputs.items():
        if name.startswith("past_key_values."):
            _, heads, _, head_dim = info.shape
            pasts[name] = np.zeros((1, heads, 0, head_dim), dtype=_ORT_DTYPES[info.type])
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


def verify_export(model_path: Path, model, tokenizer, n: int) -> VerifyResult:
    """Compare `n` greedy tokens; a mismatch is returned (and logged), never raised or hidden."""
    ids = prompt_ids(tokenizer)
    reference = torch_greedy(model, ids, n)
    try:
        onnx_tokens = ort_greedy(model_path, ids, n)
    except Exception as exc:  # e.g. fp16 kernels the CPU provider lacks
        note = f"ONNX Runtime could not run the export on the CPU: {str(exc).splitlines()[0]}"
        log.warning("verify skipped: %s", note)
        return VerifyResult(n, None, reference=reference, note=note)
    matched = next(
        (i for i, (a, b) in enumerate(zip(reference, onnx_tokens, strict=True)) if a != b), n
    )
    result = VerifyResult(n, matched == n, matched, reference, onnx_tokens)
    if not result.ok:
        result.note = f"greedy tokens diverge at position {matched}"
        log.warning("verify: %s (transformers %s, onnx %s)", result.note, reference, onnx_tokens)
    return result
