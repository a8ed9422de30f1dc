"""The decoder families of the GroupQueryAttention exporter, one module each over one builder.

Each module holds a :class:`~._family.Family`: the config types and GGUF architectures it reads,
its tensor names, and the graph variations its spec switches on (Q/K/V biases, Q/K norms,
sliding windows). :func:`hf_family` and :func:`gguf_family` find the one for a source.
"""

from __future__ import annotations

from onnxsample.errors import ExportError
from onnxsample.exporters.families import gemma2, gemma3, llama, mistral, phi3, qwen2, qwen3
from onnxsample.exporters.families._family import Family
from onnxsample.exporters.families._spec import DecoderSpec

__all__ = [
    "FAMILIES",
    "GGUF_ARCHITECTURES",
    "HF_TYPES",
    "DecoderSpec",
    "Family",
    "gguf_family",
    "gguf_refusal",
    "gguf_unverified",
    "hf_family",
]

FAMILIES: tuple[Family, ...] = (
    llama.FAMILY,
    mistral.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    phi3.FAMILY,
    gemma2.FAMILY,
    gemma3.FAMILY,
)
HF_TYPES = tuple(t for f in FAMILIES for t in f.hf_types)
GGUF_ARCHITECTURES = tuple(a for f in FAMILIES for a in f.gguf_architectures)


def hf_family(model_type: str | None, what: str) -> Family:
    """The family of an HF config's `model_type`; others are refused (optimum's layout takes
    them)."""
    for family in FAMILIES:
        if model_type in family.hf_types:
            return family
    raise ExportError(
        f"{what}: the gqa layout is for Llama-family models ({', '.join(HF_TYPES)}), "
        f"not {model_type}; use --layout optimum"
    )


def gguf_refusal(architecture: str | None) -> str:
    """Why the gqa layout does not read a GGUF of `architecture`: the sentence of its error."""
    note = next(
        (
            f" (the gqa layout reads {family.name} from HF folders only)"
            for family in FAMILIES
            if architecture in family.gguf_refused
        ),
        "",
    )
    return (
        f"GGUF architecture {architecture!r} is not one the gqa layout reads "
        f"({', '.join(GGUF_ARCHITECTURES)}){note}; use --layout optimum"
    )


def gguf_unverified(architecture: str | None) -> str:
    """Why the verify step has no reference for a GGUF of `architecture` ("" when it has)."""
    return next((f.gguf_unverified for f in FAMILIES if architecture in f.gguf_architectures), "")


def gguf_family(architecture: str | None, what: str) -> Family:
    """The family of a GGUF's `general.architecture`."""
    for family in FAMILIES:
        if architecture in family.gguf_architectures:
            return family
    raise ExportError(f"{what}: {gguf_refusal(architecture)}")
