"""Batch-wide conditions of the branching chain, valid on every execution provider.

The branching chain skips work no slot needs (``If`` on "does any row need this?"). The condition
counts the rows that do (``ReduceSum`` with ``keepdims=1``): zero rows count 0, where a maximum over
an empty axis is undefined (the CPU provider returns the lowest value, CUDA refuses ``keepdims=0``).
"""

from onnxscript import BOOL, script
from onnxscript import opset18 as op

from onnxsample.graphs._common import T_INT64, onnxsample


@script(onnxsample)
def AnyRow(flags: BOOL[...]) -> BOOL[...]:
    """Whether any element of `flags` is true; false for an empty tensor.

    flags: BOOL[...] → BOOL with every dimension 1 (one element: an ``If`` condition).
    """
    count = op.ReduceSum(op.Cast(flags, to=T_INT64), keepdims=1)
    return op.Greater(count, op.Constant(value_int=0))
