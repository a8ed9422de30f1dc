"""Locally typical sampling, as transformers' ``TypicalLogitsWarper``."""

from onnxscript import BOOL, FLOAT, script
from onnxscript import opset18 as op

from onnxsample.graphs._batch import AnyRow
from onnxsample.graphs._common import FLT_MAX, NEG_INF, onnxsample
from onnxsample.graphs.candidates import Truncate
from onnxsample.graphs.mass import MassThreshold


@script(onnxsample)
def TypicalKey(
    z: FLOAT["S", "V"], floor: FLOAT["S", 1]
) -> tuple[FLOAT["S", "V"], FLOAT["S", "V"], FLOAT["S", "V"]]:
    """Over the kept tokens (z ≥ floor): key = −|−log p − H| (larger = more typical), p, and the
    kept logits (−inf elsewhere).

    z: FLOAT["S", "V"]; floor: FLOAT["S", 1] → (key, p, kept): FLOAT["S", "V"] each.
    """
    axis = op.Constant(value_ints=[1])
    lowest = op.Constant(value_float=-FLT_MAX)
    kept = Truncate(z, floor)
    logp = op.LogSoftmax(kept, axis=1)
    p = op.Exp(logp)
    # a dropped token's −inf · 0 would be NaN: its log p is read as −FLT_MAX, so its term is −0
    plogp = op.Mul(op.Max(logp, lowest), p)
    # H = −Σ p log p; −log p − H = −(log p − Σ p log p) exactly (a negation rounds nothing)
    sum_plogp = op.ReduceSum(plogp, axis, keepdims=1)
    key = op.Neg(op.Abs(op.Sub(logp, sum_plogp)))
    return key, p, kept


@script(onnxsample)
def TypicalP(
    z: FLOAT["S", "V"], floor: FLOAT["S", 1], typical_p: FLOAT["S"]
) -> tuple[FLOAT["S", "V"], BOOL["S", 1]]:
    """H = −Σ p log p; d = |−log p − H|; sort tokens by d ascending and keep the smallest prefix whose
    mass reaches typical_p, plus every token with the same d as the crossing one; typical_p ≥ 1 is off.

    z: FLOAT["S", "V"]; floor: FLOAT["S", 1] (tokens below it were dropped by earlier filters); typical_p: FLOAT["S"] in (0, 1] → (FLOAT["S", "V"], the slots
    where it is on BOOL["S", 1]: their kept set is not a floor, so they draw from the whole row).
    """
    axis = op.Constant(value_ints=[1])
    one_f = op.Constant(value_float=1.0)
    ninf = op.Constant(value_float=NEG_INF)
    mass = op.Unsqueeze(typical_p, axis)
    off = op.GreaterOrEqual(mass, one_f)
    if AnyRow(op.Not(off)):
        key, p, kept = TypicalKey(z, floor)
        threshold = op.Where(off, ninf, MassThreshold(key, p, mass, off))
        out = op.Where(op.GreaterOrEqual(key, threshold), kept, ninf)
    else:
        out = op.Identity(z)
    return out, op.Not(off)


@script(onnxsample)
def TypicalPStatic(typical_p: FLOAT["S"]) -> BOOL["S", 1]:
    """``TypicalP`` in the static chain: the slots it is on for (typical_p < 1), which the host
    draws. Typical-p keeps the tokens whose −log p is nearest the row's entropy, in an order no
    candidates of the largest logits hold: sorting each row by that key took 32 of a CUDA
    step's kernels, every step, typical-p or not (llama.cpp's backend sampling leaves typical-p
    to the CPU as well).

    typical_p: FLOAT["S"] in (0, 1] → BOOL["S", 1].
    """
    return op.Less(
        op.Unsqueeze(typical_p, op.Constant(value_ints=[1])), op.Constant(value_float=1.0)
    )
