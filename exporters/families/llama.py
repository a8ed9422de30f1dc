"""Llama (and the models that share its config type: SmolLM2, TinyLlama, Llama 2/3.x)."""

from onnxsample.exporters.families._family import Family, refuse_biases

FAMILY = Family(
    name="llama",
    hf_types=("llama",),
    gguf_architectures=("llama",),
    # convert_hf_to_gguf permutes Q/K rows for llama.cpp's interleaved rotary; the reader undoes it.
    gguf_qk_permuted=True,
    check_hf=refuse_biases,
)
