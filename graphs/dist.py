"""The draw: inverse CDF with one host-made uniform per slot, over the kept tokens in a fixed
order.

The row is cut into B = ⌈V / BLOCK⌉ interleaved blocks of ``BLOCK`` places (block j holds the
ids ≡ j modulo B, in id order), so that no step walks the vocabulary sequentially
and every sum is one vector pass: w = exp(z − max z); a running sum inside each block, the sum of
the blocks before each block, and at every id the two added. In the order block by block, that
running sum never decreases, and the token is the first id where it passes u · Σw, clamped to the
last id that adds weight. Every sum adds the kept weights in that order with zeros between them, so
any path that adds the same nonzero weights in the same order finds the same token bit for bit: the
whole row in one count (``RowDrawStatic``), the block first and then its ids (``RowDraw``), or a
slot's candidates alone where its kept set lies inside them (``CandidateDraw``).
"""

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxscript import BOOL, FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._batch import AnyRow
from onnxsample.graphs._common import DOMAIN, NEG_INF, T_INT64, onnxsample
from onnxsample.graphs._rows import RowMax, RowMaxStatic
from onnxsample.graphs.candidates import Contained, KeptWeights, Truncate
from onnxsample.graphs.temperature import Retemper

BLOCK = 256
BELOW_ONE = float(np.nextafter(np.float32(1), np.float32(0)))  # 1 − 2^-24


@script(onnxsample)
def CountBefore(
    cum: FLOAT["S", "N"], uniform: FLOAT["S", 1], total: FLOAT["S", 1]
) -> INT64["S", 1]:
    """The inverse CDF's position over running sums `cum` (never decreasing, in any layout): with
    target = u · total, #{cum ≤ target and cum < total}, that is the first position with cum >
    target, clamped to the last one that adds weight.

    One comparison: cum < total is cum ≤ the largest float below total, which is total · (1 −
    2^-24) exactly for a normal total (≥ 1 here: the maximum adds exp(0)); and min(u · total,
    that) = min(u, 1 − 2^-24) · total, a product rounding never reorders.

    cum: FLOAT["S", "N"]; uniform: FLOAT["S", 1] in [0, 1); total: FLOAT["S", 1] (cum's largest,
    ≥ 1; a total of 0 counts every position, which a caller that may see one clamps) →
    INT64["S", 1].
    """
    axis = op.Constant(value_ints=[1])
    below_one = op.Constant(value_float=BELOW_ONE)
    bound = op.Mul(op.Min(uniform, below_one), total)
    return op.ReduceSum(op.Cast(op.LessOrEqual(cum, bound), to=T_INT64), axis, keepdims=1)


@script(onnxsample)
def Blocks(z: FLOAT["S", "V"]) -> INT64[1]:
    """B = ⌈V / BLOCK⌉, the number of interleaved blocks (id = k · B + j: block j, place k).
    z: FLOAT["S", "V"] → INT64[1]."""
    block = op.Constant(value_ints=[BLOCK])
    one = op.Constant(value_ints=[1])
    return op.Div(op.Sub(op.Add(op.Shape(z, start=1, end=2), block), one), block)


@script(onnxsample)
def WeightSums(
    z: FLOAT["S", "V"], weights: FLOAT["S", "V"]
) -> tuple[FLOAT["S", "K", "B"], FLOAT["S", "B"], FLOAT["S", "B"]]:
    """``BlockSums`` of the weights w given.

    z: FLOAT["S", "V"] (for B); weights: FLOAT["S", "V"] → (FLOAT["S", "K", "B"], FLOAT["S", "B"],
    FLOAT["S", "B"]).
    """
    zero = op.Constant(value_ints=[0])
    block = op.Constant(value_ints=[BLOCK])
    blocks = Blocks(z)
    pad = op.Sub(op.Mul(blocks, block), op.Shape(z, start=1, end=2))
    padded = op.Pad(weights, op.Concat(zero, zero, zero, pad, axis=0))
    grid = op.Reshape(padded, op.Concat(op.Shape(z, start=0, end=1), block, blocks, axis=0))
    running = op.CumSum(grid, op.Constant(value_int=1))
    sums = op.Gather(running, op.Constant(value_int=-1), axis=1)
    return running, sums, op.CumSum(sums, op.Constant(value_int=1), exclusive=1)


@script(onnxsample)
def BlockSums(
    z: FLOAT["S", "V"], top: FLOAT["S", 1]
) -> tuple[FLOAT["S", "K", "B"], FLOAT["S", "B"], FLOAT["S", "B"]]:
    """w = exp(z − top), padded with zeros to K = ``BLOCK`` places of B blocks ([S, K, B]: block
    j's places down column j): the running sum down each block, each block's sum (its last), and
    the sum of the blocks before each block. Each is one cumulative sum over a vector pass.

    z: FLOAT["S", "V"] (dropped tokens −inf); top: FLOAT["S", 1] → (FLOAT["S", "K", "B"],
    FLOAT["S", "B"], FLOAT["S", "B"]).
    """
    running, sums, before = WeightSums(z, op.Exp(op.Sub(z, top)))
    return running, sums, before


@script(onnxsample)
def DrawnId(z: FLOAT["S", "V"], place: INT64["S", 1]) -> INT64["S", 1]:
    """The id at `place` in the draw's order: place k of block j stands at j · ``BLOCK`` + k and
    is id k · B + j. :func:`drawn_id_for` makes it one lookup where V is known.

    z: FLOAT["S", "V"] (for B); place: INT64["S", 1] → INT64["S", 1].
    """
    block = op.Constant(value_ints=[BLOCK])
    return op.Add(op.Mul(op.Mod(place, block), Blocks(z)), op.Div(place, block))


def drawn_id_for(vocab: int) -> onnx.FunctionProto:
    """:func:`DrawnId` for rows of a known `vocab`: the id of every place of the draw's order as
    a constant table (B · ``BLOCK`` ids, 8 bytes each: 384 KiB for 49,152), read with one
    ``Gather`` where the arithmetic took four kernels. The same ids, padding places included.

    z: FLOAT[S, V] (unread); place: INT64[S, 1] → INT64[S, 1].
    """
    blocks = -(-vocab // BLOCK)
    places = np.arange(blocks * BLOCK, dtype=np.int64)
    table = (places % BLOCK) * blocks + places // BLOCK
    nodes = [
        helper.make_node("Constant", [], ["ids"], value=numpy_helper.from_array(table, "ids")),
        helper.make_node("Gather", ["ids", "place"], ["id"], axis=0),
    ]
    return helper.make_function(
        DOMAIN,
        DrawnId.name,
        ["z", "place"],
        ["id"],
        nodes,
        [helper.make_opsetid("", 18)],
        doc_string=f"DrawnId for V = {vocab}: a table of {blocks * BLOCK} ids.",
    )


@script(onnxsample)
def WeightsDrawStatic(
    z: FLOAT["S", "V"], weights: FLOAT["S", "V"], uniform: FLOAT["S", 1]
) -> INT64["S", 1]:
    """``RowDrawStatic`` from the weights w = exp(z − max z) given (0 for a dropped token).

    z: FLOAT["S", "V"] (for B); weights: FLOAT["S", "V"]; uniform: FLOAT["S", 1] → INT64["S", 1].
    """
    axis = op.Constant(value_ints=[1])
    whole = op.Constant(value_ints=[0, -1])
    last = op.Constant(value_ints=[-1])
    running, _, before = WeightSums(z, weights)
    cum = op.Reshape(op.Add(op.Unsqueeze(before, axis), running), whole)
    total = op.Gather(cum, last, axis=1)
    return DrawnId(z, CountBefore(cum, uniform, total))


@script(onnxsample)
def RowDrawStatic(z: FLOAT["S", "V"], top: FLOAT["S", 1], uniform: FLOAT["S", 1]) -> INT64["S", 1]:
    """Draw from whole rows in one count over every id's running sum (the blocks before its
    block plus its block's running sum): a handful of kernels, a few passes over the row.

    z: FLOAT["S", "V"] (dropped tokens −inf, finite maximum); top: FLOAT["S", 1] (max z); uniform:
    FLOAT["S", 1] → INT64["S", 1].
    """
    return WeightsDrawStatic(z, op.Exp(op.Sub(z, top)), uniform)


@script(onnxsample)
def RowDraw(z: FLOAT["S", "V"], top: FLOAT["S", 1], uniform: FLOAT["S", 1]) -> INT64["S", 1]:
    """``RowDrawStatic``'s token with two short counts instead of one over the row: the block
    (each block's last running sum is the blocks before it plus its sum), then its places.

    z: FLOAT["S", "V"] (dropped tokens −inf, finite maximum); top: FLOAT["S", 1] (max z); uniform:
    FLOAT["S", 1] → INT64["S", 1].
    """
    axis = op.Constant(value_ints=[1])
    last = op.Constant(value_ints=[-1])
    one = op.Constant(value_ints=[1])
    block = op.Constant(value_ints=[BLOCK])
    running, sums, before = BlockSums(z, top)
    ends = op.Add(before, sums)
    total = op.Gather(ends, last, axis=1)
    chosen = CountBefore(ends, uniform, total)
    column = op.Expand(
        op.Unsqueeze(chosen, axis), op.Concat(op.Shape(z, start=0, end=1), block, one, axis=0)
    )
    down = op.Squeeze(op.GatherElements(running, column, axis=2), op.Constant(value_ints=[2]))
    inside = op.Add(op.GatherElements(before, chosen, axis=1), down)
    place = CountBefore(inside, uniform, total)
    return op.Add(op.Mul(place, Blocks(z)), chosen)


@script(onnxsample)
def CandidateDraw(
    z: FLOAT["S", "V"],
    candidates: FLOAT["S", "C"],
    candidate_ids: INT64["S", "C"],
    top: FLOAT["S", 1],
    floor: FLOAT["S", 1],
    whole_rows: BOOL["S", 1],
    scale: FLOAT["S", 1],
    u: FLOAT["S", 1],
) -> tuple[INT64["S", 1], BOOL["S", 1]]:
    """``RowDraw``'s token from the candidates alone where a slot's kept set lies inside them,
    and whether it is the slot's draw (its kept set lies inside them and it need not draw from
    the whole row).

    Put in the draw's order (block by block, each block's ids ascending), the candidates are the
    row's only nonzero weights, and ``RowDraw``'s running sum changes only at them: at each, its
    block's running sum (a cumulative sum over the candidates of its block, [S, C, C]) plus the
    blocks before it (each block's sum counted once, at its last candidate, where its running
    sum is the block's sum). The same additions of the same numbers, so the same token.

    The kept candidates (≥ floor) weigh exp(Retemper(z) − Retemper(top)): the draw's temperature
    of a slot that puts it after the cuts (``scale``, 1 for every other slot, whose weights it
    leaves as they were).

    z: FLOAT["S", "V"]; candidates, candidate_ids: [S, C] (descending); top, floor: FLOAT["S", 1];
    whole_rows: BOOL["S", 1]; scale: FLOAT["S", 1]; u: FLOAT["S", 1] → (INT64["S", 1],
    BOOL["S", 1]).
    """
    zero_f = op.Constant(value_float=0.0)
    axis = op.Constant(value_ints=[1])
    axis2 = op.Constant(value_ints=[2])
    next_on = op.Constant(value_ints=[1])
    last = op.Constant(value_ints=[-1])
    end = op.Constant(value_ints=[2147483647])
    one = op.Constant(value_ints=[1])
    inside = op.And(Contained(z, candidates, floor), op.Not(whole_rows))
    count = op.Shape(candidates, start=1, end=2)
    blocks = Blocks(z)
    # the draw's order: by block (id mod B), then by id
    vocab = op.Shape(z, start=1, end=2)
    order = op.Add(op.Mul(op.Mod(candidate_ids, blocks), vocab), candidate_ids)
    _, by_order = op.TopK(order, count, axis=1, largest=0, sorted=1)
    ids = op.GatherElements(candidate_ids, by_order, axis=1)
    values = op.GatherElements(candidates, by_order, axis=1)
    shifted = op.Sub(Retemper(values, scale), Retemper(top, scale))
    weights = op.Where(op.GreaterOrEqual(values, floor), op.Exp(shifted), zero_f)
    blk = op.Mod(ids, blocks)
    # [s, j, i]: w_j where j ≤ i is in i's block; summed down j, i's block's running sum at i
    places = op.Range(op.Constant(value_int=0), op.Squeeze(count), op.Constant(value_int=1))
    upto = op.LessOrEqual(
        op.Unsqueeze(places, axis), op.Unsqueeze(places, op.Constant(value_ints=[0]))
    )
    same = op.And(op.Equal(op.Unsqueeze(blk, axis2), op.Unsqueeze(blk, axis)), upto)
    per_block = op.Where(same, op.Unsqueeze(weights, axis2), zero_f)
    at = op.Gather(
        op.CumSum(per_block, op.Constant(value_int=1)), op.Constant(value_int=-1), axis=1
    )
    following = op.Concat(
        op.Slice(blk, next_on, end, axis), op.Add(op.Slice(blk, last, end, axis), one), axis=1
    )
    sums = op.Where(op.Equal(blk, following), zero_f, at)  # each block's sum, at its last
    cum = op.Add(op.CumSum(sums, op.Constant(value_int=1), exclusive=1), at)
    total = op.Gather(cum, last, axis=1)
    # a greedy row's floor of +inf leaves no weight (total 0): its draw, thrown away, stays in range
    position = op.Min(CountBefore(cum, u, total), op.Sub(count, one))
    return op.GatherElements(ids, position, axis=1), inside


@script(onnxsample)
def Dist(
    z: FLOAT["S", "V"],
    candidates: FLOAT["S", "C"],
    candidate_ids: INT64["S", "C"],
    top: FLOAT["S", 1],
    floor: FLOAT["S", 1],
    whole_rows: BOOL["S", 1],
    scale: FLOAT["S", 1],
    uniform: FLOAT["S"],
) -> INT64["S"]:
    """Kept tokens: z ≥ floor (and not −inf). With z' = ``Retemper``(z, scale) (z itself where
    the scale is 1), w = exp(z' − max z'); token = the first id, in the
    draw's order (see the module), whose running sum exceeds u · Σw, clamped to the last id that
    adds weight. No vocabulary sort; the token depends only on the kept set and u, whichever of
    the candidates' and the row's draws a slot takes.

    z: FLOAT["S", "V"] (typical-p already applied); candidates, candidate_ids: [S, C] (descending);
    top, floor: FLOAT["S", 1]; whole_rows: BOOL["S", 1] (slots that must draw from the whole row, e.g.
    typical-p, whose kept set is not a floor); scale: FLOAT["S", 1] (the temperature of a slot
    that puts it after the cuts, else 1); uniform: FLOAT["S"] in [0, 1) → INT64["S"].
    """
    axis = op.Constant(value_ints=[1])
    u = op.Unsqueeze(uniform, axis)
    token, inside = CandidateDraw(z, candidates, candidate_ids, top, floor, whole_rows, scale, u)
    if AnyRow(op.Not(inside)):
        cut = op.And(op.Not(inside), op.Greater(floor, op.Constant(value_float=NEG_INF)))
        if AnyRow(cut):
            row = Truncate(z, floor)
        else:
            row = op.Identity(z)
        tempered = Retemper(row, scale)
        drawn = op.Where(inside, token, RowDraw(tempered, RowMax(tempered), u))
    else:
        drawn = op.Identity(token)
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
    return op.Squeeze(RowDrawStatic(z, RowMaxStatic(z), op.Unsqueeze(uniform, axis)), axis)


@script(onnxsample)
def DistCutStatic(
    z: FLOAT["S", "V"], exp_row: FLOAT["S", "V"], floor: FLOAT["S", 1], uniform: FLOAT["S"]
) -> INT64["S"]:
    """``DistRowsStatic``'s token over the row cut at `floor`, from the weights the static chain
    computed once for top-p and the draw (`exp_row` = exp(z − max z)): a dropped token weighs 0,
    as exp(−inf − max z) does, and a kept one the same number, so the same weights and token in
    a pass over the row instead of three (the cut, its maximum, its exp).

    z: FLOAT["S", "V"] (finite maximum); exp_row: FLOAT["S", "V"]; floor: FLOAT["S", 1] (at most
    max z); uniform: FLOAT["S"] in [0, 1) → INT64["S"].
    """
    axis = op.Constant(value_ints=[1])
    weights = KeptWeights(z, exp_row, floor)
    return op.Squeeze(WeightsDrawStatic(z, weights, op.Unsqueeze(uniform, axis)), axis)
