"""Gemma 3 text models (`gemma3_text`: Gemma 3 270M and 1B): Gemma 2's graph (see
:mod:`.gemma2`) plus an RMSNorm over each head of Q and K (1 + w, as Qwen3's), and local layers
that rotate with their own base.

Sliding layers come from ``layer_types`` (or transformers' default: all but every
``sliding_window_pattern``-th, 6); they rotate with ``rope_local_base_freq`` unscaled, the global
layers with ``rope_theta`` and ``rope_scaling`` (linear for the larger Gemma 3), so the graph
holds two rotary caches. Soft-capping is off in Gemma 3's configs (taken when set).

The multimodal Gemma 3 (``gemma3``, weights under ``language_model.``) is not this family.

GGUFs (llama.cpp's ``gemma3``, text weights) as Gemma 2's (norms, Q/K norms included, already
1 + w): llama.cpp makes every 6th layer global and rotates the local ones with base 10000 unscaled
(``rope.freq_base_swa`` where a file has it), the global ones with ``rope.freq_base`` and the
linear ``rope.scaling``; attention scale head_size ** -0.5, embedding / heads for the 27B (62
layers).
"""

from __future__ import annotations

from typing import Any

from onnxsample.exporters.families._family import QK_NORM_TENSORS, Family
from onnxsample.exporters.families.gemma2 import (
    GEMMA_TENSORS,
    gemma_features,
    gemma_gguf_features,
    refuse_bidirectional,
    windows_every,
)


def _features(config: dict[str, Any]) -> dict[str, Any]:
    return {
        **gemma_features(config),
        "local_rope_theta": float(config.get("rope_local_base_freq") or 10000.0),
    }


FAMILY = Family(
    name="gemma3",
    gguf_unverified="transformers' GGUF loader takes its default query_pre_attn_scalar (256), not llama.cpp's scale, and drops the linear rope scaling",
    hf_types=("gemma3_text",),
    gguf_architectures=("gemma3",),
    gguf_features=gemma_gguf_features(6, 62, 10000.0),
    tensors={**GEMMA_TENSORS, **QK_NORM_TENSORS},
    qk_norm=True,
    windows=lambda config, layers: windows_every(
        int(config.get("sliding_window_pattern") or 6), config, layers
    ),
    check_hf=refuse_bidirectional,
    features=_features,
    norm_offset=1.0,
)
