"""Qwen2 / Qwen2.5: the Llama graph plus biases on the Q, K and V projections.

llama.cpp rotates Qwen2 with NeoX's rotate-half rotary, as transformers does, so its GGUF keeps the
Q/K rows in transformers' order (no un-permuting); biases are F32 ``blk.N.attn_{q,k,v}.bias``.
Sliding windows apply to the layers `layer_types` names, when `use_sliding_window` is on.
"""

from onnxsample.exporters.families._family import (
    LLAMA_TENSORS,
    QKV_BIAS_TENSORS,
    Family,
    typed_windows,
)

FAMILY = Family(
    name="qwen2",
    hf_types=("qwen2",),
    gguf_architectures=("qwen2",),
    tensors={**LLAMA_TENSORS, **QKV_BIAS_TENSORS},
    qkv_bias=True,
    windows=typed_windows,
)
