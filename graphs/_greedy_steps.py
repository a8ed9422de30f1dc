"""The branching chain's shortcuts for greedy rows: a greedy row takes the argmax, so what the
chain would compute for it only to throw away is not computed. Its filters are off
(:func:`drawn_filters`), its draw is the cheap one (:func:`greedy_rows_skip_draw`), and a step
whose rows are all greedy skips the selection after the logit bias, the mask and the penalties
(:func:`plain_condition`, :func:`select_unless_plain`). The static chain (CUDA graphs) takes none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper

from onnxsample.graphs._common import GREEDY_BELOW, T_FLOAT, T_INT64
from onnxsample.graphs.library import FunctionBody

if TYPE_CHECKING:
    from onnxsample.graphs.chain_config import ChainConfig

__all__ = [
    "drawn_filters",
    "greedy_rows_skip_draw",
    "plain_condition",
    "scalar",
    "select_unless_plain",
]


def greedy_rows_skip_draw(body: FunctionBody, floor: str, whole_rows: str) -> tuple[str, str]:
    """(floor, whole_rows) for ``Dist``: +inf and false on the greedy rows (temperature < 1e-5)."""
    body.op("Constant", [], ["draw_greedy_below"], value=scalar("draw_greedy_below", GREEDY_BELOW))
    body.op("Constant", [], ["draw_columns"], value=helper.make_tensor("c", T_INT64, [1], [1]))
    body.op("Constant", [], ["draw_skip_floor"], value=scalar("draw_skip_floor", np.inf))
    body.op("Less", ["temperature", "draw_greedy_below"], ["draw_greedy"])
    body.op("Unsqueeze", ["draw_greedy", "draw_columns"], ["draw_greedy_rows"])
    body.op("Where", ["draw_greedy_rows", "draw_skip_floor", floor], ["draw_floor"])
    body.op("Not", ["draw_greedy_rows"], ["draw_sampled_rows"])
    body.op("And", [whole_rows, "draw_sampled_rows"], ["draw_whole_rows"])
    return "draw_floor", "draw_whole_rows"


# A filter's parameter that turns it off: top-k 0, top-p 1, min-p 0, typical-p 1.
_FILTERS_OFF = {"top_k": (T_INT64, 0), "top_p": (T_FLOAT, 1.0), "min_p": (T_FLOAT, 0.0),
                "typical_p": (T_FLOAT, 1.0)}  # fmt: skip


def drawn_filters(body: FunctionBody, config: ChainConfig) -> dict[str, str]:
    """The branching chain's filter parameters with the greedy rows' (temperature < 1e-5) turned
    off, by name: a greedy row takes the argmax and throws its filters' work away, so a batch of
    greedy rows never sorts, widens or scans a row for a filter (nor, ``CandidatesDrawn``, takes
    the candidates). Empty where that cannot hold: the static chain, a chain without a draw or a
    temperature, and one whose optional outputs (probs, candidates) read the filters' results."""
    if (
        config.static
        or not config.has("dist")
        or not config.has("temperature")
        or config.output_probs
        or config.output_candidates
    ):
        return {}
    below = scalar("filters_greedy_below", GREEDY_BELOW)
    body.op("Constant", [], ["filters_greedy_below"], value=below)
    body.op("Less", ["temperature", "filters_greedy_below"], ["filters_greedy"])
    names = {}
    for name, (kind, off) in _FILTERS_OFF.items():
        if config.has(name):
            body.op(
                "Constant", [], [f"{name}_off"], value=helper.make_tensor("off", kind, [], [off])
            )
            body.op("Where", ["filters_greedy", f"{name}_off", name], [f"{name}_drawn"])
            names[name] = f"{name}_drawn"
    return names


def plain_condition(body: FunctionBody, config: ChainConfig) -> str | None:
    """BOOL[1] ``plain``: every row of the step is greedy (t < 1e-5), so every row takes the argmax
    of its transformed logits (bias, mask, penalties). The branching chain then skips the rest of
    the selection: the temperature's pass, the filters' and the draw's checks and copies.

    None where a row always draws (a draw without a temperature) or never does (no draw: the
    chain is the argmax already), or where the selection must run (the static chain; probs and
    candidates, which read the filters' kept set).
    """
    if config.static or config.output_probs or config.output_candidates:
        return None
    if not config.has("dist") or not config.has("temperature"):
        return None
    body.call("AllGreedy", ["temperature"], ["plain"])
    return "plain"


def select_unless_plain(
    chain: FunctionBody, plain: str, selection: FunctionBody, selected: str, z: str
) -> FunctionBody:
    """``token`` = the argmax of the transformed logits `z` where `plain`, else the `selected`
    token of `selection`: an ``If`` in `chain`, which is returned.

    On a plain step the selection's token is that argmax too: every row's temperature divides by
    1, which leaves a float as it is, and every row takes its greedy token. The plain branch keeps
    ``FiniteRows``' rule where a transform may have left a row with no finite logit or with +inf
    (then token 0, or the first of the clamped maxima), without copying the rows where no row
    needs it (``FiniteArgMax``); untransformed logits (`z` is x, sanitized) have
    neither, and the argmax of a row of −inf is token 0 already. The selection's unread constants
    are left out (a branch's unused initializer is one ONNX Runtime warns of)."""
    token = helper.make_tensor_value_info
    plain_body = FunctionBody()
    if z == "x":
        plain_body.call("RowArgMax", ["x"], ["plain_token"])
    else:
        plain_body.call("RowMax", [z], ["plain_max"])
        plain_body.call("FiniteArgMax", [z, "plain_max"], ["plain_token"])
    plain_graph = helper.make_graph(
        plain_body.nodes, "plain", [], [token("plain_token", T_INT64, None)]
    )
    read = {name for node in selection.nodes for name in node.input} | {selected}
    nodes = [n for n in selection.nodes if n.op_type != "Constant" or n.output[0] in read]
    selection_graph = helper.make_graph(nodes, "selection", [], [token(selected, T_INT64, None)])
    chain.op("If", [plain], ["token"], then_branch=plain_graph, else_branch=selection_graph)
    return chain


def scalar(name: str, value: float) -> onnx.TensorProto:
    return helper.make_tensor(name, T_FLOAT, [], [value])
