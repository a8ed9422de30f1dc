"""Transplant GGUF quantised weights onto ONNX Runtime's `com.microsoft.MatMulNBits`, bit for bit.

No re-quantisation: the GGUF codes and fp16 scales are repacked, never rounded again, so
``MatMulNBits(x, ...)`` (plus a correction term for Q4_1) equals ``x @ dequantize(W).T`` up to
float rounding.

Layouts (``K`` inputs, ``N`` output channels, ``n_blocks = K / 32``):

GGUF
    A 2-D weight with ``tensor.shape == [K, N]`` (ggml order) is stored row-major as ``N`` rows of
    ``K`` inputs, cut into blocks of 32 along ``K``; `GGUFReader` hands a quantised tensor over as
    uint8 ``[N, row_bytes]``.

    - Q8_0, 34 bytes a block: fp16 ``d``, 32 x int8 ``q``; ``w = d * q``.
    - Q4_0, 18 bytes a block: fp16 ``d``, 16 bytes; element ``j`` (0..15) is the low nibble of byte
      ``j`` and element ``j + 16`` its high nibble; ``w = d * (q - 8)``.
    - Q4_1, 20 bytes a block: fp16 ``d``, fp16 ``m``, 16 bytes (nibbles as Q4_0); ``w = d * q + m``.

MatMulNBits (checked against ONNX Runtime 1.31 on CPU)
    ``B`` uint8 ``[N, n_blocks, blob]`` with ``blob = 32 * bits / 8``; at 4 bits element ``2i`` of a
    block is the low nibble of byte ``i`` and element ``2i + 1`` its high nibble. ``scales`` float
    ``[N * n_blocks]`` (row-major ``[N, n_blocks]``). ``zero_points`` at 4 bits: uint8
    ``[N, ceil(n_blocks / 2)]``, block ``2j`` in the low nibble of byte ``j``, each row padded to
    whole bytes; at 8 bits uint8 ``[N, n_blocks]``. Without ``zero_points`` the zero point is 8
    (4 bits) or 128 (8 bits). ``w = scale * (code - zero_point)``.

Mapping
    - Q4_0 -> 4 bits, codes ``q`` re-interleaved, scale ``d``, default zero point 8.
    - Q8_0 -> 8 bits, codes ``q + 128`` as uint8, scale ``d``, default zero point 128.
    - Q4_1 -> 4 bits, codes ``q``, scale ``d``, explicit zero points 0, and the correction
      ``y += blocksum(x) @ mins`` where ``blocksum(x)[..., b]`` sums ``x`` over block ``b`` and
      ``mins[b, n]`` is ``m`` of row ``n``, block ``b`` (see :func:`linear_nodes`).
    - F32 / F16 stay floats: float32 ``[N, K]``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
import onnx_ir.tape

from onnxsample.errors import ExportError

__all__ = [
    "BLOCK_SIZE",
    "SUPPORTED",
    "TRANSPLANTABLE",
    "QuantizedWeight",
    "concat_rows",
    "from_gguf",
    "linear_nodes",
    "permute_rows",
    "split_rows",
]

BLOCK_SIZE = 32
"""Elements per block along K, for every transplantable GGUF type."""

TRANSPLANTABLE = ("Q4_0", "Q4_1", "Q8_0")
"""GGUF types that become a :class:`QuantizedWeight` (and a `MatMulNBits`)."""

SUPPORTED = (*TRANSPLANTABLE, "F16", "F32")
"""Every GGUF type :func:`from_gguf` accepts."""

# Bytes per block of the transplantable types (as gguf.constants.GGML_QUANT_SIZES says).
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
_FLOAT_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2")}


@dataclass(frozen=True)
class QuantizedWeight:
    """One linear layer's weight in `MatMulNBits` form, transplanted from a GGUF tensor.

    Attributes:
        bits: 4 (Q4_0, Q4_1) or 8 (Q8_0).
        block_size: elements per block along K (32).
        k: inputs per output channel, a multiple of `block_size`.
        n: output channels.
        packed: uint8 ``[N, n_blocks, block_size * bits / 8]``, MatMulNBits' ``B``.
        scales: float32 ``[N * n_blocks]`` (row-major ``[N, n_blocks]``), the GGUF ``d``.
        zero_points: uint8 ``[N, ceil(n_blocks / 2)]`` of packed zero nibbles (Q4_1), or None for
            MatMulNBits' default (8 at 4 bits, 128 at 8 bits).
        mins: float32 ``[n_blocks, N]``, the Q4_1 ``m`` of row ``n``, block ``b`` at ``[b, n]``;
            None for the other types.
    """

    bits: int
    block_size: int
    k: int
    n: int
    packed: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    mins: np.ndarray | None

    @property
    def n_blocks(self) -> int:
        """Blocks per output channel, ``K / block_size``."""
        return self.k // self.block_size

    @property
    def qtype(self) -> str:
        """The GGUF type this weight came from: "Q4_0", "Q4_1" or "Q8_0"."""
        if self.bits == 8:
            return "Q8_0"
        return "Q4_0" if self.mins is None else "Q4_1"

    def codes(self) -> np.ndarray:
        """The unpacked codes, uint8 ``[N, n_blocks, block_size]`` (0..15 or 0..255)."""
        if self.bits == 8:
            return self.packed
        codes = np.empty((self.n, self.n_blocks, self.block_size), dtype=np.uint8)
        codes[..., 0::2] = self.packed & np.uint8(0x0F)
        codes[..., 1::2] = self.packed >> np.uint8(4)
        return codes

    def dequantize(self) -> np.ndarray:
        """The weight as float32 ``[N, K]``, bit-identical to `gguf.quants.dequantize`.

        The same float32 operations as gguf's reference, in the same order: ``d * (q - 8)``
        (Q4_0), ``d * q + m`` (Q4_1), ``d * q`` (Q8_0).
        """
        scales = self.scales.reshape(self.n, self.n_blocks, 1)
        codes = self.codes().astype(np.float32)
        if self.qtype == "Q4_1":
            assert self.mins is not None
            w = scales * codes + self.mins.T[..., None]
        else:
            w = scales * (codes - np.float32(8 if self.bits == 4 else 128))
        return w.reshape(self.n, self.k)


def from_gguf(
    data: np.ndarray, type_name: str, k: int, *, name: str = ""
) -> QuantizedWeight | np.ndarray:
    """Convert one GGUF tensor's stored data, without re-quantising it.

    Args:
        data: the tensor as `GGUFReader` gives it: uint8 ``[N, row_bytes]`` for a quantised type
            (any shape whose size is ``N * row_bytes`` is accepted), float32 / float16 ``[N, K]``
            (or the raw little-endian bytes as uint8) for F32 / F16.
        type_name: the GGUF type's name (`GGMLQuantizationType.name`), e.g. "Q4_1".
        k: inputs per output channel (``tensor.shape[0]`` in ggml order).
        name: the tensor's name, for error messages.

    Returns:
        A :class:`QuantizedWeight` for Q4_0, Q4_1, Q8_0; float32 ``[N, K]`` for F32, F16.

    Raises:
        ExportError: the type is not supported, or the data does not fit ``k``.
    """
    type_name = getattr(type_name, "name", type_name)  # tolerate a GGMLQuantizationType
    label = f"tensor {name!r}" if name else "tensor"
    if type_name in _FLOAT_DTYPES:
        return _float_rows(data, _FLOAT_DTYPES[type_name], k, label, type_name)
    if type_name not in TRANSPLANTABLE:
        raise ExportError(
            f"{label} has GGUF type {type_name}, which cannot be exported: "
            f"supported types are {', '.join(SUPPORTED)}"
        )
    blocks = _blocks(data, type_name, k, label)
    n, n_blocks = blocks.shape[:2]
    scales = np.ascontiguousarray(blocks[..., 0:2]).view("<f2").astype(np.float32).reshape(-1)
    if type_name == "Q8_0":
        codes = blocks[..., 2:] ^ np.uint8(0x80)  # int8 q -> uint8 q + 128
        return QuantizedWeight(8, BLOCK_SIZE, k, n, codes, scales, None, None)
    nibbles = blocks[..., 4:] if type_name == "Q4_1" else blocks[..., 2:]
    packed = _interleave_nibbles(nibbles)
    if type_name == "Q4_0":
        return QuantizedWeight(4, BLOCK_SIZE, k, n, packed, scales, None, None)
    mins = np.ascontiguousarray(blocks[..., 2:4]).view("<f2").astype(np.float32)
    zero_points = np.zeros((n, (n_blocks + 1) // 2), dtype=np.uint8)
    return QuantizedWeight(
        4, BLOCK_SIZE, k, n, packed, scales, zero_points, np.ascontiguousarray(mins[..., 0].T)
    )


def permute_rows(
    w: QuantizedWeight | np.ndarray, order: np.ndarray
) -> QuantizedWeight | np.ndarray:
    """Reorder the output channels: row ``i`` of the result is row ``order[i]`` of `w`.

    Exact for quantised weights, since blocks run along K and never span rows. Used to undo
    llama.cpp's permutation of the Q and K projections' rows.

    Args:
        w: a :class:`QuantizedWeight` or a float array ``[N, K]``.
        order: int ``[N]``, a permutation of ``range(N)``.

    Raises:
        ValueError: `order` is not a permutation of the rows.
    """
    n = w.n if isinstance(w, QuantizedWeight) else w.shape[0]
    order = np.asarray(order)
    if (
        order.ndim != 1
        or order.shape[0] != n
        or not np.issubdtype(order.dtype, np.integer)
        or not np.array_equal(np.sort(order), np.arange(n))
    ):
        raise ValueError(f"row order must be a permutation of range({n}), got {order!r}")
    if not isinstance(w, QuantizedWeight):
        return w[order]
    return QuantizedWeight(
        w.bits,
        w.block_size,
        w.k,
        w.n,
        w.packed[order],
        w.scales.reshape(w.n, w.n_blocks)[order].reshape(-1),
        None if w.zero_points is None else w.zero_points[order],
        None if w.mins is None else np.ascontiguousarray(w.mins[:, order]),
    )


def split_rows(
    w: QuantizedWeight | np.ndarray, sizes: list[int]
) -> list[QuantizedWeight | np.ndarray]:
    """`w`'s output channels in consecutive parts of `sizes` rows (a fused QKV or gate/up apart).

    Exact for quantised weights, as :func:`permute_rows`: blocks never span rows.
    """
    n = w.n if isinstance(w, QuantizedWeight) else w.shape[0]
    if sum(sizes) != n:
        raise ValueError(f"row parts {sizes} do not add up to the weight's {n} rows")
    starts = np.cumsum([0, *sizes])
    if not isinstance(w, QuantizedWeight):
        return [w[a:b] for a, b in itertools.pairwise(starts)]
    scales = w.scales.reshape(w.n, w.n_blocks)
    return [
        QuantizedWeight(
            w.bits,
            w.block_size,
            w.k,
            int(b - a),
            np.ascontiguousarray(w.packed[a:b]),
            np.ascontiguousarray(scales[a:b]).reshape(-1),
            None if w.zero_points is None else np.ascontiguousarray(w.zero_points[a:b]),
            None if w.mins is None else np.ascontiguousarray(w.mins[:, a:b]),
        )
        for a, b in itertools.pairwise(starts)
    ]


def concat_rows(weights: list[QuantizedWeight]) -> QuantizedWeight:
    """Stack weights along N (e.g. Q, K and V into one packed QKV projection).

    Args:
        weights: one or more weights of the same GGUF type and the same K.

    Returns:
        A weight with ``N = sum(w.n)``, the rows of ``weights[0]`` first.

    Raises:
        ValueError: no weights, or they differ in type, bits, block size or K.
    """
    if not weights:
        raise ValueError("concat_rows needs at least one weight")
    first = weights[0]
    key = (first.qtype, first.bits, first.block_size, first.k)
    for w in weights[1:]:
        if (w.qtype, w.bits, w.block_size, w.k) != key:
            raise ValueError(
                f"cannot concatenate a {w.qtype} weight with K={w.k} onto a {first.qtype} "
                f"weight with K={first.k}: type and K must match"
            )
    zero_points = [w.zero_points for w in weights if w.zero_points is not None]
    mins = [w.mins for w in weights if w.mins is not None]
    return QuantizedWeight(
        first.bits,
        first.block_size,
        first.k,
        sum(w.n for w in weights),
        np.concatenate([w.packed for w in weights], axis=0),
        np.concatenate([w.scales for w in weights], axis=0),
        np.concatenate(zero_points, axis=0) if zero_points else None,
        np.concatenate(mins, axis=1) if mins else None,
    )


def linear_nodes(
    tape: onnx_ir.tape.Tape,
    x: ir.Value,
    w: QuantizedWeight,
    name: str,
    accuracy_level: int,
    initializer: Callable[[str, np.ndarray], ir.Value],
    activations: ir.DataType | None = None,
) -> ir.Value:
    """Emit ``y = x @ dequantize(w).T`` as a `com.microsoft.MatMulNBits` (+ the Q4_1 correction).

    Nodes are named ``{name}/MatMulNBits`` and, for Q4_1, ``{name}/BlockSum/Reshape``,
    ``{name}/BlockSum/ReduceSum``, ``{name}/MinsMatMul``, ``{name}/AddMins``; initializers
    ``{name}.qweight``, ``{name}.scales``, ``{name}.qzeros``, ``{name}.mins``,
    ``{name}.block_shape``, ``{name}.block_axes``.

    The Q4_1 correction ``blocksum(x) @ mins`` reshapes x to ``[..., n_blocks, 32]`` with a
    Reshape whose leading entries are 0 (copy the input dimension): one 0 per leading axis of x
    when x's rank is known, else x is taken to be rank 3 (``[B, S, K]``, shape
    ``[0, 0, n_blocks, 32]``). ReduceSum takes its axes as an input (opset 18+).

    Speed (ONNX Runtime 1.31 CPU, one thread): 8-bit weights are fast only at accuracy_level 4;
    at levels 0 to 3 ORT's 8-bit kernel is some 20 times slower than the 4-bit one.

    Args:
        tape: records the nodes; the model must import "com.microsoft" version 1 and the default
            domain at opset 18 or later.
        x: float32 or float16 ``[..., K]`` (rank 3 ``[B, S, K]`` in the models we build); the
            scales and the Q4_1 minimums take its type (GGUF stores both in fp16: exact).
        w: the weight, ``K`` inputs to ``N`` outputs.
        name: prefix of the node, value and initializer names.
        accuracy_level: MatMulNBits' accuracy_level (0 = float32 compute, 4 = int8 activations).
        initializer: registers ``(name, array)`` as an initializer and returns its value.
        activations: x's float type where x does not carry one (default: x's, else float32).

    Returns:
        The output value, ``[..., N]`` of x's type.
    """
    if accuracy_level not in range(5):
        raise ValueError(f"accuracy_level must be 0..4, got {accuracy_level}")
    floats = {ir.DataType.FLOAT: np.float32, ir.DataType.FLOAT16: np.float16}
    kind = x.dtype or activations or ir.DataType.FLOAT
    if kind not in floats:
        raise ValueError(f"{name}: MatMulNBits input must be float32 or float16, got {kind}")
    dtype = floats[kind]
    leading = None if x.shape is None else list(x.shape)[:-1]
    scales = initializer(f"{name}.scales", w.scales.astype(dtype))
    inputs = [x, initializer(f"{name}.qweight", w.packed), scales]
    if w.zero_points is not None:
        inputs.append(initializer(f"{name}.qzeros", w.zero_points))
    y = tape.op(
        "MatMulNBits",
        inputs,
        attributes={
            "K": w.k,
            "N": w.n,
            "bits": w.bits,
            "block_size": w.block_size,
            "accuracy_level": accuracy_level,
        },
        domain="com.microsoft",
        name=f"{name}/MatMulNBits",
    )
    _named(y, f"{name}/MatMulNBits/output_0", leading, [w.n], kind)
    if w.mins is None:
        return y
    rank = 3 if leading is None else len(leading) + 1
    block_shape = np.array([0] * (rank - 1) + [w.n_blocks, w.block_size], dtype=np.int64)
    blocks = tape.op(
        "Reshape",
        [x, initializer(f"{name}.block_shape", block_shape)],
        name=f"{name}/BlockSum/Reshape",
    )
    _named(blocks, f"{name}/BlockSum/Reshape/output_0", leading, [w.n_blocks, w.block_size], kind)
    sums = tape.op(
        "ReduceSum",
        [blocks, initializer(f"{name}.block_axes", np.array([-1], dtype=np.int64))],
        attributes={"keepdims": 0},
        name=f"{name}/BlockSum/ReduceSum",
    )
    _named(sums, f"{name}/BlockSum/output_0", leading, [w.n_blocks], kind)
    correction = tape.op(
        "MatMul",
        [sums, initializer(f"{name}.mins", w.mins.astype(dtype))],
        name=f"{name}/MinsMatMul",
    )
    _named(correction, f"{name}/MinsMatMul/output_0", leading, [w.n], kind)
    out = tape.op("Add", [y, correction], name=f"{name}/AddMins")
    return _named(out, f"{name}/AddMins/output_0", leading, [w.n], kind)


def _named(
    value: ir.Value,
    name: str,
    leading: list | None,
    trailing: list[int],
    dtype: ir.DataType = ir.DataType.FLOAT,
) -> ir.Value:
    """Name a float value; give it the shape ``[*leading, *trailing]`` when `leading` is known."""
    value.name = name
    value.dtype = dtype
    if leading is not None:
        value.shape = ir.Shape([*leading, *trailing])
    return value


def _float_rows(
    data: np.ndarray, dtype: np.dtype, k: int, label: str, type_name: str
) -> np.ndarray:
    """An F32 / F16 tensor as float32 ``[N, K]``; `data` may be typed or raw uint8 bytes."""
    data = np.asarray(data)
    if data.dtype == np.uint8:
        data = np.ascontiguousarray(data).reshape(-1).view(dtype)
    elif data.dtype != dtype:
        raise ExportError(f"{label} is {type_name} but its data is {data.dtype}")
    if k <= 0 or data.size % k:
        raise ExportError(f"{label} has {data.size} elements, not a multiple of K={k}")
    return data.astype(np.float32).reshape(-1, k)


def _blocks(data: np.ndarray, type_name: str, k: int, label: str) -> np.ndarray:
    """The raw blocks of a quantised tensor, uint8 ``[N, n_blocks, block_bytes]``."""
    data = np.asarray(data)
    if data.dtype != np.uint8:
        raise ExportError(f"{label} is {type_name} but its data is {data.dtype}, not uint8")
    if k <= 0 or k % BLOCK_SIZE:
        raise ExportError(f"{label} has K={k}, not a multiple of the {BLOCK_SIZE}-element block")
    row_bytes = k // BLOCK_SIZE * _BLOCK_BYTES[type_name]
    if data.size == 0 or data.size % row_bytes:
        raise ExportError(
            f"{label} has {data.size} bytes, not a whole number of {type_name} rows "
            f"of {row_bytes} bytes (K={k})"
        )
    return np.ascontiguousarray(data).reshape(-1, k // BLOCK_SIZE, _BLOCK_BYTES[type_name])


def _interleave_nibbles(ggml: np.ndarray) -> np.ndarray:
    """Repack 4-bit codes from ggml's block order to MatMulNBits' order.

    Args:
        ggml: uint8 ``[..., 16]``; element ``j`` of a block is the low nibble of byte ``j``,
            element ``j + 16`` its high nibble.

    Returns:
        uint8 ``[..., 16]``; element ``2i`` is the low nibble of byte ``i``, ``2i + 1`` the high.
    """
    codes = np.concatenate([ggml & np.uint8(0x0F), ggml >> np.uint8(4)], axis=-1)  # [..., 32]
    return (codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))).astype(np.uint8)
