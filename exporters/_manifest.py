"""`onnxsample.json`: what an export folder holds, where it came from, and with which tools."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from onnxsample.errors import ExportError
from onnxsample.exporters import _fs

if TYPE_CHECKING:
    from onnxsample.exporters._source import Fingerprint, Source

log = logging.getLogger(__name__)

MANIFEST_NAME = "onnxsample.json"
FORMAT_VERSION = 1
# Bumped when the same request writes another graph (an export made before is then not reused):
# 2, GGUF blocks of every type (centred minimums, quantised embeddings) and the GGUF's tokenizer
# as llama.cpp reads it; 3, exact attention never gives a linear layer one row; 4, weights stored
# in the bytes their values need (fp16 where exact, 5- and 6-bit codes as bit planes, a tied float
# LM head over its table); 5, an fp16 Gemma export keeps its residual stream in float32; 6, float
# matrices of bfloat16 values (bf16 checkpoints, BF16 GGUFs) stored as bfloat16; 7, GGUF queries
# and keys one weight where the value projection's blocks differ (one linear and one minimums'
# correction less); 8, a GGUF's rope_freqs (Llama 3.1+) divide the rotary frequencies.
EXPORTER_REVISION = 8
_STACK = ("onnxsample", "torch", "transformers", "optimum", "optimum-onnx", "onnx", "gguf")
_ELEM = {v: k for k, v in onnx.TensorProto.DataType.items()}


def stack_versions() -> dict[str, str]:
    """Versions of the packages that shape an export; a change in any of them means a new export."""
    versions = {}
    for name in _STACK:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "missing"
    return versions


def _value_info(v: onnx.ValueInfoProto) -> dict[str, Any]:
    t = v.type.tensor_type
    shape = [d.dim_param or d.dim_value for d in t.shape.dim]
    return {"name": v.name, "dtype": _ELEM.get(t.elem_type, "UNDEFINED").lower(), "shape": shape}


def describe_io(model_path: Path) -> dict[str, Any]:
    """Inputs, outputs and KV-cache layout of an exported decoder, read without loading weights."""
    model = onnx.load(str(model_path), load_external_data=False)
    inputs = [_value_info(v) for v in model.graph.input]
    outputs = [_value_info(v) for v in model.graph.output]
    pasts = [i for i in inputs if i["name"].startswith("past_key_values.")]
    layers = sorted({int(i["name"].split(".")[1]) for i in pasts})
    gqa = any(n.op_type == "GroupQueryAttention" for n in model.graph.node)
    kv: dict[str, Any] = {"layout": "gqa" if gqa else "optimum", "num_layers": len(layers)}
    if pasts:
        first = pasts[0]
        kv.update(
            past="past_key_values.{layer}.{key|value}",
            present="present.{layer}.{key|value}",
            shape=first["shape"],
            num_kv_heads=first["shape"][1],
            head_dim=first["shape"][3],
            dtype=first["dtype"],
        )
    opset = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    return {"inputs": inputs, "outputs": outputs, "kv_cache": kv, "opset": opset}


# Request fields a manifest records only when they differ from these defaults (older manifests
# lack them: a missing field is the default).
_RECORDED_WHEN_NOT = {"device": "cpu", "attention": "gqa"}


def request_key(
    source_digest: str,
    layout: str,
    precision: str,
    accuracy_level: int,
    device: str = "cpu",
    attention: str = "gqa",
) -> dict[str, Any]:
    """The part of a manifest that decides whether an existing export can be reused. ``device``
    is recorded for GPU exports only (a manifest without it is a CPU export), ``attention`` for
    exact-attention exports only."""
    key = {
        "format_version": FORMAT_VERSION,
        "source_sha256": source_digest,
        "layout": layout,
        "precision": precision,
        "accuracy_level": accuracy_level,
        "exporter": {**stack_versions(), "revision": EXPORTER_REVISION},
    }
    for name, value in (("device", device), ("attention", attention)):
        if value != _RECORDED_WHEN_NOT[name]:
            key[name] = value
    return key


def read_manifest(folder: Path) -> dict[str, Any] | None:
    path = folder / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise ExportError(f"{path} is not valid JSON: {exc}") from exc
    except OSError as exc:
        raise ExportError(f"{path} cannot be read: {exc.strerror or exc}") from exc


# The names an export writes (optimum's tokenizer files and a kept HF folder included; not every
# export writes each): its own files in a folder whose manifest does not list them (an exporter
# before `files.written`).
# The Hugging Face files an export keeps beside its model (the configs, tokenizer, template).
KEPT_FROM_HF = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
EXPORT_NAMES = frozenset(
    {
        "model.onnx",
        MANIFEST_NAME,
        *KEPT_FROM_HF,
        "vocab.json",
        "merges.txt",
        "tokenizer.model",
        "added_tokens.json",
        "hf",
    }
)


def own_files(folder: Path) -> set[str]:
    """The names in `folder` that its export wrote: what another export forced into it replaces
    (every other file stays). None in a folder without a manifest."""
    if not (folder / MANIFEST_NAME).is_file():
        return set()
    try:
        files = (read_manifest(folder) or {}).get("files", {})
    except ExportError:  # an unreadable manifest: the names an export writes
        files = {}
    if isinstance(files.get("written"), list):
        return {MANIFEST_NAME, *files["written"]}
    model = files.get("model", "model.onnx")
    return {MANIFEST_NAME, model, *files.get("external_data", []), *EXPORT_NAMES}


def manifest_matches(manifest: dict[str, Any], key: dict[str, Any]) -> bool:
    same = all(manifest.get(k, d) == key.get(k, d) for k, d in _RECORDED_WHEN_NOT.items())
    return same and all(manifest.get(k) == v for k, v in key.items())


def restamp_source(folder: Path, manifest: dict[str, Any], stamp: list[Any]) -> dict[str, Any]:
    """`manifest` with its source's `stamp`, written over the folder's manifest in one step (a
    reader sees the old or the new, never half of one) while the folder still holds `manifest`:
    an export forced into it meanwhile keeps its own, and a folder this user cannot write keeps
    the old one. The file keeps its permissions."""
    updated = {**manifest, "source": {**manifest["source"], "stamp": stamp}}
    path = folder / MANIFEST_NAME
    staged = folder / f".{MANIFEST_NAME}.{os.getpid()}"
    try:
        write_manifest(folder, updated, staged.name)
        shutil.copymode(path, staged)
        if read_manifest(folder) == manifest:
            os.replace(staged, path)
    except (OSError, ExportError) as exc:
        log.debug("%s keeps its manifest: %s", folder, exc)
    finally:
        with contextlib.suppress(OSError):
            staged.unlink(missing_ok=True)
    return updated


def write_manifest(folder: Path, manifest: dict[str, Any], name: str = MANIFEST_NAME) -> Path:
    path = folder / name
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def tokenizer_facts(tokenizer, vocab) -> dict[str, Any]:
    """The tokenizer's facts for the manifest: a GGUF's as llama.cpp reads its vocabulary (BOS
    may be an ordinary token there, which a tokenizer does not name), else the tokenizer's."""
    if vocab is not None:
        return {
            "bos_token_id": vocab.bos_token_id,
            "eos_token_id": vocab.eos_token_id,
            "pad_token_id": vocab.pad_token_id,
            "chat_template": bool(vocab.chat_template),
            "add_bos_token": bool(vocab.add_bos_token),
        }
    return {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "add_bos_token": bool(getattr(tokenizer, "add_bos_token", False)),
    }


def _eos_ids(config, generation, tokens: dict[str, Any], info) -> list[int]:
    ids: set[int] = set(info.eog_ids()) if info is not None else set()
    for value in (
        generation.eos_token_id,
        config.eos_token_id,
        tokens["eos_token_id"],
    ):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return sorted(ids)


def build_manifest(
    key,
    src: Source,
    fingerprint: Fingerprint,
    folder,
    config,
    generation,
    tokens,
    info,
    checked,
    start,
) -> dict[str, Any]:
    """The manifest of an export staged in `folder`: the request `key`, the source and its
    fingerprint, the model's and tokenizer's facts (`tokens`: :func:`tokenizer_facts`), the files,
    the inputs and outputs, the verify result `checked`, and the time since `start`."""
    written = sorted(
        {p.name for p in folder.iterdir() if not p.name.startswith(".")} | {MANIFEST_NAME}
    )
    files = [n for n in written if n.startswith("model.onnx") and n != "model.onnx"]
    return {
        **key,
        "source": {
            **src.to_json(),
            "sha256": fingerprint.sha256,
            "stamp": fingerprint.stamp,
            "bytes": src.size(),
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
            "bos_token_id": tokens["bos_token_id"],
            "eos_token_ids": _eos_ids(config, generation, tokens, info),
            "pad_token_id": tokens["pad_token_id"],
            "chat_template": tokens["chat_template"],
            "add_bos_token": tokens["add_bos_token"],
        },
        "files": {
            "model": "model.onnx",
            "external_data": files,
            "bytes": _fs.folder_size(folder),
            "written": written,  # what another export forced into the folder replaces
        },
        "io": describe_io(folder / "model.onnx"),
        "verify": checked.to_json(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "export_seconds": round(time.perf_counter() - start, 2),
    }
