"""The contenders of benchmarks/gpu.py (see its doc): the engine with sampling inside the graph
(:class:`InGraph`), the plain model with sampling on the host (:class:`PlainHost`, with
:func:`host_sample`) and transformers' ``generate`` (:class:`Transformers`). Each ``run`` decodes
B copies of one prompt and returns a :func:`row` of decode tokens/s, ms per step and TTFT.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
from _harness.workload import SAMPLED


def host_sample(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row of `logits` [B, V]: temperature, top-k, top-p, then min-p (on the top-k
    candidates), then a draw from what is left."""
    z = logits.astype(np.float32) / np.float32(SAMPLED["temperature"])
    k = min(SAMPLED["top_k"], z.shape[1])
    idx = np.argpartition(-z, k - 1, axis=1)[:, :k]
    top = np.take_along_axis(z, idx, 1)
    order = np.argsort(-top, axis=1, kind="stable")
    idx, top = np.take_along_axis(idx, order, 1), np.take_along_axis(top, order, 1)
    p = np.exp(top - top[:, :1])
    p /= p.sum(1, keepdims=True)
    keep = np.cumsum(p, 1) - p < SAMPLED["top_p"]  # the smallest prefix that reaches top_p
    keep &= p >= SAMPLED["min_p"] * p[:, :1]
    c = np.cumsum(np.where(keep, p, 0), 1)
    u = rng.random((len(c), 1)) * c[:, -1:]
    pick = np.minimum((c < u).sum(1), k - 1)
    return idx[np.arange(len(idx)), pick]


class InGraph:
    """A composed model on :class:`onnxsample.Engine` (sampling inside the graph)."""

    def __init__(
        self, path: Path, provider: str, cuda_graph: bool = False, sampling: dict = SAMPLED
    ) -> None:
        from onnxsample import Engine

        self.engine = Engine(path, provider=provider, cuda_graph=cuda_graph, prefix_reuse=False)
        self.device, self.sampling = self.engine.device, sampling

    def run(self, ids: list[int], batch: int, new_tokens: int, seed: int) -> dict:
        from onnxsample import SamplingParams

        before = self.engine.stats()
        requests = [
            self.engine.submit(
                ids,
                SamplingParams(**self.sampling, ignore_eos=True, seed=seed + b),
                max_new_tokens=new_tokens,
            )
            for b in range(batch)
        ]
        done = [r.result(timeout=3600) for r in requests]
        after = self.engine.stats()
        return row(
            after.generated_tokens - before.generated_tokens - batch,
            after.decode_s - before.decode_s,
            after.decode_steps - before.decode_steps,
            [c.timings.ttft_s for c in done],
        )

    def close(self) -> None:
        self.engine.close()


class PlainHost:
    """``model.onnx`` with no sampler: IOBinding over one shared KV buffer per layer, the logits
    copied to the host each step and sampled there with numpy."""

    def __init__(self, folder: Path, provider: str) -> None:
        from onnxsample.engine._kv_shared import SharedKV, kv_specs
        from onnxsample.engine._session import create_session

        self.session, self.device = create_session(folder / "model.onnx", provider)
        inputs = self.session.get_inputs()
        pasts = {i.name: i for i in inputs if i.name.startswith("past_key_values.")}
        self.kv = SharedKV(kv_specs(pasts, None, "model.onnx"), self.device)
        logits = next(o for o in self.session.get_outputs() if o.name == "logits")
        self.vocab = int(logits.shape[-1])

    def _binding(self, row: int, rows: int, ids: np.ndarray, out: np.ndarray | None = None):
        binding = self.session.io_binding()
        if out is None:
            binding.bind_output("logits", "cpu")
        else:  # straight into a preallocated host array
            binding.bind_output("logits", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        self.kv.bind(binding, row, rows)
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("attention_mask", np.ones(ids.shape, np.int64))
        return binding

    def run(self, ids: list[int], batch: int, new_tokens: int, seed: int) -> dict:
        from onnxsample.engine._kv_shared import buffer_length

        n = len(ids)
        self.kv.grow(batch, buffer_length(n + new_tokens, None))
        rng = np.random.default_rng(seed)
        prompt = np.asarray([ids], np.int64)
        tokens = np.zeros(batch, np.int64)
        ttft = []
        start = time.perf_counter()
        for b in range(batch):  # each prompt in its own call, into its own row
            binding = self._binding(b, 1, prompt)
            self.session.run_with_iobinding(binding)
            tokens[b] = host_sample(binding.get_outputs()[0].numpy()[:, -1], rng)[0]
            ttft.append(time.perf_counter() - start)
        logits = np.empty((batch, 1, self.vocab), np.float32)
        drawn = [tokens]
        binding = self._binding(0, batch, tokens[:, None], logits)
        decode_s = 0.0
        for step in range(1, new_tokens):
            t0 = time.perf_counter()
            binding.bind_cpu_input("input_ids", tokens[:, None])
            binding.bind_cpu_input("attention_mask", np.ones((batch, n + step), np.int64))
            self.session.run_with_iobinding(binding)
            tokens = host_sample(logits[:, 0], rng)  # all rows at once
            decode_s += time.perf_counter() - t0
            drawn.append(tokens)
        self.generated = np.stack(drawn, 1)  # [B, new_tokens], for the tests
        return row(batch * (new_tokens - 1), decode_s, new_tokens - 1, ttft)

    def close(self) -> None:
        self.kv.buffers.clear()


class Transformers:
    """transformers' ``generate`` on the GGUF, de-quantised by its own loader (module doc)."""

    def __init__(self, gguf: Path, provider: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch, self.on = torch, "cuda" if provider == "cuda" else "cpu"
        dtype = torch.float16 if self.on == "cuda" else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=dtype
        ).to(self.on)
        self.model.eval()
        self.device = f"torch {torch.__version__} {self.on} {dtype}"

    def _generate(self, ids: list[int], batch: int, new_tokens: int, seed: int) -> float:
        torch = self.torch
        torch.manual_seed(seed)
        prompt = torch.tensor([ids] * batch, device=self.on)
        if self.on == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                do_sample=True,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=0,
                **SAMPLED,
            )
        if self.on == "cuda":
            torch.cuda.synchronize()
        assert out.shape == (batch, len(ids) + new_tokens), out.shape
        return time.perf_counter() - start

    def run(self, ids: list[int], batch: int, new_tokens: int, seed: int) -> dict:
        first = self._generate(ids, batch, 1, seed)
        total = self._generate(ids, batch, new_tokens, seed)
        return row(batch * (new_tokens - 1), total - first, new_tokens - 1, [first] * batch)

    def close(self) -> None:
        del self.model


def row(decoded: int, decode_s: float, steps: int, ttft: list[float]) -> dict:
    return {
        "decode_tokens_per_s": decoded / decode_s if decode_s > 0 else 0.0,
        "ms_per_step": 1000 * decode_s / max(steps, 1),
        "ttft_ms": 1000 * statistics.median(ttft),
        "decoded_tokens": decoded,
        "decode_steps": steps,
    }
