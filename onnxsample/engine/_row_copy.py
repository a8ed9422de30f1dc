"""Copies of one row of a buffer into another row of it, where the buffer lives, and of a span of
rows between the buffer and the host.

Moving a running sequence to a lower slot (see :meth:`~onnxsample.engine._scheduler.Scheduler`'s
compaction) copies its rows of the KV buffers and of the penalty counts. On the CPU that is a
numpy assignment on the buffer's own memory. On a device ONNX Runtime's Python API copies no
part of a tensor, so a one-node ``Identity`` session per element type does it: the source row
bound as its input and the destination row as its output, each at its address inside the
buffer, the copy made on the device by the provider's own kernel. The same session, one side
bound to host memory, moves a span of rows to or from the host without the rest of the buffer.
Scattered slots move as their :func:`runs` of consecutive slots, one span each, so the rows between
them do not cross.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

# ONNX element types of the buffers copied -> numpy
NUMPY_TYPES = {1: np.float32, 6: np.int32, 7: np.int64, 9: np.bool_, 10: np.float16, 16: np.uint16}


def runs(slots: Iterable[int]) -> list[tuple[int, int]]:
    """The runs ``[lo, hi)`` of consecutive slots in `slots`, in order: {0, 1, 5} -> [(0, 2), (5, 6)]."""
    found: list[tuple[int, int]] = []
    for slot in sorted(set(slots)):
        if found and found[-1][1] == slot:
            found[-1] = (found[-1][0], slot + 1)
        else:
            found.append((slot, slot + 1))
    return found


class RowCopy:
    """Copies rows inside buffers (OrtValues [rows, ...]) on `device`."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._sessions: dict[tuple[int, int], Any] = {}  # by element type and rank

    def __call__(self, value, src: int, dst: int) -> None:
        """Row `src` of `value` into its row `dst`."""
        if src == dst:
            return
        if self.device == "cpu":
            array = value.numpy()  # a view of the tensor's memory
            array[dst] = array[src]
            return
        kind = value.element_type()
        dtype = NUMPY_TYPES[kind]
        shape = [1, *value.shape()[1:]]
        row = math.prod(shape) * np.dtype(dtype).itemsize
        session = self._session(kind, len(shape))
        binding = session.io_binding()
        binding.bind_input("row", self.device, 0, dtype, shape, value.data_ptr() + src * row)
        binding.bind_output("copy", self.device, 0, dtype, shape, value.data_ptr() + dst * row)
        session.run_with_iobinding(binding)

    def to_host(self, value, lo: int, hi: int) -> np.ndarray:
        """Rows [lo, hi) of `value` as a numpy array of their own: only those rows' bytes cross
        to the host."""
        out = np.empty([hi - lo, *value.shape()[1:]], NUMPY_TYPES[value.element_type()])
        self._span(value, lo, out, to_host=True)
        return out

    def from_host(self, value, lo: int, rows: np.ndarray) -> None:
        """Write `rows` ([n, ...] of `value`'s element type) into rows [lo, lo + n) of `value`:
        only those rows' bytes cross to the device."""
        self._span(value, lo, np.ascontiguousarray(rows), to_host=False)

    def _span(self, value, lo: int, array: np.ndarray, *, to_host: bool) -> None:
        """Copy between `array` (host) and rows [lo, lo + len(array)) of `value` (where it lives),
        after checking that they fit: on a device a wrong span would write past the buffer."""
        kind = value.element_type()
        dtype = NUMPY_TYPES[kind]
        shape = value.shape()
        if (
            array.dtype != dtype
            or list(array.shape[1:]) != list(shape[1:])
            or not 0 <= lo <= lo + len(array) <= shape[0]
        ):
            raise ValueError(
                f"rows {array.dtype}{list(array.shape)} at row {lo} do not fit "
                f"{np.dtype(dtype)}{list(shape)}"
            )
        if self.device == "cpu":
            view = value.numpy()  # a view of the tensor's memory
            if to_host:
                array[...] = view[lo : lo + len(array)]
            else:
                view[lo : lo + len(array)] = array
            return
        row = math.prod(array.shape[1:]) * np.dtype(dtype).itemsize
        at = value.data_ptr() + lo * row
        binding = self._session(kind, array.ndim).io_binding()
        if to_host:
            binding.bind_input("row", self.device, 0, dtype, list(array.shape), at)
            binding.bind_output("copy", "cpu", 0, dtype, list(array.shape), array.ctypes.data)
        else:
            binding.bind_input("row", "cpu", 0, dtype, list(array.shape), array.ctypes.data)
            binding.bind_output("copy", self.device, 0, dtype, list(array.shape), at)
        self._session(kind, array.ndim).run_with_iobinding(binding)

    def _session(self, kind: int, rank: int):
        if (kind, rank) not in self._sessions:
            import onnx
            import onnxruntime as ort
            from onnx import helper

            # one node, built where it is needed: running a model loads no graph builder
            dims = [f"d{i}" for i in range(rank)]
            graph = helper.make_graph(
                [helper.make_node("Identity", ["row"], ["copy"], name="copy")],
                "row_copy",
                [helper.make_tensor_value_info("row", kind, dims)],
                [helper.make_tensor_value_info("copy", kind, dims)],
            )
            model = helper.make_model(
                graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9
            )
            onnx.checker.check_model(model, full_check=True)
            options = ort.SessionOptions()
            options.log_severity_level = 3
            provider = {"cuda": "CUDAExecutionProvider"}[self.device]
            self._sessions[kind, rank] = ort.InferenceSession(
                model.SerializeToString(), options, providers=[provider]
            )
        return self._sessions[kind, rank]
