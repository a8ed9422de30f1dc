"""The share of a decode step spent on sampling: in the graph vs on the host.

    python benchmarks/sampling_overhead.py                       # batch 1, 8, 32; 1 thread; 3 repeats
    python benchmarks/sampling_overhead.py --batch 1,8 --threads 1,2 --steps 16 --repeats 5

One decode loop, written here with IOBinding (KV cache fed back as OrtValues, as the Generator
does), times each decode step of the embedded SmolLM2 after a prefill of a fixed prompt, for:

- ``graph_full``: the composed model, the full chain (max_bias 16, no top logprobs, slots = batch),
  running t 0.8, top-k 40, top-p 0.95, min-p 0.05, repetition penalty 1.1 and an EOS bias;
- ``graph_greedy``: the composed model with the greedy-only chain (argmax inside the graph);
- ``plain``: the plain ``model.onnx``; its logits ``[B, 1, V]`` are copied to numpy and sampled there
  with the same chain (argpartition top-k, then top-p / min-p on the 40 candidates): the step is
  ``forward`` + ``host sampling`` (copy included); the same logits are also argmax'ed (``host_greedy``);
- ``graph_run`` (batch <= 8 only): the composed model ``onnxsample run`` uses (full chain, 8 slots,
  top_logprobs 20, max_bias 16), as served by the Generator;
- ``sampler_alone``: the standalone sampler model of the full chain on ``[slots + 1, V]`` logits,
  which is the in-graph sampling cost without the model around it.

Variants alternate within each repetition. Per batch the JSON holds the median step time of each
and the shares: ``sampler_alone / graph_full``, ``(graph_full - graph_greedy) / graph_full``,
``(graph_full - forward) / graph_full`` and ``host_sampling / (forward + host_sampling)``.
Composed models are written once to ``artifacts/cache/bench-sampling/``. JSON to stdout and to
``benchmarks/results/sampling_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
from _harness.machine import RUNTIME_PACKAGES, created, emit, load_average, run_record
from _harness.measure import median_ms
from _harness.script import RESULTS, ROOT, ints, logger, parser
from _harness.workload import (
    EMBEDDED_FP32,
    REPETITION_PENALTY,
    SAMPLED,
    compose_cached,
    ort_session,
)

from onnxsample import (
    SamplerChain,
    SamplingParams,
    build_sampler_model,
    pack_sampling_params,
    prepare,
    sampler_feeds,
)

EOS = 2
FULL = SamplingParams(**SAMPLED, repetition_penalty=REPETITION_PENALTY, logit_bias={EOS: -100.0})
_U_MAX = np.nextafter(np.float32(1), np.float32(0))


class HostSampler:
    """The full chain in numpy on copied logits, as a host-side sampling loop would run it."""

    def __init__(self, batch: int, vocab: int, prompt: np.ndarray, seed: int = 0) -> None:
        self.seen = np.zeros((batch, vocab), bool)
        self.seen[:, prompt] = True
        self.rng = np.random.default_rng(seed)
        self.k = FULL.top_k

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        x = np.array(logits[:, -1, :], dtype=np.float32)  # the copy a host loop makes
        x[:, EOS] -= 100.0
        penalty = np.float32(FULL.repetition_penalty)
        x = np.where(self.seen, np.where(x > 0, x / penalty, x * penalty), x)
        x /= np.float32(FULL.temperature)
        idx = np.argpartition(-x, self.k - 1, axis=1)[:, : self.k]
        vals = np.take_along_axis(x, idx, axis=1)
        order = np.argsort(-vals, axis=1, kind="stable")
        idx, vals = np.take_along_axis(idx, order, 1), np.take_along_axis(vals, order, 1)
        p = np.exp(vals - vals[:, :1])
        p /= p.sum(axis=1, keepdims=True)
        before = np.cumsum(p, axis=1) - p
        keep = (before < FULL.top_p) & (p >= FULL.min_p * p[:, :1])
        p = np.where(keep, p, 0)
        cum = np.cumsum(p, axis=1)
        u = self.rng.random((len(p), 1)) * cum[:, -1:]
        pick = np.minimum((cum <= u).sum(axis=1), keep.sum(axis=1) - 1)
        tokens = idx[np.arange(len(idx)), pick]
        self.seen[np.arange(len(tokens)), tokens] = True
        return tokens


class Loop:
    """Prefill then `steps` decode steps with IOBinding; per-step times in milliseconds."""

    def __init__(self, sess: ort.InferenceSession, batch: int, slots: int, vocab: int) -> None:
        self.sess, self.batch, self.slots, self.vocab = sess, batch, slots, vocab
        inputs = {i.name: i for i in sess.get_inputs()}
        self.inputs = set(inputs)
        self.pasts = [n for n in inputs if n.startswith("past_key_values.")]
        self.kv_shape = {n: inputs[n].shape for n in self.pasts}
        self.outputs = [o.name for o in sess.get_outputs()]
        self.composed = "sampler.row_index" in self.inputs
        if self.composed:
            meta = sess.get_modelmeta().custom_metadata_map
            chain = SamplerChain(meta.get("onnxsample.chain", ""))
            params = [FULL if "dist" in chain else None] * batch
            arrays = pack_sampling_params(
                params,
                chain,
                slots,
                max_bias=int(meta.get("onnxsample.max_bias", 0)),
                vocab_size=vocab,
                top_logprobs=int(meta.get("onnxsample.top_logprobs", 0)),
            )
            self.static = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in arrays.items()}
            self.static = {k: v for k, v in self.static.items() if k in self.inputs}

    def _bind(self, binding, ids, mask, pasts, rows, state) -> None:
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("attention_mask", mask)
        if "position_ids" in self.inputs:
            positions = np.full(ids.shape, mask.shape[1] - ids.shape[1], np.int64)
            positions += np.arange(ids.shape[1])
            binding.bind_cpu_input("position_ids", positions)
        for name in self.pasts:
            value = pasts[name]
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, value)
            else:
                binding.bind_ortvalue_input(name, value)
        if self.composed:
            for name, value in self.static.items():
                binding.bind_ortvalue_input(name, value)
            for name, value in state.items():
                binding.bind_ortvalue_input(name, value)
            binding.bind_cpu_input("sampler.row_index", rows)
            if "sampler.uniform" in self.inputs:
                u = np.minimum(self.rng.random(self.slots, dtype=np.float32), _U_MAX)
                binding.bind_cpu_input("sampler.uniform", u)
        for name in self.outputs:
            binding.bind_output(name, "cpu")

    def run(self, prompt: np.ndarray, steps: int, host: bool) -> dict[str, list[float]]:
        batch, length = self.batch, len(prompt)
        self.rng = np.random.default_rng(0)
        ids = np.tile(prompt, (batch, 1))
        mask = np.ones((batch, length), np.int64)
        pasts = {
            n: np.zeros((batch, self.kv_shape[n][1], 0, self.kv_shape[n][3]), np.float32)
            for n in self.pasts
        }
        state = {}
        if self.composed and "sampler.output_counts" in self.inputs:
            counts = np.zeros((self.slots, self.vocab), np.int32)
            state["sampler.output_counts"] = ort.OrtValue.ortvalue_from_numpy(counts)
            seen = np.zeros((self.slots, self.vocab), bool)
            seen[:batch, prompt] = True
            state["sampler.prompt_mask"] = ort.OrtValue.ortvalue_from_numpy(seen)
        sampler = HostSampler(batch, self.vocab, prompt) if host else None
        rows = np.zeros(self.slots, np.int64)
        rows[:batch] = 1 + np.arange(batch) * length + length - 1
        times: dict[str, list[float]] = {"step": [], "forward": [], "host": [], "host_greedy": []}
        for step in range(steps + 1):
            t0 = time.perf_counter()
            binding = self.sess.io_binding()
            self._bind(binding, ids, mask, pasts, rows, state)
            self.sess.run_with_iobinding(binding)
            out = dict(zip(self.outputs, binding.get_outputs(), strict=True))
            t1 = time.perf_counter()
            if self.composed:
                tokens = out["sampler.next_token"].numpy()[:batch]
                if "sampler.output_counts" in state:
                    state["sampler.output_counts"] = out["sampler.output_counts_out"]
            else:
                tokens = sampler(out["logits"].numpy())
            t2 = time.perf_counter()
            if not self.composed:
                np.argmax(np.array(out["logits"].numpy()[:, -1, :]), axis=1)
                times["host_greedy"].append((time.perf_counter() - t2) * 1e3)
            if step:  # step 0 is the prefill
                times["step"].append((t2 - t0) * 1e3)
                times["forward"].append((t1 - t0) * 1e3)
                times["host"].append((t2 - t1) * 1e3)
            pasts = {n: out["present." + n[len("past_key_values.") :]] for n in self.pasts}
            ids = np.asarray(tokens, np.int64).reshape(batch, 1)
            mask = np.ones((batch, mask.shape[1] + 1), np.int64)
            rows = np.zeros(self.slots, np.int64)
            rows[:batch] = 1 + np.arange(batch)
        return times


def sampler_alone(batch: int, vocab: int, threads: int, budget: float) -> float:
    """Median ms of the standalone full-chain sampler model on LLM-like logits."""
    chain = SamplerChain.full()
    model = build_sampler_model(chain, vocab, batch, max_bias=16)
    sess = ort_session(model.SerializeToString(), threads)
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, size=(batch + 1, vocab)).astype(np.float32)
    logits[:, :20] += np.linspace(16, 8, 20, dtype=np.float32)
    prompt = np.zeros((batch, vocab), bool)
    prompt[:, rng.choice(vocab, 64, replace=False)] = True
    feeds = sampler_feeds(
        chain, logits, [FULL] * batch, uniform=rng.random(batch), prompt_mask=prompt, max_bias=16
    )
    return median_ms(lambda: sess.run(None, feeds), budget, minimum=20, most=None)


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else float("nan")


def measure_batch(
    args: argparse.Namespace,
    models: dict[str, Path],
    batch: int,
    threads: int,
    prompt: np.ndarray,
    vocab: int,
    log: Callable[[object], None],
) -> dict:
    """Every variant's decode steps at one batch size and thread count, alternated over the
    repetitions: the median step times and the shares of sampling."""
    variants = {
        "graph_full": models[f"full-s{batch}"],
        "graph_greedy": models[f"greedy-s{batch}"],
        "plain": models["plain"],
    }
    if batch <= 8:
        variants["graph_run"] = models["run"]
    loops = {}
    for name, path in variants.items():
        slots = 8 if name == "graph_run" else batch
        loops[name] = Loop(ort_session(path, threads), batch, slots, vocab)
    samples: dict[str, dict[str, list[float]]] = {n: {} for n in loops}
    names = list(loops)
    for rep in range(args.repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            times = loops[name].run(prompt, args.steps, host=name == "plain")
            for key, values in times.items():
                samples[name].setdefault(key, []).extend(values[args.skip :])
            log(f"t{threads} b{batch} rep {rep}: {name:12s} {_median(times['step']):8.2f} ms/step")
    del loops
    med = {n: {k: _median(v) for k, v in s.items() if v} for n, s in samples.items()}
    full, greedy, plain = med["graph_full"]["step"], med["graph_greedy"]["step"], med["plain"]
    alone = sampler_alone(batch, vocab, threads, args.budget)
    row = {
        "batch": batch,
        "threads": threads,
        "step_ms": {
            "graph_full": full,
            "graph_greedy": greedy,
            "plain_forward": plain["forward"],
            "plain_host_full": plain["step"],
            "host_sampling_full": plain["host"],
            "host_sampling_greedy": plain["host_greedy"],
            "sampler_alone_full": round(alone, 3),
        },
        "spread_ms": {
            n: [round(min(s["step"]), 3), round(max(s["step"]), 3)] for n, s in samples.items()
        },
        "share": {
            "in_graph_sampler_alone": round(alone / full, 4),
            "in_graph_vs_greedy": round((full - greedy) / full, 4),
            "in_graph_vs_plain_forward": round((full - plain["forward"]) / full, 4),
            "host_numpy": round(plain["host"] / plain["step"], 4),
        },
        "steps_per_repeat": args.steps,
        "repeats": args.repeats,
    }
    if "graph_run" in med:
        row["step_ms"]["graph_run_8_slots"] = med["graph_run"]["step"]
    return row


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__)
    p.add_argument("--model", default=str(EMBEDDED_FP32))
    p.add_argument("--batch", default="1,8,32")
    p.add_argument("--threads", default="1")
    p.add_argument("--steps", type=int, default=32, help="decode steps per loop")
    p.add_argument("--skip", type=int, default=2, help="first decode steps left out of the stats")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--budget", type=float, default=1.0, help="seconds for the standalone sampler")
    p.add_argument("--cache", default=str(ROOT / "artifacts/cache/bench-sampling"))
    p.add_argument("--output", default=str(RESULTS / "sampling_overhead.json"))
    args = p.parse_args(argv)
    batches, threads_list = ints(args.batch, "batch"), ints(args.threads, "threads")
    if args.steps <= args.skip or args.repeats < 1:
        raise SystemExit("--steps > --skip, --repeats >= 1")
    log = logger("sampling_overhead")

    folder, cache = Path(args.model), Path(args.cache)
    if not (folder / "model.onnx").is_file():
        raise SystemExit(
            f"no export at {folder}: run `make run` (or `.venv/bin/onnxsample export -o "
            "artifacts/smollm2-135m-instruct`) first"
        )
    models = {"plain": folder / "model.onnx", "run": prepare(folder)}
    for b in batches:
        log(f"composing the {b}-slot graphs (cached in {cache})")
        models[f"full-s{b}"] = compose_cached(
            folder, cache / f"full-s{b}.onnx", None, max_slots=b, max_bias=16
        )
        # gather="logits": composing the greedy chain with the gather moved before the LM head
        # fails in onnxsample 0.1.0 (its check probes it with temperature 1); at decode (one
        # row per sequence) both gathers cost the same.
        models[f"greedy-s{b}"] = compose_cached(
            folder, cache / f"greedy-s{b}.onnx", "", max_slots=b, gather="logits"
        )
    manifest = json.loads((folder / "onnxsample.json").read_text())
    vocab = int(manifest["model"]["vocab_size"])
    prompt = np.random.default_rng(7).integers(100, vocab, args.prompt_tokens).astype(np.int64)
    load_before = load_average()
    rows = [
        measure_batch(args, models, b, t, prompt, vocab, log) for t in threads_list for b in batches
    ]
    report = {
        "benchmark": "sampling_overhead",
        "created": created(),
        **run_record(load_before, *RUNTIME_PACKAGES),
        "settings": {
            "model": folder.name,
            "prompt_tokens": args.prompt_tokens,
            "steps": args.steps,
            "skipped_steps": args.skip,
            "repeats": args.repeats,
            "chain": "t 0.8, top-k 40, top-p 0.95, min-p 0.05, repetition penalty 1.1, EOS bias -100",
            "graph_full": "full chain, slots = batch, max_bias 16, top_logprobs 0",
            "graph_run": "onnxsample run's graph: full chain, 8 slots, top_logprobs 20, max_bias 16",
            "host": "numpy on a copy of the last logits: argpartition top-k 40, then sort of 40",
        },
        "results": rows,
    }
    emit(report, args.output, "sampling_overhead")
    return report


if __name__ == "__main__":
    main()
