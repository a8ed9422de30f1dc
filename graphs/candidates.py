"""The candidate set: the ``CANDIDATES`` largest logits of each slot, found with one ``TopK``.

Top-k, top-p and min-p each keep the tokens whose logit is at least a per-slot threshold (a
*floor*, FLOAT["S", 1]; −inf drops nothing), so the chain passes one floor along instead of masking
the vocabulary after every filter. When a slot's kept set lies inside its candidates (its floor is
above the last candidate), top-p and the draw work on the candidates alone; otherwise they fall back
to a wider candidate set and then to the whole row. Which path a slot takes depends only on that slot, never on the rest of the batch.

The static chain (CUDA graphs) sorts no whole row: it takes the ``STATIC_CANDIDATES`` largest with
:func:`TopKSliced` (ONNX Runtime's CUDA ``TopK`` selects up to 4096 in one launch for every row,
and sorts row by row past that; over slices of the row, many blocks share it), the branching
chain's ``CANDIDATES`` being their leading columns. A slot
whose top-k or top-p set reaches past them, or that asks for typical-p (whose set no candidates of
the largest logits hold), is *flagged*, and the engine draws its token on the host with the
branching chain (``sampler.fallback``).
"""

from onnxscript import BOOL, FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._batch import AnyRow
from onnxsample.graphs._common import GREEDY_BELOW, NEG_INF, onnxsample


@script(onnxsample)
def TopKSliced(
    x: FLOAT["S", "V"], k: INT64[1], width: INT64[1]
) -> tuple[FLOAT["S", "K"], INT64["S", "K"]]:
    """The K = min(k, V) largest values of each row and their ids, descending, ties lowest id
    first: ``TopK``'s, in two ``TopK``s. First the K largest of every slice of `width` ids (the
    row padded with −inf to a multiple of `width`, k ≤ width), then the K largest of those: each
    of the row's K largest is among its slice's, and the slices' candidates stand in id order,
    so ties keep their order. The padding never comes back (V real ids tie with it or beat it,
    and stand before it).

    x: FLOAT["S", "V"]; k, width: INT64[1] → (FLOAT["S", "K"], INT64["S", "K"]).
    """
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    any_rows = op.Constant(value_ints=[-1])  # every other size is known: constants when folded
    ninf = op.Constant(value_float=NEG_INF)
    vocab = op.Shape(x, start=1, end=2)
    count = op.Min(k, vocab)
    slices = op.Div(op.Sub(op.Add(vocab, width), one), width)
    pad = op.Sub(op.Mul(slices, width), vocab)
    padded = op.Pad(x, op.Concat(zero, zero, zero, pad, axis=0), ninf)
    part, part_ids = op.TopK(
        op.Reshape(padded, op.Concat(any_rows, width, axis=0)), count, axis=1, largest=1, sorted=1
    )
    starts = op.Mul(op.Range(op.Squeeze(zero), op.Squeeze(slices), op.Squeeze(one)), width)
    ids = op.Add(
        op.Reshape(part_ids, op.Concat(any_rows, slices, count, axis=0)),
        op.Unsqueeze(starts, op.Constant(value_ints=[0, 2])),
    )
    flat = op.Concat(any_rows, op.Mul(slices, count), axis=0)
    values, order = op.TopK(op.Reshape(part, flat), count, axis=1, largest=1, sorted=1)
    return values, op.GatherElements(op.Reshape(ids, flat), order, axis=1)


CANDIDATES = 64
WIDER_CANDIDATES = 1024
# ONNX Runtime's CUDA TopK selects up to 4096 values of every row in one launch. The embedded 135M
# model's nucleus at temperature 1 passes 1024 tokens for 5.6% of its tokens at top_p 0.95 and 35%
# at 0.99, 4096 for 0.3% and 16% (benchmarks/results/static_fallback.json).
STATIC_CANDIDATES = 4096
# Past k = 256 ONNX Runtime's CUDA TopK works through each row in one thread block: 313 µs for
# 4096 of [1, 49152] and 1.43 ms of [1, 262144] on an H200. TopKSliced takes the k largest of
# every slice of the row first, so that many blocks share a row (212 µs and 0.82 ms; 1024 from
# slices of 4096: 93 µs and 0.41 ms; benchmarks/results/gpu_topk.json).
STATIC_SLICE = 8192


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
def CandidatesDrawn(
    z: FLOAT["S", "V"], temperature: FLOAT["S"]
) -> tuple[FLOAT["S", "C"], INT64["S", "C"], FLOAT["S", 1]]:
    """``Candidates`` when some row draws (temperature ≥ 1e-5). When every row is greedy, their
    draws are thrown away and the chain has turned their filters off, so the candidates of the
    first C ids stand in: the same shapes, without a ``TopK`` over the vocabulary (0.3 ms for a
    262,144-token row on one core).

    z: FLOAT["S", "V"]; temperature: FLOAT["S"] → (FLOAT["S", "C"], INT64["S", "C"], FLOAT["S", 1]).
    """
    if AnyRow(op.GreaterOrEqual(temperature, op.Constant(value_float=GREEDY_BELOW))):
        values, ids, top = Candidates(z)
    else:
        zero = op.Constant(value_ints=[0])
        one = op.Constant(value_ints=[1])
        count = op.Min(op.Constant(value_ints=[CANDIDATES]), op.Shape(z, start=1, end=2))
        values, ids, top = Candidates(op.Slice(z, zero, count, one))
    return values, ids, top


@script(onnxsample)
def CandidatesStatic(
    z: FLOAT["S", "V"],
) -> tuple[FLOAT["S", "C"], INT64["S", "C"], FLOAT["S", 1], FLOAT["S", "W"], INT64["S", "W"]]:
    """``Candidates`` and the W = min(``STATIC_CANDIDATES``, V) largest logits and their ids
    (``TopKSliced``): the C leading columns are ``Candidates``' numbers (``TopK`` orders ties by
    id either way), the maximum is the first.

    z: FLOAT["S", "V"] → (FLOAT["S", "C"], INT64["S", "C"], FLOAT["S", 1], FLOAT["S", "W"],
    INT64["S", "W"]).
    """
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    vocab = op.Shape(z, start=1, end=2)
    count = op.Min(op.Constant(value_ints=[CANDIDATES]), vocab)
    wide, wide_ids = TopKSliced(
        z,
        op.Constant(value_ints=[STATIC_CANDIDATES]),
        op.Constant(value_ints=[STATIC_SLICE]),
    )
    values = op.Slice(wide, zero, count, one)
    ids = op.Slice(wide_ids, zero, count, one)
    return values, ids, op.Slice(wide, zero, one, one), wide, wide_ids


@script(onnxsample)
def ContainedIn(
    z: FLOAT["S", "V"], wide: FLOAT["S", "W"], count: INT64[1], floor: FLOAT["S", 1]
) -> BOOL["S", 1]:
    """Whether every token with z ≥ floor is among the `count` leading values of `wide` (the
    largest, descending): count = V, or the value at count − 1 < floor. Read from a wider set,
    its leading values need no slice of their own.

    z: FLOAT["S", "V"]; wide: FLOAT["S", "W"]; count: INT64[1] (≤ W); floor: FLOAT["S", 1] →
    BOOL["S", 1].
    """
    one = op.Constant(value_ints=[1])
    everything = op.Equal(count, op.Shape(z, start=1, end=2))
    below = op.Less(op.Gather(wide, op.Sub(count, one), axis=1), floor)
    return op.Or(below, everything)


@script(onnxsample)
def Contained(
    z: FLOAT["S", "V"], candidates: FLOAT["S", "C"], floor: FLOAT["S", 1]
) -> BOOL["S", 1]:
    """Whether every token with z ≥ floor is a candidate: C = V, or the last candidate < floor.

    z: FLOAT["S", "V"]; candidates: FLOAT["S", "C"]; floor: FLOAT["S", 1] → BOOL["S", 1].
    """
    return ContainedIn(z, candidates, op.Shape(candidates, start=1, end=2), floor)


@script(onnxsample)
def FallsShort(reached: FLOAT["S", 1], mass: FLOAT["S", 1], off: BOOL["S", 1]) -> BOOL["S", 1]:
    """A static filter's flag for the host's fallback: it is on and the mass its candidates
    reached falls short of its target (an off slot's target is −inf, which nothing falls short
    of). reached, mass: FLOAT["S", 1]; off: BOOL["S", 1] → BOOL["S", 1]."""
    ninf = op.Constant(value_float=NEG_INF)
    return op.Less(reached, op.Where(off, ninf, mass))


@script(onnxsample)
def Truncate(z: FLOAT["S", "V"], floor: FLOAT["S", 1]) -> FLOAT["S", "V"]:
    """z where z ≥ floor, else −inf. z: FLOAT["S", "V"]; floor: FLOAT["S", 1] → FLOAT["S", "V"]."""
    ninf = op.Constant(value_float=NEG_INF)
    return op.Where(op.GreaterOrEqual(z, floor), z, ninf)


@script(onnxsample)
def KeptWeights(
    z: FLOAT["S", "V"], weights: FLOAT["S", "V"], floor: FLOAT["S", 1]
) -> FLOAT["S", "V"]:
    """`weights` where z ≥ floor, else 0. z, weights: FLOAT["S", "V"]; floor: FLOAT["S", 1] →
    FLOAT["S", "V"]."""
    zero_f = op.Constant(value_float=0.0)
    return op.Where(op.GreaterOrEqual(z, floor), weights, zero_f)
