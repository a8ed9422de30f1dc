"""The library of sampler functions: every ONNX local function of the ``onnxsample`` domain, the
opsets they import, a builder for the bodies of the functions assembled from them (the chain, the
prompt logprobs), and the closure of the functions a graph calls.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import onnx
from onnx import helper

from onnxsample.graphs._batch import AnyRow
from onnxsample.graphs._common import (
    DOMAIN,
    DOMAIN_VERSION,
    T_INT64,
)
from onnxsample.graphs._reproducible import in_name_order
from onnxsample.graphs._rows import (
    RowArgMax,
    RowBlocks,
    RowLog,
    RowMax,
    RowMaxStatic,
    RowTopStatic,
    RunningSum,
    row_blocks_for,
)
from onnxsample.graphs.allowed import Allowed, AllowedStatic, Constraining
from onnxsample.graphs.candidates import (
    Candidates,
    CandidatesDrawn,
    CandidatesStatic,
    Contained,
    ContainedIn,
    FallsShort,
    KeptWeights,
    TopKSliced,
    Truncate,
)
from onnxsample.graphs.dist import (
    Blocks,
    BlockSums,
    CandidateDraw,
    CountBefore,
    Dist,
    DistCutStatic,
    DistRows,
    DistRowsStatic,
    DrawnId,
    RowDraw,
    RowDrawStatic,
    WeightsDrawStatic,
    WeightSums,
    drawn_id_for,
)
from onnxsample.graphs.logit_bias import LogitBias
from onnxsample.graphs.logprobs import Logprob, TopLogprobs
from onnxsample.graphs.mass import (
    MassThreshold,
    PrefixFromSorted,
    PrefixThreshold,
)
from onnxsample.graphs.min_p import MinP
from onnxsample.graphs.penalties import (
    AdditivePenalty,
    AdditiveRule,
    Penalising,
    Penalties,
    PenaltiesStatic,
    Repeated,
    RepetitionRule,
    UpdateCounts,
)
from onnxsample.graphs.probs import FinalProbs
from onnxsample.graphs.sanitize import (
    ClampedTopStatic,
    FiniteArgMax,
    FiniteRows,
    FiniteRowsStatic,
    FixNonFinite,
    NaNToNegInf,
    OnlyToken0,
    Sanitize,
    SanitizeStatic,
)
from onnxsample.graphs.speculative import (
    Accept,
    AddTokens,
    DraftCounts,
    DraftPositions,
    PositionRows,
)
from onnxsample.graphs.temperature import (
    AllGreedy,
    Greedy,
    GreedyRows,
    Retemper,
    SelectGreedy,
    Temperature,
    TemperatureLast,
)
from onnxsample.graphs.top_k import TopK, TopKOff, TopKStatic
from onnxsample.graphs.top_p import (
    MassTotal,
    MassWeights,
    NucleusCut,
    NucleusFloor,
    NucleusFloorLong,
    NucleusMass,
    TopP,
    TopPStatic,
)
from onnxsample.graphs.typical_p import TypicalKey, TypicalP, TypicalPStatic

__all__ = ["FunctionBody", "merge_functions", "opsets", "sampler_functions", "used_functions"]

_SCRIPTS = (
    AnyRow,
    NaNToNegInf,
    FixNonFinite,
    Sanitize,
    SanitizeStatic,
    RowBlocks,
    RowMax,
    RowArgMax,
    RowTopStatic,
    RowMaxStatic,
    RowLog,
    OnlyToken0,
    FiniteArgMax,
    FiniteRows,
    FiniteRowsStatic,
    ClampedTopStatic,
    LogitBias,
    Constraining,
    Allowed,
    AllowedStatic,
    Repeated,
    AdditivePenalty,
    RepetitionRule,
    AdditiveRule,
    Penalising,
    Penalties,
    PenaltiesStatic,
    UpdateCounts,
    Temperature,
    TemperatureLast,
    Retemper,
    Greedy,
    GreedyRows,
    AllGreedy,
    SelectGreedy,
    TopKSliced,
    Candidates,
    CandidatesDrawn,
    CandidatesStatic,
    ContainedIn,
    Contained,
    FallsShort,
    Truncate,
    KeptWeights,
    TopKOff,
    TopK,
    TopKStatic,
    RunningSum,
    MassWeights,
    MassTotal,
    NucleusMass,
    NucleusCut,
    NucleusFloor,
    NucleusFloorLong,
    PrefixFromSorted,
    PrefixThreshold,
    MassThreshold,
    TopP,
    TopPStatic,
    MinP,
    TypicalKey,
    TypicalP,
    TypicalPStatic,
    CountBefore,
    Blocks,
    WeightSums,
    BlockSums,
    DrawnId,
    WeightsDrawStatic,
    RowDrawStatic,
    RowDraw,
    CandidateDraw,
    Dist,
    DistRows,
    DistRowsStatic,
    DistCutStatic,
    Logprob,
    TopLogprobs,
    FinalProbs,
    AddTokens,
    DraftPositions,
    PositionRows,
    DraftCounts,
    Accept,
)


@functools.cache
def _script_functions() -> tuple[bytes, ...]:
    protos = []
    for fn in _SCRIPTS:
        proto = in_name_order(fn.to_function_proto())  # the same bytes in every process
        del proto.opset_import[:]
        proto.opset_import.extend(opsets())
        protos.append(proto.SerializeToString())
    return tuple(protos)


def opsets() -> list[onnx.OperatorSetIdProto]:
    """The default domain at opset 18 and the ``onnxsample`` domain."""
    return [helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)]


def sampler_functions() -> list[onnx.FunctionProto]:
    """Every sampler function of the ``onnxsample`` domain (fresh copies)."""
    out = []
    for data in _script_functions():
        proto = onnx.FunctionProto()
        proto.ParseFromString(data)
        out.append(proto)
    return out


class FunctionBody:
    """Collects the nodes of a function assembled from sampler functions."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []

    def call(self, function: str, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        """A call of `function`, named after it (``Name_2``, … where it is called again)."""
        taken = sum(node.op_type == function for node in self.nodes)
        name = f"{function}_{taken + 1}" if taken else function
        self.nodes.append(
            helper.make_node(function, list(inputs), list(outputs), domain=DOMAIN, name=name)
        )

    def op(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str], **attrs) -> None:
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), **attrs))

    def constant_int64(self, name: str, value: int) -> None:
        tensor = helper.make_tensor(name, T_INT64, [1], [value])
        self.op("Constant", [], [name], value=tensor)


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


def for_vocabulary(functions: Sequence[onnx.FunctionProto], vocab: int) -> list[onnx.FunctionProto]:
    """`functions` for rows of `vocab` logits: the ones whose sizes follow from the vocabulary
    (:func:`~onnxsample.graphs._rows.RowBlocks`) with those sizes as constants, the rest as
    they are. Same signatures, same numbers, fewer ops a call."""
    specialised = {}
    for function in (row_blocks_for(vocab), drawn_id_for(vocab)):
        del function.opset_import[:]
        function.opset_import.extend(opsets())
        specialised[function.domain, function.name] = function
    return [specialised.get((f.domain, f.name), f) for f in functions]
