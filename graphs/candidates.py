"""The candidate set: the ``CANDIDATES`` largest logits of each slot, found with one ``TopK``.

Top-k, top-p and min-p each keep the tokens whose logit is at least a per-slot threshold (a
*floor*, FLOAT["S", 1]; −inf drops nothing), so the chain passes one floor along instead of masking
the vocabulary after every filter. When a slot's kept set lies inside its candidates (its floor is
above the last candidate), top-p and the draw work on the candidates alone; otherwise they fall back
to a wider candidate set and then to the whole row. Which path a slot takes depends only on that slot, never on the rest of the batch.

The static chain (CUDA graphs) sorts no whole row: it takes the ``STATIC_CANDIDATES`` largest from
one ``TopK`` (ONNX Runtime's CUDA ``TopK`` selects up to 4096 in one launch for every row, and sorts
row by row past that), the branching chain's ``CANDIDATES`` being their leading columns. A slot
whose top-k, top-p or typical-p set reaches past them is *flagged*, and the engine draws its token
on the host with the branching chain (``sampler.fallback``).
"""

from onnxscript import BOOL, FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._common import NEG_INF, onnxsample

CANDIDATES = 64
WIDER_CANDIDATES = 1024
# ONNX Runtime's CUDA TopK selects up to 4096 values of every row in one launch. The embedded 135M
# model's nucleus at temperature 1 passes 1024 tokens for 5.6% of its tokens at top_p 0.95 and 35%
# at 0.99, 4096 for 0.3% and 7.6% (benchmarks/results/static_fallback.json).
STATIC_CANDIDATES = 4096


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
def CandidatesStatic(
    z: FLOAT["S", "V"],
) -> tuple[FLOAT["S", "C"], INT64["S", "C"], FLOAT["S", 1], FLOAT["S", "W"]]:
    """``Candidates`` and the W = min(``STATIC_CANDIDATES``, V) largest logits from one ``TopK``:
    the C leading columns are ``Candidates``' numbers (``TopK`` orders ties by id either way), the
    maximum is the first.

    z: FLOAT["S", "V"] → (FLOAT["S", "C"], INT64["S", "C"], FLOAT["S", 1], FLOAT["S", "W"]).
    """
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    vocab = op.Shape(z, start=1, end=2)
    width = op.Min(op.Constant(value_ints=[STATIC_CANDIDATES]), vocab)
    count = op.Min(op.Constant(value_ints=[CANDIDATES]), vocab)
    wide, wide_ids = op.TopK(z, width, axis=1, largest=1, sorted=1)
    values = op.Slice(wide, zero, count, one)
    ids = op.Slice(wide_ids, zero, count, one)
    return values, ids, op.Slice(wide, zero, one, one), wide


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
