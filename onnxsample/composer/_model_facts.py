"""Facts about an exported model that the composer needs: its logits, vocabulary, KV head size,
and whether it is free of the names the composer adds."""

from __future__ import annotations

import json
from pathlib import Path

import onnx_ir as ir

from onnxsample.errors import ModelError
from onnxsample.graphs.chain import DOMAIN
from onnxsample.metadata import composed_metadata

_PREFIX = "sampler."


def logits_output(model: ir.Model) -> ir.Value:
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


def vocab_size(logits: ir.Value) -> int:
    vocab = logits.shape[2]
    if not isinstance(vocab, int):
        raise ModelError(f"'logits' must have a fixed vocabulary size, got dimension {vocab!r}")
    return vocab


def fix_constant_shapes(model: ir.Model) -> None:
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


def check_names(model: ir.Model) -> None:
    """Refuse models that already use the names or the function domain the composer adds."""
    done = composed_metadata(model)
    if done is not None:
        chain = str(done.chain) or "greedy"
        raise ModelError(f"the model is composed already (sampler chain {chain})")
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


ATTENTION_KEY = "onnxsample.attention"  # written by the exporter (exporters._exact_attention)


def exact_positions(model: ir.Model) -> bool:
    """Whether a position's logits do not depend on how many positions a call computes: an
    export with ``--attention exact`` (its metadata says ``onnxsample.attention: exact``)."""
    return model.metadata_props.get(ATTENTION_KEY) == "exact"


def shared_kv(model: ir.Model) -> bool:
    """Whether the decoder reads each row's length from the attention mask and writes new keys
    and values in place, so one preallocated buffer per layer serves as past and present:
    GroupQueryAttention graphs and exact-attention exports."""
    if exact_positions(model):
        return True
    return any(n.op_type == "GroupQueryAttention" for n in model.graph.all_nodes())


def kv_head_size(model: ir.Model, source: Path) -> int | None:
    """The KV cache's head size, from the past inputs' shape or, when symbolic, genai's config."""
    for value in model.graph.inputs:
        if (
            value.name.startswith("past_key_values.")
            and value.shape is not None
            and len(value.shape) == 4
        ):
            size = value.shape[3]
            return size if isinstance(size, int) else genai_head_size(source)
    return None


def genai_head_size(source: Path) -> int | None:
    """KV head size from onnxruntime-genai's config, for graphs whose cache dims are symbolic."""
    config = source.parent / "genai_config.json"
    if not config.is_file():
        return None
    try:
        return int(json.loads(config.read_text())["model"]["decoder"]["head_size"])
    except (ValueError, KeyError, TypeError):
        return None
