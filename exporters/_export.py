"""`export()`: a model source to an ONNX decoder with a KV cache, a manifest, and a verify step."""

from __future__ import annotations

import logging
import resource
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from onnxsample.errors import ExportError, InvalidParameter
from onnxsample.exporters import _fs, _manifest, gguf, hf
from onnxsample.exporters._source import Source, resolve_source
from onnxsample.exporters._verify import VerifyResult, verify_export

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16")
STAGES = ("check", "load", "export", "verify")
_KEEP_FROM_HF = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)

ProgressFn = Callable[[str], None]


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


def default_output(source: Source, precision: str) -> Path:
    name = source.name if precision == "fp32" else f"{source.name}-{precision}"
    return Path("artifacts") / name


def export(
    source: str | Path | None = None,
    output: str | Path | None = None,
    *,
    precision: str = "fp32",
    force: bool = False,
    verify_tokens: int = 8,
    keep_hf: bool = False,
    progress: ProgressFn | None = None,
) -> ExportResult:
    """Export a model source to `output/model.onnx` (optimum's decoder layout with a KV cache).

    `source` is a Hugging Face model folder, a `.gguf` file, or None for the embedded SmolLM2. An
    existing export with the same source, precision and exporter versions is reused unless `force`;
    a different one is an error. `progress(stage)` is called as each of :data:`STAGES` starts.
    """
    if precision not in PRECISIONS:
        raise InvalidParameter(
            f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
        )
    if verify_tokens < 0:
        raise InvalidParameter(f"verify_tokens must be >= 0, got {verify_tokens}")
    start = time.perf_counter()
    stage = progress or (lambda _name: None)

    stage("check")
    src = resolve_source(source)
    out = Path(output) if output is not None else default_output(src, precision)
    out = out.expanduser().absolute()
    _fs.check_output(out)
    info = gguf.inspect_gguf(src.path) if src.kind != "hf" else None
    if src.kind == "hf":
        hf.check_hf_folder(src.path)
    key = _manifest.request_key(src.digest(), precision)
    reused = _reuse(out, key, force)
    if reused is not None:
        return ExportResult(out, reused, True, time.perf_counter() - start, _peak_rss())
    _fs.check_disk(out, _disk_needed(src, info, precision, keep_hf))

    with _fs.staged_folder(out) as tmp:
        stage("load")
        if info is not None:
            hf_dir = tmp / "hf"
            model, tokenizer = gguf.gguf_to_hf(src.path, info, hf_dir)
        else:
            hf_dir = src.path
            model, tokenizer = hf.load_hf(hf_dir)
        stage("export")
        hf.optimum_export(hf_dir, tmp, precision)
        for name in _KEEP_FROM_HF:
            if (hf_dir / name).is_file() and not (tmp / name).is_file():
                shutil.copy2(hf_dir / name, tmp / name)
        stage("verify")
        if verify_tokens:
            checked = verify_export(tmp / "model.onnx", model, tokenizer, verify_tokens)
        else:
            checked = VerifyResult(0, None, note="skipped (verify_tokens=0)")
        if info is not None and not keep_hf:
            shutil.rmtree(hf_dir)
        manifest = _build_manifest(key, src, tmp, model, tokenizer, info, checked, start)
        _manifest.write_manifest(tmp, manifest)
    log.info("exported %s to %s in %.1f s", src.name, out, manifest["export_seconds"])
    return ExportResult(out, manifest, False, time.perf_counter() - start, _peak_rss())


def _reuse(out: Path, key: dict[str, Any], force: bool) -> dict[str, Any] | None:
    """The existing manifest if `out` holds this very export; None if `out` is free to (re)write."""
    if force or not out.is_dir() or not any(out.iterdir()):
        return None
    existing = _manifest.read_manifest(out)
    if existing is None:
        raise ExportError(
            f"{out} is not empty and holds no onnxsample export; choose another folder or pass --force"
        )
    if _manifest.manifest_matches(existing, key) and (out / existing["files"]["model"]).is_file():
        log.info("reusing the export in %s", out)
        return existing
    what = f"{existing.get('source', {}).get('name', '?')}, {existing.get('precision', '?')}"
    raise ExportError(
        f"{out} holds a different export ({what}, other source or exporter versions); pass --force to overwrite it"
    )


def _disk_needed(src: Source, info: gguf.GGUFInfo | None, precision: str, keep_hf: bool) -> int:
    out_bytes = 2 if precision == "fp16" else 4
    if info is not None:
        n_params = info.n_params
        hf_bytes = 4 * n_params  # de-quantised safetensors, staged then removed unless kept
    else:
        n_params = _fs.folder_size(src.path) // 2  # bf16/fp16 checkpoints; fp32 ones overestimate
        hf_bytes = 0
    return int(1.1 * (n_params * out_bytes + hf_bytes)) + (1 << 26)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _eos_ids(model, tokenizer, info: gguf.GGUFInfo | None) -> list[int]:
    ids: set[int] = set(info.eog_ids()) if info is not None else set()
    for value in (
        model.generation_config.eos_token_id,
        model.config.eos_token_id,
        tokenizer.eos_token_id,
    ):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return sorted(ids)


def _build_manifest(
    key, src: Source, folder: Path, model, tokenizer, info, checked, start
) -> dict[str, Any]:
    config = model.config
    files = sorted(
        p.name
        for p in folder.iterdir()
        if p.name.startswith("model.onnx") and p.name != "model.onnx"
    )
    return {
        **key,
        "source": {
            **src.to_json(),
            "sha256": key["source_sha256"],
            "bytes": _fs.folder_size(src.path) if src.path.is_dir() else src.path.stat().st_size,
        },
        "model": {
            "architecture": info.architecture if info is not None else config.model_type,
            "model_type": config.model_type,
            "vocab_size": int(config.vocab_size),
            "num_layers": int(config.num_hidden_layers),
            "hidden_size": int(config.hidden_size),
            "num_attention_heads": int(config.num_attention_heads),
            "num_key_value_heads": int(
                getattr(config, "num_key_value_heads", config.num_attention_heads)
            ),
            "max_position_embeddings": int(getattr(config, "max_position_embeddings", 0) or 0),
        },
        "tokens": {
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_ids": _eos_ids(model, tokenizer, info),
            "pad_token_id": tokenizer.pad_token_id,
            "chat_template": bool(getattr(tokenizer, "chat_template", None)),
            "add_bos_token": bool(getattr(tokenizer, "add_bos_token", False)),
        },
        "files": {"model": "model.onnx", "external_data": files, "bytes": _fs.folder_size(folder)},
        "io": _manifest.describe_io(folder / "model.onnx"),
        "verify": checked.to_json(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "export_seconds": round(time.perf_counter() - start, 2),
    }
