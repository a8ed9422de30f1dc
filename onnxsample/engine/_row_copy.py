"""Copies of one row of a buffer into another row of it, where the buffer lives.

Moving a running sequence to a lower slot (see :meth:`~onnxsample.engine._scheduler.Scheduler`'s
compaction) copies its rows of the KV buffers and of the penalty counts. On the CPU that is a
numpy assignment on the buffer's own memory. On a device ONNX Runtime's Python API copies no
part of a tensor, so a one-node ``Identity`` session per element type does it: the source row
bound as its input and the destination row as its output, each at its address inside the
buffer, the copy made on the device by the provider's own kernel.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# ONNX element types of the buffers copied -> numpy
NUMPY_TYPES = {1: np.float32, 6: np.int32, 7: np.int64, 9: np.bool_, 10: np.float16, 16: np.uint16}


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
