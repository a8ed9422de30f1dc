"""Qwen3: the Llama graph plus an RMSNorm over each head of Q and K, before the rotary embedding.

`head_dim` comes from the config (it need not be hidden / heads); GGUF gives it as
``qwen3.attention.key_length``. No Q/K row permutation in llama.cpp's files (NeoX rotary), no
biases (a config with `attention_bias` is refused: it biases the output projection too).
"""

from onnxsample.exporters.families._family import (
    LLAMA_TENSORS,
    QK_NORM_TENSORS,
    Family,
    refuse_biases,
    typed_windows,
)

FAMILY = Family(
    name="qwen3",
    hf_types=("qwen3",),
    gguf_architectures=("qwen3",),
    tensors={**LLAMA_TENSORS, **QK_NORM_TENSORS},
    qk_norm=True,
    windows=typed_windows,
    check_hf=refuse_biases,
)
