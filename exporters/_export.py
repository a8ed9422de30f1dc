"""`export()`: a model source to an ONNX decoder with a KV cache, a manifest, and a verify step."""

from __future__ import annotations

import importlib.util
import logging
import resource
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxsample.errors import ExportError, InvalidParameter, count
from onnxsample.exporters import _fs, _manifest, _weights, families, gguf, hf
from onnxsample.exporters._options import (
    ACCURACY_LEVELS,
    QUANTISED,
    check_choices,
    default_output,
    lossy,
    resolve_options,
)
from onnxsample.exporters._source import Source, resolve_source
from onnxsample.exporters._verify import VerifyResult, reference_out_of_reach, verify_export

log = logging.getLogger(__name__)

STAGES = ("check", "load", "export", "verify")


ProgressFn = Callable[[str], None]
# What exporting and verifying import (the `export` extra); the runtime needs none of them.
EXPORT_STACK = ("torch", "transformers", "optimum", "accelerate", "gguf", "safetensors")


def require_export_stack() -> None:
    """Raise ExportError naming the `export` extra when a package of the exporter stack is missing."""
    missing = [name for name in EXPORT_STACK if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(
            f"exporting needs the export extra ({', '.join(missing)} not installed): "
            "pip install 'onnxsample[export]'"
        )


class DifferentExport(ExportError):
    """The output folder holds another export: another request, or the same one made by other
    exporter versions (``force=True`` overwrites it)."""


@dataclass
class ExportResult:
    """What :func:`export` produced: the folder, its manifest, and what it cost."""

    output: Path
    manifest: dict[str, Any]
    reused: bool
    seconds: float
    peak_rss_bytes: int

    @property
    def model_path(self) -> Path:
        return self.output / self.manifest["files"]["model"]

    @property
    def verify(self) -> dict[str, Any]:
        return self.manifest.get("verify", {})


def export(
    source: str | Path | None = None,
    output: str | Path | None = None,
    *,
    layout: str = "auto",
    precision: str = "auto",
    accuracy_level: int = 4,
    device: str = "cpu",
    attention: str = "gqa",
    force: bool = False,
    verify_tokens: int = 8,
    keep_hf: bool = False,
    progress: ProgressFn | None = None,
) -> ExportResult:
    """Export a model source to `output/model.onnx`: a decoder with a KV cache.

    `source` is a Hugging Face model folder, a `.gguf` file, or None for the embedded SmolLM2.
    `layout` is ``gqa`` (our GroupQueryAttention graph: the families of :mod:`.families`),
    ``optimum`` (optimum's export) or ``auto``; `precision` is fp32/fp16, int8/int4 (ORT's block
    quantiser, gqa only), ``gguf`` (the GGUF's own blocks, Q4_0 to Q8_0, K-quants and IQ4,
    exactly) or ``auto`` (see :func:`resolve_options`).
    `accuracy_level` 4 lets quantised MatMuls use int8 activations (faster), 0 computes in float.
    `device` ``cuda`` writes the GPU export: the gqa layout with fp16 activations and KV cache,
    float weights in fp16 and quantised ones as fp16 ``MatMulNBits`` (accuracy level 0: CUDA has
    no int8-activation path); ``cpu`` (the default) computes in fp32.
    `attention` (gqa layout, CPU) is ``gqa`` (GroupQueryAttention, the fastest) or ``exact``:
    plain ops whose result for a position does not depend on how many positions a call computes,
    so speculative decoding and echo give exactly what one-token steps give (see
    :mod:`onnxsample.exporters._exact_attention`).
    An existing export with the same request and exporter versions is reused unless `force`; a
    different one is an error. `progress(stage)` is called as each of :data:`STAGES` starts.
    """
    require_export_stack()
    if isinstance(accuracy_level, (bool, float)) or accuracy_level not in ACCURACY_LEVELS:
        raise InvalidParameter(f"accuracy_level must be 0 or 4, got {accuracy_level!r}")
    accuracy_level = int(accuracy_level)
    verify_tokens = count("verify_tokens", verify_tokens, 0)
    if progress is not None and not callable(progress):
        raise InvalidParameter(f"progress must be a callable or None, got {progress!r}")
    check_choices(layout, precision, device, attention)
    start = time.perf_counter()
    stage = progress or (lambda _name: None)

    stage("check")
    src = resolve_source(source)
    info = gguf.inspect_gguf(src.path) if src.kind != "hf" else None
    model_type = (
        info.architecture if info is not None else hf.check_hf_folder(src.path)["model_type"]
    )
    layout, precision = resolve_options(src, info, model_type, layout, precision, device)
    if src.parts and layout != "gqa":
        raise ExportError(
            f"{src.path.name}: the optimum layout reads a GGUF through transformers, which takes "
            f"one file, not the {len(src.parts)} parts of a split GGUF (the gqa layout reads them)"
        )
    if attention == "exact" and layout != "gqa":
        raise ExportError("--attention exact is an attention of the gqa layout: use --layout gqa")
    if keep_hf and (info is None or layout != "optimum"):
        made = "a Hugging Face folder is the source" if info is None else "the gqa layout reads it"
        raise ExportError(
            f"--keep-hf keeps the Hugging Face folder the optimum layout de-quantises a GGUF into; "
            f"this export makes none ({made}); with a GGUF, add --layout optimum"
        )
    if precision not in QUANTISED or device == "cuda":
        accuracy_level = 0
    out = (
        Path(output)
        if output is not None
        else default_output(src, layout, precision, accuracy_level, device, attention)
    )
    out = out.expanduser().absolute()
    _fs.check_output(out)
    existing = None if force else _existing(out)
    # The source's files unchanged since that export hashed them: its sha256 is not read again.
    fingerprint = src.digest((existing or {}).get("source"))
    key = _manifest.request_key(
        fingerprint.sha256, layout, precision, accuracy_level, device, attention
    )
    reused = _reuse(out, key, existing)
    if reused is not None:
        if fingerprint.stamp is not None and reused["source"].get("stamp") != fingerprint.stamp:
            # Read again and found the same (the files were new when exported, or moved): the
            # next reuse need not read them.
            reused = _manifest.restamp_source(out, reused, fingerprint.stamp)
        return ExportResult(out, reused, True, time.perf_counter() - start, _peak_rss())
    # After the reuse: these import transformers (and for the optimum layout optimum: seconds),
    # and an export of this very request by these exporter versions passed them when it was made.
    # The gqa layout's families were checked by resolve_options; it never imports optimum.
    if info is not None:
        gguf.check_architecture(info, optimum=layout == "optimum", what=src.name)
    elif layout == "optimum":
        hf.check_model_type(model_type, f"model type {model_type!r}")
    own = _manifest.own_files(out)
    if out.is_dir():  # forced: what no export wrote stays, and no export writes over it
        kept = [p.name for p in out.iterdir() if p.name not in own]
        _fs.check_kept(out, kept, _manifest.EXPORT_NAMES)
    _fs.check_disk(out, _disk_needed(src, info, precision, keep_hf))
    skip_verify = _verify_skipped(src, info, layout) if verify_tokens else ""

    with _fs.staged_folder(out, own) as tmp:
        if layout == "gqa":
            reference = 0 if skip_verify else verify_tokens
            config, generation, tokenizer, vocab, model = _export_gqa(
                src, info, tmp, precision, accuracy_level, device, attention, reference, stage
            )
        else:
            config, generation, tokenizer, vocab, model = _export_optimum(
                src, info, tmp, precision, keep_hf, stage
            )
        _write_tokenizer_json(tokenizer, tmp, src.name)
        stage("verify")
        if skip_verify:
            log.warning("%s: verify step skipped: %s", src.name, skip_verify)
            checked = VerifyResult(0, None, note=f"skipped ({skip_verify})")
        elif verify_tokens:
            checked = verify_export(
                tmp / "model.onnx",
                model,
                tokenizer,
                verify_tokens,
                lossy=lossy(precision, accuracy_level, device),
            )
        else:
            checked = VerifyResult(0, None, note="skipped (verify_tokens=0)")
        if info is not None and not keep_hf:
            shutil.rmtree(tmp / "hf", ignore_errors=True)
        manifest = _manifest.build_manifest(
            key,
            src,
            fingerprint,
            tmp,
            config,
            generation,
            _manifest.tokenizer_facts(tokenizer, vocab),
            info,
            checked,
            start,
        )
        _manifest.write_manifest(tmp, manifest)
    log.info("exported %s to %s in %.1f s", src.name, out, manifest["export_seconds"])
    return ExportResult(out, manifest, False, time.perf_counter() - start, _peak_rss())


def _export_optimum(src: Source, info, tmp: Path, precision: str, keep_hf: bool, stage):
    stage("load")
    vocab = None
    if info is not None:
        hf_dir = tmp / "hf"
        model, vocab, tokenizer = gguf.gguf_to_hf(src.path, info, hf_dir)
    else:
        hf_dir = src.path
        model, tokenizer = hf.load_hf(hf_dir)
    stage("export")
    hf.optimum_export(hf_dir, tmp, precision)
    _copy_hf_files(hf_dir, tmp)
    return model.config, model.generation_config, tokenizer, vocab, model


def _export_gqa(
    src: Source, info, tmp: Path, precision, accuracy_level, device, attention, verify_tokens, stage
):
    """Our GroupQueryAttention graph; transformers only reads the tokenizer (and the reference
    model for the verify step)."""
    from onnxsample.exporters import gqa

    stage("load")
    vocab = None
    if info is not None:
        vocab, tokenizer = gguf.gguf_tokenizer(src.path, tmp)
        config = gguf.gguf_config(src.path)
        generation = gguf.gguf_generation_config(info, vocab.eog_token_ids)
        spec, weights = _weights.read_gguf(src.path, info.metadata, quantized=precision == "gguf")
        if getattr(config, "head_dim", None) not in (None, spec.head_dim):
            # transformers' GGUF config skips attention.key_length (Qwen3 takes its default 128)
            config.head_dim = spec.head_dim
        config.save_pretrained(tmp)
        generation.save_pretrained(tmp)
    else:
        tokenizer, config, generation = hf.load_hf_config(src.path)
        _check_tokenizer_json(tokenizer, src.path)
        spec, weights = _weights.read_hf(src.path)
        _copy_hf_files(src.path, tmp)
    if spec.max_positions < int(getattr(config, "max_position_embeddings", 0) or 0):
        # LongRoPE's short factors hold up to original_max_position_embeddings only (see
        # families/phi3.py): the manifest's context length is the export's
        log.warning(
            "%s: the export's context is %d positions (LongRoPE's short factors), not %d",
            src.name,
            spec.max_positions,
            config.max_position_embeddings,
        )
        config.max_position_embeddings = spec.max_positions
        if info is not None:
            config.save_pretrained(tmp)
    if device == "cuda":
        _warn_cpu_checked(spec, src.name)
    stage("export")
    activations = "fp16" if device == "cuda" or precision == "fp16" else "fp32"
    gqa.write_gqa(
        spec, weights, tmp / "model.onnx", precision, accuracy_level, activations, attention
    )
    del weights
    model = None
    if verify_tokens:
        model = (
            gguf.gguf_model(src.path, info, vocab.eog_token_ids)
            if info is not None
            else hf.load_hf(src.path)[0]
        )
    return config, generation, tokenizer, vocab, model


def _check_tokenizer_json(tokenizer, folder: Path) -> None:
    """ExportError, before any work, when `folder` has no ``tokenizer.json`` and transformers
    reads its tokenizer as a slow one only (no fast form to write one from)."""
    if not (folder / "tokenizer.json").is_file() and not hasattr(tokenizer, "backend_tokenizer"):
        raise ExportError(
            f"{folder} has no tokenizer.json, and transformers reads its tokenizer as a slow one "
            "only, which cannot be written as one"
        )


def _write_tokenizer_json(tokenizer, tmp: Path, name: str) -> None:
    """The export's ``tokenizer.json`` where the source has none (a SentencePiece
    ``tokenizer.model`` alone): the fast tokenizer transformers converted it to, as
    ``save_pretrained`` writes it; the export runs on that file alone."""
    if (tmp / "tokenizer.json").is_file():
        return
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ExportError(
            f"{name} has no tokenizer.json, and transformers reads its tokenizer as a slow one "
            "only, which cannot be written as one"
        )
    backend.save(str(tmp / "tokenizer.json"))


def _copy_hf_files(hf_dir: Path, tmp: Path) -> None:
    for name in _manifest.KEPT_FROM_HF:
        if (hf_dir / name).is_file() and not (tmp / name).is_file():
            shutil.copy2(hf_dir / name, tmp / name)


def _existing(out: Path) -> dict[str, Any] | None:
    """The manifest of the export in `out`; None if `out` is free to write. A folder that is not
    empty and holds no export is an error."""
    if not out.is_dir() or not any(out.iterdir()):
        return None
    existing = _manifest.read_manifest(out)
    if existing is None:
        raise ExportError(
            f"{out} is not empty and holds no onnxsample export; choose another folder or pass --force"
        )
    return existing


def _reuse(
    out: Path, key: dict[str, Any], existing: dict[str, Any] | None
) -> dict[str, Any] | None:
    """`existing` if it is this very export; None if `out` is free to (re)write."""
    if existing is None:
        return None
    if _manifest.manifest_matches(existing, key) and (out / existing["files"]["model"]).is_file():
        if not (out / "tokenizer.json").is_file():  # a folder's tokenizer.model, not converted
            raise DifferentExport(
                f"{out} holds this export without its tokenizer.json, which it cannot run "
                "without; pass --force to export it anew"
            )
        log.info("reusing the export in %s", out)
        return existing
    what = ", ".join(
        str(v)
        for v in (
            existing.get("source", {}).get("name", "?"),
            existing.get("layout", "optimum"),
            existing.get("precision", "?"),
        )
    )
    raise DifferentExport(
        f"{out} holds a different export ({what}, other request or exporter versions); pass --force to overwrite it"
    )


def _disk_needed(src: Source, info: gguf.GGUFInfo | None, precision: str, keep_hf: bool) -> int:
    out_bytes = 2 if precision == "fp16" else 4  # quantised exports keep a float embedding table
    if info is not None:
        n_params = info.n_params
        hf_bytes = 4 * n_params  # de-quantised safetensors, staged then removed unless kept
    else:
        n_params = hf.approximate_params(src.path)
        hf_bytes = 0
    return int(1.1 * (n_params * out_bytes + hf_bytes)) + (1 << 26)


def _verify_skipped(src: Source, info: gguf.GGUFInfo | None, layout: str) -> str:
    """Why the verify step will not run ('' when it will): a family whose GGUF transformers
    reads otherwise than llama.cpp, or an fp32 reference too large for this machine's memory
    (optimum's layout loads that model to export it, so it is checked there by the export)."""
    if layout != "gqa":
        return ""
    if info is not None and (unverified := families.gguf_unverified(info.architecture)):
        return unverified
    if src.parts:
        return "transformers' GGUF loader, the reference, reads one file, not a split GGUF's parts"
    n_params = info.n_params if info is not None else hf.approximate_params(src.path)
    return reference_out_of_reach(n_params)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _warn_cpu_checked(spec, name: str) -> None:
    """The GPU export writes sliding windows, partial rotary and soft-caps as the CPU export does
    (GroupQueryAttention's `local_window_size`, a narrower cos/sin cache, `softcap`; the logits'
    soft-cap is Div/Tanh/Mul): CUDA's kernel takes the same attributes, but its numbers were held to
    transformers on the CPU kernel only, and its placement on the simulated CUDA device."""
    checked = []
    if spec.layer_windows:
        checked.append("sliding-window attention (local_window_size)")
    if spec.rotary_dims < spec.head_dim:
        checked.append(f"partial rotary ({spec.rotary_dims} of {spec.head_dim} values per head)")
    if spec.attn_softcap:
        checked.append("attention soft-capping")
    if not checked:
        return
    log.warning(
        "%s: %s checked against transformers on ONNX Runtime's CPU GroupQueryAttention only; "
        "CUDA's GroupQueryAttention takes the same attributes, and the GPU export is checked for "
        "placement on a simulated CUDA device, not for its numbers on a GPU",
        name,
        " and ".join(checked),
    )
