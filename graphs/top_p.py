"""Top-p (nucleus), exact over every token the earlier filters left."""

from onnxscript import BOOL, DOUBLE, FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._batch import AnyRow
from onnxsample.graphs._common import T_DOUBLE, T_FLOAT, T_INT64, onnxsample
from onnxsample.graphs._rows import RunningSum
from onnxsample.graphs.candidates import (
    WIDER_CANDIDATES,
    Contained,
    ContainedIn,
    FallsShort,
    KeptWeights,
)


@script(onnxsample)
def MassWeights(z: FLOAT["S", "N"], top: FLOAT["S", 1], floor: FLOAT["S", 1]) -> DOUBLE["S", "N"]:
    """w = [z ≥ floor] · exp(z − top), computed in float32 and held in float64.

    z: FLOAT["S", "N"]; top, floor: FLOAT["S", 1] → DOUBLE["S", "N"].
    """
    return op.Cast(KeptWeights(z, op.Exp(op.Sub(z, top)), floor), to=T_DOUBLE)


@script(onnxsample)
def NucleusMass(
    sorted_z: FLOAT["S", "N"], top: FLOAT["S", 1], floor: FLOAT["S", 1], total: DOUBLE["S", 1]
) -> DOUBLE["S", "N"]:
    """p = [z ≥ floor] · exp(z − top) / total in float64 (``MassWeights``), over the N logits
    ``sorted_z``.

    sorted_z: FLOAT["S", "N"]; top, floor: FLOAT["S", 1]; total: DOUBLE["S", 1] → DOUBLE["S", "N"].
    """
    return op.Div(MassWeights(sorted_z, top, floor), total)


@script(onnxsample)
def NucleusCut(
    sorted_z: FLOAT["S", "N"], cum: DOUBLE["S", "N"], mass: FLOAT["S", 1]
) -> tuple[FLOAT["S", 1], FLOAT["S", 1]]:
    """c = `cum` (the running sum of ``NucleusMass``, accumulated in float64) compared in float32;
    m = #{c < mass} clamped to N − 1. Returns (the logit at m, c[N − 1]).

    A token is kept when the mass before it is < mass, i.e. the prefix up to the first position
    where c reaches the mass; every token whose logit equals that of position m is kept with it.
    Accumulating in float64 keeps the boundary exact over 10^5 tokens (a float32 running sum drifts
    by ~10^-4 there, which moves a top_p = 0.999 boundary by dozens of tokens).

    sorted_z: FLOAT["S", "N"] (descending); cum: DOUBLE["S", "N"]; mass: FLOAT["S", 1] →
    (FLOAT["S", 1], FLOAT["S", 1]).
    """
    axis = op.Constant(value_ints=[1])
    last = op.Constant(value_ints=[-1])
    one = op.Constant(value_ints=[1])
    c = op.Cast(cum, to=T_FLOAT)
    below = op.ReduceSum(op.Cast(op.Less(c, mass), to=T_INT64), axis, keepdims=1)
    end = op.Sub(op.Shape(sorted_z, start=1, end=2), one)
    return op.GatherElements(sorted_z, op.Min(below, end), axis=1), op.Gather(c, last, axis=1)


@script(onnxsample)
def NucleusFloor(
    sorted_z: FLOAT["S", "N"],
    top: FLOAT["S", 1],
    floor: FLOAT["S", 1],
    total: DOUBLE["S", 1],
    mass: FLOAT["S", 1],
) -> tuple[FLOAT["S", 1], FLOAT["S", 1]]:
    """``NucleusCut`` over the candidates (N ≤ ``SCAN_BLOCK``): the running sum is ``CumSum``'s,
    the same numbers as the leading ones of :func:`RunningSum` over a longer row."""
    p = NucleusMass(sorted_z, top, floor, total)
    threshold, reached = NucleusCut(sorted_z, op.CumSum(p, op.Constant(value_int=1)), mass)
    return threshold, reached


@script(onnxsample)
def NucleusFloorLong(
    sorted_z: FLOAT["S", "N"],
    top: FLOAT["S", 1],
    floor: FLOAT["S", 1],
    total: DOUBLE["S", 1],
    mass: FLOAT["S", 1],
) -> tuple[FLOAT["S", 1], FLOAT["S", 1]]:
    """``NucleusCut`` over a longer row (the ``WIDER_CANDIDATES``, the whole sorted row): the running
    sum is :func:`RunningSum`'s, linear on every provider (CUDA's ``CumSum`` is quadratic)."""
    p = NucleusMass(sorted_z, top, floor, total)
    threshold, reached = NucleusCut(sorted_z, RunningSum(p), mass)
    return threshold, reached


@script(onnxsample)
def MassTotal(z: FLOAT["S", "N"], top: FLOAT["S", 1], floor: FLOAT["S", 1]) -> DOUBLE["S", 1]:
    """Σ exp(z − top) over z ≥ floor, in float64: the normaliser of what the earlier filters left,
    over the candidates (exact when the kept set lies inside them) or over the whole row.

    z: FLOAT["S", "N"]; top, floor: FLOAT["S", 1] → DOUBLE["S", 1].
    """
    return op.ReduceSum(MassWeights(z, top, floor), op.Constant(value_ints=[1]), keepdims=1)


@script(onnxsample)
def TopP(
    z: FLOAT["S", "V"],
    candidates: FLOAT["S", "C"],
    top: FLOAT["S", 1],
    floor: FLOAT["S", 1],
    top_p: FLOAT["S"],
) -> FLOAT["S", 1]:
    """p = softmax over the tokens with z ≥ floor; keep the smallest descending prefix whose mass
    ≥ top_p: a token is kept when the mass before it is < top_p (the crossing token is kept, and the
    tokens tied with it). top_p ≥ 1 is off. Exact over every surviving token:

    - the normaliser is summed (in float64) over the candidates when the kept set lies inside
      them, else over the whole row;
    - the prefix mass is summed in descending order (accumulated in float64, compared in float32), over the
      candidates when they reach top_p, else over the ``WIDER_CANDIDATES`` largest, else over the
      whole row sorted (the leading prefix sums are the same numbers on every path, so the kept set
      does not depend on the path).

    z: FLOAT["S", "V"]; candidates: FLOAT["S", "C"]; top: FLOAT["S", 1] (row maximum); floor: FLOAT["S", 1]
    (what the earlier filters left); top_p: FLOAT["S"] in (0, 1] → the new floor FLOAT["S", 1].
    """
    axis = op.Constant(value_ints=[1])
    one_f = op.Constant(value_float=1.0)
    mass = op.Unsqueeze(top_p, axis)
    off = op.GreaterOrEqual(mass, one_f)
    if AnyRow(op.Not(off)):
        inside = Contained(z, candidates, floor)
        candidate_total = MassTotal(candidates, top, floor)
        if AnyRow(op.Not(op.Or(inside, off))):
            total = op.Where(inside, candidate_total, MassTotal(z, top, floor))
        else:
            total = op.Identity(candidate_total)
        nucleus, reached_mass = NucleusFloor(candidates, top, floor, total, mass)
        missed = op.Not(op.Or(op.GreaterOrEqual(reached_mass, mass), off))
        if AnyRow(missed):
            vocab = op.Shape(z, start=1, end=2)
            wider = op.Min(op.Constant(value_ints=[WIDER_CANDIDATES]), vocab)
            wide_z, _ = op.TopK(z, wider, axis=1, largest=1, sorted=1)
            wide, wide_mass = NucleusFloorLong(wide_z, top, floor, total, mass)
            still = op.Not(op.Or(op.GreaterOrEqual(wide_mass, mass), off))
            if AnyRow(still):
                sorted_z, _ = op.TopK(z, vocab, axis=1, largest=1, sorted=1)
                exact, _ = NucleusFloorLong(sorted_z, top, floor, total, mass)
                beyond = op.Where(still, exact, wide)
            else:
                beyond = op.Identity(wide)
            threshold = op.Where(missed, beyond, nucleus)
        else:
            threshold = op.Identity(nucleus)
        out = op.Where(off, floor, op.Max(floor, threshold))
    else:
        out = op.Identity(floor)
    return out


@script(onnxsample)
def TopPStatic(
    z: FLOAT["S", "V"],
    candidates: FLOAT["S", "C"],
    wide: FLOAT["S", "W"],
    wide_ids: INT64["S", "W"],
    exp_row: FLOAT["S", "V"],
    floor: FLOAT["S", 1],
    top_p: FLOAT["S"],
) -> tuple[FLOAT["S", 1], BOOL["S", 1]]:
    """``TopP`` without control flow or a sort of the row: the normaliser as ``TopP`` sums it (over
    the candidates, or one pass over the whole row), the prefix over the W = ``STATIC_CANDIDATES``
    largest (``RunningSum``: the leading prefix sums of every path of ``TopP``, so the same floor
    wherever the crossing lies among them), and a flag for the slots whose nucleus reaches past
    them (their floor is then not known here: the host's fallback).

    The weights are computed once, over the row, by the chain (`exp_row` = exp(z − max z), which
    the draw reads too): ``MassWeights``' numbers, and those of the W largest are gathered from
    them (an exp is the same number wherever its argument stands).

    z: FLOAT["S", "V"]; candidates: FLOAT["S", "C"]; wide: FLOAT["S", "W"] (descending) and
    wide_ids: INT64["S", "W"]; exp_row: FLOAT["S", "V"]; floor: FLOAT["S", 1]; top_p: FLOAT["S"]
    → (FLOAT["S", 1], BOOL["S", 1]).
    """
    axis = op.Constant(value_ints=[1])
    zero = op.Constant(value_ints=[0])
    one_f = op.Constant(value_float=1.0)
    mass = op.Unsqueeze(top_p, axis)
    off = op.GreaterOrEqual(mass, one_f)
    count = op.Shape(candidates, start=1, end=2)
    inside = ContainedIn(z, wide, count, floor)  # the candidates lead `wide`
    row_weights = op.Cast(KeptWeights(z, exp_row, floor), to=T_DOUBLE)  # MassWeights
    # the candidates are the leading columns of `wide`: their weights are the leading weights
    weights = op.GatherElements(row_weights, wide_ids, axis=1)
    candidate_total = op.ReduceSum(op.Slice(weights, zero, count, axis), axis, keepdims=1)
    row_total = op.ReduceSum(row_weights, axis, keepdims=1)  # MassTotal(z, top, floor)
    total = op.Where(inside, candidate_total, row_total)
    nucleus, reached_mass = NucleusCut(wide, RunningSum(op.Div(weights, total)), mass)
    beyond = FallsShort(reached_mass, mass, off)
    return op.Where(off, floor, op.Max(floor, nucleus)), beyond
