"""The sampler model alone on a device: one call of the branching and the static chain, and where
its time goes (ONNX Runtime's profiler, by node and by op type).

    python benchmarks/gpu_sampler.py build DIR [--slots 8,64] [--vocab 49152]   # needs onnxscript
    python benchmarks/gpu_sampler.py run DIR [--provider cuda] [--output FILE]  # ORT + numpy only

``build`` writes the full chain's sampler models (``{branching,static}-sN.onnx``) and the small
per-slot feeds (``feeds-sN.npz``) to DIR; ``run`` needs nothing else, so DIR can be copied to a GPU
machine that has only onnxruntime-gpu and numpy. The [S, V] inputs are made there: LLM-like logits
(N(0, 2) plus a head of 20 tokens raised by 8…16, as ``benchmarks/sampler.py``; S + 1 rows, each
slot reading its own), no prompt tokens and no output counts. Every slot samples with temperature 0.8, top-k 40, top-p 0.95, min-p 0.05 (the
serving benchmarks' setting). Inputs are bound on the device (IOBinding), the outputs copied back,
so a call's time is the sampler's and the one copy of the tokens. Median of ``--calls`` calls after
a warm-up; then ``--profile-calls`` more with the profiler on, whose node times are summed per call
(an ``If`` node's time holds the nodes of the branch it ran, which are also listed).

The profiler times a node on the host: for the CUDA provider that is the kernel launch, except
where the host waits for the device (an ``If`` reading its condition, a copy back), which then
carries the wait for everything queued before it.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

FULL = "logit_bias,penalties,temperature,top_k,top_p,min_p,typical_p,dist"
KINDS = ("branching", "static")
BIG = ("logits", "sampler.prompt_mask", "sampler.output_counts")  # made where it runs
# Outputs the engine leaves on the device (read only for a flagged slot): not copied back here.
DEVICE_ONLY = ("sampler.fallback_logits",)


def build(folder: Path, slots: list[int], vocab: int) -> None:
    import onnx

    from onnxsample import SamplingParams, sampler_feeds
    from onnxsample.composer.sampler_model import build_sampler_model

    folder.mkdir(parents=True, exist_ok=True)
    for s in slots:
        for kind in KINDS:
            model = build_sampler_model(FULL, vocab, s, max_bias=16, static=kind == "static")
            onnx.save(model, folder / f"{kind}-s{s}.onnx")
        params = [
            SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=i)
            for i in range(s)
        ]
        # s + 1 rows of logits, each slot reading its own (row 0 is the model's prompt row)
        feeds = sampler_feeds(FULL, np.zeros((s + 1, vocab), np.float32), params, max_bias=16)
        np.savez(folder / f"feeds-s{s}.npz", **{k: v for k, v in feeds.items() if k not in BIG})
    (folder / "settings.json").write_text(json.dumps({"slots": slots, "vocab": vocab}))


def _feeds(folder: Path, slots: int, vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, (slots + 1, vocab)).astype(np.float32)
    logits[:, :20] += rng.uniform(8, 16, 20).astype(np.float32)
    small = dict(np.load(folder / f"feeds-s{slots}.npz"))
    return {
        "logits": logits,
        "sampler.prompt_mask": np.zeros((slots, vocab), bool),
        "sampler.output_counts": np.zeros((slots, vocab), np.int32),
        **small,
    }


def _session(path: Path, provider: str, profile: str | None = None, cuda_graph: bool = False):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = profile
    providers: list = ["CUDAExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]
    if cuda_graph:
        providers = [("CUDAExecutionProvider", {"enable_cuda_graph": "1"})]
    if provider == "cuda" and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # CUDA and cuDNN from the nvidia-* pip packages, where present
    session = ort.InferenceSession(str(path), options, providers=providers)
    if session.get_providers()[0] != (
        "CUDAExecutionProvider" if provider == "cuda" else "CPUExecutionProvider"
    ):
        raise SystemExit(f"the {provider} provider did not load")
    return session


def _binding(session, feeds: dict[str, np.ndarray], provider: str, like: list | None = None):
    """Inputs bound on the device; outputs copied back, or (`like`: arrays of their shapes) bound
    to buffers of their own on the device, as a CUDA graph replay needs."""
    import onnxruntime as ort

    from onnxsample.engine._session import input_names

    device = "cuda" if provider == "cuda" else "cpu"
    binding = session.io_binding()
    names = input_names(session)
    for name, value in feeds.items():
        if name in names:
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, device, 0))
    for i, out in enumerate(session.get_outputs()):
        if like is None:
            binding.bind_output(out.name, device if out.name in DEVICE_ONLY else "cpu")
        else:
            buffer = ort.OrtValue.ortvalue_from_numpy(np.zeros_like(like[i]), device, 0)
            binding.bind_ortvalue_output(out.name, buffer)
    return binding


def _median_ms(session, binding, calls: int, copy: bool) -> tuple[float, float]:
    names = [o.name for o in session.get_outputs()]
    times = []
    for i in range(calls + 3):
        start = time.perf_counter()
        session.run_with_iobinding(binding)
        if copy:
            outputs = binding.get_outputs()
            _ = [v.numpy() for v, n in zip(outputs, names, strict=True) if n not in DEVICE_ONLY]
        else:
            binding.synchronize_outputs()
        if i >= 3:
            times.append(time.perf_counter() - start)
    return round(1000 * statistics.median(times), 3), round(1000 * min(times), 3)


def _profile(path: str, calls: int) -> dict:
    events = json.loads(Path(path).read_text())
    runs = sorted(e["ts"] + e["dur"] for e in events if e.get("name") == "model_run")
    warm = runs[0] if runs else 0  # the session's first call: allocations, not a step
    by_node: dict[str, float] = defaultdict(float)
    by_op: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] > warm:
            by_node[e["name"][: -len("_kernel_time")]] += e["dur"]
            by_op[e.get("args", {}).get("op_name", "?")] += e["dur"]

    def top(d: dict[str, float], n: int) -> dict[str, float]:
        return {
            k: round(v / calls / 1000, 3) for k, v in sorted(d.items(), key=lambda x: -x[1])[:n]
        }

    return {"ms_per_call_by_op": top(by_op, 12), "ms_per_call_by_node": top(by_node, 12)}


def run(folder: Path, provider: str, calls: int, profile_calls: int) -> dict:
    settings = json.loads((folder / "settings.json").read_text())
    results = {}
    scratch = tempfile.mkdtemp(prefix="gpu_sampler_")  # the profiler's files, read then removed
    for s in settings["slots"]:
        feeds = _feeds(folder, s, settings["vocab"])
        for kind in KINDS:
            path = folder / f"{kind}-s{s}.onnx"
            session = _session(path, provider)
            binding = _binding(session, feeds, provider)
            median, fastest = _median_ms(session, binding, calls, copy=True)
            row = {"ms_per_call": median, "min_ms": fastest}
            if kind == "static" and provider == "cuda":
                # Replayed as one CUDA graph (the engine's --cuda-graph): no launch per node.
                like = binding.copy_outputs_to_cpu()
                graph = _session(path, provider, cuda_graph=True)
                row["cuda_graph_ms_per_call"], _ = _median_ms(
                    graph, _binding(graph, feeds, provider, like), calls, copy=False
                )
            profiled = _session(path, provider, profile=str(Path(scratch) / f"{kind}-s{s}"))
            pbinding = _binding(profiled, feeds, provider)
            profiled.run_with_iobinding(pbinding)  # warm-up, also profiled: one extra call
            for _ in range(profile_calls):
                profiled.run_with_iobinding(pbinding)
                pbinding.copy_outputs_to_cpu()
            report = _profile(profiled.end_profiling(), profile_calls)
            results[f"{kind}-s{s}"] = {**row, **report}
            print(json.dumps({f"{kind}-s{s}": row}), file=sys.stderr)
    shutil.rmtree(scratch, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the sampler models and small feeds (needs onnxscript)")
    b.add_argument("folder", type=Path)
    b.add_argument("--slots", default="8,64")
    b.add_argument("--vocab", type=int, default=49152)
    r = sub.add_parser("run", help="time them (onnxruntime and numpy only)")
    r.add_argument("folder", type=Path)
    r.add_argument("--provider", default="cuda", choices=["cuda", "cpu"])
    r.add_argument("--calls", type=int, default=30)
    r.add_argument("--profile-calls", type=int, default=10)
    r.add_argument("--output", type=Path)
    args = p.parse_args(argv)
    if args.command == "build":
        build(args.folder, [int(x) for x in args.slots.split(",")], args.vocab)
        return
    import onnxruntime as ort

    report = {
        "benchmark": "gpu_sampler",
        "provider": args.provider,
        "onnxruntime": ort.__version__,
        "settings": json.loads((args.folder / "settings.json").read_text()),
        "results": run(args.folder, args.provider, args.calls, args.profile_calls),
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
