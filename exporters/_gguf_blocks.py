"""ggml's block formats read into integers, per-block scales and per-block minimums, exactly.

Every weight type llama.cpp quantises to with a linear rule comes apart as ``w = s * q + m``:
``q`` a small integer per element, ``s`` a float32 scale and ``m`` a float32 minimum (or none) per
*sub-block* of 16 or 32 elements along K. The scale is what gguf's reference de-quantiser multiplies
by (an fp16 ``d``, or ``d`` times a sub-block's small integer: exact in float32, not in fp16), so
``s * q + m`` in float32 is `gguf.quants.dequantize` bit for bit (one product and one sum, each
exact or rounded once, as the reference does). The unpacking below follows gguf-py's numpy
reference (``gguf/quants.py``) step for step.

===========  ==========  ============  ========================  =====================
type         super-block  sub-block     q                          m
===========  ==========  ============  ========================  =====================
Q4_0         32           32            nibble − 8                 —
Q4_1         32           32            nibble                     m
Q5_0         32           32            5 bits − 16                —
Q5_1         32           32            5 bits                     m
Q8_0         32           32            int8                       —
Q2_K         256          16            2 bits                     −dmin·(sc >> 4)
Q3_K         256          16            3 bits − 4                 —
Q4_K         256          32            nibble                     −dmin·m6
Q5_K         256          32            5 bits                     −dmin·m6
Q6_K         256          16            6 bits − 32                —
IQ4_NL       32           32            kvalues[nibble]            —
IQ4_XS       256          32            kvalues[nibble]            —
IQ3_XXS      256          32            ±grid (4..62)              —
IQ3_S        256          32            ±grid (1..15)              —
IQ2_XXS      256          32            ±grid (8, 25, 43)          —
IQ2_XS       256          16            ±grid (8, 25, 43)          —
IQ2_S        256          16            ±grid (8, 25, 43)          —
IQ1_S        256          32            8·grid ± 1 (grid −1..1)    —
IQ1_M        256          16            8·grid ± 1 (grid −1..1)    —
===========  ==========  ============  ========================  =====================

The i-quants' values are a small integer from a grid of 4 or 8 (the ``grid`` tables gguf-py
carries) with a sign, times the sub-block's scale: ``d * (0.5 + sc) / 4`` and the like are exact in
float32, and so is each product, as in the reference. IQ1's ``grid ± 1/8`` is ``(8·grid ± 1) / 8``:
its scale is ``d * (2 sc + 1) / 8``, exact too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

__all__ = ["FORMATS", "BlockFormat", "Unpacked", "unpack"]

_QK_K = 256
_IQ4_VALUES = np.array(
    (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113), np.int16
)


@dataclass(frozen=True)
class BlockFormat:
    """One ggml type: its block (elements, bytes), sub-block (elements sharing a scale) and the
    integer range ``[lo, hi]`` of ``q``; `minimum` says whether sub-blocks carry a minimum."""

    name: str
    block: int
    nbytes: int
    sub_block: int
    lo: int
    hi: int
    minimum: bool


FORMATS = {
    f.name: f
    for f in (
        BlockFormat("Q4_0", 32, 18, 32, -8, 7, False),
        BlockFormat("Q4_1", 32, 20, 32, 0, 15, True),
        BlockFormat("Q5_0", 32, 22, 32, -16, 15, False),
        BlockFormat("Q5_1", 32, 24, 32, 0, 31, True),
        BlockFormat("Q8_0", 32, 34, 32, -128, 127, False),
        BlockFormat("Q2_K", _QK_K, 84, 16, 0, 3, True),
        BlockFormat("Q3_K", _QK_K, 110, 16, -4, 3, False),
        BlockFormat("Q4_K", _QK_K, 144, 32, 0, 15, True),
        BlockFormat("Q5_K", _QK_K, 176, 32, 0, 31, True),
        BlockFormat("Q6_K", _QK_K, 210, 16, -32, 31, False),
        BlockFormat("IQ4_NL", 32, 18, 32, -127, 113, False),
        BlockFormat("IQ4_XS", _QK_K, 136, 32, -127, 113, False),
        BlockFormat("IQ3_XXS", _QK_K, 98, 32, -62, 62, False),
        BlockFormat("IQ3_S", _QK_K, 110, 32, -15, 15, False),
        BlockFormat("IQ2_XXS", _QK_K, 66, 32, -43, 43, False),
        BlockFormat("IQ2_XS", _QK_K, 74, 16, -43, 43, False),
        BlockFormat("IQ2_S", _QK_K, 82, 16, -43, 43, False),
        BlockFormat("IQ1_S", _QK_K, 50, 32, -9, 9, False),
        BlockFormat("IQ1_M", _QK_K, 56, 16, -9, 9, False),
    )
}
"""The ggml types :func:`unpack` reads, by `GGMLQuantizationType` name."""


@dataclass(frozen=True)
class Unpacked:
    """A tensor's integers ``q`` int16 ``[N, K]``, scales float32 ``[N, K / sub_block]`` and
    minimums (same shape, or None): ``w = s * q + m`` per sub-block."""

    q: np.ndarray
    scales: np.ndarray
    mins: np.ndarray | None
    fmt: BlockFormat


def unpack(blocks: np.ndarray, fmt: BlockFormat) -> Unpacked:
    """Read `blocks`, uint8 ``[N, K / fmt.block, fmt.nbytes]``, into :class:`Unpacked`."""
    n, per_row = blocks.shape[:2]
    flat = np.ascontiguousarray(blocks).reshape(n * per_row, fmt.nbytes)
    q, s, m = _READERS[fmt.name](flat)
    k = per_row * fmt.block
    subs = k // fmt.sub_block
    return Unpacked(
        q.astype(np.int16).reshape(n, k),
        np.ascontiguousarray(s, np.float32).reshape(n, subs),
        None if m is None else np.ascontiguousarray(m, np.float32).reshape(n, subs),
        fmt,
    )


def _f16(b: np.ndarray) -> np.ndarray:
    """Two bytes per row as an fp16 value, widened to float32 ``[rows, 1]``."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """ggml's 32-element nibble block: element j the low nibble of byte j, j + 16 the high."""
    return np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Bit j of a little-endian uint32, for j in 0..31."""
    return _bits(np.ascontiguousarray(qh).view(np.uint32)[..., 0], 32).astype(np.uint8)


def _q4_0(b):
    return _nibbles(b[:, 2:]).astype(np.int16) - 8, _f16(b[:, :2]), None


def _q4_1(b):
    return _nibbles(b[:, 4:]), _f16(b[:, :2]), _f16(b[:, 2:4])


def _q5_0(b):
    q = _nibbles(b[:, 6:]) | (_high_bits(b[:, 2:6]) << np.uint8(4))
    return q.astype(np.int16) - 16, _f16(b[:, :2]), None


def _q5_1(b):
    q = _nibbles(b[:, 8:]) | (_high_bits(b[:, 4:8]) << np.uint8(4))
    return q, _f16(b[:, :2]), _f16(b[:, 2:4])


def _q8_0(b):
    return np.ascontiguousarray(b[:, 2:]).view(np.int8), _f16(b[:, :2]), None


def _q2_k(b):
    rows = b.shape[0]
    scales, qs = b[:, :16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    s = d * (scales & np.uint8(0xF)).astype(np.float32)
    m = -(dmin * (scales >> np.uint8(4)).astype(np.float32))
    shift = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    q = (qs.reshape(rows, -1, 1, 32) >> shift) & np.uint8(3)
    return q.reshape(rows, _QK_K), s, m


def _q3_k(b):
    rows = b.shape[0]
    hmask, qs, scales, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    low = (
        scales[:, :8].reshape(rows, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)
    ).reshape(rows, 16)
    high = (
        scales[:, 8:].reshape(rows, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)
    ).reshape(rows, 16)
    sc = (low & np.uint8(0x0F)) | ((high & np.uint8(0x03)) << np.uint8(4))
    s = d * (sc.astype(np.int8) - np.int8(32)).astype(np.float32)
    ql = qs.reshape(rows, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    qh = hmask.reshape(rows, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
    ql = ql.reshape(rows, _QK_K) & np.uint8(3)
    qh = (qh.reshape(rows, _QK_K) & np.uint8(1)) ^ np.uint8(1)
    return ql.astype(np.int16) - (qh.astype(np.int16) << 2), s, None


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's eight 6-bit scales and minimums from their 12 bytes."""
    rows = scales.shape[0]
    d, m, m_d = np.split(scales.reshape(rows, 3, 4), 3, axis=-2)
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.reshape(rows, 8), mn.reshape(rows, 8)


def _k4_scales(b):
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    return d * sc.astype(np.float32), -(dmin * mn.astype(np.float32))


def _q4_k(b):
    rows = b.shape[0]
    s, m = _k4_scales(b)
    q = b[:, 16:].reshape(rows, -1, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(0x0F)).reshape(rows, _QK_K), s, m


def _q5_k(b):
    rows = b.shape[0]
    s, m = _k4_scales(b)
    qh, qs = b[:, 16:48], b[:, 48:]
    ql = qs.reshape(rows, -1, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    qh = qh.reshape(rows, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
    ql = (ql & np.uint8(0x0F)).reshape(rows, -1, 32)
    qh = (qh & np.uint8(0x01)).reshape(rows, -1, 32)
    return (ql | (qh << np.uint8(4))).reshape(rows, _QK_K), s, m


def _q6_k(b):
    rows = b.shape[0]
    ql, qh, scales, d = b[:, :128], b[:, 128:192], b[:, 192:208], _f16(b[:, 208:210])
    s = d * np.ascontiguousarray(scales).view(np.int8).astype(np.float32)
    ql = ql.reshape(rows, -1, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    ql = (ql & np.uint8(0x0F)).reshape(rows, -1, 32)
    qh = qh.reshape(rows, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    qh = (qh & np.uint8(0x03)).reshape(rows, -1, 32)
    q = (ql | (qh << np.uint8(4))).astype(np.int16) - 32
    return q.reshape(rows, _QK_K), s, None


def _iq4_nl(b):
    return _IQ4_VALUES[_nibbles(b[:, 2:])], _f16(b[:, :2]), None


def _iq4_xs(b):
    rows = b.shape[0]
    d = _f16(b[:, :2])
    scales_h = np.ascontiguousarray(b[:, 2:4]).view(np.uint16)
    scales_l = _nibble_pairs(b[:, 4:8])
    scales_h = scales_h.reshape(rows, 1, -1) >> np.arange(0, 16, 2, dtype=np.uint16).reshape(
        1, -1, 1
    )
    scales_h = scales_h.reshape(rows, -1).astype(np.uint8) & np.uint8(0x03)
    sc = (scales_l | (scales_h << np.uint8(4))).astype(np.int8) - np.int8(32)
    s = d * sc.astype(np.float32)
    qs = b[:, 8:].reshape(rows, -1, 1, 16) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    qs = qs.reshape(rows, -1, 32) & np.uint8(0x0F)
    return _IQ4_VALUES[qs].reshape(rows, _QK_K), s, None


@cache
def _grid(name: str) -> np.ndarray:
    """gguf-py's value grid of i-quant `name`: int16 ``[entries, 4 or 8]``."""
    import gguf.quants

    kind = getattr(gguf.quants, name)
    kind.init_grid()
    return kind.grid.reshape(kind.grid_shape).astype(np.int16)


def _bits(b: np.ndarray, width: int) -> np.ndarray:
    """Bits 0..width-1 of each byte (or word) of `b`, lowest first, as 0/1 along a new last axis."""
    return (b[..., None] >> np.arange(width, dtype=b.dtype)) & b.dtype.type(1)


def _ksigns(index: np.ndarray) -> np.ndarray:
    """±1 for each of 8 values from ggml's 7-bit sign index (the 8th bit keeps the parity even)."""
    import gguf.quants

    table = np.frombuffer(gguf.quants.IQ2_XXS.ksigns, np.uint8)
    return 1 - 2 * _bits(table[index], 8).astype(np.int16)


def _iq2_xxs(b):
    rows = b.shape[0]
    d, qs = _f16(b[:, :2]), np.ascontiguousarray(b[:, 2:]).view(np.uint32).reshape(rows, 8, 2)
    s = d * (np.float32(0.5) + (qs[..., 1] >> 28).astype(np.float32)) * np.float32(0.25)
    grid = _grid("IQ2_XXS")[qs[..., 0].copy().view(np.uint8).reshape(rows, 8, 4)]  # [r,8,4,8]
    signs = _ksigns((qs[..., 1, None] >> np.array([0, 7, 14, 21], np.uint32)) & np.uint32(0x7F))
    return (grid * signs).reshape(rows, _QK_K), s, None


def _iq2_xs(b):
    rows = b.shape[0]
    d = _f16(b[:, :2])
    qs = np.ascontiguousarray(b[:, 2:66]).view(np.uint16).reshape(rows, 32)
    sc = _nibble_pairs(b[:, 66:74])
    s = d * (np.float32(0.5) + sc.astype(np.float32)) * np.float32(0.25)
    grid = _grid("IQ2_XS")[qs & np.uint16(511)]  # [rows, 32, 8]
    return (grid * _ksigns(qs >> np.uint16(9))).reshape(rows, _QK_K), s, None


def _iq2_s(b):
    rows = b.shape[0]
    d, qs, sign_bits = _f16(b[:, :2]), b[:, 2:34], b[:, 34:66]
    qh, sc = b[:, 66:74], _nibble_pairs(b[:, 74:82])
    s = d * (np.float32(0.5) + sc.astype(np.float32)) * np.float32(0.25)
    high = (qh[..., None] >> np.array([0, 2, 4, 6], np.uint8)) & np.uint8(3)
    index = qs.astype(np.uint16) | (high.reshape(rows, 32).astype(np.uint16) << np.uint16(8))
    signs = 1 - 2 * _bits(sign_bits, 8).astype(np.int16)  # [rows, 32, 8]
    return (_grid("IQ2_S")[index] * signs).reshape(rows, _QK_K), s, None


def _iq3_xxs(b):
    rows = b.shape[0]
    d, qs = _f16(b[:, :2]), b[:, 2:66]
    scales = np.ascontiguousarray(b[:, 66:98]).view(np.uint32)  # [rows, 8]
    s = d * (np.float32(0.5) + (scales >> 28).astype(np.float32)) * np.float32(0.5)
    grid = _grid("IQ3_XXS")[qs].reshape(rows, 8, 4, 8)
    signs = _ksigns((scales[..., None] >> np.array([0, 7, 14, 21], np.uint32)) & np.uint32(0x7F))
    return (grid * signs).reshape(rows, _QK_K), s, None


def _iq3_s(b):
    rows = b.shape[0]
    d, qs, qh, sign_bits = _f16(b[:, :2]), b[:, 2:66], b[:, 66:74], b[:, 74:106]
    s = d * (1 + 2 * _nibble_pairs(b[:, 106:110]).astype(np.float32))
    index = qs.astype(np.uint16) | (_bits(qh, 8).reshape(rows, 64).astype(np.uint16) << 8)
    grid = _grid("IQ3_S")[index].reshape(rows, 32, 8)
    signs = 1 - 2 * _bits(sign_bits, 8).astype(np.int16)  # [rows, 32, 8]
    return (grid * signs).reshape(rows, _QK_K), s, None


def _iq1_index(qs: np.ndarray, high: np.ndarray) -> np.ndarray:
    """IQ1's grid indices: 8 low bits from `qs`, 3 high bits from `high` (one per index)."""
    return qs.astype(np.uint16) | ((high & 7).astype(np.uint16) << np.uint16(8))


def _iq1_s(b):
    rows = b.shape[0]
    d, qs = _f16(b[:, :2]), b[:, 2:34]
    qh = np.ascontiguousarray(b[:, 34:50]).view(np.uint16)  # [rows, 8]
    s = d * (2 * ((qh >> 12) & 7) + 1).astype(np.float32) / np.float32(8)
    shifted = qh[..., None] >> np.array([0, 3, 6, 9], np.uint16)  # [rows, 8, 4]
    grid = _grid("IQ1_S")[_iq1_index(qs, shifted.reshape(rows, 32))].reshape(rows, 8, 32)
    delta = np.where(qh & np.uint16(0x8000), -1, 1).astype(np.int16)[..., None]  # [rows, 8, 1]
    return (8 * grid + delta).reshape(rows, _QK_K), s, None


def _iq1_m(b):
    rows = b.shape[0]
    qs, qh = b[:, :32], b[:, 32:48]
    scales = np.ascontiguousarray(b[:, 48:56]).view(np.uint16)  # [rows, 4]
    d_bits = (scales & np.uint16(0xF000)) >> np.array([12, 8, 4, 0], np.uint16)
    d = np.bitwise_or.reduce(d_bits, axis=-1).view(np.float16).astype(np.float32)[:, None]
    sc = (scales[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & np.uint16(7)
    s = d * (2 * sc.reshape(rows, 16) + 1).astype(np.float32) / np.float32(8)
    nibbles = qh[..., None] >> np.array([0, 4], np.uint8)  # [rows, 16, 2]: one per index
    grid = _grid("IQ1_M")[_iq1_index(qs, nibbles.reshape(rows, 32))].reshape(rows, 32, 8)
    delta = np.where(nibbles.reshape(rows, 32) & np.uint8(8), -1, 1).astype(np.int16)[..., None]
    return (8 * grid + delta).reshape(rows, _QK_K), s, None


def _nibble_pairs(b: np.ndarray) -> np.ndarray:
    """Each byte's low then high nibble, in order."""
    return (b[..., None] >> np.array([0, 4], np.uint8)).reshape(b.shape[0], -1) & np.uint8(0x0F)


_READERS = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
    "IQ4_NL": _iq4_nl,
    "IQ4_XS": _iq4_xs,
    "IQ3_XXS": _iq3_xxs,
    "IQ3_S": _iq3_s,
    "IQ2_XXS": _iq2_xxs,
    "IQ2_XS": _iq2_xs,
    "IQ2_S": _iq2_s,
    "IQ1_S": _iq1_s,
    "IQ1_M": _iq1_m,
}
