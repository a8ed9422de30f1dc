"""What a composed model records about itself: :class:`ComposedMetadata`.

The composer writes these facts into the model's ``metadata_props`` under keys ``onnxsample.*``
(strings, as ONNX stores them); everything that reads them — the runtime, ``prepare``, ``inspect`` —
goes through this one typed object, so each key is parsed in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from onnxsample.chain import SamplerChain
from onnxsample.errors import ModelError, OnnxSampleError

__all__ = ["CONTRACT_VERSION", "KV_LAYOUTS", "ComposedMetadata", "composed_metadata"]

PREFIX = "onnxsample."
# The graph contract's version: bumped when a composed model's inputs or outputs change meaning.
CONTRACT_VERSION = "1"
KV_LAYOUTS = ("gqa", "concat")
_VERSION = "version."


@dataclass(frozen=True)
class ComposedMetadata:
    """The facts a composed model carries.

    ``chain`` lists the samplers in the graph (``logit_bias`` only when ``max_bias`` > 0);
    ``max_slots`` (S), ``top_logprobs`` (L) and ``max_bias`` (NB) are the fixed sizes of the
    per-slot inputs and outputs. ``prompt_logprobs`` says whether the graph has the
    ``sampler.prompt_rows`` / ``sampler.prompt_targets`` inputs (logprobs of prompt tokens, for
    echo). ``kv_layout`` is ``gqa`` (one preallocated buffer per layer, written in place) or
    ``concat`` (the cache grows by concatenation); ``kv_head_size`` stands in for a symbolic head
    size. ``gather`` is where the rows are picked (``lm_head``: before the LM head; ``logits``).
    """

    chain: SamplerChain
    max_slots: int
    vocab_size: int
    top_logprobs: int = 0
    max_bias: int = 0
    prompt_logprobs: bool = False
    output_probs: bool = False
    output_candidates: int = 0
    gather: str = "logits"
    inline: bool = False
    kv_layout: str = "concat"
    kv_head_size: int | None = None
    contract: str = CONTRACT_VERSION
    composer_revision: str = ""
    source: str = ""
    versions: dict[str, str] = field(default_factory=dict)

    def to_props(self) -> dict[str, str]:
        """The ``onnxsample.*`` metadata entries, as strings."""
        props: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "versions":
                props.update({PREFIX + _VERSION + k: v for k, v in value.items()})
            elif value is None:
                continue
            elif isinstance(value, bool):
                props[PREFIX + f.name] = str(value).lower()
            else:
                props[PREFIX + f.name] = str(value)
        return props

    @classmethod
    def from_props(cls, props: Mapping[str, str]) -> ComposedMetadata | None:
        """Parse ``metadata_props`` (keys with or without the ``onnxsample.`` prefix); ``None``
        when the model is not a composed one."""
        entries = {k[len(PREFIX) :]: v for k, v in props.items() if k.startswith(PREFIX)}
        if "chain" not in entries or "max_slots" not in entries:
            return None
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {"versions": {}}
        try:
            for key, raw in entries.items():
                if key.startswith(_VERSION):
                    values["versions"][key[len(_VERSION) :]] = raw
                elif key in known:
                    values[key] = _parse(key, raw)
            return cls(**values)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, OnnxSampleError):
                raise
            raise ModelError(f"unreadable onnxsample metadata: {exc}") from exc

    @classmethod
    def from_session(cls, session) -> ComposedMetadata | None:
        """Read from an ONNX Runtime session (no second read of a file that holds the weights)."""
        return cls.from_props(session.get_modelmeta().custom_metadata_map)


def _parse(key: str, raw: str) -> Any:
    if key == "chain":
        return SamplerChain(raw)
    if key in ("max_slots", "vocab_size", "top_logprobs", "max_bias", "output_candidates"):
        return int(raw)
    if key == "kv_head_size":
        return int(raw) if raw else None
    if key in ("prompt_logprobs", "output_probs", "inline"):
        return raw.lower() == "true"
    if key == "kv_layout" and raw not in KV_LAYOUTS:
        raise ModelError(f"unknown kv_layout {raw!r} (expected one of {', '.join(KV_LAYOUTS)})")
    return raw


def composed_metadata(model: Any) -> ComposedMetadata | None:
    """The metadata of a composed model (``onnx.ModelProto``, ``onnx_ir.Model``, a session, or a
    path read without its weights); ``None`` for any other model."""
    if isinstance(model, (str, Path)):
        import onnx

        model = onnx.load(str(model), load_external_data=False)
    if hasattr(model, "get_modelmeta"):
        return ComposedMetadata.from_session(model)
    props = model.metadata_props
    if isinstance(props, Mapping):
        return ComposedMetadata.from_props(props)
    return ComposedMetadata.from_props({p.key: p.value for p in props})
