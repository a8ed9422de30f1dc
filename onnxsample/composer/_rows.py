"""The rows the sampler chain reads and where its results go: the slots' rows of the LM head (or
of the logits), the active slots, and the per-slot layout of what the chain returns for them,
the penalty counts included.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxsample.composer._ir_build import const as _const
from onnxsample.composer._ir_build import filled_like
from onnxsample.composer._ir_build import op as _op
from onnxsample.graphs._common import DOMAIN
from onnxsample.graphs.library import sampler_functions

__all__ = [
    "active_slots",
    "counted",
    "emitted",
    "head_rows",
    "padded_rows",
    "per_slot",
    "slot_positions",
    "to_float",
]

ADD_TOKENS = "AddTokens"  # graphs.speculative: the one rule by which the penalty counts grow


def padded_rows(graph: ir.Graph, rows: ir.Value, width: int, tag: str) -> ir.Value:
    """[..., width] -> [1 + N, width] with a zero row first (the dummy row of inactive slots)."""
    flat = _op(
        graph,
        "Reshape",
        [rows, _const(graph, f"sampler/{tag}_shape", np.array([-1, width]))],
        f"{tag}_flat",
    )
    zero = _op(
        graph,
        "ConstantOfShape",
        [_const(graph, f"sampler/{tag}_zero_shape", np.array([1, width]))],
        f"{tag}_zero",
        value=ir.tensor(np.zeros(1, dtype=rows.dtype.numpy())),
    )
    return _op(graph, "Concat", [zero, flat], f"{tag}_padded", axis=0)


def to_float(graph: ir.Graph, value: ir.Value, tag: str) -> ir.Value:
    if value.dtype == ir.DataType.FLOAT:
        return value
    return _op(graph, "Cast", [value], f"{tag}_float", to=ir.DataType.FLOAT)


def head_rows(
    graph: ir.Graph, head: ir.Node, padded: ir.Value, indices: ir.Value, exact: bool, tag: str
) -> ir.Value:
    """The LM head (a copy of `head`) applied to the `indices` rows of `padded` hidden states:
    float logits [len(indices), V]. An exact-positions export puts the dummy row first, so that
    the head's GEMM never has one row (4-bit MatMulNBits takes another kernel for M = 1; see
    onnxsample.exporters._exact_attention), and slices it off after."""
    if exact:
        dummy = _const(graph, f"sampler/{tag}_head_dummy_row", np.array([0], np.int64))
        indices = _op(graph, "Concat", [dummy, indices], f"{tag}_head_rows_exact", axis=0)
    rows = _op(graph, "Gather", [padded, indices], f"{tag}_hidden_rows", axis=0)
    moved = ir.node(
        head.op_type,
        [rows, *head.inputs[1:]],
        {name: attr.value for name, attr in head.attributes.items()},
        domain=head.domain,
        name=f"sampler/{tag}_lm_head",
    )
    moved.outputs[0].name = f"sampler/{tag}_lm_head"
    moved.outputs[0].dtype = head.outputs[0].dtype
    graph.append(moved)
    logits = to_float(graph, moved.outputs[0], f"{tag}_logits")
    if not exact:
        return logits
    after_dummy = _const(graph, f"sampler/{tag}_head_rows_after_dummy", np.array([1]))
    last = _const(graph, f"sampler/{tag}_head_rows_all", np.array([2**62]))
    return _op(graph, "Slice", [logits, after_dummy, last], f"{tag}_head_rows_real")


def active_slots(graph: ir.Graph, row_index: ir.Value) -> ir.Value:
    """Indices of the slots with a row to sample (row_index > 0); [0] when there are none.

    The chain then runs on the active slots only, so a batch of one in an 8-slot graph pays for one
    row of LM head and sampling, not eight. Slot 0 stands in when nothing is active, so that no
    tensor is ever empty; its row is the dummy row and its state does not change.
    """
    zero = _const(graph, "sampler/zero_i64", np.array([0], np.int64))
    active = _op(graph, "Greater", [row_index, zero], "is_active")
    found = _op(graph, "NonZero", [active], "active_2d")
    found = _op(
        graph, "Reshape", [found, _const(graph, "sampler/flat", np.array([-1]))], "active_found"
    )
    count = _op(
        graph,
        "Max",
        [_op(graph, "Shape", [found], "active_count"), _const(graph, "sampler/one", np.array([1]))],
        "active_n",
    )
    padded = _op(graph, "Concat", [found, zero], "active_or_first", axis=0)
    return _op(graph, "Slice", [padded, zero, count], "active")


def slot_positions(graph: ir.Graph, active: ir.Value, slots: ir.Value) -> ir.Value:
    """INT64[S]: each slot's row among the active rows (``active[i] = s`` gives i), or A (one past
    them) for a slot without one; computed once, so that every output is one ``Gather``."""
    count = _op(graph, "Shape", [active], "slot_rows_count")
    empty = _op(graph, "Expand", [count, slots], "slot_rows_empty")
    scalar = _const(graph, "sampler/slot_rows_scalar", np.array([], np.int64))
    order = _op(
        graph,
        "Range",
        [
            _const(graph, "sampler/slot_rows_start", np.array(0, np.int64)),
            _op(graph, "Reshape", [count, scalar], "slot_rows_limit"),
            _const(graph, "sampler/slot_rows_step", np.array(1, np.int64)),
        ],
        "slot_rows_order",
    )
    return _op(graph, "ScatterElements", [empty, active, order], "slot_rows", axis=0)


def per_slot(graph: ir.Graph, positions: ir.Value, rows: ir.Value, shape, name: str) -> ir.Value:
    """rows [A, ...] laid out per slot [S, ...] by `positions` (:func:`slot_positions`): a zero
    row appended (``Concat``: the CUDA provider's ``Pad`` takes floats and bools only), then one
    ``Gather``, where a ``ScatterElements`` into zeros took a shape computation and a fill of its
    own for every output. `shape` is the output's ([S, ...]); where its trailing sizes are not
    all known, the zero row's shape is read from `rows`."""
    trailing = None if shape is None else list(shape)[1:]
    if trailing is not None and all(isinstance(d, int) for d in trailing):
        zeros = np.zeros([1, *trailing], dtype=rows.dtype.numpy())
        zero = _const(graph, f"sampler/{name}_zero_row", zeros)
    else:
        one = _const(graph, f"sampler/{name}_one_row", np.array([1], np.int64))
        zero = filled_like(graph, one, rows, 0, f"{name}_zero")
    padded = _op(graph, "Concat", [rows, zero], f"{name}_padded", axis=0)
    return _op(graph, "Gather", [padded, positions], f"{name}_slots", axis=0)


def emitted(
    graph: ir.Graph, results: dict[str, ir.Value], picked: dict[str, ir.Value]
) -> tuple[ir.Value, ir.Value]:
    """The token each active slot emits this step, ids INT64[A, 1] and emitted BOOL[A, 1]
    (false for the stand-in slot when none is active)."""
    column = _const(graph, "sampler/emitted_axis", np.array([1]))
    ids = _op(graph, "Unsqueeze", [results["sampler.next_token"], column], "emitted_ids")
    live = _op(
        graph,
        "Greater",
        [picked["sampler.row_index"], _const(graph, "sampler/emitted_zero", np.array(0))],
        "emitted_live",
    )
    return ids, _op(graph, "Unsqueeze", [live, column], "emitted_take")


def counted(
    model: ir.Model,
    counts: ir.Value,
    positions: ir.Value,
    ids: ir.Value,
    take: ir.Value,
) -> ir.Value:
    """``sampler.output_counts_out``: `counts` [S, V] plus one for every token an active slot
    emitted (ids [A, M] where take [A, M]), by the graphs' own ``AddTokens`` rule.

    Only the emitted cells are touched: the [A, M] tokens are laid out per slot first ([S, M],
    nothing taken elsewhere). Scattering the chain's updated [A, V] rows back instead costs a
    ScatterElements of A·V elements, about 1.5 ms a step on a CPU for a 49k vocabulary.
    """
    graph = model.graph
    ids.dtype = ir.DataType.INT64
    taken = _op(graph, "Cast", [take], "counts_take_active", to=ir.DataType.INT32)
    taken.dtype = ir.DataType.INT32
    at = per_slot(graph, positions, ids, None, "counts_ids")
    slot_take = _op(
        graph,
        "Cast",
        [per_slot(graph, positions, taken, None, "counts_take")],
        "counts_take",
        to=ir.DataType.BOOL,
    )
    proto = next(p for p in sampler_functions() if p.name == ADD_TOKENS)
    model.functions.setdefault((proto.domain, proto.name, ""), ir.serde.deserialize_function(proto))
    node = ir.node(ADD_TOKENS, [counts, at, slot_take], domain=DOMAIN, name="sampler/counts_out")
    graph.append(node)
    node.outputs[0].dtype = ir.DataType.INT32
    return node.outputs[0]
