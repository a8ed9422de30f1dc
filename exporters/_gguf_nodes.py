"""The graph nodes over a transplanted GGUF weight (:class:`~._gguf_quant.QuantizedWeight`):
a `com.microsoft.MatMulNBits` plus the minimums' correction for a linear layer, and an exact
embedding lookup from the same blocks, so a tied LM head and its table are stored once."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir
import onnx_ir.tape

from onnxsample.exporters._gguf_quant import QuantizedWeight
from onnxsample.exporters._store import stored_inputs

__all__ = ["gather_nodes", "linear_nodes"]

Initializer = Callable[[str, np.ndarray], ir.Value]


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
    ``{name}/BlockSum/ReduceSum``, ``{name}/MinsMatMul``, ``{name}/AddMins``; inputs
    ``{weight_name}.qweight``, ``.scales``, ``.qzeros``, ``.mins`` (initializers, or made from
    compact ones when the session loads: :mod:`._store`), ``{name}.block_shape``,
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
    init = stored_inputs(tape, w, weight_name or name, initializer, _FLOATS[kind])
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
    init = stored_inputs(tape, w, weight_name or name, initializer, np_dtype)

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
