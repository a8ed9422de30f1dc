"""The candidate set: the ``CANDIDATES`` largest logits of each slot, found with one ``TopK``.

Top-k, top-p and min-p each keep the tokens whose logit is at least a per-slot threshold (a
*floor*, FLOAT["S", 1]; −inf drops nothing), so the chain passes one floor along instead of masking
the vocabulary after every filter. When a slot's kept set lies inside its candidates (its floor is
above the last candidate), top-p and the draw work on the candidates alone; otherwise they fall back
to a wider candidate set and then to the whole row. Which path a slot takes depends only on that slot, never on the rest of the batch.
"""

from onnxscript import BOOL, FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._common import NEG_INF, onnxsample

CANDIDATES = 64
WIDER_CANDIDATES = 1024


@script(onnxsample)
def Candidates(z: FLOAT["S", "V"]) -> tuple[FLOAT["S", "C"], INT64["S", "C"], FLOAT["S", 1]]:
    """The C = min(``CANDIDATES``, V) largest logits, descending (ties: lowest id first), their ids,
    and the row maximum.

    z: FLOAT["S", "V"] → (FLOAT["S", "C"], INT64["S", "C"], FLOAT["S", 1]).
    """
    one = op.Constant(value_ints=[1])
    count = op.Min(op.Constant(value_ints=[CANDIDATES]), op.Shape(z, start=1, end=2))
    values, ids = op.TopK(z, count, axis=1, largest=1, sorted=1)
    return values, ids, op.ReduceMax(values, one, keepdims=1)


@script(onnxsample)
def SortedRow(z: FLOAT["S", "V"]) -> FLOAT["S", "V"]:
    """The whole row sorted descending: the static chain's one sort, from which top-k's k-th value
    and top-p's wider and exact prefixes are read (the same numbers the branching chain's fallback
    ``TopK`` calls return). z: FLOAT["S", "V"] → FLOAT["S", "V"]."""
    values, _ = op.TopK(z, op.Shape(z, start=1, end=2), axis=1, largest=1, sorted=1)
    return values


@script(onnxsample)
def Contained(
    z: FLOAT["S", "V"], candidates: FLOAT["S", "C"], floor: FLOAT["S", 1]
) -> BOOL["S", 1]:
    """Whether every token with z ≥ floor is a candidate: C = V, or the last candidate < floor.

    z: FLOAT["S", "V"]; candidates: FLOAT["S", "C"]; floor: FLOAT["S", 1] → BOOL["S", 1].
    """
    last = op.Constant(value_ints=[-1])
    everything = op.Equal(op.Shape(candidates, start=1, end=2), op.Shape(z, start=1, end=2))
    below = op.Less(op.Gather(candidates, last, axis=1), floor)
    return op.Or(below, everything)


@script(onnxsample)
def Truncate(z: FLOAT["S", "V"], floor: FLOAT["S", 1]) -> FLOAT["S", "V"]:
    """z where z ≥ floor, else −inf. z: FLOAT["S", "V"]; floor: FLOAT["S", 1] → FLOAT["S", "V"]."""
    ninf = op.Constant(value_float=NEG_INF)
    return op.Where(op.GreaterOrEqual(z, floor), z, ninf)
