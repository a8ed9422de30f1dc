"""Transplant GGUF quantised weights onto ONNX Runtime's `com.microsoft.MatMulNBits`, bit for bit.

No re-quantisation: the GGUF's integers and scales are repacked, never rounded again, so the weight
the graph multiplies by is `gguf.quants.dequantize`'s, bit for bit in float32.

:mod:`._gguf_blocks` reads every linear ggml type as ``w = s * q + m`` per sub-block (``q`` a small
integer, ``s`` a float32 scale, ``m`` an optional float32 minimum). A :class:`QuantizedWeight`
stores that as MatMulNBits does, ``w = s * (code - zero) + m``:

- ``bits`` 4 when ``q`` takes at most 16 values (Q4_0, Q4_1, Q4_K, Q3_K, Q2_K), else 8 (Q5_0,
  Q5_1, Q5_K, Q6_K, Q8_0, IQ4_NL, IQ4_XS and the IQ3, IQ2 and IQ1 types: MatMulNBits' 8-bit kernel
  is fast at accuracy level 4); ``block_size`` the sub-block, 32 or 16 (Q2_K, Q3_K, Q6_K, IQ2_XS,
  IQ2_S, IQ1_M).
- Without minimums ``code = q + zero`` with MatMulNBits' default zero point (8 or 128).
- With minimums the codes are *centred*: ``code = q - c + zero`` for the middle ``c`` of q's range
  and ``m' = m + c * s``, kept where every ``m'`` is exact in float32 (then ``s * (code - zero) +
  m'`` is the same real number, rounded once, as ``s * q + m``). Centred codes halve the error of
  int8 activations (accuracy level 4), whose rounding is multiplied by ``code - zero``. Where one
  ``m'`` is not exact, the codes are ``q`` with a zero point of 0 (4 bits) or ``q + 128`` (8 bits).
  The minimum is added as ``blocksum(x) @ m'`` beside the MatMulNBits
  (:func:`._gguf_nodes.linear_nodes`).

MatMulNBits' layout (ONNX Runtime 1.31): ``B`` uint8 ``[N, n_blocks, blob]``, ``blob = block_size
* bits / 8``, at 4 bits element ``2i`` in the low nibble of byte ``i``; ``scales`` ``[N, n_blocks]``;
packed uint8 ``zero_points`` ``[N, ceil(n_blocks * bits / 8)]``, absent for the default. The same
``B`` and ``scales`` also feed a quantised embedding lookup (:func:`._gguf_nodes.gather_nodes`), so a tied LM
head and its embedding table are stored once.

GGUF stores a 2-D weight with ``tensor.shape == [K, N]`` (ggml order) as ``N`` rows of ``K``
inputs; `GGUFReader` hands a quantised tensor over as uint8 ``[N, row_bytes]``. The graph's
nodes over these weights are :mod:`._gguf_nodes`'.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import ml_dtypes  # onnx and onnx-ir depend on it: their bfloat16 arrays
import numpy as np

from onnxsample.errors import ExportError
from onnxsample.exporters import _gguf_blocks

__all__ = [
    "FLOATS",
    "SUPPORTED",
    "TRANSPLANTABLE",
    "QuantizedWeight",
    "concat_rows",
    "from_gguf",
    "permute_rows",
    "split_rows",
]

TRANSPLANTABLE = tuple(_gguf_blocks.FORMATS)
"""GGUF types that become a :class:`QuantizedWeight` (and a `MatMulNBits`)."""

FLOATS = ("BF16", "F16", "F32")
"""GGUF float types: :func:`from_gguf` gives their rows as float arrays."""

SUPPORTED = (*TRANSPLANTABLE, *FLOATS)
"""Every GGUF type :func:`from_gguf` accepts."""

_CHUNK_WEIGHTS = 1 << 22  # weights unpacked at a time: blocks never span rows

_FLOAT_DTYPES = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
}


@dataclass(frozen=True)
class QuantizedWeight:
    """One linear layer's weight in `MatMulNBits` form, transplanted from a GGUF tensor:
    ``w[n, k] = scales[n, b] * (code[n, k] - zeros[n, b]) + mins[b, n]``, ``b = k // block_size``.

    Attributes:
        bits: 4 or 8.
        block_size: elements per block along K (32, or 16 for Q2_K, Q3_K, Q6_K).
        k: inputs per output channel, a multiple of `block_size`.
        n: output channels.
        packed: uint8 ``[N, n_blocks, block_size * bits / 8]``, MatMulNBits' ``B``.
        scales: float32 ``[N, n_blocks]``.
        zeros: uint8 ``[N, n_blocks]``, each block's zero point (8 centred, 0 where a moved
            minimum would not be exact); None where every block takes the default (8 / 128).
        mins: float32 ``[n_blocks, N]``, added per block; None where the type has none.
        qtype: the GGUF type it came from ("Q4_K", ...; "mixed" for rows of several).
    """

    bits: int
    block_size: int
    k: int
    n: int
    packed: np.ndarray
    scales: np.ndarray
    zeros: np.ndarray | None
    mins: np.ndarray | None
    qtype: str

    @property
    def n_blocks(self) -> int:
        """Blocks per output channel, ``K / block_size``."""
        return self.k // self.block_size

    @property
    def stacks_by(self) -> tuple[int, int, int]:
        """``(bits, block_size, k)``: weights with the same stack along N (:func:`concat_rows`)."""
        return (self.bits, self.block_size, self.k)

    @property
    def zero_points(self) -> np.ndarray | None:
        """MatMulNBits' packed ``zero_points`` input, or None for its default zero point."""
        if self.zeros is None:
            return None
        if self.bits == 8:
            return self.zeros
        zeros = self.zeros
        if zeros.shape[1] % 2:
            zeros = np.pad(zeros, ((0, 0), (0, 1)))
        return np.ascontiguousarray(zeros[:, 0::2] | (zeros[:, 1::2] << np.uint8(4)))

    def block_zeros(self) -> np.ndarray:
        """Every block's zero point, uint8 ``[N, n_blocks]``."""
        if self.zeros is not None:
            return self.zeros
        return np.full((self.n, self.n_blocks), 1 << (self.bits - 1), np.uint8)

    def codes(self) -> np.ndarray:
        """The unpacked codes, uint8 ``[N, n_blocks, block_size]`` (0..15 or 0..255)."""
        if self.bits == 8:
            return self.packed
        codes = np.empty((self.n, self.n_blocks, self.block_size), dtype=np.uint8)
        codes[..., 0::2] = self.packed & np.uint8(0x0F)
        codes[..., 1::2] = self.packed >> np.uint8(4)
        return codes

    def dequantize(self) -> np.ndarray:
        """The weight as float32 ``[N, K]``, `gguf.quants.dequantize`'s numbers: one exact product
        ``s * (code - zero)`` and one sum, as the graph computes it."""
        codes = self.codes().astype(np.float32) - self.block_zeros()[..., None].astype(np.float32)
        w = self.scales[..., None] * codes
        if self.mins is not None:
            w = w + self.mins.T[..., None]
        return w.reshape(self.n, self.k)


def from_gguf(
    data: np.ndarray, type_name: str, k: int, *, name: str = ""
) -> QuantizedWeight | np.ndarray:
    """Convert one GGUF tensor's stored data, without re-quantising it.

    Args:
        data: the tensor as `GGUFReader` gives it: uint8 ``[N, row_bytes]`` for a quantised type
            (any shape whose size is ``N * row_bytes`` is accepted), float32 / float16 ``[N, K]``
            (or the raw little-endian bytes as uint8) for F32 / F16 / BF16.
        type_name: the GGUF type's name (`GGMLQuantizationType.name`), e.g. "Q4_K".
        k: inputs per output channel (``tensor.shape[0]`` in ggml order).
        name: the tensor's name, for error messages.

    Returns:
        A :class:`QuantizedWeight` for the types of :data:`TRANSPLANTABLE`; ``[N, K]`` float rows
        of the file's own values and type (float32, float16, ml_dtypes' bfloat16) for F32, F16
        and BF16.

    Raises:
        ExportError: the type is not supported, or the data does not fit ``k``.
    """
    type_name = getattr(type_name, "name", type_name)  # tolerate a GGMLQuantizationType
    label = f"tensor {name!r}" if name else "tensor"
    if type_name in _FLOAT_DTYPES:
        return _float_rows(data, _FLOAT_DTYPES[type_name], k, label, type_name)
    fmt = _gguf_blocks.FORMATS.get(type_name)
    if fmt is None:
        raise ExportError(
            f"{label} has GGUF type {type_name}, which cannot be exported: "
            f"supported types are {', '.join(SUPPORTED)}"
        )
    blocks = _blocks(data, fmt, k, label)
    # a few million weights at a time: unpacking takes several bytes a weight in passing
    rows = max(1, _CHUNK_WEIGHTS // k)
    parts = [
        _pack(_gguf_blocks.unpack(blocks[i : i + rows], fmt)) for i in range(0, len(blocks), rows)
    ]
    return parts[0] if len(parts) == 1 else concat_rows(parts)


def _pack(u: _gguf_blocks.Unpacked) -> QuantizedWeight:
    """`u` as MatMulNBits codes: 4 or 8 bits, centred where the minimums allow (module doc)."""
    fmt = u.fmt
    bits = 4 if fmt.hi - fmt.lo < 16 else 8
    default = 1 << (bits - 1)
    n, k = u.q.shape
    mins, zeros, shift = u.mins, None, np.full(u.scales.shape, default, np.int16)
    if mins is not None:  # code = q - centre + default where the moved minimum is exact
        centre = (fmt.lo + fmt.hi + 1) // 2
        moved = mins.astype(np.float64) + centre * u.scales.astype(np.float64)
        exact = moved.astype(np.float32).astype(np.float64) == moved
        mins = np.where(exact, moved, mins).astype(np.float32)
        plain = 0 if bits == 4 else default  # 4 bits: code q, zero point 0
        shift = np.where(exact, default - centre, plain).astype(np.int16)
        if bits == 4 and not exact.all():
            zeros = np.where(exact, default, 0).astype(np.uint8)
    codes = u.q.reshape(n, -1, fmt.sub_block) + shift[..., None]
    codes = codes.astype(np.uint8)
    if bits == 4:
        codes = codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))
    return QuantizedWeight(
        bits,
        fmt.sub_block,
        k,
        n,
        np.ascontiguousarray(codes),
        u.scales,
        zeros,
        None if mins is None else np.ascontiguousarray(mins.T),
        fmt.name,
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
    return _rows(w, order)


def _rows(w: QuantizedWeight, rows: np.ndarray | slice) -> QuantizedWeight:
    """The weight of `w`'s output channels `rows` (an index array or a slice)."""
    packed = np.ascontiguousarray(w.packed[rows])
    return replace(
        w,
        n=packed.shape[0],
        packed=packed,
        scales=np.ascontiguousarray(w.scales[rows]),
        zeros=None if w.zeros is None else np.ascontiguousarray(w.zeros[rows]),
        mins=None if w.mins is None else np.ascontiguousarray(w.mins[:, rows]),
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
    return [_rows(w, slice(a, b)) for a, b in itertools.pairwise(starts)]


def concat_rows(weights: list[QuantizedWeight]) -> QuantizedWeight:
    """Stack weights along N (e.g. Q, K and V into one packed QKV projection).

    Weights of different GGUF types stack when they share bits and block size (Q4_0 and Q4_K,
    say): a part without minimums adds zeros.

    Raises:
        ValueError: no weights, or they differ in K, bits or block size.
    """
    if not weights:
        raise ValueError("concat_rows needs at least one weight")
    first = weights[0]
    for w in weights[1:]:
        if w.stacks_by != first.stacks_by:
            raise ValueError(
                f"cannot concatenate a {w.qtype} weight ({w.bits} bits, blocks of "
                f"{w.block_size}, K={w.k}) onto a {first.qtype} weight ({first.bits} bits, "
                f"blocks of {first.block_size}, K={first.k}): bits, blocks and K must match"
            )
    mins = None
    if any(w.mins is not None for w in weights):
        mins = np.concatenate(
            [
                w.mins if w.mins is not None else np.zeros((w.n_blocks, w.n), np.float32)
                for w in weights
            ],
            axis=1,
        )
    types = {w.qtype for w in weights}
    return QuantizedWeight(
        first.bits,
        first.block_size,
        first.k,
        sum(w.n for w in weights),
        np.concatenate([w.packed for w in weights], axis=0),
        np.concatenate([w.scales for w in weights], axis=0),
        None
        if all(w.zeros is None for w in weights)
        else np.concatenate([w.block_zeros() for w in weights], axis=0),
        mins,
        types.pop() if len(types) == 1 else "mixed",
    )


def _float_rows(
    data: np.ndarray, dtype: np.dtype, k: int, label: str, type_name: str
) -> np.ndarray:
    """An F32 / F16 / BF16 tensor as ``[N, K]`` of its own type; `data` may be typed or raw uint8
    bytes."""
    data = np.asarray(data)
    if data.dtype == np.uint8:
        data = np.ascontiguousarray(data).reshape(-1).view(dtype)
    elif data.dtype != dtype:
        raise ExportError(f"{label} is {type_name} but its data is {data.dtype}")
    if k <= 0 or data.size % k:
        raise ExportError(f"{label} has {data.size} elements, not a multiple of K={k}")
    return data.reshape(-1, k)


def _blocks(data: np.ndarray, fmt: _gguf_blocks.BlockFormat, k: int, label: str) -> np.ndarray:
    """The raw blocks of a quantised tensor, uint8 ``[N, K / block, block_bytes]``."""
    data = np.asarray(data)
    if data.dtype != np.uint8:
        raise ExportError(f"{label} is {fmt.name} but its data is {data.dtype}, not uint8")
    if k <= 0 or k % fmt.block:
        raise ExportError(
            f"{label} has K={k}, not a multiple of {fmt.name}'s {fmt.block}-element block"
        )
    row_bytes = k // fmt.block * fmt.nbytes
    if data.size == 0 or data.size % row_bytes:
        raise ExportError(
            f"{label} has {data.size} bytes, not a whole number of {fmt.name} rows "
            f"of {row_bytes} bytes (K={k})"
        )
    return np.ascontiguousarray(data).reshape(-1, k // fmt.block, fmt.nbytes)
