"""Non-finite logits, as the project's users rely on: NaN becomes −inf, +inf becomes the largest
float32, and a row left with no finite logit becomes a row that can only produce token 0."""

from onnxscript import BOOL, FLOAT, script
from onnxscript import opset18 as op

from onnxsample.graphs._common import FLT_MAX, NEG_INF, POS_INF, T_BOOL, T_INT64, onnxsample


@script(onnxsample)
def Sanitize(logits: FLOAT["S", "V"]) -> tuple[FLOAT["S", "V"], FLOAT["S", 1]]:
    """x = −inf where logits is NaN, else min(logits, FLT_MAX); and the maximum of each row of x.

    logits: FLOAT[S, V] → (FLOAT[S, V] with no NaN and no +inf (−inf stays: it means "never"),
    FLOAT[S, 1]). Two reductions decide whether anything needs fixing (a NaN makes the sum NaN, a
    +inf the maximum), so finite logits pass through without a write.
    """
    ninf = op.Constant(value_float=NEG_INF)
    pinf = op.Constant(value_float=POS_INF)
    big = op.Constant(value_float=FLT_MAX)
    axis = op.Constant(value_ints=[1])
    row_max = op.ReduceMax(logits, axis, keepdims=1)
    suspicious = op.Or(
        op.IsNaN(op.ReduceSum(logits, keepdims=0)),
        op.Equal(op.ReduceMax(row_max, keepdims=0), pinf),
    )
    if suspicious:
        out = op.Min(op.Where(op.IsNaN(logits), ninf, logits), big)
        out_max = op.ReduceMax(out, axis, keepdims=1)
    else:
        out = op.Identity(logits)
        out_max = op.Identity(row_max)
    return out, out_max


@script(onnxsample)
def RowMax(z: FLOAT["S", "V"]) -> FLOAT["S", 1]:
    """The maximum of each row. z: FLOAT[S, V] → FLOAT[S, 1]."""
    return op.ReduceMax(z, op.Constant(value_ints=[1]), keepdims=1)


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
    zero_f = op.Constant(value_float=0.0)
    zero_i = op.Constant(value_int=0)
    one_i = op.Constant(value_int=1)
    axis = op.Constant(value_ints=[1])
    if op.Equal(op.ReduceMax(row_max, keepdims=0), pinf):
        clamped = op.Min(z, big)
    else:
        clamped = op.Identity(z)
    finite = op.Greater(row_max, ninf)
    empty = op.Cast(op.Not(finite), to=T_INT64)
    if op.Cast(op.ReduceMax(empty, keepdims=0), to=T_BOOL):
        vocab = op.Squeeze(op.Shape(z, start=1, end=2))
        ids = op.Range(zero_i, vocab, one_i)
        only_token0 = op.Where(op.Equal(ids, zero_i), zero_f, ninf)
        out = op.Where(finite, clamped, only_token0)
    else:
        out = op.Identity(clamped)
    return out, op.Squeeze(finite, axis)
