"""Phi-3 / Phi-3.5 / Phi-4-mini (`phi3`): the Llama graph from fused weights, partial rotary and
LongRoPE.

The checkpoint packs Q, K and V into one ``qkv_proj`` and the MLP's gate and up into one
``gate_up_proj`` (gate first): the reader splits them into the builder's keys, which concatenates
them again (the same matrices, the same packed projections as Llama's).

``partial_rotary_factor`` (Phi-4-mini: 0.75) rotates the first head_dim x factor values of each
head only: GroupQueryAttention rotates as many values as its cos/sin cache is wide (x 2), so the
cache is built that narrow (checked against transformers in tests/exporters/test_export_families.py).

``rope_scaling`` ``longrope`` (Phi-3.5, Phi-4-mini; ``su``/``yarn`` in older configs, as
transformers reads them) has short and long frequency factors: the export turns with the short
ones, as transformers does within ``original_max_position_embeddings``, and its context stops there
(see :func:`._family.longrope`); cos and sin carry transformers' attention factor
sqrt(1 + ln(max / original) / ln(original)).

A ``sliding_window`` holds for every layer (as Mistral's).

GGUFs (llama.cpp's ``phi3``) keep the fused ``attn_qkv`` and ``ffn_up`` (gate then up, as
``gate_up_proj``), unpermuted, split here by rows (exact for quantised blocks). llama.cpp's
converter writes the rotated dimensions as ``phi3.rope.dimension_count``, no head size (embedding
/ heads), the window as ``phi3.attention.sliding_window`` (0: none), and LongRoPE as the tensors
``rope_factors_short.weight``/``rope_factors_long.weight`` with ``rope.scaling.attn_factor`` and
``rope.scaling.original_context_length``: read into the same spec as the HF folder's.
"""

from __future__ import annotations

from typing import Any

from onnxsample.errors import ExportError
from onnxsample.exporters._gguf_quant import QuantizedWeight, split_rows
from onnxsample.exporters.families._family import (
    LLAMA_TENSORS,
    Family,
    TensorName,
    longrope,
    uniform_window,
)
from onnxsample.exporters.families._spec import DecoderSpec

_LONGROPE_NAMES = ("longrope", "su", "yarn")  # transformers' Phi3Config reads the last two so


def _features(config: dict[str, Any]) -> dict[str, Any]:
    heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    factor = float(config.get("partial_rotary_factor") or 1.0)
    features: dict[str, Any] = {}
    if factor != 1.0:
        features["rotary_dim"] = int(head_dim * factor)
    scaling = config.get("rope_scaling")
    if scaling and scaling.get("rope_type", scaling.get("type")) in _LONGROPE_NAMES:
        # the generic reading of longrope follows (see _family.longrope)
        features["rope_scaling"] = {**scaling, "rope_type": "longrope"}
    return features


def _unpack(weights: dict[str, Any], spec: DecoderSpec, p: str) -> None:
    """qkv_proj into q, k, v rows; gate_up_proj into gate, up (halves, gate first)."""
    qkv, gate_up = weights.pop(f"{p}.qkv"), weights.pop(f"{p}.gate_up")
    q_rows, kv_rows = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    rows = [w.n if isinstance(w, QuantizedWeight) else w.shape[0] for w in (qkv, gate_up)]
    if rows != [q_rows + 2 * kv_rows, 2 * spec.intermediate_size]:
        raise ExportError(
            f"{p}: qkv_proj has {rows[0]} rows and gate_up_proj {rows[1]}, not "
            f"{q_rows + 2 * kv_rows} and {2 * spec.intermediate_size} as the config says"
        )
    # row parts: exact for a GGUF's quantised blocks too
    weights[f"{p}.q"], weights[f"{p}.k"], weights[f"{p}.v"] = split_rows(
        qkv, [q_rows, kv_rows, kv_rows]
    )
    weights[f"{p}.gate"], weights[f"{p}.up"] = split_rows(gate_up, [spec.intermediate_size] * 2)


def _gguf_features(meta, read, fields: dict[str, Any]) -> dict[str, Any]:
    """The window and LongRoPE of a llama.cpp ``phi3`` GGUF (see the module)."""
    features: dict[str, Any] = {}
    window = meta("attention.sliding_window")
    if window:
        features["layer_windows"] = (int(window),) * fields["num_layers"]
    short, long = read("rope_factors_short.weight"), read("rope_factors_long.weight")
    if short is not None:
        scaling: dict[str, Any] = {
            "rope_type": "longrope",
            "short_factor": [float(x) for x in short.reshape(-1)],
            "long_factor": None if long is None else [float(x) for x in long.reshape(-1)],
        }
        if meta("rope.scaling.attn_factor") is not None:
            scaling["attention_factor"] = float(meta("rope.scaling.attn_factor"))
        positions = {
            "max_position_embeddings": fields["max_positions"],
            "original_max_position_embeddings": meta("rope.scaling.original_context_length"),
        }
        features["rope_scaling"], features["max_positions"] = longrope(positions, scaling)
    return features


FAMILY = Family(
    name="phi3",
    gguf_unverified="transformers' GGUF loader drops the window and the LongRoPE factors (tensors in the file)",
    hf_types=("phi3",),
    gguf_architectures=("phi3",),
    gguf_features=_gguf_features,
    tensors={
        "qkv": TensorName("self_attn.qkv_proj.weight", "attn_qkv.weight"),
        "o": LLAMA_TENSORS["o"],
        "gate_up": TensorName("mlp.gate_up_proj.weight", "ffn_up.weight"),
        "down": LLAMA_TENSORS["down"],
        "attn_norm": LLAMA_TENSORS["attn_norm"],
        "ffn_norm": LLAMA_TENSORS["ffn_norm"],
    },
    windows=uniform_window,
    features=_features,
    unpack=_unpack,
)
