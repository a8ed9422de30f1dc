"""Reductions along a row that ONNX Runtime runs fast on the CPU and on CUDA: the running sum and the
maximum; and the logarithm of one value per row that does not depend on how many rows there are.

ONNX Runtime's CUDA ``CumSum`` gives each output element a thread that adds its whole prefix again,
O(N²) additions per row, and its CUDA ``ReduceMax`` over whole rows of more than one row takes
milliseconds (measured on an H100: 2.5 ms for [8, 49152], 3.2 ms for [64, 49152], 0.03 ms for one row).
Top-p's wider and whole-row prefixes and typical-p's prefixes use :func:`RunningSum` (top-p's 64
candidates keep ``CumSum``: one block, the same numbers), and every row maximum over the vocabulary
:func:`RowMax`; on the CPU each costs what the plain op does. The full chain's sampler alone on an H100 (static, 64 slots): 66 ms a call with the plain ops.

:func:`RunningSum`: ``CumSum`` inside blocks of ``SCAN_BLOCK`` values, then the sum of the blocks
before each block. Blocks start at position 0, so the first n values are the same numbers for a row
of any length ≥ n: a prefix over the candidates and the same prefix over the whole sorted row agree,
as they must for the branching and the static chains to keep the same tokens. A row of at most
``SCAN_BLOCK`` values is one block, and its running sum is ``CumSum``'s, bit for bit.

:func:`RowLog`: ONNX Runtime's CPU ``Log`` computes whole SIMD registers with a vector routine and
what is left over with the C library's, and the two can differ in the last bit. Over a [S, 1]
tensor, a slot's value took one or the other by the number of rows (scalar below 4 rows, vector
from 4 on): a min-p floor changed in its last bit with the batch around it.
"""

import onnx
from onnx import helper
from onnxscript import DOUBLE, FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._common import DOMAIN, T_INT64, onnxsample

SCAN_BLOCK = 256
LANES = 16  # float32 values in the widest SIMD register (AVX-512)


@script(onnxsample)
def RunningSum(x: DOUBLE["S", "N"]) -> DOUBLE["S", "N"]:
    """c[:, i] = x[:, 0] + … + x[:, i]: each block's ``CumSum``, plus the blocks before it (a block's
    total is its running sum's last value; their exclusive ``CumSum`` over the blocks: [S, blocks, 1]).

    x: DOUBLE["S", "N"] → DOUBLE["S", "N"].
    """
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    last = op.Constant(value_ints=[-1])
    block = op.Constant(value_ints=[SCAN_BLOCK])
    rows = op.Shape(x, start=0, end=1)  # explicit: a Reshape cannot infer a dimension of 0 rows
    n = op.Shape(x, start=1, end=2)
    blocks = op.Div(op.Sub(op.Add(n, block), one), block)
    pad = op.Sub(op.Mul(blocks, block), n)
    grid = op.Reshape(
        op.Pad(x, op.Concat(zero, zero, zero, pad, axis=0)), op.Concat(rows, blocks, block, axis=0)
    )
    inner = op.CumSum(grid, op.Constant(value_int=2))
    before = op.CumSum(op.Gather(inner, last, axis=2), op.Constant(value_int=1), exclusive=1)
    sums = op.Reshape(op.Add(inner, before), op.Concat(rows, op.Mul(blocks, block), axis=0))
    return op.Slice(sums, zero, n, one)


@script(onnxsample)
def RowBlocks(z: FLOAT["S", "V"]) -> tuple[FLOAT["S", "B", "W"], INT64[1]]:
    """The rows cut into blocks of w consecutive logits, w the largest power of two ≤ 256 that
    divides V (1 for an odd vocabulary, as GPT-2's 50,257): [S, V / w, w], and w.

    z: FLOAT[S, V] → (FLOAT[S, V / w, w], INT64[1]).
    """
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    widths = op.Constant(value_ints=[256, 128, 64, 32, 16, 8, 4, 2, 1])
    rows = op.Shape(z, start=0, end=1)  # explicit: a Reshape cannot infer a dimension of 0 rows
    vocab = op.Shape(z, start=1, end=2)
    width = op.ReduceMax(op.Where(op.Equal(op.Mod(vocab, widths), zero), widths, one), keepdims=1)
    return op.Reshape(z, op.Concat(rows, op.Div(vocab, width), width, axis=0)), width


def row_block_width(vocab: int) -> int:
    """:func:`RowBlocks`' w for rows of `vocab` logits: the largest power of two ≤ 256 dividing it."""
    return next(w for w in (256, 128, 64, 32, 16, 8, 4, 2, 1) if vocab % w == 0)


def row_blocks_for(vocab: int) -> onnx.FunctionProto:
    """:func:`RowBlocks` for rows of a known `vocab`: w and V / w are constants, so the function
    is one ``Reshape`` (the generic body recomputes them from the row's shape with nine ops on
    every call; a Reshape's 0 copies the row count, 0 rows included).

    z: FLOAT[S, V] → (FLOAT[S, V / w, w], INT64[1]).
    """
    width = row_block_width(vocab)
    shape = helper.make_tensor("shape", T_INT64, [3], [0, vocab // width, width])
    nodes = [
        helper.make_node("Constant", [], ["shape"], value=shape),
        helper.make_node("Reshape", ["z", "shape"], ["grid"]),
        helper.make_node(
            "Constant", [], ["width"], value=helper.make_tensor("width", T_INT64, [1], [width])
        ),
    ]
    return helper.make_function(
        DOMAIN,
        RowBlocks.name,
        ["z"],
        ["grid", "width"],
        nodes,
        [helper.make_opsetid("", 18)],
        doc_string=f"RowBlocks for V = {vocab}: w = {width}.",
    )


@script(onnxsample)
def RowMax(z: FLOAT["S", "V"]) -> FLOAT["S", 1]:
    """The maximum of each row, in two reductions: over blocks of w consecutive logits (w the
    largest power of two ≤ 256 that divides V), then over the blocks. A maximum does not depend on
    the order it is taken in, so this is one ``ReduceMax``'s number. It exists for the CUDA
    provider, whose ``ReduceMax`` over whole rows of a 49,152-token vocabulary takes 2.5–3 ms for
    8–64 rows on an H100 against 0.06 ms for the two reductions (on the CPU both cost the same).
    Vocabularies are multiples of 64 or more in the models we export; an odd one (GPT-2's 50,257)
    gets w = 1, the plain reduction's cost.

    z: FLOAT[S, V] → FLOAT[S, 1].
    """
    grid, _ = RowBlocks(z)
    blocks = op.ReduceMax(grid, op.Constant(value_ints=[2]), keepdims=0)
    return op.ReduceMax(blocks, op.Constant(value_ints=[1]), keepdims=1)


@script(onnxsample)
def RowArgMax(z: FLOAT["S", "V"]) -> INT64["S"]:
    """Each row's ``ArgMax`` (ties to the lowest id), as :func:`RowMax` takes the maximum: over
    blocks of w consecutive logits, the first block whose maximum is the row's, then the first
    position of that maximum inside it. The first block holding the row's maximum holds its first
    occurrence, so this is ``ArgMax``'s index for every row without NaN. ONNX Runtime's CPU
    ``ArgMax`` compares one value at a time (0.37 ms for a 262,144-token row on one core) where
    ``ReduceMax`` is vectorised (0.06 ms); for the branching chain (the static chain, on CUDA, keeps
    the one ``ArgMax`` kernel).

    z: FLOAT[S, V] (no NaN) → INT64[S].
    """
    one = op.Constant(value_ints=[1])
    rows = op.Shape(z, start=0, end=1)
    grid, width = RowBlocks(z)
    block = op.ArgMax(op.ReduceMax(grid, op.Constant(value_ints=[2]), keepdims=0), axis=1)
    inside = op.GatherElements(
        grid,
        op.Expand(
            op.Unsqueeze(block, op.Constant(value_ints=[2])), op.Concat(rows, one, width, axis=0)
        ),
        axis=1,
    )
    position = op.ArgMax(inside, axis=2, keepdims=0)  # [S, 1]
    return op.Reshape(op.Add(op.Mul(block, width), position), rows)


@script(onnxsample)
def RowTopStatic(z: FLOAT["S", "V"]) -> tuple[FLOAT["S", 1], INT64["S", 1]]:
    """:func:`RowMaxStatic`'s maximum and the ``ArgMax`` it reads it at (ties to the lowest id;
    0 for a row of −inf): one kernel gives the static chain both a row's maximum and its greedy
    token.

    z: FLOAT[S, V] (no NaN) → (FLOAT[S, 1], INT64[S, 1]).
    """
    top = op.ArgMax(z, axis=1, keepdims=1)
    return op.GatherElements(z, top, axis=1), top


@script(onnxsample)
def RowMaxStatic(z: FLOAT["S", "V"]) -> FLOAT["S", 1]:
    """The maximum of each row as the value at its ``ArgMax``: :func:`RowMax`'s number (a maximum
    is one value, wherever it is read). For the static chain (CUDA graphs): ONNX Runtime's CUDA
    ``ReduceMax`` is cuDNN's, 15 µs a launch on an H200 and two per :func:`RowMax`, where its
    ``ArgMax`` runs a kernel of its own in 4 µs and the gather in 1–2
    (``benchmarks/results/gpu_kernels.json``). On the CPU ``ReduceMax`` is the faster, so the
    branching chain keeps :func:`RowMax`; both give every row the same number.

    z: FLOAT[S, V] (no NaN) → FLOAT[S, 1].
    """
    top, _ = RowTopStatic(z)
    return top


@script(onnxsample)
def RowLog(x: FLOAT["S", 1]) -> FLOAT["S", 1]:
    """log x, each row's value computed in a row of ``LANES`` copies, so every row takes the vector
    routine whatever the number of rows. x: FLOAT[S, 1] → FLOAT[S, 1].
    """
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    lanes = op.Constant(value_ints=[1, LANES])
    return op.Slice(op.Log(op.Expand(x, lanes)), zero, one, one)
