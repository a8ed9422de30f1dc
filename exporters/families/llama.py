"""Llama (and the models that share its config type: SmolLM2, TinyLlama, Llama 2/3.x).

convert_hf_to_gguf turns Llama 3.1+'s ``llama3`` rope scaling into a ``rope_freqs`` tensor (one
factor per rotary frequency) and no scaling metadata; llama.cpp's llama architecture divides each
frequency by its factor, and so does the export.
"""

from typing import Any

from onnxsample.exporters.families._family import Family, refuse_biases

# Llama 3.1+'s rope scaling as the converter writes it: a factor per rotary frequency.
ROPE_FREQS = "rope_freqs.weight"


def _gguf_features(meta, read, fields: dict[str, Any]) -> dict[str, Any]:
    """The frequency factors of a llama.cpp ``llama`` GGUF, where it has them."""
    factors = read(ROPE_FREQS)
    if factors is None:
        return {}
    return {"rope_freq_factors": tuple(float(f) for f in factors.reshape(-1))}


FAMILY = Family(
    name="llama",
    hf_types=("llama",),
    gguf_architectures=("llama",),
    # convert_hf_to_gguf permutes Q/K rows for llama.cpp's interleaved rotary; the reader undoes it.
    gguf_qk_permuted=True,
    check_hf=refuse_biases,
    gguf_features=_gguf_features,
)
