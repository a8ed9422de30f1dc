"""Top-k: keep the k largest logits of each slot (ties at the k-th value kept), as transformers'
``TopKLogitsWarper``. The k-th value comes from the candidate set, or from one more ``TopK`` with the
largest k of the batch when some k exceeds it; never a full sort."""

from onnxscript import FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._common import NEG_INF, T_BOOL, T_INT64, onnxsample


@script(onnxsample)
def TopK(z: FLOAT["S", "V"], candidates: FLOAT["S", "C"], top_k: INT64["S"]) -> FLOAT["S", 1]:
    """floor = the k-th largest z of the row (tokens with z ≥ floor are kept); −inf when k = 0 or
    k ≥ V.

    z: FLOAT["S", "V"]; candidates: FLOAT["S", "C"] (the C largest z, descending); top_k: INT64["S"]
    (0 = off) → FLOAT["S", 1].
    """
    axis = op.Constant(value_ints=[1])
    shape1 = op.Constant(value_ints=[1])
    zero_i = op.Constant(value_int=0)
    one_i = op.Constant(value_int=1)
    ninf = op.Constant(value_float=NEG_INF)
    count = op.Shape(candidates, start=1, end=2)
    k = op.Unsqueeze(top_k, axis)
    off = op.Or(op.LessOrEqual(k, zero_i), op.GreaterOrEqual(k, op.Shape(z, start=1, end=2)))
    k_on = op.Where(off, one_i, k)
    beyond = op.Cast(op.Greater(k_on, count), to=T_INT64)
    if op.Cast(op.ReduceMax(beyond, keepdims=0), to=T_BOOL):
        k_max = op.Reshape(op.ReduceMax(k_on, keepdims=0), shape1)
        values, _ = op.TopK(z, k_max, axis=1, largest=1, sorted=1)
        kth = op.GatherElements(values, op.Sub(k_on, one_i), axis=1)
    else:
        kth = op.GatherElements(candidates, op.Sub(k_on, one_i), axis=1)
    return op.Where(off, ninf, kth)
