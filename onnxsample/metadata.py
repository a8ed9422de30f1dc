"""What a composed model records about itself: :class:`ComposedMetadata`.

The composer writes these facts into the model's ``metadata_props`` under keys ``onnxsample.*``
(strings, as ONNX stores them); everything that reads them — the runtime, ``prepare``, ``inspect`` —
goes through this one typed object, so each key is parsed in one place.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from onnxsample._wire import LENGTH_DELIMITED, FileBytes, records
from onnxsample.chain import SamplerChain
from onnxsample.errors import InvalidParameter, ModelError

__all__ = [
    "COMPOSER_REVISION",
    "CONTRACT_VERSION",
    "FALLBACK_MODEL",
    "KV_LAYOUTS",
    "ComposedMetadata",
    "composed_metadata",
    "decode_model",
    "encode_model",
]

PREFIX = "onnxsample."
# The graph contract's version: bumped when a composed model's inputs or outputs change meaning.
CONTRACT_VERSION = "1"
# Bumped when the composed graph's internals change (not its inputs and outputs), so that cached
# composed models are rebuilt. 2: the chain runs on the active slots only. 3: kv_layout metadata.
# 4: temperatures below 1e-5 are greedy; prompt logprobs in the run options. 5: draft tokens
# (speculative decoding) in the run options. 6: batch-wide conditions valid on empty rows (CUDA);
# the static chain. 7: the allowed-tokens mask. 8: the penalty counts gain only the emitted cells
# (no [S, V] scatter, no widened copy); greedy rows skip the draw. 9: row maxima and long running
# sums in blocks (RowMax, RunningSum: fast on CUDA). 10: the static chain sorts no whole row and
# flags the slots past its candidates (sampler.fallback, sampler.fallback_logits). 11: 4096 of them.
# 12: the static chain's slot dimension is symbolic (an engine binds only the rows it runs).
# 13: the static chain's wide selections take a TopK over slices of the row, then one over their
# candidates (TopKSliced); typical-p reads its set from 1024 keys, not 4096. 14: the static chain's
# row maxima read the value at ArgMax (RowMaxStatic), not cuDNN's ReduceMax; no-op pads and
# slices dropped; fewer kernels in top-p's normaliser, the draw's row and typical-p's key. 15: the
# branching chain's argmax in two steps (RowArgMax), its filters off on greedy rows and no
# candidates when every row is greedy, one pass-through for penalties and for finite rows.
# 16: counts_in_place (the penalty counts may be read and written in one buffer).
# 17: the active slots' outputs laid out per slot by one Gather each (no ScatterElements).
# 18: fewer ops in the draw's search, top-p's wide weights and top-k's flag; the static chain's
# folding drops Or(x, false), And(x, true) and Not(Not(x)); RowBlocks takes the vocabulary's sizes
# as constants; the branching prompt logprobs skip their ops when no prompt row is asked.
# 19: a greedy step (every row greedy) skips the selection after the bias, mask and penalties.
# 20: a step in which no slot drafts skips the draft verification's layout.
# 21: echo's prompt rows take their own LM-head call; the branching chain returns no counts and
# asks once whether the mask or the penalties apply; a step without drafts lays out no pairs.
# 22: sampler.logprobs (logprobs only when a slot asks). 23: a greedy step's finite-rows check
# takes the argmax inside its If (FiniteArgMax): no pass-through copy. 24: the static chain's
# greedy token is the argmax its row maximum is read at; one selection for its penalties; the
# draw's search in one comparison and its id by a lookup; fewer ops in top-k's, top-p's,
# typical-p's flags and the logprob. 26: the static chain flags typical-p's slots for the host
# (no entropy or key sort on the device), its draw reads top-p's exponentials, and top-k's flag is
# k > W alone. 27: a GGUF export's narrow weight codes are widened in the composed model (not at
# every load); the sampler functions' multi-output Ifs in their variables' order. 28: no shape with
# a dimension ONNX shape inference made up (``unk__N``), which kept ONNX Runtime from reusing any
# buffer of the model. 29: sampler.temperature_last (per slot, the temperature after the cuts).
COMPOSER_REVISION = "29"
TEMPERATURE_LAST_SINCE = 29  # the first revision whose chains read sampler.temperature_last
# A static chain's fallback (see onnxsample.engine._fallback): the branching chain for one slot, a
# standalone sampler model carried in the composed file's metadata (encode_model), so that running
# a composed model needs neither a second file nor the graph builders.
FALLBACK_MODEL = PREFIX + "fallback_model"
KV_LAYOUTS = ("gqa", "concat")
_VERSION = "version."


@dataclass(frozen=True)
class ComposedMetadata:
    """The facts a composed model carries.

    ``chain`` lists the samplers in the graph (``logit_bias`` only when ``max_bias`` > 0);
    ``max_slots`` (S), ``top_logprobs`` (L) and ``max_bias`` (NB) are the fixed sizes of the
    per-slot inputs and outputs. ``prompt_logprobs`` says whether the graph has the
    ``sampler.prompt_rows`` / ``sampler.prompt_targets`` inputs (logprobs of prompt tokens, for
    echo). ``draft_tokens`` (K) is how many draft tokens a slot can verify per run (speculative
    decoding; 0: the graph has no ``sampler.draft_*`` inputs). ``kv_layout`` is ``gqa`` (one preallocated buffer per layer, written in place) or
    ``concat`` (the cache grows by concatenation); ``kv_head_size`` stands in for a symbolic head
    size. ``exact_positions``: a position's logits do not depend on how many positions a call
    computes (an ``--attention exact`` export), so speculative verification and echo give exactly
    what one-token steps give. ``gather`` is where the rows are picked (``lm_head``: before the LM head; ``logits``).
    ``static``: the chain has no control flow and no data-dependent shape (every bound slot's row
    is computed each call), so a decode step can be captured as a CUDA graph; its slot dimension
    is ``slots``, at most S, so an engine binds only the rows it runs. ``counts_in_place``: every
    node that reads ``sampler.output_counts`` runs before ``sampler.output_counts_out`` is written,
    so an engine may bind both to one buffer and the step adds its tokens in place
    (:mod:`onnxsample.composer._in_place`).
    """

    chain: SamplerChain
    max_slots: int
    vocab_size: int
    top_logprobs: int = 0
    max_bias: int = 0
    prompt_logprobs: bool = False
    draft_tokens: int = 0
    output_probs: bool = False
    output_candidates: int = 0
    gather: str = "logits"
    inline: bool = False
    static: bool = False
    allowed_tokens: bool = False
    kv_layout: str = "concat"
    exact_positions: bool = False
    counts_in_place: bool = False
    kv_head_size: int | None = None
    contract: str = CONTRACT_VERSION
    composer_revision: str = ""
    source: str = ""
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def final_probs(self) -> bool:
        """Whether ``sampler.probs`` is the distribution each slot's token was drawn from: a
        branching chain's (a static chain draws its rows past its candidates again on the host,
        which that output does not follow)."""
        return self.output_probs and not self.static

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
            if isinstance(exc, ModelError):
                raise
            raise ModelError(f"unreadable onnxsample metadata: {exc}") from exc

    @classmethod
    def from_session(cls, session) -> ComposedMetadata | None:
        """Read from an ONNX Runtime session (no second read of a file that holds the weights)."""
        return cls.from_props(session.get_modelmeta().custom_metadata_map)


def _parse(key: str, raw: str) -> Any:
    if key == "chain":
        return SamplerChain(raw)
    if key in (
        "max_slots",
        "vocab_size",
        "top_logprobs",
        "max_bias",
        "output_candidates",
        "draft_tokens",
    ):
        value = int(raw)
        if value < (1 if key in ("max_slots", "vocab_size") else 0):
            raise ModelError(f"unreadable onnxsample metadata: {key} is {value}")
        return value
    if key == "kv_head_size":
        return int(raw) if raw else None
    if key in (
        "prompt_logprobs",
        "output_probs",
        "inline",
        "static",
        "exact_positions",
        "allowed_tokens",
        "counts_in_place",
    ):
        if raw.lower() not in ("true", "false"):
            raise ModelError(f"unreadable onnxsample metadata: {key} is {raw!r}, not true or false")
        return raw.lower() == "true"
    if key == "kv_layout" and raw not in KV_LAYOUTS:
        raise ModelError(f"unknown kv_layout {raw!r} (expected one of {', '.join(KV_LAYOUTS)})")
    return raw


def encode_model(data: bytes) -> str:
    """A serialized ONNX model as a metadata string: zlib, then base64."""
    return base64.b64encode(zlib.compress(data, 9)).decode("ascii")


def decode_model(text: str) -> bytes:
    """The serialized ONNX model :func:`encode_model` wrote."""
    try:
        return zlib.decompress(base64.b64decode(text, validate=True))
    except (ValueError, zlib.error) as exc:
        raise ModelError(f"an unreadable model in the onnxsample metadata: {exc}") from exc


def composed_metadata(model: Any) -> ComposedMetadata | None:
    """The metadata of a composed model (``onnx.ModelProto``, ``onnx_ir.Model``, a session, or a
    path read without its weights); ``None`` for any other model."""
    if isinstance(model, (str, Path)):
        return ComposedMetadata.from_props(read_props(Path(model)))
    if hasattr(model, "get_modelmeta"):
        return ComposedMetadata.from_session(model)
    if not hasattr(model, "metadata_props"):
        raise InvalidParameter(
            "composed_metadata reads an ONNX model, an onnx_ir model, a session or a path, got "
            f"{type(model).__name__}"
        )
    props = model.metadata_props
    if isinstance(props, Mapping):
        return ComposedMetadata.from_props(props)
    return ComposedMetadata.from_props({p.key: p.value for p in props})


def read_props(path: Path) -> dict[str, str]:
    """An ONNX file's ``metadata_props`` without parsing its graph: the top-level fields of the
    ModelProto are walked in the protobuf wire format (read as they are needed) and the graph's bytes
    skipped, so a file holding hundreds of MB of weights is barely read."""
    try:
        with open(path, "rb") as f:
            data = FileBytes(f)
            return {
                key: value
                for _, chunk in _fields(data, 0, len(data), {_METADATA_PROPS})
                for key, value in [_entry(chunk)]
            }
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path} is not a readable ONNX model: {exc}") from exc


_METADATA_PROPS = 14  # ModelProto.metadata_props: StringStringEntryProto {key = 1; value = 2}


def _entry(chunk: bytes) -> tuple[str, str]:
    found = {field: value.decode() for field, value in _fields(chunk, 0, len(chunk), {1, 2})}
    return found.get(1, ""), found.get(2, "")


def _fields(data, pos: int, end: int, want: set[int]):
    """(field number, bytes) of the length-delimited fields numbered in `want` in data[pos:end];
    every other field is skipped without being copied."""
    for number, kind, _, value, stop in records(data, pos, end):
        if number in want and kind == LENGTH_DELIMITED:
            yield number, bytes(data[value:stop])
