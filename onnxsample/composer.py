"""The composer: splice a sampler chain after an exported model's ``logits``.

The model's ``logits`` [B, T, V] are flattened to [B·T, V], one dummy row is prepended, and each slot
samples the row named by ``sampler.row_index`` (0 = the dummy row = an inactive slot). Where the graph
ends in an LM-head ``MatMul``, the gather moves before it: the slots' hidden states are gathered and
only S rows of logits are computed, so a long prefill no longer pays for B·T·V logits. The move is
checked numerically against the original graph and abandoned when the two disagree.

The samplers stay ONNX local functions in domain ``onnxsample`` (one ``SamplerChain`` node that Netron
opens into TopK/TopP/...), unless ``inline`` asks for plain ops. The result is one ``.onnx`` file; a
model over 2 GB keeps its weights in one ``<name>.data`` file beside it.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from onnxsample.chain import SamplerChain
from onnxsample.errors import InvalidParameter, ModelError
from onnxsample.graphs.chain import CHAIN_FUNCTION, DOMAIN
from onnxsample.loading import check_model, load_model
from onnxsample.params import pack_sampling_params
from onnxsample.sampler_model import IR_VERSION, OPSET, build_sampler_model

__all__ = [
    "COMPOSER_REVISION",
    "CONTRACT_VERSION",
    "GATHER_MODES",
    "STAGES",
    "compose",
    "composed_metadata",
]

log = logging.getLogger(__name__)

CONTRACT_VERSION = "1"
# Bumped when the composed graph's internals change (not its inputs and outputs), so that cached
# composed models are rebuilt. 2: the chain runs on the active slots only. 3: kv_layout metadata.
COMPOSER_REVISION = "3"
GATHER_MODES = ("auto", "lm_head", "logits")
_PREFIX = "sampler."
_META = "onnxsample."
_TWO_GB = 2**31 - 2**26  # protobuf's limit, with room for the graph itself
STAGES = ("read", "splice", "check-gather", "save")

_DOCS = {
    "sampler.row_index": "int64[S]: padded logits row each slot samples; 0 = inactive slot (dummy row), "
    "1 + b*T + t = batch row b, position t",
    "sampler.uniform": "float32[S]: one U(0,1) draw per slot from that sequence's own seeded generator",
    "sampler.temperature": "float32[S]: temperature; 0 = greedy for that slot (neutral 1)",
    "sampler.top_k": "int64[S]: keep the k largest logits, ties kept; 0 = off",
    "sampler.top_p": "float32[S]: nucleus mass over every surviving token (neutral 1)",
    "sampler.min_p": "float32[S]: drop tokens with p < min_p * p_max (neutral 0)",
    "sampler.typical_p": "float32[S]: locally typical mass (neutral 1)",
    "sampler.repetition_penalty": "float32[S]: HF/vLLM rule on prompt + output tokens (neutral 1)",
    "sampler.presence_penalty": "float32[S]: OpenAI rule on output tokens (neutral 0)",
    "sampler.frequency_penalty": "float32[S]: OpenAI rule on output tokens (neutral 0)",
    "sampler.bias_ids": "int64[S, NB]: logit-bias token ids; padding -1",
    "sampler.bias_values": "float32[S, NB]: logit-bias values in [-100, 100]; padding 0",
    "sampler.prompt_mask": "bool[S, V]: tokens present in the slot's prompt (set at prefill)",
    "sampler.output_counts": "int32[S, V]: state in: counts of the slot's generated tokens",
}

ProgressFn = Callable[[str], None]


def compose(
    model: str | Path,
    chain: SamplerChain | str | None = None,
    output: str | Path | None = None,
    *,
    max_slots: int = 8,
    top_logprobs: int = 0,
    max_bias: int = 0,
    output_probs: bool = False,
    output_candidates: int = 0,
    inline: bool = False,
    gather: str = "auto",
    progress: ProgressFn | None = None,
) -> Path:
    """Write model + sampler chain as one ONNX file and return its path.

    `model` is an export folder (its ``model.onnx``) or an ``.onnx`` file; `chain` defaults to the full
    canonical chain; `output` defaults to ``composed.onnx`` beside the model. `gather` is ``auto``
    (move the row gather before the LM head when the pattern is found and verified), ``lm_head``
    (require that) or ``logits`` (gather rows of the full logits).
    """
    stage = progress or (lambda _name: None)
    chain = SamplerChain.full() if chain is None else SamplerChain(chain)
    if gather not in GATHER_MODES:
        raise InvalidParameter(f"gather must be one of {', '.join(GATHER_MODES)}, got {gather!r}")
    source = _model_file(Path(model))
    out = Path(output) if output is not None else source.parent / "composed.onnx"
    out = out.expanduser().absolute()
    if out.resolve() == source.resolve():
        raise ModelError(
            f"the composed model would overwrite its source {source}; choose another -o"
        )
    if out.suffix != ".onnx":
        raise InvalidParameter(f"output must be an .onnx file, got {out.name}")

    stage("read")
    base = load_model(source)
    _fix_constant_shapes(base)
    _check_names(base)
    logits = _logits(base)
    vocab = _vocab_size(logits)
    options = dict(
        top_logprobs=top_logprobs,
        max_bias=max_bias,
        output_probs=output_probs,
        output_candidates=output_candidates,
    )
    stage("splice")
    composed, mode = None, "logits"
    if gather != "logits":
        ir.passes.common.ShapeInferencePass()(base)  # exports rarely carry intermediate shapes
    if gather != "logits" and _lm_head(logits) is not None:
        composed = _splice(base, chain, vocab, max_slots, options, lm_head=True)
        mode = "lm_head"
    elif gather == "lm_head":
        raise ModelError(
            f"{source.name}: logits do not come from an LM-head MatMul; use gather=logits"
        )
    stage("check-gather")
    if composed is not None:
        problem = _verify_lm_head(composed, chain, vocab, max_slots, max_bias, _head_size(source))
        if problem:
            if gather == "lm_head":
                raise ModelError(
                    f"moving the gather before the LM head changes the logits: {problem}"
                )
            log.warning("keeping the gather after the logits: %s", problem)
            composed, mode = None, "logits"
            base = load_model(source, check=False)
            _fix_constant_shapes(base)
    if composed is None:
        composed = _splice(base, chain, vocab, max_slots, options, lm_head=False)
    _finish(composed, chain, vocab, max_slots, options, mode, source, inline)

    stage("save")
    _save(composed, out)
    check_model(out)
    log.info("composed %s (%s, gather=%s) into %s", source.name, chain, mode, out)
    return out


def composed_metadata(model: onnx.ModelProto | ir.Model) -> dict[str, str]:
    """The ``onnxsample.*`` metadata a composed model carries (empty for any other model)."""
    props = (
        {p.key: p.value for p in model.metadata_props}
        if isinstance(model, onnx.ModelProto)
        else dict(model.metadata_props)
    )
    return {k[len(_META) :]: v for k, v in props.items() if k.startswith(_META)}


def _model_file(path: Path) -> Path:
    if path.is_dir():
        path = path / "model.onnx"
        if not path.is_file():
            raise ModelError(f"{path.parent} holds no model.onnx: export the model first")
    elif not path.exists():
        raise ModelError(f"no such model file or folder: {path}")
    elif path.suffix != ".onnx":
        raise ModelError(f"{path} is not an .onnx file or an export folder")
    return path


def _logits(model: ir.Model) -> ir.Value:
    found = [v for v in model.graph.outputs if v.name == "logits"]
    if not found:
        raise ModelError("the model has no 'logits' output, so there is nothing to sample from")
    logits = found[0]
    floats = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    if logits.dtype not in floats:
        raise ModelError(f"'logits' must be a float tensor, got {logits.dtype}")
    if logits.shape is None or len(logits.shape) != 3:
        raise ModelError(
            f"'logits' must have rank 3 [batch, sequence, vocab], got shape {logits.shape}"
        )
    return logits


def _vocab_size(logits: ir.Value) -> int:
    vocab = logits.shape[2]
    if not isinstance(vocab, int):
        raise ModelError(f"'logits' must have a fixed vocabulary size, got dimension {vocab!r}")
    return vocab


def _fix_constant_shapes(model: ir.Model) -> None:
    """A Constant's output has its tensor's shape; some exporters annotate it otherwise."""
    for node in model.graph.all_nodes():
        if (
            node.op_type == "Constant"
            and node.domain in ("", "ai.onnx")
            and "value" in node.attributes
        ):
            tensor = node.attributes["value"].value
            node.outputs[0].type = ir.TensorType(tensor.dtype)
            node.outputs[0].shape = ir.Shape(tensor.shape)


def _check_names(model: ir.Model) -> None:
    """Refuse models that already use the names or the function domain the composer adds."""
    done = composed_metadata(model)
    if done:
        raise ModelError(f"the model is composed already (sampler chain {done.get('chain', '?')})")
    values = [*model.graph.inputs, *model.graph.outputs, *model.graph.initializers.values()]
    values += [o for node in model.graph.all_nodes() for o in node.outputs]
    for value in values:
        name = value.name if isinstance(value, ir.Value) else value
        if name and (name.startswith(_PREFIX) or name.startswith("sampler/")):
            raise ModelError(
                f"the model already has a value named {name!r} (is it composed already?)"
            )
    if DOMAIN in model.opset_imports or any(k[0] == DOMAIN for k in model.functions):
        raise ModelError(
            f"the model already uses the function domain {DOMAIN!r} (is it composed already?)"
        )


def _lm_head(logits: ir.Value) -> ir.Node | None:
    """The LM-head node when `logits` = [Cast](MatMul(hidden, W)) or [Cast](MatMulNBits(hidden, ...)).

    Its first input is the hidden state [B, T, H]; the node is re-applied, with the same weight
    inputs, to the gathered rows.
    """
    node = logits.producer()
    if node is not None and node.op_type == "Cast" and node.domain in ("", "ai.onnx"):
        node = node.inputs[0].producer() if node.inputs[0] is not None else None
    if node is None or len(node.outputs) != 1:
        return None
    kind = (node.domain or "ai.onnx", node.op_type)
    if kind not in (("ai.onnx", "MatMul"), ("com.microsoft", "MatMulNBits")):
        return None
    hidden, *weights = node.inputs
    if hidden is None or hidden.shape is None or len(hidden.shape) != 3:
        return None
    if kind[1] == "MatMul":
        weight = weights[0]
        if (
            weight is None
            or weight.shape is None
            or len(weight.shape) != 2
            or weight.shape[1] != logits.shape[2]
        ):
            return None
    elif node.attributes.get_int("N") != logits.shape[2]:
        return None
    return node


def _const(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    value.shape, value.dtype = value.const_value.shape, value.const_value.dtype
    graph.register_initializer(value)
    return value


def _op(graph: ir.Graph, op_type: str, inputs, name: str, **attributes) -> ir.Value:
    node = ir.node(op_type, inputs, attributes or None, name=f"sampler/{name}")
    node.outputs[0].name = f"sampler/{name}"
    graph.append(node)
    return node.outputs[0]


def _padded_rows(graph: ir.Graph, rows: ir.Value, width: int, tag: str) -> ir.Value:
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


def _to_float(graph: ir.Graph, value: ir.Value, tag: str) -> ir.Value:
    if value.dtype == ir.DataType.FLOAT:
        return value
    return _op(graph, "Cast", [value], f"{tag}_float", to=ir.DataType.FLOAT)


def _active_slots(graph: ir.Graph, row_index: ir.Value) -> ir.Value:
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


def _scatter_slots(
    graph: ir.Graph,
    active: ir.Value,
    rows: ir.Value,
    base: ir.Value | None,
    slots: ir.Value,
    name: str,
) -> ir.Value:
    """rows [A, ...] written into [S, ...] at `active` (`slots` = [S]); the rest from `base`, or zeros."""
    if base is None:
        trailing = _op(
            graph,
            "Slice",
            [
                _op(graph, "Shape", [rows], f"{name}_shape"),
                _const(graph, f"sampler/{name}_from", np.array([1])),
                _const(graph, f"sampler/{name}_to", np.array([2**62])),
            ],
            f"{name}_trailing",
        )
        shape = _op(graph, "Concat", [slots, trailing], f"{name}_full_shape", axis=0)
        base = _op(
            graph,
            "ConstantOfShape",
            [shape],
            f"{name}_zeros",
            value=ir.tensor(np.zeros(1, dtype=rows.dtype.numpy())),
        )
    indices = _op(
        graph,
        "Unsqueeze",
        [active, _const(graph, f"sampler/{name}_axis", np.array([-1]))],
        f"{name}_indices",
    )
    return _op(graph, "ScatterND", [base, indices, rows], f"{name}_scattered")


def _splice(base: ir.Model, chain, vocab, max_slots, options, *, lm_head: bool) -> ir.Model:
    """Add the sampler inputs, the row selection and the chain node to `base` (in place).

    The chain runs on the active slots only (:func:`_active_slots`); its per-slot inputs are gathered
    to those slots and its outputs scattered back to all S, inactive slots keeping their state.
    """
    sampler = ir.from_proto(
        build_sampler_model(chain, vocab, max_slots, gather_rows=not lm_head, **options)
    )
    graph = base.graph
    logits = next(v for v in graph.outputs if v.name == "logits")
    new_inputs = {}
    for template in sampler.graph.inputs[1:]:
        value = ir.Value(name=template.name, shape=template.shape, type=template.type)
        value.doc_string = _DOCS.get(template.name, "")
        graph.inputs.append(value)
        new_inputs[value.name] = value
    active = _active_slots(graph, new_inputs["sampler.row_index"])
    slots = _op(graph, "Shape", [new_inputs["sampler.row_index"]], "slots")
    picked = {
        name: _op(graph, "Gather", [value, active], f"{name[len(_PREFIX) :]}_active", axis=0)
        for name, value in new_inputs.items()
    }
    if lm_head:
        head = _lm_head(logits)
        hidden = head.inputs[0]
        width = hidden.shape[2]
        padded = _padded_rows(graph, hidden, width if isinstance(width, int) else -1, "hidden")
        rows = _op(graph, "Gather", [padded, picked["sampler.row_index"]], "hidden_rows", axis=0)
        moved = ir.node(
            head.op_type,
            [rows, *head.inputs[1:]],
            {name: attr.value for name, attr in head.attributes.items()},
            domain=head.domain,
            name="sampler/lm_head",
        )
        moved.outputs[0].name = "sampler/lm_head"
        moved.outputs[0].dtype = head.outputs[0].dtype
        graph.append(moved)
        rows = _to_float(graph, moved.outputs[0], "logits")
    else:
        rows = _padded_rows(graph, _to_float(graph, logits, "logits"), vocab, "logits")
    chain_inputs = [rows] + [picked[v.name] for v in sampler.graph.inputs[1:]]
    node = ir.node(
        CHAIN_FUNCTION,
        chain_inputs,
        domain=DOMAIN,
        num_outputs=len(sampler.graph.outputs),
        name="sampler",
        doc_string=f"onnxsample sampler chain: {chain}",
    )
    graph.append(node)
    for value, template in zip(node.outputs, sampler.graph.outputs, strict=True):
        tag = template.name[len(_PREFIX) :]
        value.name, value.type = f"sampler/{tag}_active_out", template.type
        state = new_inputs.get("sampler.output_counts") if tag == "output_counts_out" else None
        out = _scatter_slots(graph, active, value, state, slots, tag)
        out.name, out.type, out.shape = template.name, template.type, template.shape
        graph.outputs.append(out)
    for key, function in sampler.functions.items():
        base.functions[key] = function
    base.opset_imports[DOMAIN] = 1
    return base


def _verify_lm_head(
    model: ir.Model, chain, vocab: int, max_slots: int, max_bias: int, head_size: int | None
) -> str:
    """Run the composed graph once with `logits` still an output; '' when the moved gather agrees."""
    import onnxruntime as ort

    feeds = _probe_feeds(model, chain, vocab, max_slots, max_bias, head_size)
    if feeds is None:
        return "the model has inputs the check cannot fill"
    _reconcile_versions(model)
    try:
        session = ort.InferenceSession(_serialized(model), providers=["CPUExecutionProvider"])
        logits, logprob = session.run(["logits", "sampler.logprob"], feeds)
        tokens = session.run(["sampler.next_token"], feeds)[0]
    except Exception as exc:  # an unexpected graph: keep the safe layout
        return f"the check run failed: {str(exc).splitlines()[0]}"
    flat = logits.reshape(-1, vocab).astype(np.float64)
    rows = feeds["sampler.row_index"]
    for slot, row in enumerate(rows):
        if row == 0:
            continue
        ref = flat[row - 1] - flat[row - 1].max()
        ref = ref[tokens[slot]] - np.log(np.exp(ref).sum())
        if not np.isclose(logprob[slot], ref, rtol=1e-3, atol=1e-3):
            return f"slot {slot}: logprob {logprob[slot]:.5f} vs {ref:.5f} from the full logits"
    return ""


def _head_size(source: Path) -> int | None:
    """KV head size from onnxruntime-genai's config, for graphs whose cache dims are symbolic."""
    config = source.parent / "genai_config.json"
    if not config.is_file():
        return None
    try:
        return int(json.loads(config.read_text())["model"]["decoder"]["head_size"])
    except (ValueError, KeyError, TypeError):
        return None


def _kv_head_size(model: ir.Model, source: Path) -> int | None:
    """The KV cache's head size, from the past inputs' shape or, when symbolic, genai's config."""
    for value in model.graph.inputs:
        if (
            value.name.startswith("past_key_values.")
            and value.shape is not None
            and len(value.shape) == 4
        ):
            size = value.shape[3]
            return size if isinstance(size, int) else _head_size(source)
    return None


def _probe_feeds(model: ir.Model, chain, vocab, max_slots, max_bias, head_size=None) -> dict | None:
    """Small inputs (batch 2, 3 tokens, empty KV cache) for a decoder in optimum's or genai's layout."""
    rng = np.random.default_rng(0)
    batch, seq = 2, 3
    # Neutral values for every slot: valid for any chain, greedy-only included.
    params = pack_sampling_params(
        [], chain, max_slots, max_bias=max_bias if "logit_bias" in chain else 0
    )
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.inputs:
        name, shape, dtype = value.name, value.shape, value.dtype.numpy()
        if name in params:
            feeds[name] = params[name]
        elif name == "sampler.row_index":
            rows = np.zeros(max_slots, dtype=np.int64)
            n = min(max_slots, batch * seq)
            rows[:n] = np.arange(1, n + 1)
            feeds[name] = rows
        elif name == "sampler.uniform":
            feeds[name] = rng.random(max_slots, dtype=np.float32)
        elif name.startswith(_PREFIX):
            feeds[name] = np.zeros([d for d in shape], dtype=dtype)
        elif name == "input_ids":
            feeds[name] = rng.integers(0, vocab, (batch, seq), dtype=np.int64)
        elif name == "attention_mask":
            feeds[name] = np.ones((batch, seq), dtype=dtype)
        elif name == "position_ids":
            feeds[name] = np.tile(np.arange(seq, dtype=dtype), (batch, 1))
        elif name.startswith("past_key_values.") and len(shape) == 4:
            heads, size = shape[1], shape[3] if isinstance(shape[3], int) else head_size
            if not isinstance(heads, int) or not isinstance(size, int):
                return None
            feeds[name] = np.zeros((batch, heads, 0, size), dtype=dtype)
        else:
            return None
    return feeds


def _serialized(model: ir.Model) -> bytes:
    ir.external_data.load_to_model(model)  # a session made from bytes cannot find external files
    proto = ir.to_proto(model)
    if proto.ByteSize() > _TWO_GB:
        raise ModelError("the model is too large to check in memory")
    return proto.SerializeToString()


def _reconcile_versions(model: ir.Model) -> None:
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


def _finish(
    model: ir.Model, chain, vocab, max_slots, options, mode, source: Path, inline: bool
) -> None:
    graph = model.graph
    graph.outputs[:] = [v for v in graph.outputs if v.name != "logits"]
    ir.passes.common.RemoveUnusedNodesPass()(model)
    _reconcile_versions(model)
    if inline:
        ir.passes.common.InlinePass()(model)
        model.opset_imports.pop(DOMAIN, None)
    in_graph = [n for n in chain.names if n != "logit_bias" or options["max_bias"] > 0]
    meta = {
        "chain": ",".join(in_graph),
        "max_slots": str(max_slots),
        "vocab_size": str(vocab),
        "top_logprobs": str(options["top_logprobs"]),
        "max_bias": str(options["max_bias"]),
        "output_probs": str(bool(options["output_probs"])).lower(),
        "output_candidates": str(options["output_candidates"]),
        "gather": mode,
        "inline": str(inline).lower(),
        "contract": CONTRACT_VERSION,
        "composer_revision": COMPOSER_REVISION,
        "source": source.name,
    }
    # "gqa": GroupQueryAttention reads per-row lengths from the mask, so one preallocated buffer per
    # layer serves as past and present (right padding); "concat": the cache grows by concatenation.
    gqa = any(n.op_type == "GroupQueryAttention" for n in graph.all_nodes())
    meta["kv_layout"] = "gqa" if gqa else "concat"
    head_size = _kv_head_size(model, source)
    if head_size:
        meta["kv_head_size"] = str(head_size)
    for package in ("onnxsample", "onnx", "onnxscript", "onnx-ir"):
        meta[f"version.{package}"] = importlib.metadata.version(package)
    model.metadata_props.update({_META + k: v for k, v in meta.items()})
    graph.doc_string = (
        graph.doc_string or ""
    ) + f"\nonnxsample: sampler chain {chain}, {max_slots} slots"


def _save(model: ir.Model, out: Path) -> None:
    """Write one file; weights over 2 GB go to one `<name>.data` file beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial")
    data_name = f"{out.name}.data"
    try:
        ir.external_data.load_to_model(model)
        total = sum(
            t.const_value.nbytes for t in model.graph.initializers.values() if t.const_value
        )
        if total > _TWO_GB:
            ir.save(model, tmp, external_data=data_name)
            shutil.move(tmp.with_name(data_name), out.with_name(data_name))
        else:
            ir.save(model, tmp)
            out.with_name(data_name).unlink(missing_ok=True)
        tmp.replace(out)
    except OSError as exc:
        raise ModelError(f"cannot write {out}: {exc.strerror or exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
