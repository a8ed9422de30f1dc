"""Decoder weights for the GroupQueryAttention exporter, read from an HF folder or a GGUF file.

Both readers give the same thing: a :class:`~onnxsample.exporters.families.DecoderSpec` and a
mapping from our tensor names (``embed``, ``layers.{i}.q`` ... ``norm``, ``lm_head``; the family's
extra ones such as ``layers.{i}.q_bias`` or ``layers.{i}.q_norm``) to float ``[N, K]`` arrays
(output channels first, as in torch; float32 vectors for norms and biases; matrices in the
source's own float type: fp16, bfloat16 (ml_dtypes') or float32, so an export holds a half-precision
source's matrices in their own two bytes a value, not as float32 copies) or, from a GGUF with
``precision="gguf"``, the file's own quantised blocks
(:class:`~onnxsample.exporters._gguf_quant.QuantizedWeight`).

llama.cpp stores a Llama's Q and K with their rows permuted for its interleaved rotary embedding;
the GGUF reader undoes that (exactly: a row permutation moves whole quantisation blocks), so both
sources feed one graph with the rotate-half rotary of transformers. Families whose llama.cpp
rotary is NeoX's (Qwen2, Qwen3) are stored unpermuted.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import ml_dtypes  # onnx and onnx-ir depend on it: their bfloat16 arrays
import numpy as np

from onnxsample.errors import ExportError
from onnxsample.exporters import _gguf_quant
from onnxsample.exporters.families import DecoderSpec, Family, gguf_family, hf_family
from onnxsample.exporters.families._family import FUSED, FUSED_PARTS, LINEAR

__all__ = ["read_gguf", "read_hf"]

log = logging.getLogger(__name__)


# ---- Hugging Face folders ---------------------------------------------------------------------


def read_hf(folder: Path) -> tuple[DecoderSpec, dict[str, np.ndarray]]:
    """Spec and float weights of an HF folder of a supported family (safetensors)."""
    from safetensors import safe_open

    config = json.loads((folder / "config.json").read_text())
    family = hf_family(config.get("model_type"), folder.name)
    spec = family.hf_spec(config, folder.name)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ExportError(f"{folder} holds no *.safetensors weights (needed by the gqa layout)")
    raw: dict[str, np.ndarray] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118  (safe_open is not a mapping)
                    raw[name] = _hf_array(f.get_tensor(name))
        except Exception as exc:  # safetensors raises its own error types
            raise ExportError(f"cannot load {file.name}: {exc}") from exc
    weights = {"embed": raw.pop("model.embed_tokens.weight"), "norm": raw.pop("model.norm.weight")}
    for i in range(spec.num_layers):
        for key, names in family.tensors.items():
            name = f"model.layers.{i}.{names.hf}"
            if name not in raw:
                raise ExportError(f"{folder.name}: weight {name} is missing")
            weights[f"layers.{i}.{key}"] = raw.pop(name)
        if family.unpack is not None:  # fused tensors (Phi-3's qkv_proj, gate_up_proj) apart
            family.unpack(weights, spec, f"layers.{i}")
    if family.norm_offset:
        for key in [k for k in weights if k == "norm" or k.endswith("_norm")]:
            weights[key] = weights[key] + np.float32(family.norm_offset)
    head = raw.pop("lm_head.weight", None)
    weights["lm_head"] = weights["embed"] if head is None else head
    _refuse_leftovers(raw, folder.name)
    return spec, weights


def _hf_array(tensor) -> np.ndarray:
    """A checkpoint tensor as numpy: matrices in their own type (fp16, bfloat16, float32; other
    types as float32), vectors (norms, biases) in float32."""
    import torch

    if tensor.dim() != 2:
        return tensor.float().numpy()
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: the same bits, as ml_dtypes'
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if tensor.dtype in (torch.float16, torch.float32):
        return tensor.numpy()
    return tensor.float().numpy()


def _refuse_leftovers(raw: dict[str, np.ndarray], what: str) -> None:
    """A weight the family does not read would be silently dropped: refuse instead."""
    left = sorted(n for n in raw if not n.endswith("rotary_emb.inv_freq"))
    if left:
        raise ExportError(
            f"{what}: weights the gqa layout does not use ({_listed(left)}); use --layout optimum"
        )


def _listed(names: list[str]) -> str:
    """The first few of `names`, and how many more."""
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


# ---- GGUF files ----------------------------------------------------------------------------------


def _unpermute_order(rows: int, heads: int) -> np.ndarray:
    """Row order that turns llama.cpp's interleaved Q/K rows back into transformers' halves."""
    return np.arange(rows).reshape(heads, -1, 2).transpose(0, 2, 1).reshape(-1)


def read_gguf(
    path: Path, metadata: dict[str, Any], *, quantized: bool
) -> tuple[DecoderSpec, dict[str, Any]]:
    """Spec and weights of a GGUF decoder: float32 arrays, or the file's blocks when `quantized`.

    `metadata` is the header :func:`~onnxsample.exporters.gguf.inspect_gguf` read already.

    Norm weights and biases are always float32; with `quantized` every linear weight, the LM
    head and the token embedding keep their GGUF blocks (which must be transplantable), else
    they are de-quantised to float32. Float tensors (F32, F16, BF16) are the file's own rows.

    The linear weights and an untied LM head are read from the file when taken from the mapping
    (``weights[key]``, ``pop``), each time anew, so a graph that takes them one at a time holds
    one layer's, not the model's; their shapes are known without reading them
    (``weights.rows_cols(key)``). A family's fused tensors (Phi-3's) are read and split apart
    when the first of their parts is taken, and let go once the last is. The embedding is read
    at once: its rows give the vocabulary size, and a tied LM head is the same object.
    """
    from onnxsample.exporters.gguf import open_gguf

    reader = open_gguf(path)
    tensors = {t.name: t for t in reader.tensors}
    family = gguf_family(metadata.get("general.architecture"), path.name)
    used: set[str] = set()  # by the family's spec (its rope factors)

    def read(name: str) -> np.ndarray | None:
        t = tensors.get(name)
        used.add(name)
        return None if t is None else _float(np.asarray(t.data), t.tensor_type, name)

    spec = family.gguf_spec(metadata, set(tensors), path.name, read)

    def tensor(name: str):
        if name not in tensors:
            raise ExportError(f"{path.name}: tensor {name} is missing")
        return tensors[name]

    def load(name: str, *, linear: bool, order: np.ndarray | None = None):
        t = tensor(name)
        data, type_name = np.asarray(t.data), t.tensor_type.name
        if not linear or not (quantized or type_name in _gguf_quant.FLOATS):
            w = _float(data, t.tensor_type, name)
        else:
            w = _gguf_quant.from_gguf(data, type_name, int(t.shape[0]), name=name)
        return w if order is None else _gguf_quant.permute_rows(w, order)

    def later(name: str, order: np.ndarray | None = None) -> _Later:
        cols, *rest = (int(n) for n in tensor(name).shape)
        rows = int(np.prod(rest, dtype=np.int64))
        return _Later(lambda: load(name, linear=True, order=order), (rows, cols))

    # What the graph takes, named before anything is read: a tensor it has no place for would be
    # left out, and llama.cpp computes with every tensor it loads (it refuses a file with others).
    taken = {"token_embd.weight", "output_norm.weight", *used}
    taken |= {f"blk.{i}.{n.gguf}" for i in range(spec.num_layers) for n in family.tensors.values()}
    if not spec.tied:
        taken.add("output.weight")
    left = sorted(set(tensors) - taken)
    if left:
        raise ExportError(
            f"{path.name}: tensors the {family.name} graph has no place for: {_listed(left)}"
        )
    embed = load("token_embd.weight", linear=True)  # gathered from its blocks when quantized
    if spec.vocab_size == 0:
        rows = embed.n if isinstance(embed, _gguf_quant.QuantizedWeight) else embed.shape[0]
        spec = DecoderSpec(**{**spec.__dict__, "vocab_size": int(rows)})
    weights = _Weights({"embed": embed, "norm": load("output_norm.weight", linear=False)})
    shapes, orders = _shapes(spec), _qk_orders(family, spec)
    linear = (*LINEAR, *FUSED)
    for i in range(spec.num_layers):
        for key, names in family.tensors.items():
            name = f"blk.{i}.{names.gguf}"
            if key in linear:
                weights[f"layers.{i}.{key}"] = later(name, orders.get(key))
            else:
                weights[f"layers.{i}.{key}"] = load(name, linear=False).reshape(-1)
        if family.unpack is not None:  # Phi-3's attn_qkv and ffn_up (gate, up) apart
            _unpack_when_taken(weights, family, spec, shapes, f"layers.{i}")
    # a tied LM head is the embedding's own object: the graph stores its blocks once
    weights["lm_head"] = embed if spec.tied else later("output.weight")
    _check_shapes(weights, shapes, path.name)
    return spec, weights


def _unpack_when_taken(
    weights: _Weights, family: Family, spec: DecoderSpec, shapes: dict[str, tuple[int, int]], p: str
) -> None:
    """Put the parts of layer `p`'s fused tensors in their place, each read when taken: the
    fused tensors are read and split apart (the family's `unpack`, which checks their rows) when
    the first part is taken. Until then a part's shape is the header's (`shapes`)."""
    fused = {f"{p}.{k}": weights.deferred(f"{p}.{k}") for k in FUSED if f"{p}.{k}" in weights}
    for key in fused:
        del weights[key]

    def read() -> dict[str, Any]:
        parts = {key: later.read() for key, later in fused.items()}
        family.unpack(parts, spec, p)
        return parts

    keys = [f"{p}.{part}" for key in fused for part in FUSED_PARTS[key.rsplit(".", 1)[1]]]
    parts = _Parts(read, keys)
    for key in keys:
        weights[key] = _Later(functools.partial(parts.take, key), shapes[key])


class _Parts:
    """A layer's fused tensors split apart when the first part is taken, held until the last
    of `keys` is (and read again if one is asked for after that)."""

    def __init__(self, read: Callable[[], dict[str, Any]], keys: list[str]) -> None:
        self._read, self._keys = read, frozenset(keys)
        self._parts: dict[str, Any] | None = None
        self._left: set[str] = set()

    def take(self, key: str) -> Any:
        if self._parts is None:
            self._parts, self._left = self._read(), set(self._keys)
        part = self._parts[key]
        self._left.discard(key)
        if not self._left:
            self._parts = None
        return part


class _Later:
    """A GGUF tensor read from the file when the graph takes it, and its [rows, columns]."""

    __slots__ = ("read", "shape")

    def __init__(self, read: Callable[[], Any], shape: tuple[int, int]) -> None:
        self.read, self.shape = read, shape


class _Weights(MutableMapping):
    """A GGUF decoder's weights by our names, each linear weight read from the file only when
    taken (``weights[key]``, ``pop``), so a graph that takes them one at a time
    (:func:`~onnxsample.exporters.gqa.build_gqa_model`'s `consume`) never holds them all."""

    def __init__(self, items: dict[str, Any]) -> None:
        self._items = items

    def __getitem__(self, key: str) -> Any:
        value = self._items[key]
        return value.read() if isinstance(value, _Later) else value

    def __setitem__(self, key: str, value: Any) -> None:
        self._items[key] = value

    def __delitem__(self, key: str) -> None:
        del self._items[key]

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def deferred(self, key: str) -> Any:
        """`key`'s entry as it is held: a weight, or the :class:`_Later` that reads it."""
        return self._items[key]

    def rows_cols(self, key: str) -> tuple[int, int]:
        """[rows, columns] of `key` without reading it."""
        value = self._items[key]
        return value.shape if isinstance(value, _Later) else _rows_cols(value)


def _rows_cols(w: Any) -> tuple[int, int]:
    return (w.n, w.k) if isinstance(w, _gguf_quant.QuantizedWeight) else tuple(np.shape(w))


def _check_shapes(weights: _Weights, shapes: dict[str, tuple[int, int]], name: str) -> None:
    """Refuse metadata that contradicts the tensors (a wrong embedding_length, head counts or
    feed_forward_length: the header's `shapes`) before a graph is built on it."""
    for key, shape in shapes.items():
        if key in weights and weights.rows_cols(key) != shape:
            raise ExportError(
                f"{name}: the metadata contradicts the tensors: {key} is "
                f"{list(weights.rows_cols(key))} (rows, inputs), the header's sizes make it "
                f"{list(shape)}"
            )


def _shapes(spec: DecoderSpec) -> dict[str, tuple[int, int]]:
    """[rows, columns] of every matrix, as the header's sizes give them."""
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    h, f = spec.hidden_size, spec.intermediate_size
    shapes = {"embed": (spec.vocab_size, h), "lm_head": (spec.vocab_size, h)}
    for i in range(spec.num_layers):
        p = f"layers.{i}"
        shapes |= {f"{p}.q": (q, h), f"{p}.k": (kv, h), f"{p}.v": (kv, h), f"{p}.o": (h, q)}
        shapes |= {f"{p}.gate": (f, h), f"{p}.up": (f, h), f"{p}.down": (h, f)}
    return shapes


def _qk_orders(family: Family, spec: DecoderSpec) -> dict[str, np.ndarray]:
    """Row orders that undo llama.cpp's Q/K permutation, for the families it permutes."""
    if not family.gguf_qk_permuted:
        return {}
    return {
        "q": _unpermute_order(spec.num_heads * spec.head_dim, spec.num_heads),
        "k": _unpermute_order(spec.num_kv_heads * spec.head_dim, spec.num_kv_heads),
    }


def _float(data: np.ndarray, qtype, name: str) -> np.ndarray:
    import gguf.quants

    try:
        return np.ascontiguousarray(gguf.quants.dequantize(data, qtype), dtype=np.float32)
    except NotImplementedError as exc:
        raise ExportError(
            f"tensor {name} has type {qtype.name}, which cannot be de-quantised"
        ) from exc
