"""The standalone sampler model: ``logits`` in, the contract's ``sampler.*`` outputs out.

The model's graph holds one ``onnxsample.SamplerChain`` node whose function calls the sampler
functions of :mod:`onnxsample.graphs`, all carried in ``model.functions`` (domain ``onnxsample``).
Its value names are the composed graph's: ``logits`` then the ``sampler.*`` inputs, and the
``sampler.*`` outputs, so the composer can merge this graph after a model's logits (onnx-ir or
``onnx.compose.merge_models``). With ``gather_rows=False`` the ``logits`` input is already one row
per slot (``float32[S, V]``), for a composer that gathers the slots' hidden states before the LM head.

The output-count state (``sampler.prompt_mask``, ``sampler.output_counts`` in,
``sampler.output_counts_out`` out) exists only when the chain contains ``penalties``: nothing else
reads it, and a graph without it has no state to carry between steps.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import helper

from onnxsample.chain import TEMPERATURE_LAST, SamplerChain
from onnxsample.errors import InvalidParameter, check_count
from onnxsample.graphs._common import DOMAIN
from onnxsample.graphs.chain import CHAIN_FUNCTION, build_chain_function
from onnxsample.graphs.chain_config import ChainConfig, chain_inputs, chain_outputs
from onnxsample.graphs.library import for_vocabulary, merge_functions, used_functions
from onnxsample.graphs.prompt_logprobs import (
    PROMPT_FUNCTION,
    PROMPT_INPUTS,
    build_prompt_function,
    prompt_outputs,
)
from onnxsample.metadata import FALLBACK_MODEL, ComposedMetadata, encode_model
from onnxsample.params import MAX_TOP_LOGPROBS, SamplingParams, pack_sampling_params

logger = logging.getLogger(__name__)

__all__ = [
    "IR_VERSION",
    "OPSET",
    "build_sampler_model",
    "fallback_props",
    "sampler_config",
    "sampler_feeds",
]

OPSET = 18
IR_VERSION = 10  # opset 18 needs IR >= 8; onnxruntime 1.31 loads IR <= 11
ROWS_DIM = "rows"


# The most [slots, vocab] (or [slots, max_bias]) entries of a graph's per-slot state (penalty
# counts, masks, the bias table): 8 GB of int32, past which it would fill a machine's memory
# before its first step.
MAX_SLOT_ENTRIES = 2**31


def sampler_config(
    chain: SamplerChain | str,
    vocab_size: int,
    max_slots: int,
    *,
    top_logprobs: int = 0,
    max_bias: int = 0,
    output_probs: bool = False,
    output_candidates: int = 0,
    gather_rows: bool = True,
    static: bool = False,
    allowed_tokens: bool = False,
    counts_out: bool = True,
    logprobs_on_request: bool = False,
) -> ChainConfig:
    """Check the build options and return the graph configuration they describe."""
    chain = SamplerChain(chain)
    check_count("vocab_size", vocab_size, 1)
    check_count("max_slots", max_slots, 1)
    if max_slots * vocab_size > MAX_SLOT_ENTRIES:
        raise InvalidParameter(
            f"max_slots must be at most {MAX_SLOT_ENTRIES // vocab_size} for a vocabulary of "
            f"{vocab_size} (its per-slot state is [slots, vocab]), got {max_slots}"
        )
    check_count("top_logprobs", top_logprobs, 0, MAX_TOP_LOGPROBS)
    if top_logprobs > vocab_size:
        raise InvalidParameter(
            f"top_logprobs must be <= vocab_size ({vocab_size}), got {top_logprobs}"
        )
    check_count("max_bias", max_bias, 0)
    if max_slots * max_bias > MAX_SLOT_ENTRIES:
        raise InvalidParameter(
            f"max_bias must be at most {MAX_SLOT_ENTRIES // max_slots} for {max_slots} slots "
            f"(its table is [slots, max_bias]), got {max_bias}"
        )
    if max_bias > 0 and "logit_bias" not in chain:
        raise InvalidParameter(f"max_bias={max_bias} needs logit_bias in the chain {str(chain)!r}")
    check_count("output_candidates", output_candidates, 0, vocab_size)
    if "logit_bias" in chain and max_bias == 0:
        logger.info("max_bias=0: the logit_bias sampler has no table and is left out of the graph")
    return ChainConfig(
        samplers=chain.names,
        top_logprobs=int(top_logprobs),
        max_bias=int(max_bias),
        output_probs=bool(output_probs),
        output_candidates=int(output_candidates),
        gather_rows=bool(gather_rows),
        static=bool(static),
        allowed_tokens=bool(allowed_tokens),
        counts_out=bool(counts_out),
        logprobs_on_request=bool(logprobs_on_request),
    )


def build_sampler_model(
    chain: SamplerChain | str,
    vocab_size: int,
    max_slots: int,
    *,
    top_logprobs: int = 0,
    max_bias: int = 0,
    output_probs: bool = False,
    output_candidates: int = 0,
    gather_rows: bool = True,
    prompt_logprobs: bool = False,
    static: bool = False,
    allowed_tokens: bool = False,
    counts_out: bool = True,
    logprobs_on_request: bool = False,
) -> onnx.ModelProto:
    """Build the standalone sampler model for ``chain``.

    Inputs: ``logits`` float32[R, V] (R padded rows, row 0 the dummy row; float32[S, V] with
    ``gather_rows=False``), then the ``sampler.*`` inputs the chain reads. Outputs:
    ``sampler.next_token``, ``sampler.logprob``, then as configured ``sampler.top_logprob_ids`` /
    ``sampler.top_logprobs`` [S, L], ``sampler.output_counts_out`` (with ``penalties``, unless
    ``counts_out`` is false),
    ``sampler.probs`` [S, V], ``sampler.candidate_ids`` / ``sampler.candidate_logits`` [S, K].
    ``logit_bias`` takes effect only with ``max_bias`` > 0 (the table's width NB).

    With ``prompt_logprobs`` the model also takes ``sampler.prompt_rows`` / ``sampler.prompt_targets``
    int64[P] (rows of the padded logits and the token that follows each) and returns
    ``sampler.prompt_logprob`` float32[P] and, with L > 0, ``sampler.prompt_top_logprob_ids`` /
    ``sampler.prompt_top_logprobs`` [P, L] (it needs ``gather_rows``).

    ``static`` builds the chain without control flow or data-dependent shapes (the same tokens,
    kept sets and logprobs; see :class:`~onnxsample.graphs.ChainConfig`). ``allowed_tokens`` adds
    ``sampler.allowed`` bool[S, V] (or [S, 1] when no slot is constrained): tokens a slot may
    take (structured output). ``logprobs_on_request`` adds ``sampler.logprobs`` int64[S] (how
    many logprobs each slot asks for: −1 none; see :class:`~onnxsample.graphs.ChainConfig`).
    """
    if prompt_logprobs and not gather_rows:
        raise InvalidParameter("prompt_logprobs needs gather_rows: prompt rows index the logits")
    config = sampler_config(
        chain,
        vocab_size,
        max_slots,
        top_logprobs=top_logprobs,
        max_bias=max_bias,
        output_probs=output_probs,
        output_candidates=output_candidates,
        gather_rows=gather_rows,
        static=static,
        allowed_tokens=allowed_tokens,
        counts_out=counts_out,
        logprobs_on_request=logprobs_on_request,
    )
    vocab_size, max_slots = int(vocab_size), int(max_slots)  # a numpy integer's too
    top_logprobs, max_bias = config.top_logprobs, config.max_bias
    output_candidates = config.output_candidates
    dims = {
        "S": max_slots,
        "V": vocab_size,
        "NB": max_bias,
        "L": top_logprobs,
        "K": output_candidates,
    }
    logits_dims = [ROWS_DIM if gather_rows else max_slots, vocab_size]
    inputs = [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, logits_dims)]
    inputs += [
        helper.make_tensor_value_info(name, elem, [dims.get(d, d) for d in shape])
        for name, elem, shape in chain_inputs(config)
    ]
    outputs = [
        helper.make_tensor_value_info(name, elem, [dims[d] for d in shape])
        for name, elem, shape in chain_outputs(config)
    ]
    chain_fn = build_chain_function(config)
    nodes = [
        helper.make_node(
            CHAIN_FUNCTION,
            [v.name for v in inputs],
            [v.name for v in outputs],
            domain=DOMAIN,
            name="sampler",
        )
    ]
    functions = used_functions(chain_fn)
    if prompt_logprobs:
        inputs += [
            helper.make_tensor_value_info(name, elem, list(shape))
            for name, elem, shape in PROMPT_INPUTS
        ]
        prompt_out = prompt_outputs(top_logprobs)
        outputs += [
            helper.make_tensor_value_info(name, elem, [dims.get(d, d) for d in shape])
            for name, elem, shape in prompt_out
        ]
        rows, targets = (name for name, _, _ in PROMPT_INPUTS)
        nodes.append(helper.make_node("Gather", ["logits", rows], ["prompt_logits"], axis=0))
        nodes.append(
            helper.make_node(
                PROMPT_FUNCTION,
                ["prompt_logits", targets],
                [name for name, _, _ in prompt_out],
                domain=DOMAIN,
                name="prompt_logprobs",
            )
        )
        prompt_fn = build_prompt_function(top_logprobs, static=config.static)
        functions = merge_functions(functions, used_functions(prompt_fn))
    functions = for_vocabulary(functions, vocab_size)
    # A default, as the composed graph has: a host that packs none draws in the canonical order.
    defaults = [
        onnx.numpy_helper.from_array(np.zeros(max_slots, np.bool_), name=v.name)
        for v in inputs
        if v.name == TEMPERATURE_LAST
    ]
    graph = helper.make_graph(nodes, "onnxsample_sampler", inputs, outputs, initializer=defaults)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)],
        functions=functions,
        ir_version=IR_VERSION,
        producer_name="onnxsample",
        doc_string=f"onnxsample sampler: {','.join(config.samplers) or 'greedy'}",
    )
    meta = ComposedMetadata(
        chain=SamplerChain(s for s in config.samplers if config.has(s)),
        max_slots=max_slots,
        vocab_size=vocab_size,
        top_logprobs=top_logprobs,
        max_bias=max_bias,
        prompt_logprobs=prompt_logprobs,
        output_probs=config.output_probs,
        output_candidates=output_candidates,
        static=config.static,
        allowed_tokens=config.allowed_tokens,
    )
    helper.set_model_props(model, {**meta.to_props(), **fallback_props(meta)})
    logger.debug("built sampler model %s (S=%d, V=%d)", meta.chain, max_slots, vocab_size)
    return model


def fallback_props(meta: ComposedMetadata) -> dict[str, str]:
    """The metadata entry a static chain that flags slots carries (``FALLBACK_MODEL``): the
    branching chain of the same sampler for one slot's row, which the engine runs on the host for
    a flagged slot; nothing for any other chain."""
    options = dict(
        top_logprobs=meta.top_logprobs,
        max_bias=meta.max_bias,
        output_probs=meta.output_probs,
        output_candidates=meta.output_candidates,
        allowed_tokens=meta.allowed_tokens,
    )
    config = sampler_config(
        meta.chain, meta.vocab_size, meta.max_slots, static=meta.static, **options
    )
    if not config.flags_fallback:
        return {}
    branching = build_sampler_model(meta.chain, meta.vocab_size, 1, gather_rows=False, **options)
    return {FALLBACK_MODEL: encode_model(branching.SerializeToString())}


def sampler_feeds(
    chain: SamplerChain | str,
    logits: np.ndarray,
    slots: Sequence[SamplingParams | None],
    *,
    max_slots: int | None = None,
    uniform: np.ndarray | Sequence[float] | None = None,
    row_index: np.ndarray | Sequence[int] | None = None,
    prompt_mask: np.ndarray | None = None,
    output_counts: np.ndarray | None = None,
    max_bias: int = 0,
    prompt_rows: np.ndarray | Sequence[int] | None = None,
    prompt_targets: np.ndarray | Sequence[int] | None = None,
    allowed: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The inputs of the standalone sampler model for ``slots`` (``None`` = inactive slot).

    By default active slot s samples row s + 1 of ``logits`` (row 0 is the dummy row) and inactive
    slots row 0; the uniforms default to 0.5, the prompt mask to empty and the counts to zero.
    `prompt_rows` / `prompt_targets` feed a model built with ``prompt_logprobs`` (both or neither);
    `allowed` (bool [S, V], or [S, 1] for no constraint) one built with ``allowed_tokens``.
    """
    chain = SamplerChain(chain)
    try:
        logits = np.asarray(logits, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidParameter(f"logits must be numbers, float32 [rows, vocab]: {exc}") from None
    if logits.ndim != 2:
        raise InvalidParameter(f"logits must be [rows, vocab], got shape {logits.shape}")
    rows_given, vocab = logits.shape
    size = max_slots if max_slots is not None else len(slots)
    feeds = {"logits": logits}
    feeds.update(pack_sampling_params(slots, chain, size, max_bias=max_bias, vocab_size=vocab))
    if row_index is None:
        rows = np.zeros(size, dtype=np.int64)
        for s, params in enumerate(slots):
            rows[s] = 0 if params is None else s + 1
    else:
        rows = _per_slot("row_index", row_index, size, np.int64)
        if (rows < 0).any() or (rows >= rows_given).any():
            raise InvalidParameter(f"row_index must index the {rows_given} rows of logits")
    feeds["sampler.row_index"] = rows
    if "dist" in chain:
        u = (
            np.full(size, 0.5)
            if uniform is None
            else _per_slot("uniform", uniform, size, np.float64)
        )
        if not ((u >= 0) & (u <= 1)).all():
            raise InvalidParameter("uniform must be in [0, 1]")
        feeds["sampler.uniform"] = u.astype(np.float32)
    if "penalties" in chain:
        empty = np.zeros((size, vocab), dtype=bool)
        feeds["sampler.prompt_mask"] = (
            empty
            if prompt_mask is None
            else _per_slot("prompt_mask", prompt_mask, size, bool, vocab)
        )
        counts = (
            np.zeros((size, vocab), dtype=np.int32)
            if output_counts is None
            else _per_slot("output_counts", output_counts, size, np.int32, vocab)
        )
        feeds["sampler.output_counts"] = counts
    if (prompt_rows is None) != (prompt_targets is None):
        raise InvalidParameter("prompt_rows and prompt_targets go together")
    if prompt_rows is not None:
        feeds["sampler.prompt_rows"] = np.asarray(prompt_rows, dtype=np.int64).reshape(-1)
        feeds["sampler.prompt_targets"] = np.asarray(prompt_targets, dtype=np.int64).reshape(-1)
    if allowed is not None:
        feeds["sampler.allowed"] = np.asarray(allowed, dtype=bool)
    return feeds


def _per_slot(name: str, value, size: int, dtype, vocab: int | None = None) -> np.ndarray:
    """`value` as `dtype` [size] (or [size, vocab]), else InvalidParameter naming it."""
    shape = (size,) if vocab is None else (size, vocab)
    try:
        array = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise InvalidParameter(
            f"{name} must be {np.dtype(dtype).name} {list(shape)}: {exc}"
        ) from None
    if array.shape != shape:
        raise InvalidParameter(f"{name} must be {list(shape)}, got shape {array.shape}")
    return array


def sampler_session(
    chain: SamplerChain | str,
    vocab_size: int,
    max_slots: int,
    *,
    threads: int = 1,
    check: bool = True,
    **options,
):
    """The standalone sampler model in an ONNX Runtime CPU session (tests, benchmarks, host use).

    `options` are :func:`build_sampler_model`'s keywords; `check` runs the ONNX checker first.
    """
    import onnxruntime as ort

    model = build_sampler_model(chain, vocab_size, max_slots, **options)
    if check:
        onnx.checker.check_model(model, full_check=True)
    session_options = ort.SessionOptions()
    session_options.intra_op_num_threads = threads
    session_options.inter_op_num_threads = 1
    session_options.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(), session_options, providers=["CPUExecutionProvider"]
    )
