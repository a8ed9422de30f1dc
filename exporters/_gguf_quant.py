"""Transplant GGUF quantised weights onto ONNX Runtime's `com.microsoft.MatMulNBits`, bit for bit.

No re-quantisation: the GGUF's integers and scales are repacked, never rounded again, so the weight
the graph multiplies by is `gguf.quants.dequantize`'s, bit for bit in float32.

:mod:`._gguf_blocks` reads every linear ggml type as ``w = s * q + m`` per sub-block (``q`` a small
integer, ``s`` a float32 scale, ``m`` an optional float32 minimum). A :class:`QuantizedWeight`
stores that as MatMulNBits does, ``w = s * (code - zero) + m``:

- ``bits`` 4 when ``q`` takes at most 16 values (Q4_0, Q4_1, Q4_K, Q3_K, Q2_K), else 8 (Q5_0,
  Q5_1, Q5_K, Q6_K, Q8_0, IQ4_NL, IQ4_XS: MatMulNBits' 8-bit kernel is fast at accuracy level 4);
  ``block_size`` the sub-block, 32 or 16 (Q2_K, Q3_K, Q6_K).
- Without minimums ``code = q + zero`` with MatMulNBits' default zero point (8 or 128).
- With minimums the codes are *centred*: ``code = q - c + zero`` for the middle ``c`` of q's range
  and ``m' = m + c * s``, kept where every ``m'`` is exact in float32 (then ``s * (code - zero) +
  m'`` is the same real number, rounded once, as ``s * q + m``). Centred codes halve the error of
  int8 activations (accuracy level 4), whose rounding is multiplied by ``code - zero``. Where one
  ``m'`` is not exact, the codes are ``q`` with a zero point of 0 (4 bits) or ``q + 128`` (8 bits).
  The minimum is added as ``blocksum(x) @ m'`` beside the MatMulNBits (:func:`linear_nodes`).

MatMulNBits' layout (ONNX Runtime 1.31): ``B`` uint8 ``[N, n_blocks, blob]``, ``blob = block_size
* bits / 8``, at 4 bits element ``2i`` in the low nibble of byte ``i``; ``scales`` ``[N, n_blocks]``;
packed uint8 ``zero_points`` ``[N, ceil(n_blocks * bits / 8)]``, absent for the default. The same
``B`` and ``scales`` also feed a quantised embedding lookup (:func:`gather_nodes`), so a tied LM
head and its embedding table are stored once.

GGUF stores a 2-D weight with ``tensor.shape == [K, N]`` (ggml order) as ``N`` rows of ``K``
inputs; `GGUFReader` hands a quantised tensor over as uint8 ``[N, row_bytes]``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir
import onnx_ir.tape

from onnxsample.errors import ExportError
from onnxsample.exporters import _gguf_blocks

__all__ = [
    "SUPPORTED",
    "TRANSPLANTABLE",
    "QuantizedWeight",
    "concat_rows",
    "from_gguf",
    "gather_nodes",
    "linear_nodes",
    "permute_rows",
    "split_rows",
]

TRANSPLANTABLE = tuple(_gguf_blocks.FORMATS)
"""GGUF types that become a :class:`QuantizedWeight` (and a `MatMulNBits`)."""

SUPPORTED = (*TRANSPLANTABLE, "BF16", "F16", "F32")
"""Every GGUF type :func:`from_gguf` accepts."""

_FLOAT_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2")}


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
            (or the raw little-endian bytes as uint8) for F32 / F16.
        type_name: the GGUF type's name (`GGMLQuantizationType.name`), e.g. "Q4_K".
        k: inputs per output channel (``tensor.shape[0]`` in ggml order).
        name: the tensor's name, for error messages.

    Returns:
        A :class:`QuantizedWeight` for the types of :data:`TRANSPLANTABLE`; float32 ``[N, K]`` for
        F32, F16 and BF16.

    Raises:
        ExportError: the type is not supported, or the data does not fit ``k``.
    """
    type_name = getattr(type_name, "name", type_name)  # tolerate a GGMLQuantizationType
    label = f"tensor {name!r}" if name else "tensor"
    if type_name in _FLOAT_DTYPES:
        return _float_rows(data, _FLOAT_DTYPES[type_name], k, label, type_name)
    if type_name == "BF16":
        import gguf.quants

        return gguf.quants.dequantize(np.asarray(data), gguf.GGMLQuantizationType.BF16).reshape(
            -1, k
        )
    fmt = _gguf_blocks.FORMATS.get(type_name)
    if fmt is None:
        raise ExportError(
            f"{label} has GGUF type {type_name}, which cannot be exported: "
            f"supported types are {', '.join(SUPPORTED)}"
        )
    return _pack(_gguf_blocks.unpack(_blocks(data, fmt, k, label), fmt))


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
    key = (first.bits, first.block_size, first.k)
    for w in weights[1:]:
        if (w.bits, w.block_size, w.k) != key:
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


Initializer = Callable[[str, np.ndarray], ir.Value]


def _inputs(w: QuantizedWeight, name: str, initializer: Initializer, dtype) -> dict[str, ir.Value]:
    """The initializers of `w` named ``{name}.qweight``, ``.scales``, ``.qzeros``, ``.mins``
    (scales and minimums in `dtype`)."""
    values = {
        "qweight": initializer(f"{name}.qweight", w.packed),
        "scales": initializer(f"{name}.scales", w.scales.astype(dtype)),
    }
    if w.zero_points is not None:
        values["qzeros"] = initializer(f"{name}.qzeros", w.zero_points)
    if w.mins is not None:
        values["mins"] = initializer(f"{name}.mins", w.mins.astype(dtype))
    return values


_FLOATS = {ir.DataType.FLOAT: np.float32, ir.DataType.FLOAT16: np.float16}


def linear_nodes(
    tape: onnx_ir.tape.Tape,
    x: ir.Value,
    w: QuantizedWeight,
    name: str,
    accuracy_level: int,
    initializer: Initializer,
    activations: ir.DataType | None = None,
    *,
    weight_name: str | None = None,
    block_sums: dict | None = None,
) -> ir.Value:
    """Emit ``y = x @ dequantize(w).T`` as a `com.microsoft.MatMulNBits` (+ the minimums).

    Nodes are named ``{name}/MatMulNBits`` and, with minimums, ``{name}/BlockSum/Reshape``,
    ``{name}/BlockSum/ReduceSum``, ``{name}/MinsMatMul``, ``{name}/AddMins``; initializers
    ``{weight_name}.qweight``, ``.scales``, ``.qzeros``, ``.mins``, ``{name}.block_shape``,
    ``{name}.block_axes`` (`weight_name` defaults to `name`; a tied LM head names its embedding's,
    so the blocks are stored once).

    The minimums add ``blocksum(x) @ mins``: x reshaped to ``[..., n_blocks, block_size]`` (a
    Reshape whose leading entries are 0, one per leading axis of x when its rank is known, else x
    is taken to be ``[B, S, K]``), summed over the block. `block_sums`, shared by the layers of a
    graph, keeps one block sum per input and block size: projections of one input (Q, K and V,
    gate and up) sum it once.

    Speed (ONNX Runtime 1.31 CPU, one thread): 8-bit weights are fast only at accuracy_level 4;
    at levels 0 to 3 ORT's 8-bit kernel is some 20 times slower than the 4-bit one.

    Args:
        tape: records the nodes; the model must import "com.microsoft" version 1 and the default
            domain at opset 18 or later.
        x: float32 or float16 ``[..., K]``; scales and minimums take its type (exact in float32;
            rounded to fp16 for K-quants' products of two scales).
        w: the weight, ``K`` inputs to ``N`` outputs.
        name: prefix of the node and value names.
        accuracy_level: MatMulNBits' accuracy_level (0 = float32 compute, 4 = int8 activations).
        initializer: registers ``(name, array)`` as an initializer and returns its value.
        activations: x's float type where x does not carry one (default: x's, else float32).

    Returns:
        The output value, ``[..., N]`` of x's type.
    """
    if accuracy_level not in range(5):
        raise ValueError(f"accuracy_level must be 0..4, got {accuracy_level}")
    kind = x.dtype or activations or ir.DataType.FLOAT
    if kind not in _FLOATS:
        raise ValueError(f"{name}: MatMulNBits input must be float32 or float16, got {kind}")
    leading = None if x.shape is None else list(x.shape)[:-1]
    init = _inputs(w, weight_name or name, initializer, _FLOATS[kind])
    inputs = [x, init["qweight"], init["scales"]]
    if "qzeros" in init:
        inputs.append(init["qzeros"])
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
    key = (id(x), w.block_size)
    sums = None if block_sums is None else block_sums.get(key, (None, None))[1]
    if sums is None:
        rank = 3 if leading is None else len(leading) + 1
        block_shape = np.array([0] * (rank - 1) + [w.n_blocks, w.block_size], dtype=np.int64)
        blocks = tape.op(
            "Reshape",
            [x, initializer(f"{name}.block_shape", block_shape)],
            name=f"{name}/BlockSum/Reshape",
        )
        _named(
            blocks, f"{name}/BlockSum/Reshape/output_0", leading, [w.n_blocks, w.block_size], kind
        )
        sums = tape.op(
            "ReduceSum",
            [blocks, initializer(f"{name}.block_axes", np.array([-1], dtype=np.int64))],
            attributes={"keepdims": 0},
            name=f"{name}/BlockSum/ReduceSum",
        )
        _named(sums, f"{name}/BlockSum/output_0", leading, [w.n_blocks], kind)
        if block_sums is not None:
            block_sums[key] = (x, sums)  # x kept alive: its id stays its own
    correction = tape.op("MatMul", [sums, init["mins"]], name=f"{name}/MinsMatMul")
    _named(correction, f"{name}/MinsMatMul/output_0", leading, [w.n], kind)
    out = tape.op("Add", [y, correction], name=f"{name}/AddMins")
    return _named(out, f"{name}/AddMins/output_0", leading, [w.n], kind)


def gather_nodes(
    tape: onnx_ir.tape.Tape,
    ids: ir.Value,
    w: QuantizedWeight,
    name: str,
    initializer: Initializer,
    dtype: ir.DataType = ir.DataType.FLOAT,
    *,
    weight_name: str | None = None,
) -> ir.Value:
    """Emit ``dequantize(w)[ids]``: an embedding lookup straight from the blocks.

    Gathers the rows' codes, scales and minimums (the same initializers as :func:`linear_nodes`
    under `weight_name`, so a tied LM head shares them), unpacks 4-bit codes in float arithmetic
    (``high = floor(b / 16)``, ``low = b - 16 * high``: exact), and computes ``s * (code - zero) + m`` as the weight's own rule: exact in float32.
    ONNX Runtime's ``GatherBlockQuantized`` wants scales of the data's rank, which MatMulNBits
    refuses, so plain ops keep one copy of the table.

    Args:
        ids: int64 ``[B, S]`` token ids.
        name: prefix of the node names; `weight_name` that of the initializers (default `name`).
        dtype: the output's float type.

    Returns:
        ``[B, S, K]`` of `dtype`.
    """
    np_dtype = _FLOATS[dtype]
    init = _inputs(w, weight_name or name, initializer, np_dtype)

    def op(op_type: str, inputs: list, suffix: str, **attributes) -> ir.Value:
        return tape.op(op_type, inputs, attributes or None, name=f"{name}/{suffix}")

    def const(suffix: str, array: np.ndarray) -> ir.Value:
        return initializer(f"{name}.{suffix}", array)

    packed = op("Gather", [init["qweight"], ids], "GatherCodes", axis=0)  # [B, S, nb, blob]
    codes = op("Cast", [packed], "CodesFloat", to=dtype)
    if w.bits == 4:  # nibbles apart in float arithmetic (exact; CUDA has no BitShift kernel)
        high = op(
            "Floor",
            [op("Mul", [codes, const("sixteenth", np.array(1 / 16, np_dtype))], "Over16")],
            "High",
        )
        low = op(
            "Sub",
            [codes, op("Mul", [high, const("sixteen", np.array(16, np_dtype))], "High16")],
            "Low",
        )
        axis = const("pair_axis", np.array([-1], np.int64))
        codes = op(
            "Concat",
            [op("Unsqueeze", [low, axis], "LowPair"), op("Unsqueeze", [high, axis], "HighPair")],
            "Pairs",
            axis=-1,
        )
    shape = const("block_shape", np.array([0, 0, w.n_blocks, w.block_size], np.int64))
    codes = op("Reshape", [codes, shape], "Codes")  # [B, S, nb, block]
    last = const("block_axis", np.array([-1], np.int64))
    if w.zeros is None:
        zero = const("zero", np.array(1 << (w.bits - 1), np_dtype))
    else:  # per-block zero points, unpacked (MatMulNBits' are packed in nibbles)
        zeros = initializer(f"{weight_name or name}.block_zeros", w.zeros)
        zero = op("Gather", [zeros, ids], "GatherZeros", axis=0)
        zero = op("Unsqueeze", [op("Cast", [zero], "ZerosFloat", to=dtype), last], "Zeros")
    values = op("Sub", [codes, zero], "Centre")
    scales = op(
        "Unsqueeze", [op("Gather", [init["scales"], ids], "GatherScales", axis=0), last], "Scales"
    )
    values = op("Mul", [values, scales], "Scale")
    if w.mins is not None:  # mins are [nb, N]: gather columns, then blocks last
        mins = op("Gather", [init["mins"], ids], "GatherMins", axis=1)  # [nb, B, S]
        mins = op("Transpose", [mins], "MinsRows", perm=[1, 2, 0])
        values = op("Add", [values, op("Unsqueeze", [mins, last], "Mins")], "AddMins")
    out = op("Reshape", [values, const("shape", np.array([0, 0, w.k], np.int64))], "Rows")
    return _named(
        out, f"{name}/Rows/output_0", None if ids.shape is None else list(ids.shape), [w.k], dtype
    )


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
