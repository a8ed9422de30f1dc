"""The decoder builder's graph: a tape with named initializers, one float type, and the linear
layers and embeddings over float matrices or GGUF blocks (:mod:`._gguf_nodes`), stored as
:mod:`._store` keeps them."""

from __future__ import annotations

import itertools
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
from onnx_ir import tape as ir_tape

from onnxsample.exporters import _gguf_nodes, _store
from onnxsample.exporters._gguf_quant import QuantizedWeight, concat_rows

__all__ = ["ExternalData", "GraphBuilder", "concat_weights"]

_DTYPES = {"fp32": (ir.DataType.FLOAT, np.float32), "fp16": (ir.DataType.FLOAT16, np.float16)}


class GraphBuilder:
    """A tape with named initializers and one float type for activations and weights."""

    def __init__(
        self,
        precision: str,
        accuracy_level: int,
        compact: bool = True,
        external: ExternalData | None = None,
    ) -> None:
        self.tape = ir_tape.Tape()
        self.external = external  # where initializers go as they are made (else: in memory)
        self.compact = compact  # float matrices as few bytes as they need (:mod:`._store`)
        self.dtype, self.np_dtype = _DTYPES[precision]
        self.accuracy_level = accuracy_level
        self._consts: dict[str, ir.Value] = {}
        self._block_sums: dict = {}  # one block sum per input of the GGUF minimums' corrections
        # by weight: a tied LM head is its embedding's object; a weight leaves memory once stored
        self._weight_names = _ByObject()  # GGUF blocks: their initializers' prefix
        self._tables = _ByObject()  # float embeddings: their table

    def const(self, name: str, array: np.ndarray) -> ir.Value:
        """The initializer `name`; asked again (a tied LM head's blocks), the same value."""
        if name not in self._consts:
            array = np.ascontiguousarray(array)
            out = self.external is not None and array.nbytes > ExternalData.MIN_BYTES
            tensor = self.external.tensor(array, name) if out else ir.tensor(array, name=name)
            self._consts[name] = self.tape.initializer(tensor, name=name)
        return self._consts[name]

    def _weight_name(self, weight: QuantizedWeight, name: str) -> str:
        """The initializers' prefix of `weight`: the first name it was used under."""
        first = self._weight_names.get(weight)
        if first is None:
            self._weight_names.put(weight, name)
        return name if first is None else first

    def embedding(self, ids: ir.Value, weight: Any, name: str, weight_name: str) -> ir.Value:
        """weight[ids]: a float table, or a GGUF's blocks gathered and de-quantised exactly;
        nodes named after `name`, initializers after `weight_name`."""
        if isinstance(weight, QuantizedWeight):
            return _gguf_nodes.gather_nodes(
                self.tape,
                ids,
                weight,
                name,
                self.const,
                self.dtype,
                weight_name=self._weight_name(weight, weight_name),
            )
        table = self._matrix(np.asarray(weight), f"{weight_name}.weight")
        self._tables.put(weight, table)
        return self.op("Gather", [table, ids], name, axis=0)

    def _matrix(self, array: np.ndarray, name: str) -> ir.Value:
        if not self.compact:
            return self.const(name, np.asarray(array, self.np_dtype))
        return _store.float_matrix(self.tape, array, name, self.const, self.np_dtype)

    def op(self, op_type: str, inputs, name: str, domain: str = "", **attributes) -> ir.Value:
        out = self.tape.op(op_type, inputs, attributes or None, domain=domain, name=name)
        out.name = name
        return out

    def ops(self, op_type, inputs, name, num_outputs, domain="", **attributes) -> list[ir.Value]:
        outs = self.tape.op_multi_out(
            op_type, inputs, attributes or None, num_outputs=num_outputs, domain=domain, name=name
        )
        for i, value in enumerate(outs):
            value.name = f"{name}/out{i}"
        return list(outs)

    def linear(self, x: ir.Value, weight: Any, name: str) -> ir.Value:
        """x @ weight.T for a float [N, K] array or a GGUF-transplanted quantised weight; a list
        (row parts that do not stack: GGUF types of other bits) is one linear each, concatenated."""
        if isinstance(weight, list):
            parts = [self.linear(x, w, f"{name}.{i}") for i, w in enumerate(weight)]
            return self.op("Concat", parts, f"{name}/Concat", axis=-1)
        if isinstance(weight, QuantizedWeight) and (
            weight.bits == 4 or self.accuracy_level == 4 or self.dtype == ir.DataType.FLOAT16
        ):
            return _gguf_nodes.linear_nodes(
                self.tape,
                x,
                weight,
                name,
                self.accuracy_level,
                self.const,
                self.dtype,
                weight_name=self._weight_name(weight, name),
                block_sums=self._block_sums,
            )
        if isinstance(weight, QuantizedWeight):
            # ORT's 8-bit MatMulNBits is ~20x slower than 4-bit below accuracy level 4 on the CPU
            # (fp32 activations); the float matrix holds the same values. CUDA's fp16 kernel has
            # a fused 8-bit path, so fp16 graphs keep the blocks.
            weight = weight.dequantize()
        table = self._tables.get(weight) if self.compact else None
        if table is not None:  # a tied LM head: its embedding's table, transposed
            w = _store.transposed(self.tape, table, f"{name}.weight")
        else:
            w = self._matrix(np.asarray(weight).T, f"{name}.weight")
        return self.op("MatMul", [x, w], f"{name}/MatMul")


class ExternalData:
    """A model's external data written as the graph makes its initializers, not at the save: the
    builder then holds one layer's weights at a time, not all of them.

    Every initializer of more than :attr:`MIN_BYTES` is appended to the data file at once and
    kept as an external tensor; smaller ones stay in the model. That is the layout ``ir.save``
    writes from tensors in memory (packed densely, in the graph's order, past 256 bytes), so the
    model saved with ``ir.save(model, path)`` (no `external_data`: the tensors are already
    external) is the same, byte for byte. Use it as a context manager around the build, and save
    the model after leaving it (the file is complete once closed).
    """

    MIN_BYTES = 256  # ir.save's own threshold for external data

    def __init__(self, data: Path) -> None:
        self.data = data
        self._file = open(data, "wb")  # noqa: SIM115  (closed by __exit__)

    def __enter__(self) -> ExternalData:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    def tensor(self, array: np.ndarray, name: str) -> ir.ExternalTensor:
        """`array`, appended to the data file, as the external tensor that refers to it."""
        offset = self._file.tell()
        self._file.write(array.reshape(-1).view(np.uint8))
        return ir.ExternalTensor(
            self.data.name,
            offset,
            array.nbytes,
            ir.DataType.from_numpy(array.dtype),
            shape=ir.Shape(array.shape),
            name=name,
            base_dir=self.data.parent,
        )


class _ByObject:
    """Values kept for objects by identity, without keeping the objects alive."""

    def __init__(self) -> None:
        self._items: dict[int, tuple[weakref.ref, Any]] = {}

    def get(self, obj: Any) -> Any:
        found = self._items.get(id(obj))
        return found[1] if found is not None and found[0]() is obj else None

    def put(self, obj: Any, value: Any) -> None:
        self._items[id(obj)] = (weakref.ref(obj), value)


def concat_weights(weights: list[Any]) -> Any:
    """Row parts stacked into one weight; where GGUF blocks of other bits or block sizes meet, a
    list of the runs of consecutive parts that stack (Q4_K_M's Q4_K queries and keys as one weight
    beside its Q6_K value projection), one linear each."""
    if all(isinstance(w, QuantizedWeight) for w in weights):
        runs = [list(run) for _, run in itertools.groupby(weights, lambda w: w.stacks_by)]
        stacked = [run[0] if len(run) == 1 else concat_rows(run) for run in runs]
        return stacked[0] if len(stacked) == 1 else stacked
    return np.concatenate(
        [w.dequantize() if isinstance(w, QuantizedWeight) else w for w in weights]
    )
