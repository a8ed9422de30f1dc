"""Exact "smallest prefix reaching a mass" thresholds over an arbitrary sort key (typical-p).

Sort the tokens by a key (descending), accumulate their probabilities in that order, and find the
first position m whose cumulative mass reaches the target (the crossing token is kept). Every token
whose key is ≥ the key at m is kept, so tied tokens are kept together and the result does not depend
on how a sort orders ties.

The common case never sorts the vocabulary: the first ``CANDIDATES`` keys come from one ``TopK``; only
when some slot's candidates do not reach its mass does the function sort every token. Both paths
compute the same prefix sums over the same order, so the kept set is the same whichever ran.
"""

from onnxscript import BOOL, FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._batch import AnyRow
from onnxsample.graphs._common import T_DOUBLE, T_FLOAT, T_INT64, onnxsample
from onnxsample.graphs._rows import RunningSum
from onnxsample.graphs.candidates import CANDIDATES


@script(onnxsample)
def PrefixFromSorted(
    sorted_key: FLOAT["S", "N"], order: INT64["S", "N"], p: FLOAT["S", "V"], mass: FLOAT["S", 1]
) -> tuple[FLOAT["S", 1], FLOAT["S", 1]]:
    """Over the N largest keys (`sorted_key`, descending, and their ids `order`): c = running sum
    (:func:`RunningSum`) of p in that order (float64, compared in float32), m = #{c < mass}
    clamped to the last, threshold = key at m; and the mass of all N (c at the last), which
    reaches the target or not.

    sorted_key: FLOAT["S", "N"]; order: INT64["S", "N"]; p: FLOAT["S", "V"]; mass: FLOAT["S", 1]
    → (FLOAT["S", 1], FLOAT["S", 1]).
    """
    axis = op.Constant(value_ints=[1])
    one = op.Constant(value_ints=[1])
    n = op.Shape(sorted_key, start=1, end=2)
    gathered = op.Cast(op.GatherElements(p, order, axis=1), to=T_DOUBLE)
    cum = op.Cast(RunningSum(gathered), to=T_FLOAT)
    below = op.ReduceSum(op.Cast(op.Less(cum, mass), to=T_INT64), axis, keepdims=1)
    last = op.Sub(n, one)
    threshold = op.GatherElements(sorted_key, op.Min(below, last), axis=1)
    return threshold, op.Gather(cum, last, axis=1)


@script(onnxsample)
def PrefixThreshold(
    key: FLOAT["S", "V"], p: FLOAT["S", "V"], mass: FLOAT["S", 1], k: INT64[1]
) -> tuple[FLOAT["S", 1], FLOAT["S", 1]]:
    """:func:`PrefixFromSorted` over the min(k, V) largest keys, from one ``TopK``.

    key, p: FLOAT["S", "V"]; mass: FLOAT["S", 1]; k: INT64[1] → (FLOAT["S", 1], FLOAT["S", 1]).
    """
    n = op.Min(k, op.Shape(key, start=1, end=2))
    sorted_key, order = op.TopK(key, n, axis=1, largest=1, sorted=1)
    threshold, reached_mass = PrefixFromSorted(sorted_key, order, p, mass)
    return threshold, reached_mass


@script(onnxsample)
def MassThreshold(
    key: FLOAT["S", "V"], p: FLOAT["S", "V"], mass: FLOAT["S", 1], off: BOOL["S", 1]
) -> FLOAT["S", 1]:
    """Exact prefix threshold of every slot: the ``CANDIDATES`` largest keys when they reach the mass
    of every slot that is on, else a sort of the whole row.

    key, p: FLOAT["S", "V"]; mass: FLOAT["S", 1]; off: BOOL["S", 1] (slots whose result is ignored).
    """
    candidates = op.Constant(value_ints=[CANDIDATES])
    vocab = op.Shape(key, start=1, end=2)
    threshold, reached_mass = PrefixThreshold(key, p, mass, candidates)
    if AnyRow(op.Not(op.Or(op.GreaterOrEqual(reached_mass, mass), off))):
        exact, _ = PrefixThreshold(key, p, mass, vocab)
        result = op.Identity(exact)
    else:
        result = op.Identity(threshold)
    return result
