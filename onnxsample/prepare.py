"""From what a user names (nothing, a .gguf file, a Hugging Face folder, an export folder, an .onnx
file) to a composed model to run.

Nothing means the embedded SmolLM2: exported into the user cache on first use (for the GPU with
``device="cuda"``: the fp16 GQA export). A .gguf file or a Hugging Face model folder is exported
there too on first use, as ``onnxsample export`` exports it by default, into a folder of its own
per source path and device (``exports/<digest of the path>[-cuda][-exact]/<name>``); the export is
reused while the source's files are unchanged, and made again when they change. An export folder
or a plain model is composed on the fly with the full chain and room for every run option (top
logprobs, logit bias); an existing, up-to-date `composed.onnx` beside the model is used as it is.
``static`` composes the chain without control flow (CUDA graphs) beside it, as
`composed-static.onnx`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from onnxsample.errors import InvalidParameter, ModelError, check_count
from onnxsample.metadata import (
    COMPOSER_REVISION,
    CONTRACT_VERSION,
    ComposedMetadata,
    composed_metadata,
)

__all__ = ["RUN_COMPOSE_OPTIONS", "cache_dir", "prepare"]

log = logging.getLogger(__name__)

# One graph for every request `onnxsample run` (and the engine) can make: 8 sequences, up to 20 top
# logprobs, 16 logit-bias entries per sequence, prompt logprobs (echo), and on GroupQueryAttention
# exports up to 8 draft tokens per sequence and step (speculative decoding, used only when asked).
RUN_COMPOSE_OPTIONS = {
    "max_slots": 8,
    "top_logprobs": 20,
    "max_bias": 16,
    "prompt_logprobs": True,
    "allowed_tokens": True,
    "draft_tokens": "auto",
}


def cache_dir() -> Path:
    """Where `run` keeps the embedded model's export: $ONNXSAMPLE_CACHE, else the user cache."""
    if os.environ.get("ONNXSAMPLE_CACHE"):
        return Path(os.environ["ONNXSAMPLE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "onnxsample"


def _composed(path: Path) -> ComposedMetadata | None:
    return composed_metadata(path)


def _up_to_date(
    composed: Path,
    model: Path,
    slots: int,
    static: bool = False,
    candidates: int = 0,
    probs: bool = False,
) -> bool:
    if not composed.is_file():
        return False
    if model.is_file() and composed.stat().st_mtime < model.stat().st_mtime:
        return False
    meta = _composed(composed)
    return (
        meta is not None
        and meta.contract == CONTRACT_VERSION
        and meta.composer_revision == COMPOSER_REVISION
        and meta.max_slots == slots
        and meta.static == static
        and meta.output_candidates == candidates
        and meta.output_probs == probs
    )


def prepare(
    model: str | Path | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    max_slots: int | None = None,
    device: str = "cpu",
    static: bool = False,
    attention: str = "gqa",
    candidates: int = 0,
    probs: bool = False,
) -> Path:
    """The composed model to run for `model`, exporting and composing it first when needed.

    A composed file is used as it is (its slots included). A .gguf file or a Hugging Face folder
    is exported first (into the user cache, once; see the module). An export folder or a plain
    model is composed with :data:`RUN_COMPOSE_OPTIONS`, and `max_slots` slots when given (kept
    apart: ``composed-s16.onnx``); `static` composes the chain without control flow and without
    draft verification (``composed-static.onnx``); `candidates` K > 0 composes the graph's K
    candidates instead of draft verification, for host samplers such as llama.cpp's infill
    sampler (``composed-c64.onnx``); `probs` composes the final distribution each token is drawn
    from (``sampler.probs``) instead of draft verification, for llama-server's
    ``post_sampling_probs`` (``composed-p.onnx``). `device` ``cuda`` exports the embedded model, a
    .gguf file or a Hugging Face folder for the GPU (fp16); `attention` ``exact`` exports them with
    exact attention (speculative decoding and echo then give exactly what one-token steps give;
    see ``onnxsample export --attention``)."""
    slots = RUN_COMPOSE_OPTIONS["max_slots"] if max_slots is None else max_slots
    check_count("max_slots", slots, 1)
    if device not in ("cpu", "cuda"):
        raise InvalidParameter(f"device must be cpu or cuda, got {device!r}")
    if attention not in ("gqa", "exact"):
        raise InvalidParameter(f"attention must be gqa or exact, got {attention!r}")
    check_count("candidates", candidates, 0)
    if not isinstance(probs, bool):
        raise InvalidParameter(f"probs must be a boolean, got {probs!r}")
    if probs and static:
        raise InvalidParameter(
            "probs gives a branching chain's final distribution, and static composes the static "
            "chain (which the host draws again past its candidates): choose one"
        )
    source = model is not None and _is_source(Path(model).expanduser())
    if attention == "exact" and model is not None and not source:
        raise InvalidParameter(
            "--attention exact chooses the export of the embedded model, a .gguf file or a "
            "Hugging Face folder: export your model with `onnxsample export --attention exact` "
            "and run that folder"
        )
    suffix = (
        ("-static" if static else "")
        + ("" if slots == RUN_COMPOSE_OPTIONS["max_slots"] else f"-s{slots}")
        + (f"-c{candidates}" if candidates else "")
        + ("-p" if probs else "")
    )
    if model is None:
        from onnxsample.exporters._options import export_name
        from onnxsample.exporters.embedded import EMBEDDED_NAME

        # The fastest export that keeps llama.cpp's quality: our GQA graph on the GGUF's own blocks
        # with int8 activations on the CPU, as llama.cpp; on the GPU fp16 weights and activations
        # (the model is small: a step costs its kernels, and fp16 weights take half of them).
        precision = "fp16" if device == "cuda" else "gguf"
        options = {"layout": "gqa", "precision": precision, "accuracy_level": 4, "device": device}
        if attention == "exact":
            options["attention"] = attention
        folder = cache_dir() / export_name(EMBEDDED_NAME, **options)
        _export_cached(None, folder, progress, options)
    elif source:
        folder = _export_source(Path(model).expanduser(), progress, device, attention)
    else:
        path = Path(model)
        if path.is_file():
            if path.suffix != ".onnx":
                raise ModelError(f"{path} is not an .onnx file, a .gguf file or an export folder")
            if _composed(path) is not None:
                return _checked(path, candidates, probs)
            folder = path.parent
            if path.name != "model.onnx":
                target = path.with_name(f"{path.stem}.composed{suffix}.onnx")
                if _up_to_date(target, path, slots, static, candidates, probs):
                    return target
                return _compose(path, target, progress, slots, static, candidates, probs)
        elif path.is_dir():
            folder = path
        else:
            raise ModelError(f"no such model file or folder: {path}")
    target = folder / f"composed{suffix}.onnx"
    if _up_to_date(target, folder / "model.onnx", slots, static, candidates, probs):
        log.info("using %s", target)
        return target
    if not (folder / "model.onnx").is_file():  # nor a config.json: _is_source said so
        raise ModelError(
            f"{folder} is a folder with neither a model.onnx (an export) nor a config.json (a "
            "Hugging Face model to export)"
        )
    return _compose(folder, target, progress, slots, static, candidates, probs)


def _checked(composed: Path, candidates: int, probs: bool = False) -> Path:
    """A composed file runs as it is: asked for candidates or the final distribution, it must
    have them."""
    meta = _composed(composed)
    have = meta.output_candidates
    if candidates and have < candidates:
        raise InvalidParameter(
            f"{composed} was composed with {have} candidates, not {candidates}: serve its export "
            f"folder, or compose it again with --candidates {candidates} --draft-tokens 0"
        )
    if probs and not meta.final_probs:
        raise InvalidParameter(
            f"{composed} was not composed with the final distribution of a branching chain: "
            "serve its export folder, or compose it again with --output-probs --draft-tokens 0"
        )
    return composed


def _is_source(path: Path) -> bool:
    """Whether `path` is what ``onnxsample export`` reads rather than an export: a .gguf file, or a
    Hugging Face folder (its config.json without a model.onnx beside it)."""
    if path.is_file():
        from onnxsample._gguf_file import is_gguf

        return path.suffix.lower() == ".gguf" or is_gguf(path)
    return path.is_dir() and (path / "config.json").is_file() and not (path / "model.onnx").exists()


def _export_source(path: Path, progress, device: str, attention: str) -> Path:
    """The export folder of a .gguf file or Hugging Face folder, exported on first use with
    `onnxsample export`'s defaults (and `device`, `attention`) into the user cache."""
    from onnxsample.exporters._source import resolve_source

    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    digest += ("-cuda" if device == "cuda" else "") + ("-exact" if attention == "exact" else "")
    # `serve`'s model name: the file's or folder's (a split GGUF's without its -00001-of-0000N),
    # a link's own name (a hub cache's snapshots/REV/NAME.gguf, not its blob's hash)
    source = resolve_source(path)
    options = {"device": device} | ({"attention": attention} if attention == "exact" else {})
    folder = cache_dir() / "exports" / digest / source.name
    made = [p for p in (folder.parent, folder.parent.parent, cache_dir()) if not p.exists()]
    try:
        _export_cached(source.path, folder, progress, options)
    except BaseException:  # a failed export leaves no folders behind, the cache's own included
        for parent in made:  # innermost first
            with contextlib.suppress(OSError):
                parent.rmdir()  # only where empty: another export may have begun there
        raise
    return folder


def _export_cached(source: Path | None, folder: Path, progress, options: dict) -> None:
    """Export `source` into `folder`, our cache: an export of other files or exporter versions
    there is made again."""
    from onnxsample.exporters import export
    from onnxsample.exporters._export import DifferentExport

    try:
        export(source, folder, progress=progress, **options)
    except DifferentExport:
        log.info("%s holds an export of other files or exporter versions: exporting again", folder)
        export(source, folder, progress=progress, force=True, **options)


def _compose(
    source: Path,
    target: Path,
    progress,
    slots: int,
    static: bool = False,
    candidates: int = 0,
    probs: bool = False,
) -> Path:
    from onnxsample.composer import compose  # onnxscript: only when a graph is built

    options = {**RUN_COMPOSE_OPTIONS, "max_slots": slots}
    if static:
        options.update(static=True, draft_tokens=0)
    if candidates:  # the candidates describe one position per slot: no draft verification
        options.update(output_candidates=candidates, draft_tokens=0)
    if probs:  # likewise: the distribution of one position per slot
        options.update(output_probs=True, draft_tokens=0)
    return compose(source, None, target, progress=progress, **options)
