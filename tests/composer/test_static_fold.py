"""The static chain's folding (onnxsample/composer/_static.py) drops the pads and slices that known
sizes make no-ops, each of which ONNX Runtime runs as a copy on every call, and keeps every other."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxsample.composer._static import fold_static

BIG = np.iinfo(np.int64).max


def _model(op: str, *constants: list[int]) -> onnx.ModelProto:
    """x [slots, 8] → `op`(x, *constants) → Neg → y."""
    nodes, names = [], []
    for i, values in enumerate(constants):
        name = f"c{i}"
        tensor = helper.make_tensor(name, TensorProto.INT64, [len(values)], values)
        nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        names.append(name)
    nodes += [helper.make_node(op, ["x", *names], ["t"]), helper.make_node("Neg", ["t"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["slots", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


@pytest.mark.parametrize(
    ("op", "constants", "dropped"),
    [
        ("Pad", [[0, 0, 0, 0]], True),
        ("Pad", [[0, 0, 0, 8]], False),
        ("Slice", [[0], [8], [1]], True),  # the whole known axis
        ("Slice", [[0], [BIG], [1]], True),
        ("Slice", [[0], [8], [-1]], True),
        ("Slice", [[0], [4], [1]], False),
        ("Slice", [[1], [8], [1]], False),
        ("Slice", [[0], [8], [1], [2]], False),  # every other value
        ("Slice", [[0], [8], [0]], False),  # the slot axis: its size is not known
    ],
)
def test_a_no_op_pad_or_slice_is_dropped_and_nothing_else(op, constants, dropped):
    proto = _model(op, *constants)
    model = ir.from_proto(proto)
    fold_static(model)
    folded = ir.to_proto(model)
    onnx.checker.check_model(folded, full_check=True)
    assert (op not in [n.op_type for n in folded.graph.node]) == dropped
    x = np.arange(24, dtype=np.float32).reshape(3, 8)
    expected, got = (
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": x}
        )[0]
        for m in (proto, folded)
    )
    np.testing.assert_array_equal(got, expected)
