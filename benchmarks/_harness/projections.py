"""The embedded SmolLM2's four projections a layer as small ONNX models: the GGUF benchmarks that
time one form of a quantised weight against another (``gguf_minimums``, ``gguf_codes``).

A model is ``layers`` layers of the four projections, weights of their own (so that a call reads
them from memory, as a decode step does), one token; each projection's leading columns feed the
next. The forms alternate within each repetition, with a pause between sessions so that one's
spinning threads do not slow the next.

Needs numpy and onnx at import time; onnxruntime comes in through :func:`workload.ort_session`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .script import RESULTS, parser
from .workload import ort_session

# (name, K, N): Q/K/V fused, O, gate/up fused, down.
PROJECTIONS = (("qkv", 576, 960), ("o", 576, 576), ("gate_up", 576, 3072), ("down", 1536, 576))
BLOCK = 32


class Graph:
    """Nodes and initializers of one benchmark model."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0
        self._shared: dict[tuple, str] = {}

    def shared(self, key: tuple, array: np.ndarray) -> str:
        """One initializer per `key`: every later call with that key gets the first one's."""
        if key not in self._shared:
            self._shared[key] = self.const(array)
        return self._shared[key]

    def const(self, array: np.ndarray) -> str:
        self._n += 1
        name = f"c{self._n}"
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs) -> list[str]:
        self._n += 1
        outs = [f"v{self._n}_{i}" for i in range(outputs)]
        domain = "com.microsoft" if op_type == "MatMulNBits" else ""
        self.nodes.append(helper.make_node(op_type, inputs, outs, domain=domain, **attrs))
        return outs

    def nbits(self, x: str, b: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None = None,
              **attrs) -> str:  # fmt: skip
        """``MatMulNBits(x, b, scales[, zeros])`` (``K``, ``N``, ``bits``, ... in `attrs`)."""
        inputs = [x, self.const(b), self.const(scales.ravel())]
        if zeros is not None:
            inputs.append(self.const(zeros))
        return self.op("MatMulNBits", inputs, **attrs)[0]

    def serialize(self, name: str, k: int, out: str, rank: int = 3, rows: int | str = 1) -> bytes:
        """The model: input ``x`` float ``[rows, 1, k]`` (``[rows, k]`` at rank 2), output `out`."""
        shape = [rows, 1, k] if rank == 3 else [rows, k]
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
            self.inits,
        )
        opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
        return helper.make_model(graph, ir_version=10, opset_imports=opsets).SerializeToString()


# (graph, x, K, N, rng) -> the projection's output
Projection = Callable[[Graph, str, int, int, np.random.Generator], str]


def layers_model(projection: Projection, layers: int, rank: int = 3, seed: int = 0) -> bytes:
    """`layers` layers of the four projections, each built by `projection`."""
    rng = np.random.default_rng(seed)
    g = Graph()
    x = "x"
    axis = g.const(np.array([-1], np.int64))
    start = g.const(np.array([0], np.int64))
    for _ in range(layers):
        for i, (_name, k, n) in enumerate(PROJECTIONS):
            y = projection(g, x, k, n, rng)
            nxt = PROJECTIONS[(i + 1) % len(PROJECTIONS)][1]  # the next projection's K
            x = g.op("Slice", [y, start, g.const(np.array([nxt], np.int64)), axis])[0]
    return g.serialize("layers", PROJECTIONS[0][1], x, rank)


def forms_parser(doc: str | None, name: str) -> argparse.ArgumentParser:
    """The command line the weight-form benchmarks share; the report goes to results/NAME.json."""
    p = parser(doc)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--calls", type=int, default=20, help="calls per repetition")
    p.add_argument("--output", default=str(RESULTS / f"{name}.json"))
    return p


class Timed(NamedTuple):
    """One form's model for :func:`time_forms`: `layers` layers, `calls` calls a repetition."""

    model: bytes
    layers: int
    calls: int
    rank: int = 3


def time_forms(forms: dict[str, Timed], threads: int, repeats: int) -> dict[str, list[float]]:
    """µs per layer of each form's model, `repeats` times: each repetition runs every form in
    turn."""
    sessions, feeds = {}, {}
    for form, timed in forms.items():
        sessions[form] = ort_session(timed.model, threads)
        shape = [1, 1, PROJECTIONS[0][1]][-timed.rank :]
        feeds[form] = {"x": np.random.default_rng(1).random(shape, dtype=np.float32)}
        for _ in range(3):
            sessions[form].run(None, feeds[form])
    times: dict[str, list[float]] = {form: [] for form in forms}
    for _ in range(repeats):
        for form, timed in forms.items():
            time.sleep(0.05)  # the previous session's threads stop spinning
            start = time.perf_counter()
            for _ in range(timed.calls):
                sessions[form].run(None, feeds[form])
            elapsed = time.perf_counter() - start
            times[form].append(elapsed / timed.calls / timed.layers * 1e6)
    return times
