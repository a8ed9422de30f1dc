"""How weights are stored in the ONNX file: in as few bytes as their values need, turned into the
arrays the kernels take when ONNX Runtime loads the model.

Float matrices (:func:`float_matrix`) whose values are all fp16 numbers (an F16 GGUF, fp16 or
bf16 checkpoints in range) are stored as fp16 in a float32 graph, with a Cast; those whose values
are all bfloat16 numbers (a bf16 checkpoint, a BF16 GGUF) as bfloat16, with a Cast; a tied LM
head is the embedding's table transposed in the graph, so the table is stored once.

A transplanted GGUF weight (:func:`stored_inputs`):

MatMulNBits has 4- and 8-bit codes and scales of the activations' type, so a Q6_K tensor (6-bit
codes, a scale per 16) would take 8 + 2 bits a weight in its arrays against 6.56 in the GGUF, and a
Q5_K one 10 against 5.5. On disk the export keeps what the values need instead:

- 8-bit codes whose values span at most 64 (Q5_0, Q5_1, Q5_K, Q6_K): the code minus the smallest
  code (of the tensor, or of each block where that saves bytes), as a plane of low nibbles (two a
  byte) and a plane of the 1 or 2 high bits (8 or 4 a byte);
- scales and minimums that are fp16 numbers (the d and m of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
  IQ4_NL): as fp16.

A few integer ops (BitwiseAnd, BitShift, Concat, BitwiseOr, Add; Cast for the floats) rebuild the
arrays from those initializers alone, so ONNX Runtime's constant folding (any optimisation level
but ``disable``) replaces them by the arrays themselves when the session is made: the kernels,
their prepacking and every bit of the result are the same as with the arrays stored whole. With
optimisation disabled the ops run every call and MatMulNBits takes a non-constant ``B``: slower,
and not the same kernel. Composing runs them once (``onnxsample.composer._fold_codes``), so the
model an engine loads holds the arrays and no session spends its load on them. Only float32 (CPU) exports are stored so; the fp16 GPU export keeps the
arrays whole.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import ml_dtypes  # onnx and onnx-ir depend on it: their bfloat16 arrays
import numpy as np
import onnx_ir as ir
import onnx_ir.tape

from onnxsample.exporters._gguf_quant import QuantizedWeight

__all__ = ["float_matrix", "stored_inputs", "transposed"]

Initializer = Callable[[str, np.ndarray], ir.Value]

_CHUNK_CODES = 1 << 22  # codes split into planes at a time

# The arrays already built on a tape, by initializer prefix and float type: a tied LM head and its
# embedding ask for the same ones.
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def stored_inputs(
    tape: onnx_ir.tape.Tape, w: QuantizedWeight, name: str, initializer: Initializer, dtype
) -> dict[str, ir.Value]:
    """MatMulNBits' inputs of `w`: values named ``{name}.qweight``, ``.scales``, ``.qzeros``,
    ``.mins`` (scales and minimums of the numpy float type `dtype`), from initializers or, for
    float32, rebuilt from the compact ones (module doc)."""
    built = _BUILT.setdefault(tape, {})
    key = (name, np.dtype(dtype).name)
    if key in built:
        return built[key]
    compact = np.dtype(dtype) == np.float32
    values = {
        "qweight": _codes(tape, w, f"{name}.qweight", initializer)
        if compact
        else initializer(f"{name}.qweight", w.packed),
        "scales": _floats(tape, w.scales, f"{name}.scales", initializer, dtype, compact),
    }
    if w.zero_points is not None:
        values["qzeros"] = initializer(f"{name}.qzeros", w.zero_points)
    if w.mins is not None:
        values["mins"] = _floats(tape, w.mins, f"{name}.mins", initializer, dtype, compact)
    built[key] = values
    return values


def float_matrix(
    tape: onnx_ir.tape.Tape, array: np.ndarray, name: str, initializer: Initializer, dtype
) -> ir.Value:
    """`array` as the value `name` of numpy float type `dtype` and `array`'s shape: from an fp16
    or bfloat16 initializer (and a Cast) where `dtype` is float32 and every value is one."""
    out = _floats(tape, np.asarray(array), name, initializer, dtype, np.dtype(dtype) == np.float32)
    out.dtype = ir.DataType.FLOAT if np.dtype(dtype) == np.float32 else ir.DataType.FLOAT16
    out.shape = ir.Shape(array.shape)
    return out


def transposed(tape: onnx_ir.tape.Tape, matrix: ir.Value, name: str) -> ir.Value:
    """`matrix` [N, K] as [K, N], named `name` (a tied LM head over its embedding's table)."""
    out = tape.op("Transpose", [matrix], {"perm": [1, 0]}, name=f"{name}/Transpose")
    out.name, out.dtype = name, matrix.dtype
    out.shape = ir.Shape(list(reversed(list(matrix.shape))))
    return out


def _fp16(array: np.ndarray) -> np.ndarray | None:
    """`array` as fp16 where every value is an fp16 number, else None."""
    if array.dtype == np.float16:
        return array
    # a million values at a time: most matrices that do not fit show it in their first rows
    for rows in _row_slices(array, 1 << 20):
        wide = array[rows].astype(np.float32)  # exact from bfloat16 too
        if not np.array_equal(wide.astype(np.float16).astype(np.float32), wide):
            return None
    return np.ascontiguousarray(array, dtype=np.float16)  # one copy, of a transposed view too


def _bf16(array: np.ndarray) -> np.ndarray | None:
    """`array` as bfloat16 where every value is a bfloat16 number (float32 values whose low 16
    bits are zero), else None."""
    if array.dtype == ml_dtypes.bfloat16:
        return array
    if array.dtype != np.float32:
        return None
    low = np.uint32(0xFFFF)
    if any(np.any(array[rows].view(np.uint32) & low) for rows in _row_slices(array, 1 << 20)):
        return None
    return (array.view(np.uint32) >> np.uint32(16)).astype(np.uint16).view(ml_dtypes.bfloat16)


def _row_slices(array: np.ndarray, values: int) -> list[slice]:
    """`array`'s rows in slices of about `values` values."""
    rows = max(1, values // max(1, array[:1].size))
    return [slice(i, i + rows) for i in range(0, len(array), rows)]


def _floats(tape, array: np.ndarray, name: str, initializer, dtype, compact: bool) -> ir.Value:
    """`array` in `dtype`; with `compact`, from an fp16 initializer where every value is an fp16
    number, else from a bfloat16 one where every value is a bfloat16 number, and a Cast."""
    if not compact:
        return initializer(name, np.asarray(array, dtype))
    if (half := _fp16(array)) is not None:
        stored = initializer(f"{name}.fp16", half)
    elif (brain := _bf16(array)) is not None:
        stored = initializer(f"{name}.bf16", brain)
    else:
        return initializer(name, np.asarray(array, dtype))
    out = tape.op("Cast", [stored], {"to": ir.DataType.FLOAT}, name=f"{name}/Cast")
    out.name = name
    return out


def _codes(tape, w: QuantizedWeight, name: str, initializer) -> ir.Value:
    """MatMulNBits' ``B``: stored whole, or as bit planes where 8-bit codes span at most 64."""
    if w.bits != 8:
        return initializer(name, w.packed)
    codes = w.packed  # uint8 [N, n_blocks, block]
    base, high_bits = _base(codes)
    if high_bits is None:
        return initializer(name, codes)
    low, high = _planes_by_rows(codes, base, high_bits)

    def op(op_type: str, inputs: list, suffix: str, **attributes) -> ir.Value:
        return tape.op(op_type, inputs, attributes or None, name=f"{name}/{suffix}")

    def u8(suffix: str, value) -> ir.Value:
        return initializer(f"{name}.{suffix}", np.asarray(value, np.uint8))

    stored_low = initializer(f"{name}.low", low)
    nibbles = op(
        "Concat",
        [
            op("BitwiseAnd", [stored_low, u8("mask4", 15)], "LowFirst"),
            op("BitShift", [stored_low, u8("four", 4)], "LowSecond", direction="RIGHT"),
        ],
        "Low",
        axis=-1,
    )
    planes = 8 // high_bits
    shifts = u8("shifts", (np.arange(planes) * high_bits).reshape(planes, 1))
    spread = op(
        "BitShift", [initializer(f"{name}.high", high), shifts], "HighPlanes", direction="RIGHT"
    )
    high_values = op(
        "Reshape",
        [
            op("BitwiseAnd", [spread, u8("mask_high", (1 << high_bits) - 1)], "HighValues"),
            initializer(f"{name}.shape", np.array(codes.shape, np.int64)),
        ],
        "High",
    )
    raised = op("BitShift", [high_values, u8("four", 4)], "HighRaised", direction="LEFT")
    out = op("BitwiseOr", [nibbles, raised], "Codes")
    if base.any():
        out = op("Add", [out, u8("base", base)], "Based")
    out.name = name
    return out


def _base(codes: np.ndarray) -> tuple[np.ndarray, int | None]:
    """(what to subtract from `codes`, the high bits left above a nibble: 1, 2, or None where the
    codes are kept whole): one base for the tensor, or one per block (a byte each) where that
    saves more than it costs. Q5_K codes of centred and uncentred blocks span 48 together, 32 in
    each block."""
    block = codes.shape[-1]
    lowest, highest = codes.min(axis=-1, keepdims=True), codes.max(axis=-1, keepdims=True)
    options = [
        (_high_bits(int(highest.max()) - int(lowest.min())), np.uint8(lowest.min())),
        (_high_bits(int((highest - lowest).max())), lowest),
    ]
    # bits a code plus, for per-block bases, a byte a block
    found = [(bits + (8 / block if base.ndim else 0), bits, base) for bits, base in options if bits]
    if not found:
        return np.uint8(0), None
    _, bits, base = min(found, key=lambda option: option[0])
    return np.asarray(base, np.uint8), bits


def _high_bits(largest: int) -> int:
    """Bits above a nibble that values 0..largest need: 1, 2, or 0 when more than 2."""
    return 1 if largest < 32 else 2 if largest < 64 else 0


def _planes_by_rows(
    codes: np.ndarray, base: np.ndarray, high_bits: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_planes` of ``codes - base``, a few million codes at a time (each takes several
    bytes in passing)."""
    parts = [
        _planes(codes[rows] - (base[rows] if base.ndim else base), high_bits)
        for rows in _row_slices(codes, _CHUNK_CODES)
    ]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([low for low, _ in parts]), np.concatenate([high for _, high in parts])


def _planes(values: np.ndarray, high_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """`values` uint8 ``[N, nb, block]`` below ``16 << high_bits`` as (low nibbles ``[N, nb,
    block / 2]``: element j of the block in the low nibble of byte j, element j + block/2 in its
    high nibble; high bits ``[N, nb, 1, per]``: element ``p * per + j`` in bits ``p * high_bits``
    of byte j, ``per = block * high_bits / 8``)."""
    half = values.shape[-1] // 2
    low = values & np.uint8(15)
    low = low[..., :half] | (low[..., half:] << np.uint8(4))
    planes = 8 // high_bits
    high = (values >> np.uint8(4)).reshape(*values.shape[:-1], planes, -1)
    packed = np.zeros((*high.shape[:-2], 1, high.shape[-1]), np.uint8)
    for p in range(planes):
        packed[..., 0, :] |= high[..., p, :] << np.uint8(p * high_bits)
    return np.ascontiguousarray(low), packed
