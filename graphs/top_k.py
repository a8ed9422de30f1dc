"""Top-k: keep the k largest logits of each slot (ties at the k-th value kept), as transformers'
``TopKLogitsWarper``. The k-th value comes from the candidate set, or from one more ``TopK`` with the
largest k of the batch when some k exceeds it; never a full sort. The static twin reads it from the
static chain's wider candidates (the same values: ``TopK`` returns the row's own numbers, largest
first) and flags a slot whose k reaches past them."""

from onnxscript import BOOL, FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._batch import AnyRow
from onnxsample.graphs._common import NEG_INF, onnxsample


@script(onnxsample)
def TopKOff(z: FLOAT["S", "V"], top_k: INT64["S"]) -> tuple[BOOL["S", 1], INT64["S", 1]]:
    """Which slots have top-k off (k = 0 or k ≥ V), and k where it is on (1 where off).

    z: FLOAT["S", "V"]; top_k: INT64["S"] → (BOOL["S", 1], INT64["S", 1]).
    """
    axis = op.Constant(value_ints=[1])
    zero_i = op.Constant(value_int=0)
    one_i = op.Constant(value_int=1)
    k = op.Unsqueeze(top_k, axis)
    off = op.Or(op.LessOrEqual(k, zero_i), op.GreaterOrEqual(k, op.Shape(z, start=1, end=2)))
    return off, op.Where(off, one_i, k)


@script(onnxsample)
def TopK(z: FLOAT["S", "V"], candidates: FLOAT["S", "C"], top_k: INT64["S"]) -> FLOAT["S", 1]:
    """floor = the k-th largest z of the row (tokens with z ≥ floor are kept); −inf when k = 0 or
    k ≥ V.

    z: FLOAT["S", "V"]; candidates: FLOAT["S", "C"] (the C largest z, descending); top_k: INT64["S"]
    (0 = off) → FLOAT["S", 1].
    """
    shape1 = op.Constant(value_ints=[1])
    one_i = op.Constant(value_int=1)
    ninf = op.Constant(value_float=NEG_INF)
    off, k_on = TopKOff(z, top_k)
    if AnyRow(op.Greater(k_on, op.Shape(candidates, start=1, end=2))):
        k_max = op.Reshape(op.ReduceMax(k_on, keepdims=1), shape1)
        values, _ = op.TopK(z, k_max, axis=1, largest=1, sorted=1)
        kth = op.GatherElements(values, op.Sub(k_on, one_i), axis=1)
    else:
        kth = op.GatherElements(candidates, op.Sub(k_on, one_i), axis=1)
    return op.Where(off, ninf, kth)


@script(onnxsample)
def TopKStatic(
    z: FLOAT["S", "V"], wide: FLOAT["S", "W"], top_k: INT64["S"]
) -> tuple[FLOAT["S", 1], BOOL["S", 1]]:
    """``TopK`` without control flow, from the W largest logits: the floor, and whether k > W
    (the floor is then not known here: the slot is flagged for the host's fallback). A k ≥ V
    keeps every token, as k = 0 does: the engine packs it as 0 (``pack_sampling_params``), so
    only a caller's own k ≥ V takes the host's path, where it keeps every token.

    The floor is read from the W logits between two −inf: k ≤ 0 reads the first, 1 ≤ k ≤ W reads
    the k-th largest logit, and k > W the last, which a flagged slot leaves unused.

    z: FLOAT["S", "V"]; wide: FLOAT["S", "W"] (descending); top_k: INT64["S"] → (FLOAT["S", 1],
    BOOL["S", 1]).
    """
    ninf = op.Constant(value_float=NEG_INF)
    axis = op.Constant(value_ints=[1])
    zero_i = op.Constant(value_int=0)
    one_i = op.Constant(value_int=1)
    k = op.Unsqueeze(top_k, axis)
    width = op.Squeeze(op.Shape(wide, start=1, end=2))
    between = op.Pad(wide, op.Constant(value_ints=[0, 1, 0, 1]), ninf)
    floor = op.GatherElements(between, op.Clip(k, zero_i, op.Add(width, one_i)), axis=1)
    return floor, op.Greater(k, width)
