"""Runs inside the simulated CUDA device's venv (onnxruntime-gpu over stand-in CUDA libraries, see
scripts/cuda_sim/build.sh) and prints one JSON object: what ONNX Runtime's real host code did.

    python _probe.py placement MODEL [--cuda-graph]
    python _probe.py engine MODEL SCENARIO [--cuda-graph | --default-graph] [--tokenizer DIR]

`engine MODEL copies` reports, per decode step of one running request, the copies each way and the
kernels: `launches` (libcudart) and `library` (the cuBLAS, cuBLASLt and cuDNN calls that launch
work on a real device).

The simulated device computes nothing: every value read back from it is zero (token ids, If
conditions, NonZero counts), so a probe checks what runs and what is copied, never a number.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import sys
import tempfile
import traceback
from pathlib import Path

import onnx
import onnxruntime as ort

_STATS = ("launches", "captures", "capture_errors", "graph_launches", "d2h", "default", "h2d")
_COUNTERS = (*_STATS, "d2h_bytes", "h2d_bytes", "library", "blocks", "d2d")


def counters() -> dict[str, int]:
    """The stand-in libcudart's counters: kernel launches, captures, copies by direction (`d2d`:
    from device to device), the calls into cuBLAS, cuBLASLt and cuDNN that launch work on a real
    device (`library`), and the thread blocks the launched kernels' grids asked for (`blocks`:
    how much work)."""
    found = _stats()
    return {k: found[k] for k in (*_STATS, "library", "blocks", "d2d")}


def copied_bytes() -> dict[str, int]:
    """The bytes copied so far each way between the host and the device."""
    found = _stats()
    return {"d2h": found["d2h_bytes"], "h2d": found["h2d_bytes"]}


def _stats() -> dict[str, int]:
    """Every counter of the stand-in libcudart, by name."""
    lib = ctypes.CDLL("libcudart.so.13")
    out = (ctypes.c_long * len(_COUNTERS))()
    lib.fakecuda_stats(out)
    return dict(zip(_COUNTERS, out, strict=True))


def placement(model: str, cuda_graph: bool) -> dict:
    """ORT's node → provider assignment, the Memcpy nodes it inserted (with what they feed), and
    whether the session accepted CUDA-graph capture."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    with tempfile.TemporaryDirectory() as tmp:
        optimized = Path(tmp) / "optimized.onnx"
        options.optimized_model_filepath = str(optimized)
        cuda = {"enable_cuda_graph": "1"} if cuda_graph else {}
        try:
            session = ort.InferenceSession(
                model, options, providers=[("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]
            )
        except Exception as exc:  # ORT refuses capture at session creation
            return {"created": False, "error": str(exc).splitlines()[0]}
        graph = onnx.load(str(optimized), load_external_data=False).graph
    producer = {out: node for node in graph.node for out in node.output}
    copies = []
    for node in graph.node:
        if node.op_type.startswith("Memcpy"):
            source = producer.get(node.input[0])
            users = [n.op_type for n in graph.node if node.output[0] in n.input]
            copies.append([node.op_type, source.op_type if source else "input", *users])
    assigned = collections.Counter()
    off_cuda = []
    for subgraph in session.get_provider_graph_assignment_info():
        for node in subgraph.get_nodes():
            assigned[subgraph.ep_name] += 1
            if subgraph.ep_name != "CUDAExecutionProvider":
                off_cuda.append([node.op_type, node.name])
    control = [n.op_type for n in graph.node if n.op_type in ("If", "Loop", "Scan", "NonZero")]
    shape_only = _shape_arithmetic(graph)
    present = _all_names(graph)
    compute_off_cuda = [
        [op, name] for op, name in off_cuda if name not in shape_only and name in present
    ]
    return {
        "created": True,
        "providers": session.get_providers(),
        "nodes": dict(assigned),
        "off_cuda": sorted(off_cuda),
        "compute_off_cuda": sorted(compute_off_cuda),
        "unknown": sorted([op, name] for op, name in off_cuda if name not in present),
        "memcpy": copies,
        "control_flow": sorted(control),
    }


def _shape_arithmetic(graph: onnx.GraphProto, known: set[str] | None = None) -> set[str]:
    """Nodes (in `graph` and its subgraphs) that compute only from tensor shapes and constants,
    what ORT keeps on the CPU by design: Shape/Size of anything, then any node whose inputs are
    all such values."""
    known = {t.name for t in graph.initializer} | {""} | (known or set())
    names = set()
    for node in graph.node:  # a topological order
        if node.op_type in ("Shape", "Size", "Constant") or all(i in known for i in node.input):
            known.update(node.output)
            names.add(node.name)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                names |= _shape_arithmetic(attr.g, set(known))
    return names


def _all_names(graph: onnx.GraphProto) -> set[str]:
    names = set()
    for node in graph.node:
        names.add(node.name)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                names |= _all_names(attr.g)
    return names


def engine(model: str, scenario: str, cuda_graph: bool | None, tokenizer: str | None) -> dict:
    """Run one engine scenario on the CUDA provider; what it did and what it copied."""
    from onnxsample import Constraint, Engine, SamplingParams

    # the simulated device reads every token back as 0, an end-of-generation id of some vocabularies
    # (SmolLM2's <|endoftext|>, as llama.cpp reads its GGUF): the scenarios run their full lengths
    params = SamplingParams(
        temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, seed=1, ignore_eos=True
    )
    options: dict = {"provider": "cuda", "tokenizer": tokenizer, "cuda_graph": cuda_graph}
    if cuda_graph is None:  # the engine's default
        del options["cuda_graph"]
    if scenario in ("copies", "fallback", "fallback-gap", "mask-copies"):
        options["prefix_reuse"] = False  # both requests prefill the same way
        from onnxsample import composed_metadata

        if not composed_metadata(model).chain.samples:
            params = SamplingParams(temperature=0.0, ignore_eos=True)
    prompt = list(range(10, 30))
    if scenario == "chunked":
        options["prefill_chunk"] = 6
    if scenario == "speculative":
        options.update(speculative="ngram", draft_tokens=4)
        prompt = [7, 8, 9] * 8
    result: dict = {"scenario": scenario}
    with Engine(model, **options) as eng:
        result["device"] = eng.device
        base = counters()
        if scenario == "batch-cancel":
            requests = [eng.submit(prompt[: 5 + i], params, max_new_tokens=12) for i in range(3)]
            requests[1].cancel()
            done = [r.result(timeout=120) for r in requests]
            result["finish"] = [c.finish_reason for c in done]
        elif scenario == "grow":
            # A request that reserves more positions arrives while another decodes: the KV buffers
            # are replaced (a new decode bucket) and, once it has gone, shrink back (another).
            # The running one is long enough to outlast this thread's cancel on a loaded machine.
            running = eng.submit(prompt, params, max_new_tokens=200, chat=False)
            next(iter(running))
            lengths = [_kv_length(eng)]
            grown = eng.submit(prompt[:5], params, max_new_tokens=2000, chat=False)
            next(iter(grown))
            lengths.append(_kv_length(eng))
            grown.cancel()
            done = running.result(timeout=120)
            lengths.append(_kv_length(eng))
            result.update(lengths=lengths, tokens=len(done.token_ids), finish=done.finish_reason)
        elif scenario == "buckets":
            # Requests of 60, 16 and 8 tokens queued at once take slots 0, 1 and 2: the steps
            # bind four rows, two once the last ends, then one: a graph per bucket, each
            # captured once.
            result.update(_queued_at_once(eng, prompt, params, (60, 16, 8)))
        elif scenario == "compact":
            # Two short requests in slots 0 and 1 and a long one in slot 2, queued at once: once
            # the first ends, the long one moves to slot 0 (its KV rows and penalty counts copied
            # on the device) and the steps bind two rows, then one, instead of four.
            penalised = SamplingParams(
                temperature=0.8, repetition_penalty=1.2, presence_penalty=0.5, ignore_eos=True
            )  # the counts move too
            result.update(_queued_at_once(eng, prompt, penalised, (3, 10, 40)))
            result["moved"] = eng.stats().moved
        elif scenario == "fallback":
            result.update(_forced_fallback(eng, prompt, params))
        elif scenario == "fallback-gap":
            # Three requests at once in slots 0, 1 and 2, the even slots flagged: slot 1's rows
            # lie between the flagged ones and stay on the device.
            result.update(_forced_fallback(eng, prompt, params, together=3, even=True))
        elif scenario == "mask-copies":
            # A constrained request's mask rows against a plain request's, both after a
            # constrained one (whose row the next call resets): the bytes to the device.
            constrained = SamplingParams(seed=3, constraint=Constraint.grammar(_TOKEN_ZERO))
            _complete(eng, prompt, constrained, 4)
            sent = {}
            for label, asked in (("plain", params), ("constrained", constrained)):
                before = copied_bytes()
                done = _complete(eng, prompt, asked, 10)
                sent[label] = copied_bytes()["h2d"] - before["h2d"]
                result[f"{label}_tokens"] = len(done.token_ids)
            result.update(h2d=sent, vocab=eng.meta.vocab_size)
        elif scenario == "copies":
            # Per decode step, in a steady state: the difference between two requests that differ
            # only in length, after a first one has warmed up (and captured) the decode step.
            _complete(eng, prompt, params, 4)
            buffers = _device_buffers(eng)
            first, short = _counted(eng, prompt, params, 6)
            second, long = _counted(eng, prompt, params, 14)
            steps = len(long.token_ids) - len(short.token_ids)
            result["per_step"] = {k: (second[k] - first[k]) / steps for k in ("h2d", "d2h")}
            result["kernels_per_step"] = {
                k: (second[k] - first[k]) / steps
                for k in ("launches", "library", "graph_launches", "blocks", "d2d")
            }
            result["buffers_kept"] = _device_buffers(eng) == buffers
            result["host_outputs"] = sorted(eng._scheduler.runner.host)
        else:
            if scenario == "penalties":
                params = SamplingParams(
                    temperature=0.7,
                    repetition_penalty=1.2,
                    presence_penalty=0.5,
                    frequency_penalty=0.3,
                    logit_bias={5: 3.0, 9: -100.0},
                    seed=2,
                )
            if scenario == "prompt-logprobs":
                params = SamplingParams(prompt_logprobs=2, logprobs=True, top_logprobs=2)
            if scenario == "greedy":
                params = SamplingParams(temperature=0.0)
            if scenario == "constrained":
                params = SamplingParams(seed=3, constraint=Constraint.grammar(_TOKEN_ZERO))
            completion = _complete(eng, prompt, params, 10)
            result["tokens"] = len(completion.token_ids)
            result["finish"] = completion.finish_reason
            if scenario == "prompt-logprobs":
                result["prompt_logprobs"] = len(completion.prompt_logprobs or [])
        stats = eng.stats()
        result["decode_steps"] = stats.decode_steps
        result["prefill_calls"] = stats.prefill_calls
        result["drafted"] = stats.drafted_tokens
        result["counters"] = {k: v - base[k] for k, v in counters().items()}
        result["failure"] = repr(eng.failure) if eng.failure else None
    return result


def _queued_at_once(eng, prompt, params, lengths) -> dict:
    """Requests of `lengths` tokens queued in one go (slots 0, 1, 2…): their token counts, and
    the row buckets and graphs the decode steps were captured in."""
    done = _at_once(eng, [prompt[: 8 + i] for i in range(len(lengths))], params, lengths)
    graphs = eng._scheduler.runner.graphs._graphs
    return {
        "buckets": sorted({key[0] for key in graphs}),
        "graphs": len(graphs),
        "tokens": [len(c.token_ids) for c in done],
    }


def _at_once(eng, prompts, params, lengths) -> list:
    """Requests of `prompts` and `lengths` tokens queued in one go (slots 0, 1, 2…), completed."""
    prepared = [
        eng.prepare(prompt, params, n, None, False, None, i)
        for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True))
    ]
    return [r.result(timeout=120) for r in eng.enqueue(prepared)]


def _forced_fallback(eng, prompt, params, together: int = 1, even: bool = False) -> dict:
    """The bytes a static chain's host fallback moves: the device computes nothing, so no slot
    flags itself; here every sampling slot is flagged (`even`: the even slots only). Requests of
    the same length (`together` at once), the second run's flagged, after a warm-up: the
    difference in bytes each way, the tokens redrawn, the penalty-count moves (a redrawn token
    that differs from the graph's) and the calls whose flagged slots were not consecutive."""
    from onnxsample.engine._fallback import FALLBACK_FLAGS

    runner, state = eng._scheduler.runner, eng._scheduler.state
    redraw, retake = runner._redraw, state.retake
    moved: list = []
    gaps = [0]

    def flagged(call, uniform, allowed, host):
        slots = [seq.slot for seq in call.sampling if not even or seq.slot % 2 == 0]
        for slot in slots:
            host[FALLBACK_FLAGS][slot] = True
        gaps[0] += bool(slots) and max(slots) - min(slots) + 1 > len(slots)
        redraw(call, uniform, allowed, host)

    def counted(moves):
        moved.extend(m for m in moves if m[1] != m[2])
        retake(moves)

    def run(n):
        return _at_once(eng, [prompt] * together, params, [n] * together)

    run(4)
    before = copied_bytes()
    run(12)
    plain = {k: v - before[k] for k, v in copied_bytes().items()}
    runner._redraw, state.retake = flagged, counted
    run(4)  # the fallback's own first run
    moved.clear()
    gaps[0] = 0
    redrawn = runner.redrawn
    before = copied_bytes()
    run(12)
    after = copied_bytes()
    return {
        "extra_bytes": {k: after[k] - before[k] - plain[k] for k in plain},
        "redrawn": runner.redrawn - redrawn,
        "moved": len(moved),
        "gaps": gaps[0],
        "vocab": eng.meta.vocab_size,
        "slots": eng.meta.max_slots,
        "penalties": state.penalties,
    }


def _kv_length(eng) -> int:
    return eng._scheduler.layout.kv.length


# The device computes nothing and reads back token 0: a grammar of token 0 (llguidance's Lark
# token reference) runs a constrained request's every step; one that refuses it fails the request.
_TOKEN_ZERO = "start: <[0]>*"


def _counted(eng, prompt, params, n):
    before = counters()
    completion = _complete(eng, prompt, params, n)
    after = counters()
    return {k: after[k] - before[k] for k in after}, completion


def _complete(eng, prompt, params, n):
    return eng.submit(prompt, params, max_new_tokens=n, chat=False).result(timeout=120)


def _device_buffers(eng) -> dict[str, object]:
    """Where the KV buffers, the penalty counts and the sampler parameters live on the device."""
    state = eng._scheduler.state
    kv = eng._scheduler.layout.kv
    found: dict[str, object] = {n: v.data_ptr() for n, v in kv.buffers.items()}
    found["counts"] = sorted(v.data_ptr() for v in (state.counts, state._spare) if v is not None)
    found.update({n: v.data_ptr() for n, v in state.static().items()})
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=("placement", "engine"))
    parser.add_argument("model")
    parser.add_argument("scenario", nargs="?")
    graphs = parser.add_mutually_exclusive_group()
    graphs.add_argument("--cuda-graph", action="store_true")
    graphs.add_argument(
        "--default-graph", action="store_true", help="leave cuda_graph to the engine"
    )
    parser.add_argument("--tokenizer")
    args = parser.parse_args()
    try:
        if args.command == "placement":
            report = placement(args.model, args.cuda_graph)
        else:
            graph = None if args.default_graph else args.cuda_graph
            report = engine(args.model, args.scenario, graph, args.tokenizer)
        report["ok"] = True
    except Exception as exc:
        report = {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "trace": traceback.format_exc(),
        }
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
