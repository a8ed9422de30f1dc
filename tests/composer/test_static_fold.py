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
    return _one_input(nodes, "x", TensorProto.FLOAT, 8)


def _one_input(nodes: list, name: str, elem: int, width: int) -> onnx.ModelProto:
    """`nodes` as a model of one input `name` [slots, width] and one output y."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(name, elem, ["slots", width])],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _folded_matches(proto: onnx.ModelProto, feeds: dict) -> list[str]:
    """The ops left by folding `proto` (checked in full), whose outputs equal the original's."""
    model = ir.from_proto(proto)
    fold_static(model)
    folded = ir.to_proto(model)
    onnx.checker.check_model(folded, full_check=True)
    expected, got = (
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feeds
        )[0]
        for m in (proto, folded)
    )
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    return [n.op_type for n in folded.graph.node]


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
    x = np.arange(24, dtype=np.float32).reshape(3, 8)
    assert (op not in _folded_matches(_model(op, *constants), {"x": x})) == dropped


def _logical_model(op: str, value: bool | None, dims: list[int], first: bool) -> onnx.ModelProto:
    """b [slots, 4] → `op`(b, constant `value` of `dims`) (the constant first if `first`), or
    Not(Not(b)) for op "Not" → Xor with b → y, so the result's values and shape both show."""
    nodes = []
    if op == "Not":
        nodes += [helper.make_node("Not", ["b"], ["n"]), helper.make_node("Not", ["n"], ["t"])]
    else:
        tensor = helper.make_tensor("c", TensorProto.BOOL, dims, [value] * int(np.prod(dims)))
        nodes.append(helper.make_node("Constant", [], ["c"], value=tensor))
        nodes.append(helper.make_node(op, ["c", "b"] if first else ["b", "c"], ["t"]))
    nodes.append(helper.make_node("Xor", ["t", "b"], ["y"]))
    return _one_input(nodes, "b", TensorProto.BOOL, 4)


@pytest.mark.parametrize(
    ("op", "value", "dims", "first", "dropped"),
    [
        ("Or", False, [1], False, True),  # a folded Contained: Or(below, false)
        ("Or", False, [1, 1], True, True),
        ("Or", True, [1], False, False),
        ("And", True, [1], False, True),
        ("And", False, [1], True, False),
        ("Or", False, [1, 1, 1], False, False),  # would add a dimension
        ("Or", False, [4], False, False),  # not one value
        ("Not", None, [], False, True),  # Not(Not(b)) is b
    ],
)
def test_a_logical_op_that_passes_its_operand_through_is_dropped(op, value, dims, first, dropped):
    b = np.array([[True, False, True, False]] * 3)
    proto = _logical_model(op, value, dims, first)
    assert (op not in _folded_matches(proto, {"b": b})) == dropped
