"""What the GroupQueryAttention builder needs to know of a decoder: :class:`DecoderSpec`.

One spec for every family: the shapes, the rotary embedding, and the graph variations the families
differ by (biased Q/K/V projections, RMSNorm over each head of Q and K, sliding windows, partial
rotary, Gemma's scaled embeddings, post-norms, GeGLU, attention scale and logit soft-capping).
The builder reads these features, never a family's name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxsample.errors import ExportError

__all__ = ["DecoderSpec", "check_spec"]

_ROPE_TYPES = (None, "default", "llama3", "linear", "longrope")
ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class DecoderSpec:
    """The shape of a Llama-style decoder, its rotary embedding and its attention variations."""

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
    # llama.cpp's `rope_freqs` tensor (Llama 3.1+ files): rotary frequency i is divided by factor i.
    rope_freq_factors: tuple[float, ...] | None = None
    # The family (names the graph) and its variations of the Llama graph:
    family: str = "llama"
    qkv_bias: bool = False  # Q, K and V projections add a bias (the output projection does not)
    qk_norm: bool = False  # RMSNorm over each head of Q and K (weights of head_dim) before rotary
    # Per layer: how many keys a position sees, itself included (transformers' `sliding_window`),
    # or None for all of them; empty when no layer has a window.
    layer_windows: tuple[int | None, ...] = ()
    # Rotary on the first rotary_dim values of each head only (Phi-4-mini); None: all head_dim.
    rotary_dim: int | None = None
    # Sliding-window layers rotate with this base, unscaled (Gemma 3's rope_local_base_freq).
    local_rope_theta: float | None = None
    embed_scale: float | None = None  # embeddings times this, in the activations' type (Gemma)
    post_norms: bool = False  # RMSNorm of the attention's and the MLP's outputs (Gemma 2/3)
    activation: str = "silu"  # of the gated MLP: silu (SwiGLU) or gelu_tanh (GeGLU)
    attn_scale: float | None = None  # None: head_dim ** -0.5
    attn_softcap: float | None = None  # scores -> c * tanh(scores / c) before the softmax
    final_softcap: float | None = None  # logits -> c * tanh(logits / c)

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer`, None when it attends to every earlier position."""
        return self.layer_windows[layer] if self.layer_windows else None

    @property
    def rotary_dims(self) -> int:
        """How many values of each head the rotary embedding turns (the first ones)."""
        return self.rotary_dim or self.head_dim

    @property
    def scale(self) -> float:
        """The attention's scale of q @ k^T."""
        return float(self.attn_scale if self.attn_scale is not None else self.head_dim**-0.5)

    def layer_rope(self, layer: int) -> tuple[float, bool]:
        """(rope base, scaled) of `layer`: local layers of Gemma 3 have their own, unscaled."""
        if self.local_rope_theta is not None and self.window(layer) is not None:
            return self.local_rope_theta, False
        return self.rope_theta, True

    def inv_freq(self, theta: float | None = None, scaled: bool = True) -> np.ndarray:
        """float64 [rotary_dims / 2]: rotary frequencies, with the configured scaling (llama3,
        linear, longrope's short factors) and a GGUF's frequency factors unless not `scaled`."""
        dim = self.rotary_dims
        inv = 1.0 / (theta or self.rope_theta) ** (np.arange(0, dim, 2) / dim)
        if scaled and self.rope_freq_factors is not None:  # as llama.cpp's rope: theta / factor
            inv = inv / np.asarray(self.rope_freq_factors, np.float64)
        scaling = (self.rope_scaling or {}) if scaled else {}
        rope_type = scaling.get("rope_type", scaling.get("type"))
        if rope_type == "linear":
            return inv / scaling["factor"]
        if rope_type == "longrope":
            # transformers' short factors: its choice while a sequence stays within
            # original_max_position_embeddings, which the export's positions never exceed
            return inv / np.asarray(scaling["short_factor"], np.float64)
        if rope_type != "llama3":
            return inv
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        medium = (wavelen <= old / low) & (wavelen >= old / high)
        return np.where(medium, (1 - smooth) * inv / factor + smooth * inv, scaled)

    def attention_factor(self, scaled: bool = True) -> float:
        """longrope's factor on cos and sin (transformers' `attention_scaling`); 1 otherwise."""
        scaling = (self.rope_scaling or {}) if scaled else {}
        if scaling.get("rope_type", scaling.get("type")) != "longrope":
            return 1.0
        if scaling.get("attention_factor") is not None:
            return float(scaling["attention_factor"])
        factor = scaling["factor"]  # max / original positions (see _family.longrope)
        if factor <= 1.0:
            return 1.0
        return math.sqrt(
            1 + math.log(factor) / math.log(scaling["original_max_position_embeddings"])
        )

    def rotary_caches(
        self, theta: float | None = None, scaled: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """(cos, sin), float32 [max_positions, rotary_dims / 2], as GroupQueryAttention takes
        them (a cache narrower than head_dim / 2 turns only the first rotary_dims values)."""
        angles = np.outer(
            np.arange(self.max_positions, dtype=np.float64), self.inv_freq(theta, scaled)
        )
        factor = self.attention_factor(scaled)
        return (
            (np.cos(angles) * factor).astype(np.float32),
            (np.sin(angles) * factor).astype(np.float32),
        )


def check_spec(spec: DecoderSpec, what: str) -> None:
    """Refuse what GroupQueryAttention cannot express, naming the way out (optimum's layout),
    and sizes no model has (a damaged header: no heads, a context of 0 positions)."""
    sizes = {
        "hidden size": spec.hidden_size,
        "feed-forward size": spec.intermediate_size,
        "number of layers": spec.num_layers,
        "number of attention heads": spec.num_heads,
        "number of key/value heads": spec.num_kv_heads,
        "head size": spec.head_dim,
        "context length": spec.max_positions,
    }
    for name, size in sizes.items():
        if size < 1:
            raise ExportError(f"{what}: the {name} is {size}: the header is damaged")
    scaling = spec.rope_scaling or {}
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type not in _ROPE_TYPES:
        raise ExportError(
            f"{what}: rope scaling {rope_type!r} is not supported by the gqa layout "
            "(supported: none, llama3, linear, longrope); use --layout optimum"
        )
    if rope_type == "linear" and not scaling.get("factor"):
        raise ExportError(f"{what}: linear rope scaling without a factor")
    if rope_type == "longrope" and spec.rotary_dims // 2 != len(scaling.get("short_factor") or []):
        raise ExportError(
            f"{what}: longrope short_factor must have {spec.rotary_dims // 2} values (rotary "
            f"dimensions / 2), got {len(scaling.get('short_factor') or [])}"
        )
    factors = spec.rope_freq_factors
    if factors is not None:
        bad = [f for f in factors if not (math.isfinite(f) and f > 0)]
        if len(factors) != spec.rotary_dims // 2 or bad:
            got = f"the factor {bad[0]}" if bad else f"{len(factors)} factors"
            raise ExportError(
                f"{what}: rope_freqs must hold {spec.rotary_dims // 2} positive factors (rotary "
                f"dimensions / 2), got {got}"
            )
    if spec.rotary_dims % 2 or not 0 < spec.rotary_dims <= spec.head_dim:
        raise ExportError(
            f"{what}: a rotary dimension of {spec.rotary_dims} does not fit heads of "
            f"{spec.head_dim}; use --layout optimum"
        )
    if spec.rotary_dims < spec.head_dim and spec.rotary_dims % 16:
        raise ExportError(
            f"{what}: partial rotary over {spec.rotary_dims} of {spec.head_dim} values per head: "
            "GroupQueryAttention turns a multiple of 16 only (Phi-4-mini: 96 of 128); use "
            "--layout optimum"
        )
    if spec.activation not in ACTIVATIONS:
        raise ExportError(
            f"{what}: MLP activation {spec.activation!r} is not one of the gqa layout's "
            f"({', '.join(ACTIVATIONS)}); use --layout optimum"
        )
    if spec.head_dim % 16 or spec.num_heads % spec.num_kv_heads:
        raise ExportError(
            f"{what}: head_dim {spec.head_dim} (must be a multiple of 16) or {spec.num_heads} heads "
            f"over {spec.num_kv_heads} KV heads does not fit GroupQueryAttention; use --layout optimum"
        )
    if spec.layer_windows and len(spec.layer_windows) != spec.num_layers:
        raise ExportError(
            f"{what}: {len(spec.layer_windows)} sliding windows for {spec.num_layers} layers"
        )
    if any(w is not None and w < 1 for w in spec.layer_windows):
        raise ExportError(f"{what}: sliding windows must be at least 1, got {spec.layer_windows}")
