"""Graph surgery: splice the sampler chain after a model's logits (or before its LM head).

The model's ``logits`` [B, T, V] are flattened to [B·T, V], one dummy row is prepended, and each slot
samples the row named by ``sampler.row_index`` (0 = the dummy row = an inactive slot). With
``lm_head=True`` the slots' hidden states are gathered instead and the LM-head node is applied to
those rows only. The chain runs on the active slots only and its outputs are scattered back to all S
(those rows and that layout: :mod:`onnxsample.composer._rows`).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxsample.chain import TEMPERATURE_LAST
from onnxsample.composer import _rows as layout
from onnxsample.composer import _splice_draft as draft
from onnxsample.composer._ir_build import op as _op
from onnxsample.composer._model_facts import exact_positions
from onnxsample.composer.sampler_model import IR_VERSION, OPSET, build_sampler_model
from onnxsample.errors import ModelError
from onnxsample.graphs._common import DOMAIN
from onnxsample.graphs.chain import CHAIN_FUNCTION
from onnxsample.graphs.library import used_functions
from onnxsample.graphs.prompt_logprobs import (
    PROMPT_FUNCTION,
    PROMPT_INPUTS,
    build_prompt_function,
    prompt_outputs,
)

_PREFIX = "sampler."
LOGPROBS = "sampler.logprobs"
COUNTS, COUNTS_OUT = "sampler.output_counts", "sampler.output_counts_out"
SLOTS_DIM = "slots"  # a static chain's slot dimension

DOCS = {
    "sampler.row_index": "int64[S]: padded logits row each slot samples; 0 = inactive slot (dummy row), "
    "1 + b*T + t = batch row b, position t",
    "sampler.uniform": "float32[S]: one U(0,1) draw per slot from that sequence's own seeded generator",
    "sampler.temperature": "float32[S]: temperature; below 1e-5 = greedy for that slot (neutral 1)",
    TEMPERATURE_LAST: "bool[S]: the temperature after top-k, top-p, min-p and "
    "typical-p, where llama.cpp's default order puts it: the cuts read the untempered distribution "
    "(default false)",
    "sampler.top_k": "int64[S]: keep the k largest logits, ties kept; 0 = off",
    "sampler.top_p": "float32[S]: nucleus mass over every surviving token (neutral 1)",
    "sampler.min_p": "float32[S]: drop tokens with p < min_p * p_max (neutral 0)",
    "sampler.typical_p": "float32[S]: locally typical mass (neutral 1)",
    "sampler.repetition_penalty": "float32[S]: HF/vLLM rule on prompt + output tokens (neutral 1)",
    "sampler.presence_penalty": "float32[S]: OpenAI rule on output tokens (neutral 0)",
    "sampler.frequency_penalty": "float32[S]: OpenAI rule on output tokens (neutral 0)",
    "sampler.bias_ids": "int64[S, NB]: logit-bias token ids; padding -1",
    "sampler.bias_values": "float32[S, NB]: logit-bias values in [-100, 100]; padding 0",
    "sampler.allowed": "bool[S, V]: tokens the slot may take (structured output: a grammar's "
    "mask), applied after the logit bias; bool[S, 1] all true when no slot is constrained",
    "sampler.logprobs": "int64[S]: logprobs the slot asks for: -1 none, n >= 0 the chosen token's "
    "and the n most likely; a step where no slot asks computes none (default: every slot asks "
    "for all L)",
    "sampler.prompt_mask": "bool[S, V]: tokens present in the slot's prompt (set at prefill)",
    "sampler.output_counts": "int32[S, V]: state in: counts of the slot's generated tokens",
    "sampler.prompt_rows": "int64[P]: padded rows (1 + b*T + t) whose logprobs to report, for echo; "
    "P = 0 when no prompt logprobs are wanted",
    "sampler.prompt_targets": "int64[P]: the token whose logprob each prompt row reports (the next "
    "prompt token)",
    # outputs
    "sampler.next_token": "int64[S]: the token each slot drew (an inactive slot's is unused)",
    "sampler.logprob": "float32[S]: its logprob under the raw distribution (the model's logits)",
    "sampler.top_logprob_ids": "int64[S, L]: the slot's most likely tokens, raw distribution",
    "sampler.top_logprobs": "float32[S, L]: their logprobs",
    COUNTS_OUT: "int32[S, V]: state out: the counts with this step's tokens added (the next "
    "step's sampler.output_counts)",
    "sampler.probs": "float32[S, V]: the distribution the token was drawn from, after every "
    "filter and the temperature (llama-server's post_sampling_probs)",
    "sampler.candidate_ids": "int64[S, K]: the K most likely tokens after the chain's filters, "
    "most likely first (for a sampler on the host)",
    "sampler.candidate_logits": "float32[S, K]: their logits after the filters; -inf where a "
    "filter dropped the token",
    "sampler.fallback": "bool[S]: the slot's kept set may reach past the candidates (or it asks "
    "for typical-p): the host takes its token from the branching chain over its row",
    "sampler.fallback_logits": "float32[S, V]: the rows the host's fallback samples",
    "sampler.prompt_logprob": "float32[P]: the logprob of each prompt row's target token (echo)",
    "sampler.prompt_top_logprob_ids": "int64[P, L]: each prompt row's most likely tokens",
    "sampler.prompt_top_logprobs": "float32[P, L]: their logprobs",
}


def splice(
    base: ir.Model,
    chain,
    vocab,
    max_slots,
    options,
    *,
    head: ir.Node | None,
    prompt_logprobs: bool = False,
    draft_tokens: int = 0,
    static: bool = False,
) -> ir.Model:
    """Add the sampler inputs, the row selection and the chain node to `base` (in place); with
    `head` (the LM-head node, see :func:`onnxsample.composer._lm_head.find_lm_head`) the rows are gathered
    before it.

    The chain runs on the active slots only (:func:`layout.active_slots`); its per-slot inputs are gathered
    to those slots and its outputs scattered back to all S, inactive slots keeping their state.

    With `prompt_logprobs`, ``sampler.prompt_rows`` [P] name more rows (prompt positions) whose
    logprobs of ``sampler.prompt_targets`` are returned; before an LM head they take a head call
    of their own. P = 0 (every decode step) costs a few empty ops.

    With `draft_tokens` K > 0 the chain scores up to K + 1 positions per slot and verifies the
    slots' drafts (:mod:`onnxsample.composer._splice_draft`).

    With `static` the chain runs on every slot (an inactive one samples the dummy row and keeps its
    state), so no shape depends on the data: no ``NonZero``, no scatter back, nothing the host
    must read before the step ends (CUDA graphs). Its slot dimension is declared ``slots`` (at most
    S, the metadata's ``max_slots``): an engine binds the first rows only, as many as it runs.
    """
    sampler = ir.from_proto(
        build_sampler_model(
            chain,
            vocab,
            max_slots,
            gather_rows=head is None,
            static=static,
            counts_out=static,  # else the step's tokens are added to all S rows (layout.counted)
            logprobs_on_request=not static,
            **options,
        )
    )
    graph = base.graph
    logits = next(v for v in graph.outputs if v.name == "logits")
    new_inputs = {}
    for template in sampler.graph.inputs[1:]:
        shape = _slot_dim(template.shape, max_slots) if static else template.shape
        value = ir.Value(name=template.name, shape=shape, type=template.type)
        value.doc_string = DOCS.get(template.name, "")
        graph.inputs.append(value)
        new_inputs[value.name] = value
        if value.name == LOGPROBS:  # a default: a host that binds nothing gets every logprob
            every = np.full(max_slots, options.get("top_logprobs", 0), np.int64)
            value.const_value = ir.tensor(every, name=LOGPROBS)
            graph.register_initializer(value)
        if value.name == TEMPERATURE_LAST and not static:  # a default: the canonical order
            value.const_value = ir.tensor(np.zeros(max_slots, np.bool_), name=TEMPERATURE_LAST)
            graph.register_initializer(value)
    for name, elem, dims in (
        draft.draft_inputs(draft_tokens, "dist" in chain, options.get("allowed_tokens", False))
        if draft_tokens
        else []
    ):
        value = ir.Value(
            name=name, shape=ir.Shape([max_slots, *dims[1:]]), type=ir.TensorType(elem)
        )
        value.doc_string = draft.DOCS[name]
        graph.inputs.append(value)
        new_inputs[name] = value
    active = None if static else layout.active_slots(graph, new_inputs["sampler.row_index"])
    slots = _op(graph, "Shape", [new_inputs["sampler.row_index"]], "slots")
    positions = None if active is None else layout.slot_positions(graph, active, slots)
    picked = (
        dict(new_inputs)
        if active is None
        else {
            name: _op(graph, "Gather", [value, active], f"{name[len(_PREFIX) :]}_active", axis=0)
            for name, value in new_inputs.items()
        }
    )
    drafts, head_index = None, picked["sampler.row_index"]
    if draft_tokens:
        drafts = draft.drafting(graph, picked[draft.DRAFT_TOKENS])
        head_index = draft.scored_rows(graph, drafts, picked)
    prompt = _prompt_inputs(graph) if prompt_logprobs else None
    prompt_logits = None
    if head is not None:
        hidden = head.inputs[0]
        width = hidden.shape[2]
        padded = layout.padded_rows(
            graph, hidden, width if isinstance(width, int) else -1, "hidden"
        )
        exact = exact_positions(base)
        rows = layout.head_rows(graph, head, padded, head_index, exact, "slot")
        if prompt is not None:  # a head call of its own: P = 0 (every decode step) is an empty
            # GEMM, where slicing one call's [A + P, V] logits copied the slots' rows every step
            prompt_logits = layout.head_rows(graph, head, padded, prompt[0], exact, "prompt")
    else:
        rows = layout.padded_rows(graph, layout.to_float(graph, logits, "logits"), vocab, "logits")
        if prompt is not None:
            prompt_logits = _op(graph, "Gather", [rows, prompt[0]], "prompt_logits", axis=0)
    if static:  # the vocabulary for onnxsample.composer._static's folding of the chain's sizes
        for known in (rows, prompt_logits):
            if known is not None:
                known.type, known.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([None, vocab])
    specs = {t.name: (t.type, t.shape) for t in sampler.graph.outputs}

    def run_chain(into: ir.Graph, chain_in: dict[str, ir.Value], tag: str) -> dict:
        """The chain on `rows` and `chain_in`, appended to `into`: its outputs by name."""
        node = ir.node(
            CHAIN_FUNCTION,
            [rows] + [chain_in[v.name] for v in sampler.graph.inputs[1:]],
            domain=DOMAIN,
            num_outputs=len(sampler.graph.outputs),
            name="sampler",
            doc_string=f"onnxsample sampler chain: {chain}",
        )
        into.append(node)
        out = {}
        for value, template in zip(node.outputs, sampler.graph.outputs, strict=True):
            value.name = f"sampler/{template.name[len(_PREFIX) :]}_{tag}"
            value.type = template.type
            out[template.name] = value
        return out

    if drafts is not None:
        results, emitted = draft.verified(
            graph, drafts, picked, run_chain, specs, draft_tokens, layout.emitted
        )
        specs = draft.output_specs(specs, draft_tokens, max_slots)
        draft.add_functions(base)
    else:
        results = run_chain(graph, picked, "active_out")
        emitted = layout.emitted(graph, results, picked)
    if COUNTS in new_inputs and not static:
        specs = _with_counts_out(specs, new_inputs[COUNTS])
    for name, (kind, shape) in specs.items():
        tag = name[len(_PREFIX) :]
        if active is None:
            out = _op(graph, "Identity", [results[name]], tag)
        elif name == COUNTS_OUT:
            out = layout.counted(base, new_inputs[COUNTS], positions, *emitted)
        else:
            out = layout.per_slot(graph, positions, results[name], shape, tag)
        out.name, out.type = name, kind
        out.shape = _slot_dim(shape, max_slots) if static else shape
        out.doc_string = DOCS.get(name) or draft.DOCS.get(name, "")
        graph.outputs.append(out)
    for key, function in sampler.functions.items():
        base.functions[key] = function
    if prompt is not None:
        _prompt_logprobs(base, prompt_logits, prompt[1], options["top_logprobs"], static)
    base.opset_imports[DOMAIN] = 1
    return base


def _with_counts_out(specs: dict, counts: ir.Value) -> dict:
    """`specs` with ``sampler.output_counts_out`` (the shape and type of `counts`) after the
    logprobs, where a chain that returns the counts has it."""
    out, after = (
        {},
        "sampler.top_logprobs" if "sampler.top_logprobs" in specs else "sampler.logprob",
    )
    for name, spec in specs.items():
        out[name] = spec
        if name == after:
            out[COUNTS_OUT] = (counts.type, counts.shape)
    return out


def _slot_dim(shape: ir.Shape, max_slots: int) -> ir.Shape:
    """`shape` [S, ...] with its slot dimension named ``slots`` (a static chain's rows are
    independent: it runs on however many the engine binds, up to S)."""
    dims = list(shape)
    if dims and dims[0] == max_slots:
        dims[0] = ir.SymbolicDim(SLOTS_DIM)
    return ir.Shape(dims)


def _prompt_inputs(graph: ir.Graph) -> tuple[ir.Value, ir.Value]:
    values = []
    for name, elem, shape in PROMPT_INPUTS:
        value = ir.Value(name=name, shape=ir.Shape(shape), type=ir.TensorType(ir.DataType(elem)))
        value.doc_string = DOCS.get(name, "")
        graph.inputs.append(value)
        values.append(value)
    return values[0], values[1]


def _prompt_logprobs(
    model: ir.Model, rows: ir.Value, targets: ir.Value, top: int, static: bool
) -> None:
    """The PromptLogprobs node on the prompt rows' logits, its outputs and its functions."""
    function = build_prompt_function(top, static=static)
    for proto in used_functions(function):
        key = (proto.domain, proto.name, "")
        if key not in model.functions:
            model.functions[key] = ir.serde.deserialize_function(proto)
    specs = prompt_outputs(top)
    node = ir.node(
        PROMPT_FUNCTION,
        [rows, targets],
        domain=DOMAIN,
        num_outputs=len(specs),
        name="sampler/prompt_logprobs",
        doc_string="logprobs of the prompt tokens (echo)",
    )
    model.graph.append(node)
    dims = {"L": top}
    for value, (name, elem, shape) in zip(node.outputs, specs, strict=True):
        value.name = name
        value.type = ir.TensorType(ir.DataType(elem))
        value.shape = ir.Shape([dims.get(d, d) for d in shape])
        value.doc_string = DOCS.get(name, "")
        model.graph.outputs.append(value)


def reconcile_versions(model: ir.Model) -> None:
    """One IR version and one default-domain opset for the model and the sampler functions."""
    opset = model.opset_imports.get("", OPSET)
    if opset < OPSET:
        raise ModelError(
            f"the model uses opset {opset}; the samplers need opset >= {OPSET}: re-export it"
        )
    model.ir_version = max(model.ir_version, IR_VERSION)
    for key, function in model.functions.items():
        if key[0] == DOMAIN:
            function.opset_imports[""] = opset
