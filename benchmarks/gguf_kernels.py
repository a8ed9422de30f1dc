"""llama.cpp's own dot products inside ONNX Runtime against MatMulNBits, on the same GGUF export.

    python benchmarks/gguf_kernels.py [--models llama256:Q4_K_M,smollm2:Q4_K_M] [--threads 1,2]

Is a kernel that reads GGUF blocks as the file stores them (no fp32 scale and block sum per block,
no separate minimums' correction) what a batch-1 decode step lacks? To answer by measurement,
``native/ggml_matmul.cc`` is an ONNX Runtime custom op, ``GgmlMatMul``, that multiplies by a
GGUF tensor's raw rows with ggml's own ``from_float`` and ``vec_dot`` (llama.cpp's CPU kernels
for weights it has not repacked), split over ONNX Runtime's intra-op threads. It is built here
with g++ against the llama.cpp build's ``libggml-cpu`` (``make llama-cpp``) and ONNX Runtime's
C++ headers (Debian's ``libonnxruntime-dev``, fetched once; the C API is stable across versions).

Each model's export (``onnxsample export FILE``, as ``gguf_files.py`` makes it) is rewritten: every
``MatMulNBits`` with its minimums' correction (``/BlockSum``, ``/MinsMatMul``, ``/AddMins``)
becomes a ``GgmlMatMul`` per GGUF tensor (a Concat where the export fused several: Q, K and V,
gate and up), Q and K rows reordered as the exporter reorders them. Then one decode step of each
(one token over 256 past positions, the plain model, no sampler), sessions alternating, timed;
and ONNX Runtime's profiler splits a step into the linear layers (MatMulNBits and the minimums,
or GgmlMatMul), the LM head and the rest. The logits of a 16-token prompt are compared (both
compute with int8 activations, quantised differently). Output: JSON on stdout and ``--output``.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from _harness.machine import emit, load_average, run_record
from _harness.script import RESULTS, ROOT, ints, logger, parser
from gguf_models import built_llama_cpp, gguf_path

log = logger("gguf_kernels")
CACHE = ROOT / "artifacts" / "ggml-op"
_DEB = "pool/main/o/onnxruntime/libonnxruntime-dev_1.23.2+dfsg-6.1_amd64.deb"
_PARTS = {
    "qkv_proj": ("attn_q", "attn_k", "attn_v"),
    "o_proj": ("attn_output",),
    "gate_up_proj": ("ffn_gate", "ffn_up"),
    "down_proj": ("ffn_down",),
}


def _headers() -> Path:
    """ONNX Runtime's C/C++ API headers from Debian's package, extracted once."""
    include = CACHE / "ort-include"
    if (include / "onnxruntime_cxx_api.h").is_file():
        return include
    with tempfile.TemporaryDirectory() as tmp:
        deb = Path(tmp) / "dev.deb"
        log(f"fetching {_DEB}")
        urllib.request.urlretrieve(f"http://deb.debian.org/debian/{_DEB}", deb)
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
        shutil.copytree(Path(tmp) / "usr/include/onnxruntime", include, dirs_exist_ok=True)
    return include


def _library() -> Path:
    """native/ggml_matmul.cc built against the llama.cpp build's ggml (made again when newer)."""
    built = built_llama_cpp()
    source = Path(__file__).parent / "native" / "ggml_matmul.cc"
    out = CACHE / "libonnxsample_ggml.so"
    if out.is_file() and out.stat().st_mtime >= source.stat().st_mtime:
        return out
    cmd = ["g++", "-O2", "-std=c++17", "-shared", "-fPIC", str(source), "-o", str(out)]
    cmd += ["-I", str(_headers()), "-I", str(built.src / "ggml" / "include")]
    cmd += ["-L", str(built.bin), "-lggml-cpu", "-lggml-base", f"-Wl,-rpath,{built.bin}"]
    subprocess.run(cmd, check=True)
    return out


def _unpermute(rows: int, heads: int) -> np.ndarray:
    return np.arange(rows).reshape(heads, -1, 2).transpose(0, 2, 1).reshape(-1)


def _part_tensors(names: list[str], rows: list[int], widths: list[int], part: int) -> list[str]:
    """The GGUF tensors (`names`, of `rows` output rows each) behind part `part` of a projection
    the export made of parts (``{proj}.{i}``, `widths` their output widths): runs of consecutive
    tensors whose blocks stack, as Q4_K queries and keys beside a Q6_K value."""
    start, starts = sum(widths[:part]), itertools.accumulate([0, *rows[:-1]])
    return [n for n, s in zip(names, starts, strict=True) if start <= s < start + widths[part]]


def _rewritten(folder: Path, gguf_file: Path, out: Path) -> Path:
    """`folder`'s export with each linear layer a GgmlMatMul over the GGUF's own rows (made again
    when the export is newer)."""
    import gguf
    import onnx_ir as ir
    import onnx_ir.passes.common

    made = out / "model.onnx"
    if made.is_file() and made.stat().st_mtime >= (folder / "model.onnx").stat().st_mtime:
        return out
    reader = gguf.GGUFReader(gguf_file)
    tensors = {t.name: t for t in reader.tensors}
    config = json.loads((folder / "config.json").read_text())
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    permuted = config.get("model_type") == "llama"

    def rows(name: str) -> tuple[np.ndarray, int]:
        t = tensors[name]
        data = np.asarray(t.data)
        data = data.view(np.uint8).reshape(data.shape[0], -1)
        part = name.split(".")[-2]
        if permuted and part in heads:
            data = data[_unpermute(data.shape[0], heads[part])]
        return np.ascontiguousarray(data), int(t.tensor_type)

    model = ir.load(folder / "model.onnx")
    graph = model.graph
    nodes = {n.name: n for n in graph}
    weights: dict[str, ir.Value] = {}
    for node in [n for n in graph if n.op_type == "MatMulNBits"]:
        prefix = node.name.removesuffix("/MatMulNBits")
        if prefix == "lm_head":
            names = ["output.weight" if "output.weight" in tensors else "token_embd.weight"]
        else:
            layer, proj, part = re.fullmatch(r"layers\.(\d+)\.(\w+?)(?:\.(\d+))?", prefix).groups()
            names = [f"blk.{layer}.{p}.weight" for p in _PARTS[proj]]
            if part is not None:
                stem = prefix.rsplit(".", 1)[0]
                widths = [n.attributes["N"].as_int() for n in graph
                          if re.fullmatch(rf"{re.escape(stem)}\.\d+/MatMulNBits", n.name)]  # fmt: skip
                sizes = [int(tensors[n].shape[1]) for n in names]
                names = _part_tensors(names, sizes, widths, int(part))
        final = nodes.get(f"{prefix}/AddMins", node).outputs[0]
        made, outs = [], []
        for i, name in enumerate(names):
            if name not in weights:
                data, kind = rows(name)
                weights[name] = ir.Value(name=f"ggml/{name}", const_value=ir.tensor(data))
                weights[name].meta["ggml_type"] = kind
                graph.register_initializer(weights[name])
            w = weights[name]
            made.append(
                ir.node(
                    "GgmlMatMul", [node.inputs[0], w], {"ggml_type": w.meta["ggml_type"]},
                    domain="onnxsample.ggml", name=f"{prefix}/GgmlMatMul{i}",
                )
            )  # fmt: skip
            outs.append(made[-1].outputs[0])
        if len(outs) > 1:
            made.append(ir.node("Concat", outs, {"axis": -1}, name=f"{prefix}/GgmlConcat"))
        graph.insert_before(node, made)
        product, name = made[-1].outputs[0], final.name
        ir.convenience.replace_all_uses_with(final, product, replace_graph_outputs=True)
        final.name, product.name = f"{name}/replaced", name  # "logits" stays the output's name
    ir.passes.common.RemoveUnusedNodesPass()(model)
    model.opset_imports["onnxsample.ggml"] = 1
    out.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if not f.name.startswith("model.onnx"):
            shutil.copy(f, out / f.name)
    ir.save(model, out / "model.onnx", external_data="model.onnx.data")
    return out


def _session(folder: Path, threads: int, library: Path, profile: str | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    options.register_custom_ops_library(str(library))
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = profile
    return ort.InferenceSession(
        str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )


def _feed(session, ids: list[int], past: int) -> dict:
    feed = {
        "input_ids": np.array([ids], np.int64),
        "attention_mask": np.ones((1, past + len(ids)), np.int64),
    }
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            feed[i.name] = np.zeros((1, i.shape[1], past, i.shape[3]), np.float32)
    return feed


def _step_ms(session, calls: int) -> float:
    feed = _feed(session, [42], 256)
    for _ in range(5):
        session.run(["logits"], feed)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        session.run(["logits"], feed)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _split(folder: Path, threads: int, library: Path, calls: int = 32) -> dict:
    """ms per step in the linear layers, the LM head and the rest (ONNX Runtime's profiler)."""
    session = _session(folder, threads, library, str(RESULTS / "gguf-kernels-profile"))
    feed = _feed(session, [42], 256)
    for _ in range(calls):
        session.run(["logits"], feed)
    trace = Path(session.end_profiling())
    parts = {"linear": 0.0, "lm_head": 0.0, "rest": 0.0}
    linear = ("/MatMulNBits", "/GgmlMatMul", "/GgmlConcat", "/BlockSum/", "/MinsMatMul", "/AddMins")
    for e in json.loads(trace.read_text()):
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        part = "lm_head" if name.startswith("lm_head") else "rest"
        if part == "rest" and any(k in name for k in linear):
            part = "linear"
        parts[part] += e["dur"] / 1e3 / calls
    trace.unlink(missing_ok=True)
    return {k: round(v, 3) for k, v in parts.items()}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--models", default="llama256:Q4_K_M,smollm2:Q4_K_M")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--output", default=str(RESULTS / "gguf_kernels.json"))
    args = p.parse_args()
    from gguf_files import _ours

    library = _library()
    load_before = load_average()
    report = {"run": None, "models": {}}
    for name in args.models.split(","):
        path = gguf_path(name)
        label = path.stem
        folder, _ = _ours(path, label)
        ggml = _rewritten(folder, path, CACHE / f"export-{label}")
        forms = {"matmulnbits": folder, "ggml": ggml}
        a, b = (_session(f, 1, library) for f in forms.values())
        prompt = _feed(a, list(range(100, 116)), 0)
        la, lb = a.run(["logits"], prompt)[0][0], b.run(["logits"], prompt)[0][0]
        entry = {
            "gguf": path.name,
            "logits_max_abs_diff": round(float(np.abs(la - lb).max()), 4),
            "logits_max_abs": round(float(np.abs(la).max()), 4),
            "same_greedy_tokens": float((la.argmax(-1) == lb.argmax(-1)).mean()),
            "cells": [],
        }
        for threads in ints(args.threads, "threads"):
            sessions = {k: _session(f, threads, library) for k, f in forms.items()}
            steps = {k: [] for k in forms}
            for r in range(args.repeats):
                for k in list(forms)[:: 1 if r % 2 == 0 else -1]:
                    steps[k].append(_step_ms(sessions[k], args.calls))
            del sessions
            cell = {"threads": threads}
            for k, f in forms.items():
                cell[k] = {
                    "step_ms": round(statistics.median(steps[k]), 3),
                    "step_ms_all": [round(s, 3) for s in steps[k]],
                    "profile_ms": _split(f, threads, library),
                }
            cell["ggml_over_matmulnbits"] = round(
                cell["ggml"]["step_ms"] / cell["matmulnbits"]["step_ms"], 3
            )
            log(f"{label} t={threads}: {cell}")
            entry["cells"].append(cell)
        report["models"][label] = entry
    report["run"] = run_record(load_before, "onnxruntime", "onnxsample")
    emit(report, args.output, "gguf_kernels")


if __name__ == "__main__":
    main()
