"""The pieces of one decoder layer in the GroupQueryAttention layout (:mod:`.gqa`): the attention's
input projection (packed QKV, its bias, Qwen3's per-head norms), the MLP's activation, and the
RMSNorms, with or without the residual add."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxsample.exporters._gqa_graph import GraphBuilder, concat_weights
from onnxsample.exporters.families import DecoderSpec

__all__ = [
    "ACTIVATIONS",
    "MS",
    "add_and_norm",
    "attention_inputs",
    "head_norm",
    "norm_weight",
    "rms_norm",
]

MS = "com.microsoft"


def attention_inputs(
    g: GraphBuilder,
    spec: DecoderSpec,
    weights: dict[str, Any],
    take: Callable[[str], Any],
    x: ir.Value,
    p: str,
) -> ir.Value | tuple[ir.Value, ir.Value, ir.Value]:
    """The attention's input: the packed QKV projection (plus its bias, for families with one),
    or q, k, v apart when each head of q and k is RMS-normalised first (Qwen3). Matrices come from
    `take`, vectors from `weights`."""
    qkv = g.linear(x, concat_weights([take(f"{p}.{k}") for k in ("q", "k", "v")]), f"{p}.qkv_proj")
    if spec.qkv_bias:
        bias = np.concatenate([np.reshape(weights[f"{p}.{k}_bias"], -1) for k in ("q", "k", "v")])
        qkv = g.op(
            "Add", [qkv, g.const(f"{p}.qkv_proj.bias", bias.astype(g.np_dtype))], f"{p}/qkv_bias"
        )
    if not spec.qk_norm:
        return qkv
    d, heads, kv_heads = spec.head_dim, spec.num_heads, spec.num_kv_heads
    split = g.const(f"{p}.qkv_split", np.array([heads * d, kv_heads * d, kv_heads * d], np.int64))
    q, k, v = g.ops("Split", [qkv, split], f"{p}/qkv_split", 3, axis=-1)
    return (
        head_norm(g, spec, q, heads, norm_weight(weights, f"{p}.q_norm", g), f"{p}.q_norm"),
        head_norm(g, spec, k, kv_heads, norm_weight(weights, f"{p}.k_norm", g), f"{p}.k_norm"),
        v,
    )


def _silu(g: GraphBuilder, gate: ir.Value, p: str) -> ir.Value:
    return g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{p}/sigmoid")], f"{p}/silu")


def _gelu_tanh(g: GraphBuilder, gate: ir.Value, p: str) -> ir.Value:
    """transformers' gelu_pytorch_tanh (Gemma's GeGLU)."""
    return g.op("Gelu", [gate], f"{p}/gelu", approximate="tanh")


ACTIVATIONS = {"silu": _silu, "gelu_tanh": _gelu_tanh}


def rms_norm(
    g: GraphBuilder,
    spec: DecoderSpec,
    x: ir.Value,
    weights: dict[str, Any],
    key: str,
    wide: bool = False,
) -> ir.Value:
    """A plain RMSNorm (Gemma's post-attention and post-MLP norms, before the residual add); with
    `wide` its output (and weight) is float32, for a float32 residual stream."""
    weight = norm_weight(weights, key, g)
    return g.op(
        "SimplifiedLayerNormalization",
        [x, g.const(f"{key}.weight", weight.astype(np.float32) if wide else weight)],
        "/".join(key.rsplit(".", 1)),
        axis=-1,
        epsilon=float(spec.rms_norm_eps),
    )


def add_and_norm(
    g: GraphBuilder,
    x: ir.Value,
    residual: ir.Value,
    weights: dict[str, Any],
    key: str,
    eps: float,
    wide: bool,
    name: str | None = None,
) -> tuple[ir.Value, ir.Value]:
    """``residual += x``, then the RMSNorm `key` of it: (normalised, residual), the node named
    `name` (default `key` with its last dot a slash). One SkipSimplifiedLayerNormalization; with
    `wide` (a float32 residual, x already float32) an Add and a SimplifiedLayerNormalization whose
    output takes the weight's type."""
    name = name or "/".join(key.rsplit(".", 1))
    w = g.const(f"{key}.weight", norm_weight(weights, key, g))
    if not wide:
        normed, _, _, total = g.ops(
            "SkipSimplifiedLayerNormalization", [x, residual, w], name, 4, domain=MS, epsilon=eps
        )
        return normed, total
    total = g.op("Add", [x, residual], f"{name}/residual")
    return g.op("SimplifiedLayerNormalization", [total, w], name, axis=-1, epsilon=eps), total


def head_norm(
    g: GraphBuilder, spec: DecoderSpec, x: ir.Value, heads: int, weight: np.ndarray, name: str
) -> ir.Value:
    """RMSNorm over each head's head_dim values of x [B, S, heads * head_dim]."""
    by_head = g.op(
        "Reshape",
        [x, g.const(f"{name}.heads", np.array([0, 0, heads, spec.head_dim], np.int64))],
        name,
    )
    normed = g.op(
        "SimplifiedLayerNormalization",
        [by_head, g.const(f"{name}.weight", weight)],
        f"{name}/norm",
        axis=-1,
        epsilon=float(spec.rms_norm_eps),
    )
    flat = np.array([0, 0, heads * spec.head_dim], np.int64)
    return g.op("Reshape", [normed, g.const(f"{name}.flat", flat)], f"{name}/flat")


def norm_weight(weights: dict[str, Any], key: str, g: GraphBuilder) -> np.ndarray:
    return np.asarray(weights[key], g.np_dtype).reshape(-1)
