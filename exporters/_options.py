"""Which export a request means: the choices and their refusals, ``auto`` decided for a source,
and the folder name that says what was chosen."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from onnxsample.errors import ExportError, InvalidParameter
from onnxsample.exporters import _gguf_quant, families, gguf
from onnxsample.exporters._source import Source

__all__ = [
    "ACCURACY_LEVELS",
    "ATTENTIONS",
    "DEVICES",
    "LAYOUTS",
    "PRECISIONS",
    "QUANTISED",
    "check_choices",
    "default_output",
    "export_name",
    "lossy",
    "resolve_options",
]

log = logging.getLogger(__name__)

LAYOUTS = ("auto", "gqa", "optimum")
DEVICES = ("cpu", "cuda")
ATTENTIONS = ("gqa", "exact")  # GroupQueryAttention, or exporters._exact_attention's plain ops
PRECISIONS = ("auto", "fp32", "fp16", "int8", "int4", "gguf")
# Up to this many parameters the GPU export of a GGUF takes fp16 weights by default. On the
# simulated device the embedded 135M model alone launches 367 kernels a decode step with fp16
# weights against 731 with its Q4_1 blocks (317 and 681 composed, greedy) (MatMulNBits, then the block sums, a GEMM and an Add for the
# minimums); the fp16 weights read some 1.5 bytes a parameter more. At an H100's 3.35 TB/s a
# billion parameters cost ~0.45 ms more a step that way, about what those kernels cost: above it
# the blocks' bytes win. An estimate until a GPU measures the crossing.
GPU_FP16_MAX_PARAMS = 1_000_000_000
ACCURACY_LEVELS = (0, 4)
QUANTISED = ("int8", "int4", "gguf")


def export_name(
    name: str,
    layout: str,
    precision: str,
    accuracy_level: int,
    device: str = "cpu",
    attention: str = "gqa",
) -> str:
    """Folder name of an export: the source's name, plus what is not the optimum fp32 default."""
    if device == "cuda":
        return f"{name}-{layout}-{precision}-cuda"
    if (layout, precision) == ("optimum", "fp32"):
        return name
    suffix = f"-{layout}-{precision}"
    suffix += f"-a{accuracy_level}" if precision in QUANTISED else ""
    return name + suffix + ("-exact" if attention == "exact" else "")


def resolve_options(
    src: Source,
    info: gguf.GGUFInfo | None,
    model_type: str,
    layout: str,
    precision: str,
    device: str = "cpu",
) -> tuple[str, str]:
    """(layout, precision) with ``auto`` decided for this source; refuse what cannot be combined.

    `model_type` is the HF config's (for a GGUF: its architecture). ``auto`` layout is ``gqa`` for
    the families of :mod:`.families` (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2/3) and
    ``optimum`` otherwise; ``auto`` precision is ``gguf`` (the file's own blocks) for a GGUF whose
    weights are all transplantable, else fp32 (fp16 for ``cuda``). For ``cuda``, a GGUF of at most
    :data:`GPU_FP16_MAX_PARAMS` parameters is de-quantised to fp16 instead: a small model's decode
    step on a GPU is bound by how many kernels it launches, not by the bytes of its weights.

    ``device="cuda"`` is the GPU export: our GQA graph with fp16 activations and KV cache, where
    every compute node has a CUDA kernel (CUDA's GroupQueryAttention takes fp16/bf16 only).
    """
    check_choices(layout, precision, device)
    if device == "cuda":
        if layout == "optimum":
            raise ExportError(
                "--device cuda writes our GroupQueryAttention layout (fp16): drop --layout optimum"
            )
        if precision == "fp32":
            raise ExportError(
                "--device cuda computes in fp16 (CUDA's attention has no fp32 kernel): use "
                "--precision auto, fp16, int4, int8 or gguf"
            )
    known = families.GGUF_ARCHITECTURES if info is not None else families.HF_TYPES
    ours = model_type in known
    if layout == "auto":
        layout = "gqa" if ours else "optimum"
    elif layout == "gqa" and not ours and info is not None:
        raise ExportError(families.gguf_refusal(model_type))
    elif layout == "gqa" and not ours:
        raise ExportError(
            f"the gqa layout is for Llama-family models ({', '.join(known)}), not {model_type}; "
            "use --layout optimum"
        )
    transplantable = info is not None and not untransplantable(info)
    if precision == "auto":
        float_precision = "fp16" if device == "cuda" else "fp32"
        precision = "gguf" if layout == "gqa" and transplantable else float_precision
        if precision == "gguf" and device == "cuda" and info.n_params <= GPU_FP16_MAX_PARAMS:
            precision = "fp16"
            log.info(
                "%s: %.0fM parameters: the GPU export de-quantises them to fp16 (one GEMM a "
                "projection, where the blocks take up to five kernels); --precision gguf keeps "
                "the blocks",
                src.path.name,
                info.n_params / 1e6,
            )
        if info is not None and layout == "gqa" and not transplantable:
            log.warning(
                "%s: %s cannot be transplanted as they are: exporting de-quantised %s weights",
                src.path.name,
                _untransplantable_tensors(info),
                float_precision,
            )
    if layout == "optimum" and precision not in ("fp32", "fp16"):
        raise ExportError(f"precision {precision} needs --layout gqa (optimum: fp32, fp16)")
    if precision == "gguf":
        if info is None:
            raise ExportError(
                "precision gguf transplants a GGUF file's own blocks: give a .gguf source"
            )
        if untransplantable(info):
            raise ExportError(
                f"{src.path.name}: precision gguf cannot transplant "
                f"{_untransplantable_tensors(info)} (supported: "
                f"{', '.join(_gguf_quant.SUPPORTED)}); use --precision fp32, int8 or int4"
            )
    return layout, precision


def lossy(precision: str, accuracy_level: int, device: str = "cpu") -> str:
    """Why an export does not compute what transformers computes ('' when it should)."""
    if precision in ("int8", "int4"):
        return "re-quantised weights"
    if device == "cuda" or precision == "fp16":
        return "fp16 activations"
    if precision == "gguf" and accuracy_level == 4:
        return "int8 activations"
    return ""


def check_choices(layout: str, precision: str, device: str = "cpu", attention: str = "gqa") -> None:
    if device not in DEVICES:
        raise InvalidParameter(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if attention not in ATTENTIONS:
        raise InvalidParameter(
            f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}"
        )
    if attention == "exact" and device == "cuda":
        raise InvalidParameter(
            "--attention exact is for the CPU (the GPU's GEMM kernels are chosen by shape, so "
            "plain ops give no such guarantee there): drop it with --device cuda"
        )
    if layout not in LAYOUTS:
        raise InvalidParameter(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if precision not in PRECISIONS:
        raise InvalidParameter(
            f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
        )


def untransplantable(info: gguf.GGUFInfo) -> list[str]:
    """GGUF tensor types that precision gguf cannot carry over as they are."""
    return sorted(set(info.tensor_types) - set(_gguf_quant.SUPPORTED))


def _untransplantable_tensors(info: gguf.GGUFInfo) -> str:
    """The tensors precision gguf cannot carry, named with their types (the first few)."""
    bad = [f"{n} ({t})" for n, t in info.tensors.items() if t not in _gguf_quant.SUPPORTED]
    return ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")


def default_output(source: Source, *options: Any) -> Path:
    """artifacts/ + :func:`export_name` of `source` with `options` (layout, precision, ...)."""
    return Path("artifacts") / export_name(source.name, *options)
