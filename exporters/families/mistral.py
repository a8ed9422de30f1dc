"""Mistral: the Llama graph, `head_dim` from the config, and a sliding window on every layer.

transformers' window of W keys (a position sees itself and the W - 1 before it) is ONNX Runtime's
GroupQueryAttention ``local_window_size`` W (its CPU kernel: the tests compare with transformers).
llama.cpp writes Mistral GGUFs as ``llama`` (its llama reader then ignores the window), so this
family reads HF folders only.
"""

from onnxsample.exporters.families._family import Family, uniform_window

FAMILY = Family(
    name="mistral",
    hf_types=("mistral",),
    gguf_architectures=(),
    windows=uniform_window,
)
