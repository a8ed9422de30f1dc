"""Assemble the sampler functions into one ``SamplerChain`` function for a given configuration.

The chain function takes the logits (padded rows, or rows already gathered per slot) and the
``sampler.*`` inputs without their ``sampler.`` prefix, and returns the contract's outputs. Only the
inputs the configured samplers read are present. A graph without ``dist`` decodes greedily.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from onnxsample.chain import SAMPLER_NAMES
from onnxsample.graphs._common import (
    DOMAIN,
    DOMAIN_VERSION,
    GREEDY_BELOW,
    T_BOOL,
    T_FLOAT,
    T_INT32,
    T_INT64,
)
from onnxsample.graphs.candidates import Candidates, Contained, Truncate
from onnxsample.graphs.dist import Dist, DistRows, InverseCdf, RowDraw
from onnxsample.graphs.logit_bias import LogitBias
from onnxsample.graphs.logprobs import Logprob, TopLogprobs
from onnxsample.graphs.mass import MassThreshold, PrefixThreshold
from onnxsample.graphs.min_p import MinP
from onnxsample.graphs.penalties import Penalties, UpdateCounts
from onnxsample.graphs.probs import FinalProbs
from onnxsample.graphs.sanitize import FiniteRows, RowMax, Sanitize
from onnxsample.graphs.speculative import (
    Accept,
    AddTokens,
    DraftCounts,
    DraftPositions,
    PositionRows,
)
from onnxsample.graphs.temperature import Greedy, GreedyRows, SelectGreedy, Temperature
from onnxsample.graphs.top_k import TopK
from onnxsample.graphs.top_p import NucleusFloor, TopP
from onnxsample.graphs.typical_p import TypicalP

CHAIN_FUNCTION = "SamplerChain"
PROMPT_FUNCTION = "PromptLogprobs"
PREFIX = "sampler."
CANONICAL_ORDER = SAMPLER_NAMES
_SCRIPTS = (
    Sanitize,
    RowMax,
    FiniteRows,
    LogitBias,
    Penalties,
    UpdateCounts,
    Temperature,
    Greedy,
    GreedyRows,
    SelectGreedy,
    Candidates,
    Contained,
    Truncate,
    TopK,
    NucleusFloor,
    PrefixThreshold,
    MassThreshold,
    TopP,
    MinP,
    TypicalP,
    InverseCdf,
    RowDraw,
    Dist,
    DistRows,
    Logprob,
    TopLogprobs,
    FinalProbs,
    AddTokens,
    DraftPositions,
    PositionRows,
    DraftCounts,
    Accept,
)
# Per-slot inputs of each sampler: (name without prefix, element type, trailing dims).
_SLOT = ("S",)
_ROW = ("S", "V")
_INPUTS = {
    "dist": [("uniform", T_FLOAT, _SLOT)],
    "temperature": [("temperature", T_FLOAT, _SLOT)],
    "top_k": [("top_k", T_INT64, _SLOT)],
    "top_p": [("top_p", T_FLOAT, _SLOT)],
    "min_p": [("min_p", T_FLOAT, _SLOT)],
    "typical_p": [("typical_p", T_FLOAT, _SLOT)],
    "penalties": [
        ("repetition_penalty", T_FLOAT, _SLOT),
        ("presence_penalty", T_FLOAT, _SLOT),
        ("frequency_penalty", T_FLOAT, _SLOT),
    ],
    "logit_bias": [("bias_ids", T_INT64, ("S", "NB")), ("bias_values", T_FLOAT, ("S", "NB"))],
}
_STATE = [("prompt_mask", T_BOOL, _ROW), ("output_counts", T_INT32, _ROW)]


@dataclass(frozen=True)
class ChainConfig:
    """What one sampler graph contains. ``samplers`` is in canonical order; ``logit_bias`` is only
    effective with ``max_bias`` > 0 (its table has ``max_bias`` entries per slot)."""

    samplers: tuple[str, ...]
    top_logprobs: int = 0
    max_bias: int = 0
    output_probs: bool = False
    output_candidates: int = 0
    gather_rows: bool = True

    def has(self, name: str) -> bool:
        if name == "logit_bias":
            return name in self.samplers and self.max_bias > 0
        return name in self.samplers


def chain_inputs(config: ChainConfig) -> list[tuple[str, int, tuple[str, ...]]]:
    """The graph inputs after ``logits``, in contract order: (full name, element type, dims)."""
    found = [(PREFIX + "row_index", T_INT64, _SLOT)]
    for name in ("dist", "temperature", "top_k", "top_p", "min_p", "typical_p", "penalties"):
        if config.has(name):
            found += [(PREFIX + n, t, d) for n, t, d in _INPUTS[name]]
    if config.has("logit_bias"):
        found += [(PREFIX + n, t, d) for n, t, d in _INPUTS["logit_bias"]]
    if config.has("penalties"):
        found += [(PREFIX + n, t, d) for n, t, d in _STATE]
    return found


def chain_outputs(config: ChainConfig) -> list[tuple[str, int, tuple[str, ...]]]:
    """The graph outputs, in contract order: (full name, element type, dims)."""
    found = [(PREFIX + "next_token", T_INT64, _SLOT), (PREFIX + "logprob", T_FLOAT, _SLOT)]
    if config.top_logprobs > 0:
        found += [
            (PREFIX + "top_logprob_ids", T_INT64, ("S", "L")),
            (PREFIX + "top_logprobs", T_FLOAT, ("S", "L")),
        ]
    if config.has("penalties"):
        found.append((PREFIX + "output_counts_out", T_INT32, _ROW))
    if config.output_probs:
        found.append((PREFIX + "probs", T_FLOAT, _ROW))
    if config.output_candidates > 0:
        found += [
            (PREFIX + "candidate_ids", T_INT64, ("S", "K")),
            (PREFIX + "candidate_logits", T_FLOAT, ("S", "K")),
        ]
    return found


@functools.cache
def _script_functions() -> tuple[bytes, ...]:
    protos = []
    for fn in _SCRIPTS:
        proto = fn.to_function_proto()
        del proto.opset_import[:]
        proto.opset_import.extend(_opsets())
        protos.append(proto.SerializeToString())
    return tuple(protos)


def _opsets() -> list[onnx.OperatorSetIdProto]:
    return [helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)]


def sampler_functions() -> list[onnx.FunctionProto]:
    """Every sampler function of the ``onnxsample`` domain (fresh copies)."""
    out = []
    for data in _script_functions():
        proto = onnx.FunctionProto()
        proto.ParseFromString(data)
        out.append(proto)
    return out


class _Body:
    """Collects the nodes of the chain function."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []

    def call(self, function: str, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        self.nodes.append(
            helper.make_node(function, list(inputs), list(outputs), domain=DOMAIN, name=function)
        )

    def op(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str], **attrs) -> None:
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), **attrs))

    def constant_int64(self, name: str, value: int) -> None:
        tensor = helper.make_tensor(name, T_INT64, [1], [value])
        self.op("Constant", [], [name], value=tensor)


def build_chain_function(config: ChainConfig) -> onnx.FunctionProto:
    """The ``onnxsample.SamplerChain`` function for ``config`` (inputs/outputs without prefix)."""
    body = _Body()
    if config.gather_rows:
        body.op("Gather", ["logits", "row_index"], ["rows"], axis=0)
    else:
        body.op("Identity", ["logits"], ["rows"])
    body.call("Sanitize", ["rows"], ["x", "x_max"])
    z = "x"
    if config.has("logit_bias"):
        body.call("LogitBias", [z, "bias_ids", "bias_values"], ["biased"])
        z = "biased"
    if config.has("penalties"):
        penalties = ["repetition_penalty", "presence_penalty", "frequency_penalty"]
        body.call("Penalties", [z, "prompt_mask", "output_counts", *penalties], ["penalised"])
        z = "penalised"
    if config.has("temperature"):
        body.call("Temperature", [z, "temperature"], ["scaled"])
        z = "scaled"
    z_max = "x_max"
    if z != "x":
        body.call("RowMax", [z], ["z_max"])
        z_max = "z_max"
    body.call("FiniteRows", [z, z_max], ["processed", "finite"])
    z = "processed"
    sampling = config.has("dist")
    if not sampling:
        body.call("Greedy", [z], ["greedy_token"])
    elif config.has("temperature"):
        body.call("GreedyRows", [z, "temperature"], ["greedy_token"])
    floors = [n for n in ("top_k", "top_p", "min_p") if config.has(n)]
    floor = "no_floor"
    body.op("Constant", [], [floor], value=helper.make_tensor(floor, T_FLOAT, [1, 1], [-np.inf]))
    if floors:
        body.call("Candidates", [z], ["candidates", "candidate_ids_all", "top"])
    if config.has("top_k"):
        body.call("TopK", [z, "candidates", "top_k"], ["floor_top_k"])
        floor = "floor_top_k"
    if config.has("top_p"):
        body.call("TopP", [z, "candidates", "top", floor, "top_p"], ["floor_top_p"])
        floor = "floor_top_p"
    if config.has("min_p"):
        body.call("MinP", ["top", floor, "min_p"], ["floor_min_p"])
        floor = "floor_min_p"
    draw_z = z
    if config.has("typical_p"):
        body.call("TypicalP", [z, floor, "typical_p"], ["typical", "typical_rows"])
        draw_z, whole_rows = "typical", "typical_rows"
    else:
        whole_rows = "no_whole_rows"
        flag = helper.make_tensor(whole_rows, T_BOOL, [1, 1], [False])
        body.op("Constant", [], [whole_rows], value=flag)
    kept = draw_z  # the kept set as logits (dropped tokens −inf), for the optional outputs
    if floors and (config.output_probs or config.output_candidates):
        body.call("Truncate", [draw_z, floor], ["kept"])
        kept = "kept"
    if sampling:
        if floors:
            draw_inputs = [draw_z, "candidates", "candidate_ids_all", "top", floor, whole_rows]
            body.call("Dist", [*draw_inputs, "uniform"], ["drawn_token"])
        else:
            body.call("DistRows", [draw_z, "uniform"], ["drawn_token"])
        if config.has("temperature"):
            body.call("SelectGreedy", ["temperature", "greedy_token", "drawn_token"], ["token"])
        else:
            body.op("Identity", ["drawn_token"], ["token"])
    else:
        body.op("Identity", ["greedy_token"], ["token"])
    outputs = ["next_token", "logprob"]
    body.op("Identity", ["token"], ["next_token"])
    body.call("Logprob", ["x", "x_max", "token"], ["logprob", "row_max", "log_total"])
    if config.top_logprobs > 0:
        body.constant_int64("top_count", config.top_logprobs)
        top_inputs = ["x", "row_max", "log_total", "top_count"]
        body.call("TopLogprobs", top_inputs, ["top_logprob_ids", "top_logprobs"])
        outputs += ["top_logprob_ids", "top_logprobs"]
    if config.has("penalties"):
        body.call("UpdateCounts", ["output_counts", "token", "row_index"], ["output_counts_out"])
        outputs.append("output_counts_out")
    if config.output_probs:
        if sampling and config.has("temperature"):
            eps = helper.make_tensor("greedy_below", T_FLOAT, [], [GREEDY_BELOW])
            body.op("Constant", [], ["greedy_below"], value=eps)
            body.op("Less", ["temperature", "greedy_below"], ["greedy_rows"])
        else:
            flag = helper.make_tensor("greedy_rows", T_BOOL, [], [not sampling])
            body.op("Constant", [], ["greedy_rows"], value=flag)
        body.call("FinalProbs", [kept, "token", "greedy_rows", "finite"], ["probs"])
        outputs.append("probs")
    if config.output_candidates > 0:
        body.constant_int64("candidate_count", config.output_candidates)
        body.op(
            "TopK",
            [kept, "candidate_count"],
            ["candidate_logits", "candidate_ids"],
            axis=1,
            largest=1,
            sorted=1,
        )
        outputs += ["candidate_ids", "candidate_logits"]
    inputs = ["logits"] + [name[len(PREFIX) :] for name, _, _ in chain_inputs(config)]
    return helper.make_function(
        DOMAIN,
        CHAIN_FUNCTION,
        inputs,
        outputs,
        body.nodes,
        _opsets(),
        doc_string=f"Sampler chain: {','.join(config.samplers) or 'greedy'}",
    )


# Prompt logprobs (echo): per prompt position p, a padded-logits row and the token that follows.
PROMPT_INPUTS = [
    (PREFIX + "prompt_rows", T_INT64, ("P",)),
    (PREFIX + "prompt_targets", T_INT64, ("P",)),
]


def prompt_outputs(top_logprobs: int) -> list[tuple[str, int, tuple[str, ...]]]:
    """The prompt-logprob outputs: each target's logprob, and with L > 0 the L most likely tokens."""
    found = [(PREFIX + "prompt_logprob", T_FLOAT, ("P",))]
    if top_logprobs > 0:
        found += [
            (PREFIX + "prompt_top_logprob_ids", T_INT64, ("P", "L")),
            (PREFIX + "prompt_top_logprobs", T_FLOAT, ("P", "L")),
        ]
    return found


def build_prompt_function(top_logprobs: int) -> onnx.FunctionProto:
    """``onnxsample.PromptLogprobs(rows: FLOAT[P, V], targets: INT64[P])``: the raw log-softmax of
    each row at its target token (what OpenAI's ``echo`` reports for prompt tokens), and with
    ``top_logprobs`` = L > 0 the L most likely tokens of each row and their logprobs. The same
    functions as the sampled token's logprob, so both agree bit for bit; P may be 0."""
    body = _Body()
    body.call("Sanitize", ["rows"], ["x", "x_max"])
    body.call("Logprob", ["x", "x_max", "targets"], ["logprob", "row_max", "log_total"])
    outputs = ["logprob"]
    if top_logprobs > 0:
        body.constant_int64("top_count", top_logprobs)
        top_inputs = ["x", "row_max", "log_total", "top_count"]
        body.call("TopLogprobs", top_inputs, ["top_logprob_ids", "top_logprobs"])
        outputs += ["top_logprob_ids", "top_logprobs"]
    return helper.make_function(
        DOMAIN,
        PROMPT_FUNCTION,
        ["rows", "targets"],
        outputs,
        body.nodes,
        _opsets(),
        doc_string="Logprobs of prompt tokens under the raw distribution",
    )


def used_functions(chain: onnx.FunctionProto) -> list[onnx.FunctionProto]:
    """Every sampler function ``chain`` calls, directly or through another one, callees first, and
    ``chain`` last."""
    library = {f.name: f for f in sampler_functions()}
    ordered: dict[str, onnx.FunctionProto] = {}

    def visit(nodes: Sequence[onnx.NodeProto]) -> None:
        for node in nodes:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g.node)
            if node.domain == DOMAIN and node.op_type in library and node.op_type not in ordered:
                visit(library[node.op_type].node)
                ordered[node.op_type] = library[node.op_type]

    visit(chain.node)
    return [*ordered.values(), chain]


def merge_functions(*groups: Sequence[onnx.FunctionProto]) -> list[onnx.FunctionProto]:
    """The functions of every group, each once (callees before their callers, as given)."""
    merged: dict[tuple[str, str], onnx.FunctionProto] = {}
    for group in groups:
        for function in group:
            merged.setdefault((function.domain, function.name), function)
    return list(merged.values())
