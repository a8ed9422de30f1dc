"""What the GroupQueryAttention builder needs to know of a decoder: :class:`DecoderSpec`.

One spec for every family: the shapes, the rotary embedding, and the few graph variations the
families differ by (biased Q/K/V projections, RMSNorm over each head of Q and K, sliding windows).
The builder reads these features, never a family's name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxsample.errors import ExportError

__all__ = ["DecoderSpec", "check_spec"]

_ROPE_TYPES = (None, "default", "llama3")


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
    # The family (names the graph) and its variations of the Llama graph:
    family: str = "llama"
    qkv_bias: bool = False  # Q, K and V projections add a bias (the output projection does not)
    qk_norm: bool = False  # RMSNorm over each head of Q and K (weights of head_dim) before rotary
    # Per layer: how many keys a position sees, itself included (transformers' `sliding_window`),
    # or None for all of them; empty when no layer has a window.
    layer_windows: tuple[int | None, ...] = ()

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer`, None when it attends to every earlier position."""
        return self.layer_windows[layer] if self.layer_windows else None

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


def check_spec(spec: DecoderSpec, what: str) -> None:
    """Refuse what GroupQueryAttention cannot express, naming the way out (optimum's layout)."""
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
    if spec.layer_windows and len(spec.layer_windows) != spec.num_layers:
        raise ExportError(
            f"{what}: {len(spec.layer_windows)} sliding windows for {spec.num_layers} layers"
        )
    if any(w is not None and w < 1 for w in spec.layer_windows):
        raise ExportError(f"{what}: sliding windows must be at least 1, got {spec.layer_windows}")
