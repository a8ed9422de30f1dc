"""Non-finite logits, as the project's users rely on: NaN becomes −inf, +inf becomes the largest
float32, and a row left with no finite logit becomes a row that can only produce token 0.

Each function has a static twin (``...Static``) for graphs without control flow (CUDA graphs): it
always computes what the branching one computes only when some row needs it. Both return the same
numbers: the fix leaves finite logits and −inf exactly as they are.
"""

from onnxscript import BOOL, FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._batch import AnyRow
from onnxsample.graphs._common import FLT_MAX, NEG_INF, POS_INF, onnxsample
from onnxsample.graphs._rows import RowArgMax, RowMax, RowTopStatic


@script(onnxsample)
def NaNToNegInf(x: FLOAT[...]) -> FLOAT[...]:
    """x with NaN read as −inf (any shape)."""
    return op.Where(op.IsNaN(x), op.Constant(value_float=NEG_INF), x)


@script(onnxsample)
def FixNonFinite(logits: FLOAT["S", "V"]) -> FLOAT["S", "V"]:
    """−inf where logits is NaN, else min(logits, FLT_MAX). FLOAT[S, V] → FLOAT[S, V]."""
    big = op.Constant(value_float=FLT_MAX)
    return op.Min(NaNToNegInf(logits), big)


@script(onnxsample)
def Sanitize(logits: FLOAT["S", "V"]) -> tuple[FLOAT["S", "V"], FLOAT["S", 1]]:
    """x = −inf where logits is NaN, else min(logits, FLT_MAX); and the maximum of each row of x.

    logits: FLOAT[S, V] → (FLOAT[S, V] with no NaN and no +inf (−inf stays: it means "never"),
    FLOAT[S, 1]). Two reductions decide whether anything needs fixing (a NaN makes the sum NaN, a
    +inf the maximum), so finite logits pass through without a write.
    """
    pinf = op.Constant(value_float=POS_INF)
    axis = op.Constant(value_ints=[1])
    row_max = RowMax(logits)
    suspicious = op.Or(
        AnyRow(op.IsNaN(op.ReduceSum(logits, axis, keepdims=1))),
        AnyRow(op.Equal(row_max, pinf)),
    )
    if suspicious:
        out = FixNonFinite(logits)
        out_max = RowMax(out)
    else:
        out = op.Identity(logits)
        out_max = op.Identity(row_max)
    return out, out_max


@script(onnxsample)
def SanitizeStatic(
    logits: FLOAT["S", "V"],
) -> tuple[FLOAT["S", "V"], FLOAT["S", 1], INT64["S", 1]]:
    """``Sanitize`` without control flow (the maximum: :func:`RowTopStatic`), and the argmax the
    maximum is read at: the greedy token of a chain that transforms nothing. FLOAT[S, V] →
    (FLOAT[S, V], FLOAT[S, 1], INT64[S, 1])."""
    out = FixNonFinite(logits)
    top, at = RowTopStatic(out)
    return out, top, at


@script(onnxsample)
def ClampedTopStatic(
    z: FLOAT["S", "V"],
) -> tuple[FLOAT["S", "V"], FLOAT["S", 1], INT64["S", 1]]:
    """``FiniteRows``' clamp of +inf to FLT_MAX, then the clamped row's maximum and the argmax it
    is read at (:func:`RowTopStatic`). That argmax is the greedy token of ``FiniteRowsStatic``'s
    row: the clamped row itself, or for a row with no finite logit [0, −inf, …], whose argmax is
    0 as is that of a row of −inf. So the static chain's greedy token and row maximum take one
    ``ArgMax``, where they took one each.

    z: FLOAT[S, V] (no NaN) → (FLOAT[S, V], FLOAT[S, 1], INT64[S, 1]).
    """
    big = op.Constant(value_float=FLT_MAX)
    clamped = op.Min(z, big)
    top, at = RowTopStatic(clamped)
    return clamped, top, at


@script(onnxsample)
def OnlyToken0(z: FLOAT["S", "V"], finite: BOOL["S", 1]) -> FLOAT["S", "V"]:
    """z where the row has a finite maximum, else [0, −inf, …, −inf].

    z: FLOAT[S, V]; finite: BOOL[S, 1] → FLOAT[S, V].
    """
    ninf = op.Constant(value_float=NEG_INF)
    zero = op.Constant(value_floats=[0.0])
    none_before = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    after = op.Sub(op.Shape(z, start=1, end=2), one)
    # [0] padded with V − 1 × −inf: a constant where the vocabulary is known (the static chain)
    only_token0 = op.Pad(zero, op.Concat(none_before, after, axis=0), ninf)
    return op.Where(finite, z, only_token0)


@script(onnxsample)
def FiniteRows(z: FLOAT["S", "V"], row_max: FLOAT["S", 1]) -> tuple[FLOAT["S", "V"], BOOL["S"]]:
    """Clamp +inf (an overflow of a penalty or a small temperature) to FLT_MAX, then give every row a
    finite maximum: a row with no finite logit becomes [0, −inf, …, −inf], so the draw, greedy and
    every filter return token 0 for it and never compute NaN.

    z: FLOAT["S", "V"] (no NaN) → (FLOAT["S", "V"], finite: BOOL["S"], false for the rows that were replaced).
    """
    ninf = op.Constant(value_float=NEG_INF)
    pinf = op.Constant(value_float=POS_INF)
    big = op.Constant(value_float=FLT_MAX)
    axis = op.Constant(value_ints=[1])
    overflow = op.Equal(row_max, pinf)
    finite = op.Greater(row_max, ninf)
    # One pass-through when every row is finite (an If's skipped branch copies the row), not two.
    if AnyRow(op.Or(overflow, op.Not(finite))):
        if AnyRow(overflow):
            clamped = op.Min(z, big)
        else:
            clamped = op.Identity(z)
        if AnyRow(op.Not(finite)):
            out = OnlyToken0(clamped, finite)
        else:
            out = op.Identity(clamped)
    else:
        out = op.Identity(z)
    return out, op.Squeeze(finite, axis)


@script(onnxsample)
def FiniteArgMax(z: FLOAT["S", "V"], row_max: FLOAT["S", 1]) -> INT64["S"]:
    """``RowArgMax`` of ``FiniteRows``' rows, which a greedy step takes: where every row has a
    finite maximum, the argmax of z itself, so that a step copies no row for a pass-through.

    z: FLOAT["S", "V"] (no NaN); row_max: FLOAT["S", 1] → INT64["S"].
    """
    ninf = op.Constant(value_float=NEG_INF)
    pinf = op.Constant(value_float=POS_INF)
    if AnyRow(op.Or(op.Equal(row_max, pinf), op.Not(op.Greater(row_max, ninf)))):
        rows, _ = FiniteRows(z, row_max)
        token = RowArgMax(rows)
    else:
        token = RowArgMax(z)
    return token


@script(onnxsample)
def FiniteRowsStatic(
    z: FLOAT["S", "V"], row_max: FLOAT["S", 1]
) -> tuple[FLOAT["S", "V"], BOOL["S"]]:
    """``FiniteRows`` without control flow, on a row already clamped (``SanitizeStatic``'s, or
    ``ClampedTopStatic``'s: no +inf). z: FLOAT[S, V]; row_max: FLOAT[S, 1] → (FLOAT[S, V],
    BOOL[S])."""
    ninf = op.Constant(value_float=NEG_INF)
    finite = op.Greater(row_max, ninf)
    out = OnlyToken0(z, finite)
    return out, op.Squeeze(finite, op.Constant(value_ints=[1]))
