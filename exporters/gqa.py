"""Our own GroupQueryAttention layout for Llama-family decoders, written with onnx-ir.

One builder for every family of :mod:`.families`: the spec says which variations a model has
(biases on the packed QKV projection, an RMSNorm over each head of Q and K, sliding windows as
GroupQueryAttention's ``local_window_size``, partial rotary as a cos/sin cache narrower than the
head, a second rotary cache for local layers, scaled embeddings, post-attention and post-MLP norms,
GeGLU, the attention's scale and ``softcap``, and a soft-cap of the logits).

The graph (about 11 nodes per layer) is the layout onnxruntime-genai's builder writes: packed QKV
projection, rotary embedding inside ``com.microsoft.GroupQueryAttention``, ``SkipSimplified-
LayerNormalization`` for the residual adds, and one LM-head ``MatMul`` (or ``MatMulNBits``) at the end,
which the composer can move its row gather in front of.

Inputs and outputs (the graph contract of a ``gqa`` export)::

    input_ids                    int64 [batch, sequence]
    attention_mask               int64 [batch, total_sequence]   1 = real token, right-padded
    past_key_values.{i}.key      T [batch, kv_heads, past_sequence, head_dim]   (and .value)
    logits                       float32 [batch, sequence, vocab]
    present.{i}.key              T [batch, kv_heads, present_sequence, head_dim] (and .value)

Positions come from the mask (GroupQueryAttention's ``seqlens_k``), so there is no ``position_ids``.
A past buffer of fixed length can be bound as past and present at once (shared-buffer mode).

``attention="exact"`` computes attention from plain ops instead (:mod:`._exact_attention`): a
position's logits are then the same bits in a one-position step and inside a multi-position call
(speculative verification, echo), at some decode speed; its past must be a buffer at least as long
as the mask.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxsample.exporters._exact_attention import ATTENTION_KEY, ExactAttention
from onnxsample.exporters._gqa_graph import ExternalData, GraphBuilder, concat_weights
from onnxsample.exporters._gqa_layer import (
    ACTIVATIONS,
    MS,
    add_and_norm,
    attention_inputs,
    norm_weight,
    rms_norm,
)
from onnxsample.exporters._options import ATTENTIONS
from onnxsample.exporters.families import DecoderSpec

__all__ = ["ATTENTIONS", "OPSET", "build_gqa_model", "write_gqa"]

log = logging.getLogger(__name__)

OPSET = 21
IR_VERSION = 10


def build_gqa_model(
    spec: DecoderSpec,
    weights: dict[str, Any],
    *,
    precision: str = "fp32",
    accuracy_level: int = 0,
    attention: str = "gqa",
    compact: bool = True,
    consume: bool = False,
    external: ExternalData | None = None,
) -> ir.Model:
    """The decoder as an onnx-ir model (weights as in-memory initializers; save it with ir.save).

    `weights` maps ``embed``, ``norm``, ``lm_head`` and ``layers.{i}.{q,k,v,o,gate,up,down,
    attn_norm,ffn_norm}`` to float [N, K] arrays or quantised weights (see :mod:`._weights`), plus
    ``layers.{i}.{q,k,v}_bias`` with `spec.qkv_bias`, ``layers.{i}.{q,k}_norm`` with
    `spec.qk_norm` and ``layers.{i}.post_{attn,ffn}_norm`` with `spec.post_norms` (norm weights as
    the graph multiplies by them: Gemma's 1 + w already added).
    `precision` is the float type of activations, KV cache and float weights (``fp32``/``fp16``).
    `attention` is ``gqa`` (com.microsoft.GroupQueryAttention) or ``exact`` (see the module).
    `compact` stores float matrices in as few bytes as they need, rebuilt when the session loads
    (:mod:`._store`); off, every matrix is an initializer of its own (for a quantiser to find).
    `consume` takes each matrix out of `weights` as the graph stores it, so a source whose matrices
    the graph copies (float32 ones, transposed) is not held twice.
    `external` writes the initializers to the model's external data file as they are made (see
    :class:`~._gqa_graph.ExternalData`); save the model with ``ir.save(model, path)``.
    """
    g = GraphBuilder(precision, accuracy_level, compact, external)
    take = weights.pop if consume else weights.__getitem__
    T = g.dtype
    batch, seq, total = "batch_size", "sequence_length", "total_sequence_length"
    input_ids = ir.Value(
        name="input_ids", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([batch, seq])
    )
    mask = ir.Value(
        name="attention_mask", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([batch, total])
    )
    kv_shape = [batch, spec.num_kv_heads, "past_sequence_length", spec.head_dim]
    present_shape = [batch, spec.num_kv_heads, "present_sequence_length", spec.head_dim]
    inputs, outputs, pasts = [input_ids, mask], [], []
    for i in range(spec.num_layers):
        pair = []
        for kind in ("key", "value"):
            value = ir.Value(
                name=f"past_key_values.{i}.{kind}", type=ir.TensorType(T), shape=ir.Shape(kv_shape)
            )
            inputs.append(value)
            pair.append(value)
        pasts.append(pair)

    # Row lengths and the mask's width; for GroupQueryAttention: seqlens_k = real tokens - 1 per
    # row, total = mask width.
    one = g.const("const/one", np.array([1], np.int64))
    lengths = g.op("ReduceSum", [mask, one], "lengths", keepdims=0)
    width = g.op("Gather", [g.op("Shape", [mask], "mask_shape"), one], "mask_width", axis=0)
    if attention == "gqa":
        seqlens_k = g.op(
            "Cast",
            [g.op("Sub", [lengths, one], "lengths_minus_one")],
            "seqlens_k",
            to=ir.DataType.INT32,
        )
        total_len = g.op("Cast", [width], "total_sequence_length", to=ir.DataType.INT32)
    elif attention != "exact":
        raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
    # One (cos, sin) cache per rotary base the layers use (Gemma 3's local layers have their own).
    caches: dict[tuple[float, bool], tuple[ir.Value, ir.Value]] = {}
    for i in range(spec.num_layers):
        rope = spec.layer_rope(i)
        if rope not in caches:
            cos, sin = spec.rotary_caches(*rope)
            prefix = "rotary" if not caches else f"rotary_{len(caches)}"
            caches[rope] = (
                g.const(f"{prefix}.cos_cache", cos.astype(g.np_dtype)),
                g.const(f"{prefix}.sin_cache", sin.astype(g.np_dtype)),
            )

    exact = None
    if attention == "exact":
        exact = ExactAttention(g, spec, input_ids, lengths, width)
    hidden = g.embedding(input_ids, take("embed"), "embed", "model.embed_tokens")
    if spec.embed_scale is not None:  # transformers multiplies in the embedding's own type
        scale = g.const("embed.scale", np.array(spec.embed_scale, g.np_dtype))
        hidden = g.op("Mul", [hidden, scale], "embed_scaled")
    if exact is not None:  # never one row in a linear layer (see the module)
        hidden = exact.padded(hidden, "embed_rows")
    eps = float(spec.rms_norm_eps)
    # Gemma's residual stream leaves fp16's range (Gemma 3 270M passes 65504 by its 8th layer):
    # in an fp16 export it is kept in float32, the post-norms writing float32 into it and the
    # pre-norms reading it back to fp16 (SimplifiedLayerNormalization takes the two types).
    wide = spec.post_norms and T == ir.DataType.FLOAT16
    residual = g.op("Cast", [hidden], "embed_fp32", to=ir.DataType.FLOAT) if wide else hidden
    x = g.op(
        "SimplifiedLayerNormalization",
        [
            residual,
            g.const("layers.0.attn_norm.weight", norm_weight(weights, "layers.0.attn_norm", g)),
        ],
        "layers.0/attn_norm",
        axis=-1,
        epsilon=eps,
    )
    for i in range(spec.num_layers):
        p = f"layers.{i}"
        qkv = attention_inputs(g, spec, weights, take, x, p)
        window = spec.window(i)
        cos_cache, sin_cache = caches[spec.layer_rope(i)]
        if exact is not None:
            attn, present_k, present_v = exact.layer(
                qkv, pasts[i][0], pasts[i][1], p, window, (cos_cache, sin_cache)
            )
        else:
            packed = not isinstance(qkv, tuple)
            # ORT 1.31 (CPU) lets a query see local_window_size keys, itself included, as
            # transformers sees sliding_window (tests/exporters/test_export_families.py)
            window_attr = {} if window is None else {"local_window_size": window}
            if spec.attn_softcap:
                window_attr["softcap"] = float(spec.attn_softcap)
            attn, present_k, present_v = g.ops(
                "GroupQueryAttention",
                [
                    *((qkv, None, None) if packed else qkv),
                    pasts[i][0],
                    pasts[i][1],
                    seqlens_k,
                    total_len,
                    cos_cache,
                    sin_cache,
                ],
                f"{p}/attn",
                3,
                domain=MS,
                num_heads=spec.num_heads,
                kv_num_heads=spec.num_kv_heads,
                do_rotary=1,
                rotary_interleaved=0,
                scale=spec.scale,
                **window_attr,
            )
        for value, kind in ((present_k, "key"), (present_v, "value")):
            value.name = f"present.{i}.{kind}"
            value.type, value.shape = ir.TensorType(T), ir.Shape(present_shape)
            outputs.append(value)
        o = g.linear(attn, take(f"{p}.o"), f"{p}.o_proj")
        if spec.post_norms:
            o = rms_norm(g, spec, o, weights, f"{p}.post_attn_norm", wide)
        x, residual = add_and_norm(g, o, residual, weights, f"{p}.ffn_norm", eps, wide)
        gate_up = g.linear(
            x, concat_weights([take(f"{p}.gate"), take(f"{p}.up")]), f"{p}.gate_up_proj"
        )
        gate, up = g.ops(
            "Split",
            [gate_up, g.const(f"{p}.split", np.array([spec.intermediate_size] * 2, np.int64))],
            f"{p}/split",
            2,
            axis=-1,
        )
        act = g.op("Mul", [ACTIVATIONS[spec.activation](g, gate, p), up], f"{p}/act")
        down = g.linear(act, take(f"{p}.down"), f"{p}.down_proj")
        if spec.post_norms:
            down = rms_norm(g, spec, down, weights, f"{p}.post_ffn_norm", wide)
        last = i == spec.num_layers - 1
        norm_name = "norm" if last else f"layers.{i + 1}.attn_norm"
        x, residual = add_and_norm(
            g, down, residual, weights, norm_name, eps, wide, "final_norm" if last else None
        )
    # Shape inference does not know the contrib ops: annotate what the composer looks for.
    rows = seq if exact is None else "padded_sequence_length"
    x.type, x.shape = ir.TensorType(T), ir.Shape([batch, rows, spec.hidden_size])
    logits = g.linear(x, take("lm_head"), "lm_head")
    if exact is not None:  # the head also sees two rows or more; the zero position goes after it
        logits = exact.unpadded(logits, "lm_head_rows")
    if T != ir.DataType.FLOAT:
        logits = g.op("Cast", [logits], "logits_fp32", to=ir.DataType.FLOAT)
    if spec.final_softcap:  # c * tanh(logits / c), after the LM head (the composer then gathers
        # the logits' rows: its LM-head move looks for a head that ends the graph)
        cap = g.const("logits.softcap", np.array(spec.final_softcap, np.float32))
        capped = g.op("Tanh", [g.op("Div", [logits, cap], "logits_over_cap")], "logits_tanh")
        logits = g.op("Mul", [capped, cap], "logits_capped")
    logits.name = "logits"
    logits.type = ir.TensorType(ir.DataType.FLOAT)
    logits.shape = ir.Shape([batch, seq, spec.vocab_size])
    graph = ir.Graph(
        inputs,
        [logits, *outputs],
        nodes=g.tape.nodes,
        initializers=g.tape.initializers,
        opset_imports={"": OPSET, MS: 1},
        name=f"onnxsample-gqa-{spec.family}",
    )
    model = ir.Model(graph, ir_version=IR_VERSION, producer_name="onnxsample")
    if exact is not None:
        model.metadata_props[ATTENTION_KEY] = "exact"
    return model


def write_gqa(
    spec: DecoderSpec,
    weights: dict[str, Any],
    path: Path,
    precision: str = "fp32",
    accuracy_level: int = 0,
    activations: str = "fp32",
    attention: str = "gqa",
) -> None:
    """Build the decoder and save it as `path` with its weights in `path`.data; `weights` is
    consumed (see `build_gqa_model`'s `consume`).

    `activations` (``fp32``/``fp16``) is the float type of activations, KV cache and float weights.
    ``int8``/``int4`` build the float graph, then ORT's MatMulNBits quantiser turns every MatMul with
    a constant weight into 4- or 8-bit blocks of 32 (symmetric), the LM head included (it is a
    materialised matrix here, also for tied embeddings).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    data = path.with_name(f"{path.name}.data")
    options = {"precision": activations, "accuracy_level": accuracy_level, "attention": attention}
    if precision in ("int8", "int4"):  # ORT's quantiser takes the float graph in memory
        model = build_gqa_model(spec, weights, compact=False, consume=True, **options)
        model = _ort_quantise(model, 8 if precision == "int8" else 4, accuracy_level)
        ir.save(model, path, external_data=data.name)
    else:  # the weights go to the data file as the graph makes them
        with ExternalData(data) as external:
            model = build_gqa_model(spec, weights, consume=True, external=external, **options)
        ir.save(model, path)
    log.info("wrote %s (%d nodes, %s)", path, len(model.graph), precision)


def _ort_quantiser():
    """ONNX Runtime's MatMulNBits quantiser. Its package configures the root logger when first
    imported (``logging.basicConfig`` at INFO), which printed its progress, some 40 lines, on
    every int8/int4 export: the root logger is put back as it was."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        from onnxruntime.quantization import matmul_nbits_quantizer
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return matmul_nbits_quantizer


def _ort_quantise(model: ir.Model, bits: int, accuracy_level: int) -> ir.Model:
    quantiser = _ort_quantiser()
    config = quantiser.DefaultWeightOnlyQuantConfig(
        block_size=32, is_symmetric=True, accuracy_level=accuracy_level, bits=bits
    )
    quantizer = quantiser.MatMulNBitsQuantizer(
        ir.to_proto(model),
        bits=bits,
        block_size=32,
        is_symmetric=True,
        accuracy_level=accuracy_level,
        algo_config=config,
    )
    quantizer.process()
    return ir.from_proto(quantizer.model.model)
