"""Weight codes widened once, when composing, rather than at every load.

A GGUF export keeps 5- and 6-bit codes in their bits on disk, with a few integer ops (BitwiseAnd,
BitShift, Concat, BitwiseOr, Reshape, Add) that rebuild the 8-bit codes ``MatMulNBits`` reads
from those initializers alone (see ``onnxsample.exporters._store``). ONNX Runtime's constant
folding runs them each time a session is made: 2–3 s of Gemma 3 270M's load on two cores. The
composed model is what the engine loads, so here those ops are run once, by ONNX Runtime on the
CPU (the same kernels the folding would run: the same bytes), and their results stored in its
place; the export on disk stays small. Float ops (the fp16 scales' Casts) are left to the session:
folding them would double their bytes for little time.
"""

from __future__ import annotations

import logging

import onnx
import onnx_ir as ir
import onnx_ir.passes.common

from onnxsample.composer._cpu_session import cpu_session, data_folders

__all__ = ["fold_weight_codes"]

log = logging.getLogger(__name__)

_INTEGER_OPS = frozenset({"BitShift", "BitwiseAnd", "BitwiseOr", "Concat", "Reshape", "Add"})
_INTEGERS = frozenset({ir.DataType.UINT8, ir.DataType.INT8, ir.DataType.INT64})


def fold_weight_codes(model: ir.Model) -> int:
    """Replace each integer computation of `model`'s main graph that reads initializers alone by
    the initializer it computes; returns how many initializers were made."""
    graph = model.graph
    # the element type of each constant value; each of these ops gives its first input's
    known = {v.name: v.const_value.dtype for v in graph.initializers.values() if v.const_value}
    folded: list[ir.Node] = []
    for node in graph:
        if (
            node.op_type in _INTEGER_OPS
            and node.domain == ""
            and node.inputs
            and all(v is not None and v.name in known for v in node.inputs)
            and known[node.inputs[0].name] in _INTEGERS
        ):
            folded.append(node)
            for value in node.outputs:
                known[value.name] = known[node.inputs[0].name]
                value.dtype = value.dtype or known[value.name]
    inside = set(folded)
    results = [
        v
        for node in folded
        for v in node.outputs
        if v.is_graph_output() or any(use.node not in inside for use in v.uses())
    ]
    if not results:
        return 0
    arrays = _run(model, folded, results)
    for value, array in zip(results, arrays, strict=True):
        name = value.name
        value.name = f"{name}.computed"  # its node goes (unused); the initializer takes the name
        stored = ir.Value(name=name, const_value=ir.tensor(array, name=name))
        stored.type, stored.shape = value.type, ir.Shape(array.shape)
        graph.register_initializer(stored)
        ir.convenience.replace_all_uses_with(value, stored, replace_graph_outputs=True)
    ir.passes.common.RemoveUnusedNodesPass()(model)
    log.info("widened %d weight code arrays for the engine's load", len(results))
    return len(results)


def _run(model: ir.Model, nodes: list[ir.Node], results: list[ir.Value]) -> list:
    """The values of `results`, by an ONNX Runtime CPU session over `nodes` alone, their
    initializers read from where they are (one folder's data files, mapped, or copied in)."""
    inputs = {v.name: v for node in nodes for v in node.inputs if v.const_value is not None}
    tensors = [v.const_value for v in inputs.values()]
    folders = data_folders(tensors)
    if len(folders) > 1:
        tensors = [ir.tensor(t.numpy(), name=t.name) for t in tensors]
    proto = onnx.helper.make_model(
        onnx.helper.make_graph(
            [ir.serde.serialize_node(node) for node in nodes],
            "weight_codes",
            [],
            [onnx.helper.make_tensor_value_info(v.name, v.dtype.value, None) for v in results],
            [ir.serde.serialize_tensor(t) for t in tensors],
        ),
        opset_imports=[onnx.helper.make_opsetid("", model.opset_imports.get("", 21))],
        ir_version=10,
    )
    folder = folders.pop() if len(folders) == 1 else None
    session = cpu_session(proto.SerializeToString(), folder, optimize=False)
    return session.run([v.name for v in results], {})
