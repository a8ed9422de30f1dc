"""Small onnx-ir builders the graph surgery shares: named constants, one-output nodes, and the
trailing dimensions of a value's shape. Every node and value they make is named ``sampler/<name>``.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir


def const(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    """`array` as an initializer of `graph` called `name`."""
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    value.shape, value.dtype = value.const_value.shape, value.const_value.dtype
    graph.register_initializer(value)
    return value


def op(graph: ir.Graph, op_type: str, inputs, name: str, **attributes) -> ir.Value:
    """Append one `op_type` node to `graph`; its (only) output."""
    node = ir.node(op_type, inputs, attributes or None, name=f"sampler/{name}")
    node.outputs[0].name = f"sampler/{name}"
    graph.append(node)
    return node.outputs[0]


def filled_like(graph: ir.Graph, lead: ir.Value, like: ir.Value, fill, name: str) -> ir.Value:
    """A tensor of shape [*lead, *Shape(like)[1:]] and `like`'s type, every element `fill`."""
    shape = op(graph, "Concat", [lead, trailing_shape(graph, like, name)], f"{name}_size", axis=0)
    value = ir.tensor(np.array([fill], dtype=like.dtype.numpy()))
    return op(graph, "ConstantOfShape", [shape], f"{name}_fill", value=value)


def trailing_shape(graph: ir.Graph, value: ir.Value, name: str) -> ir.Value:
    """Shape(value)[1:], for building [N, *trailing] tensors around `value`."""
    return op(
        graph,
        "Slice",
        [
            op(graph, "Shape", [value], f"{name}_shape"),
            const(graph, f"sampler/{name}_from", np.array([1])),
            const(graph, f"sampler/{name}_to", np.array([2**62])),
        ],
        f"{name}_trailing",
    )


def scatter_rows(
    graph: ir.Graph, base: ir.Value, index: ir.Value, rows: ir.Value, name: str
) -> ir.Value:
    """`base` with its row ``index[i]`` replaced by ``rows[i]`` (along axis 0), any rank.

    ScatterElements with the index broadcast over each row: the CUDA provider's ScatterND prints a
    warning for every such node at every session start, ScatterElements does not.
    """
    trailing = trailing_shape(graph, rows, f"{name}_rows")
    one = const(graph, f"sampler/{name}_one", np.array([1]))
    ones = op(
        graph, "Max", [op(graph, "Min", [trailing, one], f"{name}_min1"), one], f"{name}_ones"
    )
    lead = const(graph, f"sampler/{name}_lead", np.array([-1]))
    column = op(
        graph,
        "Reshape",
        [index, op(graph, "Concat", [lead, ones], f"{name}_column_shape", axis=0)],
        f"{name}_column",
    )
    full = op(graph, "Expand", [column, op(graph, "Shape", [rows], f"{name}_full")], f"{name}_at")
    return op(graph, "ScatterElements", [base, full, rows], f"{name}_scattered", axis=0)
