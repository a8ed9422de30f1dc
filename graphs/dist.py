"""The draw: inverse CDF in vocabulary order with one host-made uniform per slot.

A slot whose kept set lies inside its candidates draws from them, put back in id order. Otherwise it
draws from the whole row with a two-level cumulative sum, so that no step walks the vocabulary
sequentially: the sums of blocks of ``BLOCK`` consecutive ids first, then the ids inside the one
block the target falls in.
"""

from onnxscript import BOOL, FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._batch import AnyRow
from onnxsample.graphs._common import NEG_INF, T_FLOAT, T_INT64, onnxsample
from onnxsample.graphs._rows import RowMax, RowMaxStatic
from onnxsample.graphs.candidates import Contained, Truncate

BLOCK = 256


@script(onnxsample)
def InverseCdf(weights: FLOAT["S", "N"], target: FLOAT["S", 1]) -> FLOAT["S", 1]:
    """c = cumsum(w); the first position with c > target, clamped to the last position with w > 0
    (as FLOAT: counts are exact in float32 up to 2^24).

    Both are counts of a prefix, as c never decreases: #{c ≤ target} and #{c < c[N − 1]}. The
    smaller one is the count of the positions in both: one reduction, five ops where each count
    and their minimum took seven.

    weights: FLOAT["S", "N"] ≥ 0; target: FLOAT["S", 1] → FLOAT["S", 1].
    """
    axis = op.Constant(value_ints=[1])
    cum_axis = op.Constant(value_int=1)
    last = op.Constant(value_ints=[-1])
    cum = op.CumSum(weights, cum_axis)
    total = op.Gather(cum, last, axis=1)
    before = op.And(op.LessOrEqual(cum, target), op.Less(cum, total))
    return op.ReduceSum(op.Cast(before, to=T_FLOAT), axis, keepdims=1)


@script(onnxsample)
def RowDraw(z: FLOAT["S", "V"], top: FLOAT["S", 1], uniform: FLOAT["S", 1]) -> INT64["S", 1]:
    """Draw from whole rows: w = exp(z − top); block sums, then the ids inside the chosen block.

    z: FLOAT["S", "V"] (dropped tokens −inf, finite maximum); top: FLOAT["S", 1] (max z); uniform:
    FLOAT["S", 1] → INT64["S", 1].
    """
    axis2 = op.Constant(value_ints=[2])
    cum_axis = op.Constant(value_int=1)
    last = op.Constant(value_ints=[-1])
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    block = op.Constant(value_ints=[BLOCK])
    rows = op.Shape(z, start=0, end=1)
    vocab = op.Shape(z, start=1, end=2)
    blocks = op.Div(op.Sub(op.Add(vocab, block), one), block)
    pad = op.Sub(op.Mul(blocks, block), vocab)
    weights = op.Pad(op.Exp(op.Sub(z, top)), op.Concat(zero, zero, zero, pad, axis=0))
    grid = op.Reshape(weights, op.Concat(rows, blocks, block, axis=0))
    block_sums = op.ReduceSum(grid, axis2, keepdims=0)
    target = op.Mul(uniform, op.Gather(op.CumSum(block_sums, cum_axis), last, axis=1))
    chosen = op.Cast(InverseCdf(block_sums, target), to=T_INT64)
    before = op.CumSum(block_sums, cum_axis, exclusive=1)
    local = op.Sub(target, op.GatherElements(before, chosen, axis=1))
    index = op.Expand(op.Unsqueeze(chosen, axis2), op.Concat(rows, one, block, axis=0))
    picked = op.Reshape(op.GatherElements(grid, index, axis=1), op.Concat(rows, block, axis=0))
    offset = op.Cast(InverseCdf(picked, local), to=T_INT64)
    return op.Add(op.Mul(chosen, block), offset)


@script(onnxsample)
def CandidateDraw(
    z: FLOAT["S", "V"],
    candidates: FLOAT["S", "C"],
    candidate_ids: INT64["S", "C"],
    top: FLOAT["S", 1],
    floor: FLOAT["S", 1],
    whole_rows: BOOL["S", 1],
    u: FLOAT["S", 1],
) -> tuple[INT64["S", 1], BOOL["S", 1]]:
    """The draw among the candidates, put back in id order, and whether it is the slot's draw (its
    kept set lies inside the candidates and it need not draw from the whole row).

    z: FLOAT["S", "V"]; candidates, candidate_ids: [S, C] (descending); top, floor: FLOAT["S", 1];
    whole_rows: BOOL["S", 1]; u: FLOAT["S", 1] → (INT64["S", 1], BOOL["S", 1]).
    """
    zero_f = op.Constant(value_float=0.0)
    last = op.Constant(value_ints=[-1])
    inside = op.And(Contained(z, candidates, floor), op.Not(whole_rows))
    count = op.Shape(candidates, start=1, end=2)
    ids_f = op.Cast(candidate_ids, to=T_FLOAT)  # exact: ids < 2^24
    _, by_id = op.TopK(ids_f, count, axis=1, largest=0, sorted=1)  # ascending ids
    ids = op.GatherElements(candidate_ids, by_id, axis=1)
    values = op.GatherElements(candidates, by_id, axis=1)
    weights = op.Where(op.GreaterOrEqual(values, floor), op.Exp(op.Sub(values, top)), zero_f)
    total = op.Gather(op.CumSum(weights, op.Constant(value_int=1)), last, axis=1)
    position = op.Cast(InverseCdf(weights, op.Mul(u, total)), to=T_INT64)
    return op.GatherElements(ids, position, axis=1), inside


@script(onnxsample)
def Dist(
    z: FLOAT["S", "V"],
    candidates: FLOAT["S", "C"],
    candidate_ids: INT64["S", "C"],
    top: FLOAT["S", 1],
    floor: FLOAT["S", 1],
    whole_rows: BOOL["S", 1],
    uniform: FLOAT["S"],
) -> INT64["S"]:
    """Kept tokens: z ≥ floor (and not −inf). w = exp(z − max z); token = the first id, in
    vocabulary order, whose cumulative w exceeds u · Σw, clamped to the last id with w > 0. No
    vocabulary sort; the token depends only on the kept set and u.

    z: FLOAT["S", "V"] (typical-p already applied); candidates, candidate_ids: [S, C] (descending);
    top, floor: FLOAT["S", 1]; whole_rows: BOOL["S", 1] (slots that must draw from the whole row, e.g.
    typical-p, whose kept set is not a floor); uniform: FLOAT["S"] in [0, 1) → INT64["S"].
    """
    axis = op.Constant(value_ints=[1])
    u = op.Unsqueeze(uniform, axis)
    token, inside = CandidateDraw(z, candidates, candidate_ids, top, floor, whole_rows, u)
    if AnyRow(op.Not(inside)):
        cut = op.And(op.Not(inside), op.Greater(floor, op.Constant(value_float=NEG_INF)))
        if AnyRow(cut):
            row = Truncate(z, floor)
        else:
            row = op.Identity(z)
        drawn = op.Where(inside, token, RowDraw(row, RowMax(row), u))
    else:
        drawn = op.Identity(token)
    return op.Squeeze(drawn, axis)


@script(onnxsample)
def DistStatic(
    row: FLOAT["S", "V"],
    candidates: FLOAT["S", "C"],
    candidate_ids: INT64["S", "C"],
    top: FLOAT["S", 1],
    floor: FLOAT["S", 1],
    whole_rows: BOOL["S", 1],
    uniform: FLOAT["S"],
) -> INT64["S"]:
    """``Dist`` without control flow: both draws, each slot taking the one ``Dist`` takes for it
    (truncating at a floor of −inf changes nothing; the row maximum is :func:`RowMaxStatic`'s).
    ``Dist``'s inputs, but `row` is z already truncated at the floor (``Truncate``: typical-p's
    row is)."""
    axis = op.Constant(value_ints=[1])
    u = op.Unsqueeze(uniform, axis)
    token, inside = CandidateDraw(row, candidates, candidate_ids, top, floor, whole_rows, u)
    drawn = op.Where(inside, token, RowDraw(row, RowMaxStatic(row), u))
    return op.Squeeze(drawn, axis)


@script(onnxsample)
def DistRows(z: FLOAT["S", "V"], uniform: FLOAT["S"]) -> INT64["S"]:
    """The draw of a chain with no top-k / top-p / min-p: every slot draws from its whole row
    (``RowDraw``), with the same rule as ``Dist``.

    z: FLOAT["S", "V"] (dropped tokens −inf, finite maximum); uniform: FLOAT["S"] in [0, 1) → INT64["S"].
    """
    axis = op.Constant(value_ints=[1])
    return op.Squeeze(RowDraw(z, RowMax(z), op.Unsqueeze(uniform, axis)), axis)


@script(onnxsample)
def DistRowsStatic(z: FLOAT["S", "V"], uniform: FLOAT["S"]) -> INT64["S"]:
    """``DistRows`` with the static chain's row maximum (:func:`RowMaxStatic`, the same number).

    z: FLOAT["S", "V"]; uniform: FLOAT["S"] in [0, 1) → INT64["S"].
    """
    axis = op.Constant(value_ints=[1])
    return op.Squeeze(RowDraw(z, RowMaxStatic(z), op.Unsqueeze(uniform, axis)), axis)
