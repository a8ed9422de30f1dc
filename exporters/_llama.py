"""Llama-family weights for the GroupQueryAttention exporter, read from an HF folder or a GGUF file.

Both readers give the same thing: a :class:`LlamaSpec` and a mapping from our tensor names
(``embed``, ``layers.{i}.q`` ... ``norm``, ``lm_head``) to float32 ``[N, K]`` arrays (output channels
first, as in torch) or, from a GGUF with ``precision="gguf"``, the file's own quantised blocks
(:class:`~onnxsample.exporters._gguf_quant.QuantizedWeight`).

llama.cpp stores Q and K with their rows permuted for its interleaved rotary embedding; the GGUF
reader undoes that (exactly: a row permutation moves whole quantisation blocks), so both sources feed
one graph with the rotate-half rotary of transformers.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnxsample.errors import ExportError

log = logging.getLogger(__name__)

LLAMA_HF_TYPES = ("llama",)
LLAMA_GGUF_ARCHITECTURES = ("llama",)
_ROPE_TYPES = (None, "default", "llama3")


@dataclass(frozen=True)
class LlamaSpec:
    """The shape of a Llama-family decoder and its rotary embedding."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_positions: int
    tied: bool
    rope_scaling: dict[str, Any] | None = None

    def inv_freq(self) -> np.ndarray:
        """float64 [head_dim / 2]: rotary frequencies, llama3 scaling applied when configured."""
        inv = 1.0 / self.rope_theta ** (np.arange(0, self.head_dim, 2) / self.head_dim)
        scaling = self.rope_scaling or {}
        if scaling.get("rope_type", scaling.get("type")) != "llama3":
            return inv
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        medium = (wavelen <= old / low) & (wavelen >= old / high)
        return np.where(medium, (1 - smooth) * inv / factor + smooth * inv, scaled)

    def rotary_caches(self) -> tuple[np.ndarray, np.ndarray]:
        """(cos, sin), float32 [max_positions, head_dim / 2], as GroupQueryAttention takes them."""
        angles = np.outer(np.arange(self.max_positions, dtype=np.float64), self.inv_freq())
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _check_spec(spec: LlamaSpec, what: str) -> None:
    scaling = spec.rope_scaling or {}
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type not in _ROPE_TYPES:
        raise ExportError(
            f"{what}: rope scaling {rope_type!r} is not supported by the gqa layout "
            "(supported: none, llama3); use --layout optimum"
        )
    if spec.head_dim % 16 or spec.num_heads % spec.num_kv_heads:
        raise ExportError(
            f"{what}: head_dim {spec.head_dim} (must be a multiple of 16) or {spec.num_heads} heads "
            f"over {spec.num_kv_heads} KV heads does not fit GroupQueryAttention; use --layout optimum"
        )


# ---- Hugging Face folders ---------------------------------------------------------------------

_HF_NAMES = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def hf_spec(config: dict[str, Any], what: str) -> LlamaSpec:
    """The spec of an HF Llama `config.json`; anything the gqa layout cannot express is an error."""
    if config.get("model_type") not in LLAMA_HF_TYPES:
        raise ExportError(f"{what} is not a Llama-family model; use --layout optimum")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise ExportError(f"{what}: biased projections are not supported by the gqa layout")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    spec = LlamaSpec(
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(config["intermediate_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=float(config.get("rope_theta", 10000.0)),
        max_positions=int(config.get("max_position_embeddings", 2048)),
        tied=bool(config.get("tie_word_embeddings", False)),
        rope_scaling=config.get("rope_scaling"),
    )
    _check_spec(spec, what)
    return spec


def read_hf(folder: Path) -> tuple[LlamaSpec, dict[str, np.ndarray]]:
    """Spec and float32 weights of an HF Llama folder (safetensors; bf16/fp16/fp32)."""
    from safetensors import safe_open

    config = json.loads((folder / "config.json").read_text())
    spec = hf_spec(config, folder.name)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ExportError(f"{folder} holds no *.safetensors weights (needed by the gqa layout)")
    raw: dict[str, np.ndarray] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118  (safe_open is not a mapping)
                    raw[name] = f.get_tensor(name).float().numpy()
        except Exception as exc:  # safetensors raises its own error types
            raise ExportError(f"cannot load {file.name}: {exc}") from exc
    weights = {"embed": raw.pop("model.embed_tokens.weight"), "norm": raw.pop("model.norm.weight")}
    for i in range(spec.num_layers):
        for key, hf_name in _HF_NAMES.items():
            name = f"model.layers.{i}.{hf_name}.weight"
            if name not in raw:
                raise ExportError(f"{folder.name}: weight {name} is missing")
            weights[f"layers.{i}.{key}"] = raw.pop(name)
    head = raw.pop("lm_head.weight", None)
    weights["lm_head"] = weights["embed"] if head is None else head
    return spec, weights


# ---- GGUF files ----------------------------------------------------------------------------------

_GGUF_NAMES = {
    "q": "attn_q",
    "k": "attn_k",
    "v": "attn_v",
    "o": "attn_output",
    "gate": "ffn_gate",
    "up": "ffn_up",
    "down": "ffn_down",
    "attn_norm": "attn_norm",
    "ffn_norm": "ffn_norm",
}


def gguf_spec(metadata: dict[str, Any], tensor_names: set[str], what: str) -> LlamaSpec:
    arch = metadata.get("general.architecture")
    if arch not in LLAMA_GGUF_ARCHITECTURES:
        raise ExportError(
            f"{what}: GGUF architecture {arch!r} is not Llama-family; use --layout optimum"
        )

    def get(key: str, default=None):
        value = metadata.get(f"{arch}.{key}", default)
        if value is None:
            raise ExportError(f"{what}: GGUF metadata {arch}.{key} is missing")
        return value

    heads, hidden = int(get("attention.head_count")), int(get("embedding_length"))
    rope_scaling = None
    if metadata.get(f"{arch}.rope.scaling.type") not in (None, "none"):
        rope_scaling = {"rope_type": metadata[f"{arch}.rope.scaling.type"]}
    spec = LlamaSpec(
        vocab_size=int(metadata.get(f"{arch}.vocab_size") or 0),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(metadata.get(f"{arch}.attention.head_count_kv") or heads),
        head_dim=int(metadata.get(f"{arch}.rope.dimension_count") or hidden // heads),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_theta=float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
        max_positions=int(get("context_length")),
        tied="output.weight" not in tensor_names,
        rope_scaling=rope_scaling,
    )
    _check_spec(spec, what)
    return spec


def _unpermute_order(rows: int, heads: int) -> np.ndarray:
    """Row order that turns llama.cpp's interleaved Q/K rows back into transformers' halves."""
    return np.arange(rows).reshape(heads, -1, 2).transpose(0, 2, 1).reshape(-1)


def read_gguf(
    path: Path, metadata: dict[str, Any], *, quantized: bool
) -> tuple[LlamaSpec, dict[str, Any]]:
    """Spec and weights of a GGUF Llama: float32 arrays, or the file's own blocks when `quantized`.

    `metadata` is the header :func:`~onnxsample.exporters.gguf.inspect_gguf` read already.

    Norm weights and the token embedding's lookup table are always float32; with `quantized` every
    linear weight (the LM head included) keeps its GGUF type, which must be transplantable.
    """
    import gguf

    from onnxsample.exporters import _gguf_quant

    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    spec = gguf_spec(metadata, set(tensors), path.name)

    def load(name: str, *, linear: bool):
        if name not in tensors:
            raise ExportError(f"{path.name}: tensor {name} is missing")
        t = tensors[name]
        data, type_name = np.asarray(t.data), t.tensor_type.name
        k = int(t.shape[0])
        if linear and quantized:
            return _gguf_quant.from_gguf(data, type_name, k, name=name)
        return _float(data, t.tensor_type, name)

    embed = load("token_embd.weight", linear=False)
    if spec.vocab_size == 0:
        spec = LlamaSpec(**{**spec.__dict__, "vocab_size": int(embed.shape[0])})
    weights: dict[str, Any] = {"embed": embed, "norm": load("output_norm.weight", linear=False)}
    q_order = _unpermute_order(spec.num_heads * spec.head_dim, spec.num_heads)
    k_order = _unpermute_order(spec.num_kv_heads * spec.head_dim, spec.num_kv_heads)
    for i in range(spec.num_layers):
        for key, gguf_name in _GGUF_NAMES.items():
            linear = not key.endswith("norm")
            w = load(f"blk.{i}.{gguf_name}.weight", linear=linear)
            if key in ("q", "k"):
                w = _gguf_quant.permute_rows(w, q_order if key == "q" else k_order)
            weights[f"layers.{i}.{key}"] = w
    head = "token_embd.weight" if spec.tied else "output.weight"
    weights["lm_head"] = (
        load(head, linear=True) if quantized else (embed if spec.tied else load(head, linear=False))
    )
    return spec, weights


def _float(data: np.ndarray, qtype, name: str) -> np.ndarray:
    import gguf.quants

    try:
        return np.ascontiguousarray(gguf.quants.dequantize(data, qtype), dtype=np.float32)
    except NotImplementedError as exc:
        raise ExportError(
            f"tensor {name} has type {qtype.name}, which cannot be de-quantised"
        ) from exc
