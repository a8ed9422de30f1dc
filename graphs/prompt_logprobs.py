"""Prompt logprobs (echo): the raw log-softmax of prompt rows at the tokens that follow them."""

from __future__ import annotations

import onnx
from onnx import helper

from onnxsample.graphs._common import DOMAIN, T_FLOAT, T_INT64
from onnxsample.graphs.chain_config import PREFIX
from onnxsample.graphs.library import FunctionBody, opsets

__all__ = ["PROMPT_FUNCTION", "PROMPT_INPUTS", "build_prompt_function", "prompt_outputs"]

PROMPT_FUNCTION = "PromptLogprobs"
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


def build_prompt_function(top_logprobs: int, static: bool = False) -> onnx.FunctionProto:
    """``onnxsample.PromptLogprobs(rows: FLOAT[P, V], targets: INT64[P])``: the raw log-softmax of
    each row at its target token (what OpenAI's ``echo`` reports for prompt tokens), and with
    ``top_logprobs`` = L > 0 the L most likely tokens of each row and their logprobs. The same
    functions as the sampled token's logprob, so both agree bit for bit; P may be 0. `static`
    builds it without control flow."""
    body = FunctionBody()
    if static:
        body.call("SanitizeStatic", ["rows"], ["x", "x_max", "x_argmax"])
    else:
        body.call("Sanitize", ["rows"], ["x", "x_max"])
    body.call("Logprob", ["x", "targets"], ["logprob", "logp"])
    outputs = ["logprob"]
    if top_logprobs > 0:
        body.constant_int64("top_count", top_logprobs)
        top_inputs = ["x", "logp", "top_count"]
        body.call("TopLogprobs", top_inputs, ["top_logprob_ids", "top_logprobs"])
        outputs += ["top_logprob_ids", "top_logprobs"]
    nodes = body.nodes if static else _when_asked(body.nodes, outputs, top_logprobs)
    return helper.make_function(
        DOMAIN,
        PROMPT_FUNCTION,
        ["rows", "targets"],
        outputs,
        nodes,
        opsets(),
        doc_string="Logprobs of prompt tokens under the raw distribution",
    )


def _when_asked(
    nodes: list[onnx.NodeProto], outputs: list[str], top_logprobs: int
) -> list[onnx.NodeProto]:
    """`nodes` in an ``If`` on P > 0, whose other branch returns the empty outputs: a decode step
    asks for no prompt row, and then skips the thirty-odd small ops over an empty row set."""
    types = {"logprob": T_FLOAT, "top_logprob_ids": T_INT64, "top_logprobs": T_FLOAT}
    dims = {"logprob": [0], "top_logprob_ids": [0, top_logprobs], "top_logprobs": [0, top_logprobs]}

    def graph(name: str, body: list[onnx.NodeProto], prefix: str) -> onnx.GraphProto:
        results = [helper.make_tensor_value_info(prefix + o, types[o], None) for o in outputs]
        return helper.make_graph(body, name, [], results)

    empty = [
        helper.make_node(
            "Constant",
            [],
            ["none_" + o],
            value=helper.make_tensor("none_" + o, types[o], dims[o], []),
        )
        for o in outputs
    ]
    # the asked branch's results renamed: the If node's outputs take the function's names
    asked = []
    for node in nodes:
        renamed = onnx.NodeProto()
        renamed.CopyFrom(node)
        renamed.output[:] = ["asked_" + o if o in outputs else o for o in node.output]
        asked.append(renamed)
    return [
        helper.make_node("Size", ["targets"], ["prompt_count"]),
        helper.make_node(
            "Constant", [], ["no_rows"], value=helper.make_tensor("n", T_INT64, [], [0])
        ),
        helper.make_node("Greater", ["prompt_count", "no_rows"], ["prompt_asked"]),
        helper.make_node(
            "If",
            ["prompt_asked"],
            outputs,
            then_branch=graph("asked", asked, "asked_"),
            else_branch=graph("none", empty, "none_"),
        ),
    ]
