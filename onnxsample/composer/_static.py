"""A static chain's graph, made ready for CUDA graphs with a symbolic slot dimension.

A static chain declares its slot dimension ``slots`` so that an engine binds only the rows it runs
(:mod:`onnxsample.engine._slots`). ONNX Runtime folds a ``Shape`` into a constant only when the
whole shape is known, so with a symbolic row count every size the chain reads from a
``[slots, V]`` tensor (the vocabulary, the candidates, a prefix's length) would be computed on
the host each call and copied to the device, and ONNX Runtime refuses to capture a graph with
copies in it. So the chain is inlined and those sizes folded here, with ONNX shape inference,
where the vocabulary and the candidate count are known: what is left on the host is shape
arithmetic that feeds shapes only.

Only values that are exact whatever computes them are folded: integer and boolean results, and
float data that is only moved or selected (``Pad``, ``Where``, ``Concat``…), never a float
computed by a transcendental function, whose last bit could differ from ONNX Runtime's.
"""

from __future__ import annotations

import onnx_ir as ir

_EXACT_TYPES = {
    ir.DataType.BOOL,
    ir.DataType.INT8,
    ir.DataType.INT16,
    ir.DataType.INT32,
    ir.DataType.INT64,
    ir.DataType.UINT8,
}
_MOVES = {
    "Cast",
    "Concat",
    "ConstantOfShape",
    "Expand",
    "Gather",
    "Identity",
    "Pad",
    "Reshape",
    "Slice",
    "Squeeze",
    "Unsqueeze",
    "Where",
}


def _exact(node: ir.Node) -> bool | None:
    """None (fold as the folder decides) where the result is exact; False elsewhere."""
    if node.op_type in _MOVES and node.domain in ("", "ai.onnx"):
        return None
    if all(v.dtype in _EXACT_TYPES for v in node.outputs if v.dtype is not None):
        return None
    return False


def _constant(value: ir.Value | None) -> list[int] | None:
    tensor = None if value is None else ir.convenience.get_const_tensor(value)
    return None if tensor is None else [int(v) for v in tensor.numpy().reshape(-1)]


def _passed_through(node: ir.Node) -> ir.Value | None:
    """The input that `node` returns unchanged, where the known sizes make it a no-op (which
    costs a copy or a kernel launch on every call), else None."""
    if node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None:
        return None
    if node.op_type in _NEUTRAL:
        return _logical_operand(node, _NEUTRAL[node.op_type])
    if node.op_type == "Not":  # Not(Not(x)) is x
        inner = node.inputs[0].producer()
        if inner is not None and inner.op_type == "Not" and inner.domain in ("", "ai.onnx"):
            return inner.inputs[0]
    return node.inputs[0] if _does_nothing(node) else None


# Or with false and And with true return their other operand.
_NEUTRAL = {"Or": False, "And": True}


def _logical_operand(node: ir.Node, neutral: bool) -> ir.Value | None:
    """The operand of a logical `node` whose other operand is one `neutral` value of no more
    dimensions, so that the result has the operand's shape: a ``Contained`` test folds to
    ``Or(below, false)`` when the candidates are fewer than the known vocabulary."""
    for value, other in (node.inputs, node.inputs[::-1]):
        constant = None if other is None else ir.convenience.get_const_tensor(other)
        if constant is None or constant.size != 1 or value is None or value.shape is None:
            continue
        if bool(constant.numpy().reshape(-1)[0]) is neutral and len(constant.shape) <= len(
            value.shape
        ):
            return value
    return None


def _does_nothing(node: ir.Node) -> bool:
    """A ``Pad`` by zero everywhere, or a ``Slice`` of a whole known axis from 0 with step 1: each
    copies its input on every call (a device-to-device copy on CUDA) and changes nothing. The
    chain pads and slices rows to a multiple of a block, which the known vocabulary often is."""
    if node.op_type == "Pad":
        pads = _constant(node.inputs[1] if len(node.inputs) > 1 else None)
        return pads is not None and not any(pads) and len(node.inputs) < 4
    if node.op_type != "Slice" or len(node.inputs) < 4 or node.inputs[0].shape is None:
        return False
    starts, ends, axes = (_constant(v) for v in node.inputs[1:4])
    steps = _constant(node.inputs[4]) if len(node.inputs) > 4 else None
    shape = node.inputs[0].shape
    if starts is None or ends is None or axes is None or any(starts) or len(axes) != len(ends):
        return False
    if steps is not None and any(step != 1 for step in steps):
        return False
    for axis, end in zip(axes, ends, strict=True):
        dim = shape[axis] if -len(shape) <= axis < len(shape) else None
        if not isinstance(dim, int) or end < dim:
            return False
    return True


def fold_static(model: ir.Model) -> None:
    """Fold the (inlined) static chain's sizes into constants, in place, and drop what the known
    sizes make no-ops: pads and slices that copy their input, logical ops left with a neutral
    operand (``Or(x, false)``, ``And(x, true)``) and double negations."""
    from onnxscript.optimizer import fold_constants

    fold_constants(model, onnx_shape_inference=True, should_fold=_exact)
    ends = {*model.graph.inputs, *model.graph.outputs}
    for node in list(model.graph):
        kept = _passed_through(node)
        if kept is not None and node.outputs[0] not in ends:
            ir.convenience.replace_all_uses_with(node.outputs[0], kept)
    ir.passes.common.RemoveUnusedNodesPass()(model)
    # The inference named the chain functions' dimensions after their signatures ("S", "V"),
    # which ONNX Runtime would take for one size wherever the name recurs: it infers its own.
    for node in model.graph.all_nodes():
        for value in node.outputs:
            if value not in ends:
                value.shape = None
