"""Gemma 3 text models (`gemma3_text`: Gemma 3 270M and 1B): Gemma 2's graph (see
:mod:`.gemma2`) plus an RMSNorm over each head of Q and K (1 + w, as Qwen3's), and local layers
that rotate with their own base.

Sliding layers come from ``layer_types`` (or transformers' default: all but every
``sliding_window_pattern``-th, 6); they rotate with ``rope_local_base_freq`` unscaled, the global
layers with ``rope_theta`` and ``rope_scaling`` (linear for the larger Gemma 3), so the graph
holds two rotary caches. Soft-capping is off in Gemma 3's configs (taken when set).

The multimodal Gemma 3 (``gemma3``, weights under ``language_model.``) is not this family.
"""

from __future__ import annotations

from typing import Any

from onnxsample.exporters.families._family import QK_NORM_TENSORS, Family
from onnxsample.exporters.families.gemma2 import (
    GEMMA_TENSORS,
    gemma_features,
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
    hf_types=("gemma3_text",),
    gguf_architectures=(),
    gguf_refused=("gemma3",),
    tensors={**GEMMA_TENSORS, **QK_NORM_TENSORS},
    qk_norm=True,
    windows=lambda config, layers: windows_every(
        int(config.get("sliding_window_pattern") or 6), config, layers
    ),
    check_hf=refuse_bidirectional,
    features=_features,
    norm_offset=1.0,
)
