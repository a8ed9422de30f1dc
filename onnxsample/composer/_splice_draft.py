"""Graph surgery for speculative decoding: score K + 1 positions per slot, keep what verifies.

With ``draft_tokens`` = K > 0 the composed graph takes each slot's draft (``sampler.draft_tokens``
[S, K], −1 past its end) and a uniform per draft position (``sampler.draft_uniform`` [S, K]). The
sampler chain then runs once per scored (slot, position) pair instead of once per slot: the pairs
are position 0 of every active slot and positions 1..k of a slot drafting k tokens, so a step
without drafts scores exactly the rows a non-speculative graph would. Each pair reads the padded
logits row ``row_index[slot] + position``, its slot's parameters, its own uniform and the penalty
counts with the drafts before it; :mod:`onnxsample.graphs.speculative` holds the rule that keeps a
draft and its proof that sampling stays exact.

A step in which no active slot drafts (every decode step of a run without speculation) skips
the verification: ``If`` nodes on :func:`drafting` give the LM head the active slots' own rows
(:func:`scored_rows`) and run the chain on those slots as they are, without the (slot, position)
pairs or the grid (:func:`verified`), so such a step costs about what a graph without draft
verification costs.

Position 0's results keep the contract's names (``sampler.next_token``, ``sampler.logprob``, ...);
positions 1..K come back as ``sampler.draft_next_token`` etc. [S, K], with ``sampler.accepted``
[S]: the slot emits ``next_token`` and then ``draft_next_token[:accepted]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxsample.composer._ir_build import const as _const
from onnxsample.composer._ir_build import filled_like, scatter_rows, trailing_shape
from onnxsample.composer._ir_build import op as _op
from onnxsample.graphs._batch import AnyRow
from onnxsample.graphs._common import DOMAIN
from onnxsample.graphs.library import sampler_functions
from onnxsample.graphs.speculative import (
    Accept,
    AddTokens,
    DraftCounts,
    DraftPositions,
    PositionRows,
)

DRAFT_TOKENS, DRAFT_UNIFORM = "sampler.draft_tokens", "sampler.draft_uniform"
ALLOWED, DRAFT_ALLOWED = "sampler.allowed", "sampler.draft_allowed"
ACCEPTED = "sampler.accepted"
# Outputs per drafted position, after the contract's per-slot output of the same result.
DRAFT_OUTPUTS = {
    "sampler.next_token": "sampler.draft_next_token",
    "sampler.logprob": "sampler.draft_logprob",
    "sampler.top_logprob_ids": "sampler.draft_top_logprob_ids",
    "sampler.top_logprobs": "sampler.draft_top_logprobs",
}
DOCS = {
    DRAFT_TOKENS: "int64[S, K]: the slot's draft, fed as input positions 1..k after its last token "
    "(row_index + i is position i's row); -1 ends it; all -1 = no draft",
    DRAFT_UNIFORM: "float32[S, K]: the U(0,1) draws of positions 1..K (position 0 takes "
    "sampler.uniform), from the slot's own generator",
    DRAFT_ALLOWED: "bool[S, K, V]: the tokens allowed at positions 1..K (structured output; "
    "position 0 takes sampler.allowed); [S, K, 1] all true when no slot is constrained",
    ACCEPTED: "int64[S]: drafts kept; the slot emits next_token, then draft_next_token[:accepted]",
    "sampler.draft_next_token": "int64[S, K]: the token sampled at position i + 1 (-1 if unscored)",
    "sampler.draft_logprob": "float32[S, K]: its logprob under the raw distribution",
    "sampler.draft_top_logprob_ids": "int64[S, K, L]: position i + 1's most likely tokens",
    "sampler.draft_top_logprobs": "float32[S, K, L]: their logprobs",
}
# Per-slot inputs whose positions 1..K come in their own draft input.
_LATER = {"sampler.uniform": DRAFT_UNIFORM, ALLOWED: DRAFT_ALLOWED}
_FUNCTIONS = (AnyRow, AddTokens, DraftPositions, PositionRows, DraftCounts, Accept)


@dataclass
class Positions:
    """The scored (slot, position) pairs: `pairs` [R, 2], and per pair its active-slot index,
    its position and its padded logits row ([R] each)."""

    pairs: ir.Value
    slot: ir.Value
    position: ir.Value
    rows: ir.Value


def draft_inputs(
    draft_tokens: int, sampling: bool, allowed: bool = False
) -> list[tuple[str, ir.DataType, list]]:
    """The speculative inputs: (name, element type, dims)."""
    found = [(DRAFT_TOKENS, ir.DataType.INT64, ["S", draft_tokens])]
    if sampling:
        found.append((DRAFT_UNIFORM, ir.DataType.FLOAT, ["S", draft_tokens]))
    if allowed:
        found.append((DRAFT_ALLOWED, ir.DataType.BOOL, ["S", draft_tokens, "A"]))
    return found


def _call(graph: ir.Graph, function: str, inputs, outputs: int, tag: str) -> list[ir.Value]:
    node = ir.node(function, inputs, domain=DOMAIN, num_outputs=outputs, name=f"sampler/{tag}")
    for i, value in enumerate(node.outputs):
        value.name = f"sampler/{tag}_{i}" if outputs > 1 else f"sampler/{tag}"
    graph.append(node)
    return list(node.outputs)


def positions(
    graph: ir.Graph, drafts: ir.Value, row_index: ir.Value, tag: str = "draft"
) -> Positions:
    """The pairs to score for the active slots' `drafts` [A, K] and `row_index` [A]."""
    (pairs,) = _call(graph, "DraftPositions", [drafts, row_index], 1, f"{tag}_positions")
    slot, position, rows = _call(graph, "PositionRows", [pairs, row_index], 3, f"{tag}_rows")
    return Positions(pairs, slot, position, rows)


def scored_rows(graph: ir.Graph, when: ir.Value, picked: dict[str, ir.Value]) -> ir.Value:
    """INT64[R]: the padded rows the chain scores this step (the LM head's rows): every scored
    pair's where `when` (some slot drafts), else the active slots' own ``row_index``."""
    row_index = picked["sampler.row_index"]

    def pairs(branch: ir.Graph) -> list[ir.Value]:
        return [positions(branch, picked[DRAFT_TOKENS], row_index, "head_pairs").rows]

    def own(branch: ir.Graph) -> list[ir.Value]:
        return [_op(branch, "Identity", [row_index], "head_rows_own")]

    kinds = [ir.TensorType(ir.DataType.INT64)]
    then = _branch("sampler/head_rows_drafting", kinds, pairs)
    other = _branch("sampler/head_rows_undrafted", kinds, own)
    (rows,) = _if(graph, when, then, other, ["rows"], kinds, "head_index")
    return rows


def per_row(graph: ir.Graph, picked: dict[str, ir.Value], at: Positions) -> dict[str, ir.Value]:
    """The chain's inputs for the scored pairs, from the active slots' inputs `picked`."""
    drafts = picked[DRAFT_TOKENS]
    out = {}
    for name, value in picked.items():
        tag = name.removeprefix("sampler.")
        if name in (DRAFT_TOKENS, DRAFT_UNIFORM, DRAFT_ALLOWED):
            continue
        if name == "sampler.row_index":
            out[name] = at.rows
        elif _LATER.get(name) in picked:  # position 0's value, then 1..K's, per scored pair
            later = picked[_LATER[name]]
            axis = _const(graph, f"sampler/{tag}_axis", np.array([1]))
            first = _op(graph, "Unsqueeze", [value, axis], f"{tag}_0")
            every = _op(graph, "Concat", [first, later], f"{tag}_all", axis=1)
            out[name] = _op(graph, "GatherND", [every, at.pairs], f"{tag}_pairs")
        elif name == "sampler.output_counts":
            counts = [value, drafts, at.slot, at.position]
            (out[name],) = _call(graph, "DraftCounts", counts, 1, "draft_counts")
        else:
            out[name] = _op(graph, "Gather", [value, at.slot], f"{tag}_rows", axis=0)
    return out


def _grid(graph: ir.Graph, rows: ir.Value, at: Positions, size: ir.Value, fill, tag: str):
    """rows [R, ...] laid out as [A, K + 1, ...] by (slot, position); `fill` elsewhere."""
    tag = f"grid_{tag}"
    width = _op(
        graph,
        "Slice",
        [
            size,
            _const(graph, f"sampler/{tag}_width_from", np.array([1])),
            _const(graph, f"sampler/{tag}_width_to", np.array([2])),
        ],
        f"{tag}_width",
    )
    cells = _op(graph, "ReduceProd", [size], f"{tag}_cells", keepdims=1)
    flat = _op(
        graph,
        "Add",
        [_op(graph, "Mul", [at.slot, width], f"{tag}_start"), at.position],
        f"{tag}_cell",
    )
    base = filled_like(graph, cells, rows, fill, tag)
    laid = scatter_rows(graph, base, flat, rows, tag)
    shape = _op(
        graph, "Concat", [size, trailing_shape(graph, rows, f"{tag}_each")], f"{tag}_layout", axis=0
    )
    return _op(graph, "Reshape", [laid, shape], tag)


def accept(
    graph: ir.Graph,
    results: dict[str, ir.Value],
    picked: dict[str, ir.Value],
    at: Positions,
) -> tuple[dict[str, ir.Value], tuple[ir.Value, ir.Value]]:
    """From the chain's per-pair `results` (by output name) to per-active-slot outputs: position
    0 under the contract's names, positions 1..K under the draft names and ``sampler.accepted``;
    and the tokens each active slot emits (ids INT64[A, K + 1], emitted BOOL[A, K + 1]), which
    the penalty counts gain."""
    drafts, row_index = picked[DRAFT_TOKENS], picked["sampler.row_index"]
    size = _op(
        graph,
        "Concat",
        [
            _op(graph, "Shape", [drafts], "draft_slots", end=1),
            _op(
                graph,
                "Add",
                [
                    _op(graph, "Shape", [drafts], "draft_width", start=1, end=2),
                    _const(graph, "sampler/one_position", np.array([1])),
                ],
                "draft_positions_n",
            ),
        ],
        "draft_grid_size",
        axis=0,
    )
    zero = _const(graph, "sampler/position_zero", np.array(0))
    first = _const(graph, "sampler/position_first", np.array([1]))
    last = _const(graph, "sampler/position_last", np.array([2**62]))
    axis = _const(graph, "sampler/position_axis", np.array([1]))
    out: dict[str, ir.Value] = {}
    tokens = None
    for name, value in results.items():
        if name not in DRAFT_OUTPUTS:
            continue
        tag = name.removeprefix("sampler.")
        fill = -1 if name == "sampler.next_token" else 0
        grid = _grid(graph, value, at, size, fill, tag)
        if name == "sampler.next_token":
            tokens = grid
        out[name] = _op(graph, "Gather", [grid, zero], f"{tag}_first", axis=1)
        out[DRAFT_OUTPUTS[name]] = _op(graph, "Slice", [grid, first, last, axis], f"{tag}_drafts")
        out[name].dtype = out[DRAFT_OUTPUTS[name]].dtype = value.dtype
    assert tokens is not None
    accepted, emitted = _call(graph, "Accept", [tokens, drafts, row_index], 2, "accept")
    out[ACCEPTED] = accepted
    accepted.dtype = ir.DataType.INT64
    return out, (tokens, emitted)


def drafting(graph: ir.Graph, drafts: ir.Value) -> ir.Value:
    """BOOL[1]: whether some active slot drafts this step (its `drafts` [A, K] hold a token)."""
    zero = _const(graph, "sampler/draft_none", np.array(0))
    given = _op(graph, "GreaterOrEqual", [drafts, zero], "draft_given")
    (flag,) = _call(graph, "AnyRow", [given], 1, "drafting")
    return flag


def _branch(name: str, kinds: list[ir.TypeProtocol], build) -> ir.Graph:
    """An ``If`` branch called `name`, its nodes appended by `build` (a function of the branch's
    graph returning its outputs), the outputs typed `kinds`."""
    branch = ir.Graph([], [], nodes=[], name=name)
    for value, kind in zip(build(branch), kinds, strict=True):
        value.type = kind
        branch.outputs.append(value)
    return branch


def _if(graph: ir.Graph, cond: ir.Value, then: ir.Graph, other: ir.Graph, names, kinds, tag):
    """The outputs of ``If(cond, then, other)``, named ``sampler/<name>_<tag>`` and typed `kinds`."""
    node = ir.node(
        "If",
        [cond],
        {"then_branch": then, "else_branch": other},
        num_outputs=len(names),
        name=f"sampler/{tag}",
    )
    graph.append(node)
    for value, name, kind in zip(node.outputs, names, kinds, strict=True):
        value.name, value.type = f"sampler/{name.removeprefix('sampler.')}_{tag}", kind
    return list(node.outputs)


def verified(
    graph: ir.Graph,
    when: ir.Value,
    picked: dict[str, ir.Value],
    run_chain,
    specs: dict[str, tuple],
    draft_tokens: int,
    own_tokens,
) -> tuple[dict[str, ir.Value], tuple[ir.Value, ir.Value]]:
    """Where `when` (some slot drafts): the chain run on every scored (slot, position) pair and
    :func:`accept`'s outputs. Else the chain run on the active slots as they are (`picked`), every
    draft position unscored (``draft_next_token`` −1, the rest 0), nothing accepted, and the
    tokens `own_tokens` (graph, results, picked) says each slot emits. `run_chain` (graph, inputs
    by name, tag) appends the chain to a branch and returns its outputs by name; `specs` are
    their (type, shape). So a step without drafts lays out no pairs: no positions, per-pair
    gathers or draft counts."""
    unknown = set(specs) - set(DRAFT_OUTPUTS)
    assert not unknown, f"chain outputs without a draft layout: {sorted(unknown)}"
    names = [n for name in specs for n in (name, DRAFT_OUTPUTS[name])] + [ACCEPTED]
    int64, flag = ir.TensorType(ir.DataType.INT64), ir.TensorType(ir.DataType.BOOL)
    kinds = [specs[name][0] for name in specs for _ in (0, 1)] + [int64, int64, flag]

    def verify(branch: ir.Graph) -> list[ir.Value]:
        at = positions(branch, picked[DRAFT_TOKENS], picked["sampler.row_index"])
        results = run_chain(branch, per_row(branch, picked, at), "pairs_out")
        out, emitted = accept(branch, results, picked, at)
        return [out[name] for name in names] + list(emitted)

    def unverified(branch: ir.Graph) -> list[ir.Value]:
        results = run_chain(branch, picked, "active_out")
        out = []
        rows = _op(branch, "Shape", [picked["sampler.row_index"]], "unscored_slots")
        width = _const(branch, "sampler/unscored_width", np.array([draft_tokens]))
        lead = _op(branch, "Concat", [rows, width], "unscored_lead", axis=0)
        for name, value in results.items():
            tag = name.removeprefix("sampler.")
            out.append(value)
            fill = ir.tensor(
                np.array([-1 if name == "sampler.next_token" else 0], value.dtype.numpy())
            )
            shape = lead
            trailing = list(specs[name][1])[1:]
            if trailing:  # [A, L]: the top logprobs' L
                last = _const(branch, f"sampler/unscored_{tag}_width", np.array(trailing))
                shape = _op(branch, "Concat", [lead, last], f"unscored_{tag}_shape", axis=0)
            out.append(_op(branch, "ConstantOfShape", [shape], f"unscored_{tag}", value=fill))
        nothing = ir.tensor(np.array([0], dtype=np.int64))
        out.append(_op(branch, "ConstantOfShape", [rows], "unaccepted", value=nothing))
        return out + list(own_tokens(branch, results, picked))

    then = _branch("sampler/verified", kinds, verify)
    other = _branch("sampler/unverified", kinds, unverified)
    found = _if(graph, when, then, other, [*names, "emitted_ids", "emitted_take"], kinds, "step")
    return dict(zip(names, found, strict=False)), (found[-2], found[-1])


def add_functions(model: ir.Model) -> None:
    """The speculative functions into `model.functions`."""
    names = {script.name for script in _FUNCTIONS}
    for proto in sampler_functions():
        key = (proto.domain, proto.name, "")
        if proto.name in names and key not in model.functions:
            model.functions[key] = ir.serde.deserialize_function(proto)


def output_specs(specs: dict[str, tuple], draft_tokens: int, max_slots: int) -> dict[str, tuple]:
    """The composed graph's sampler outputs (name → (type, shape)): the contract's per-slot ones,
    then ``sampler.accepted`` and one draft output per per-slot result, [S, K, ...]."""
    out = dict(specs)
    out[ACCEPTED] = (ir.TensorType(ir.DataType.INT64), ir.Shape([max_slots]))
    for name, draft_name in DRAFT_OUTPUTS.items():
        if name in specs:
            kind, shape = specs[name]
            out[draft_name] = (kind, ir.Shape([max_slots, draft_tokens, *list(shape)[1:]]))
    return out
