"""Decode steps as CUDA graphs: every input and output at a fixed device address, replayed.

ONNX Runtime's CUDA provider (``enable_cuda_graph``) captures the kernels of one run and replays
them for every later run with the same ``gpu_graph_id``, without launching a kernel from the host
and without copying inputs or outputs: the host must write the next step's inputs into the very
buffers the graph was captured with, and read its outputs from the ones it wrote. So a decode step
here binds device buffers only, allocated once per graph:

- the per-step inputs (``input_ids``, ``attention_mask``, ``sampler.row_index``,
  ``sampler.uniform``), overwritten in place from the host before each replay;
- the KV buffers, the sampler parameters, the penalty counts and the allowed-tokens mask, which
  live on the device anyway (the counts are added to in place where the composer found that safe;
  where they swap two buffers every step, each layout has one graph per parity; the mask is
  rewritten in place when a constrained sequence's row changes);
- the outputs, copied to the host after the replay (only ``sampler.next_token`` and the logprobs
  come back; a static chain's ``sampler.fallback_logits`` stays in the caller's buffer).

One graph serves one *bucket*: the same KV buffers (a grown cache is a new bucket), the same
rows (the first :meth:`~onnxsample.engine._slots.SlotState.rows` slots: 1, 2, 4, 8… as requests
come and go, so a step's cost follows the running requests) and, with two count buffers, the same
parity. A
bucket's first runs are ordinary (ONNX Runtime needs a warm-up before capture), then it is
captured and replayed. Prefill calls, whose shape follows the prompt, run uncaptured
(``gpu_graph_id`` -1).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxsample.engine._allowed import ALLOWED
from onnxsample.engine._layout import Call
from onnxsample.engine._slots import COUNTS_OUT, SlotState, bind_rows

log = logging.getLogger(__name__)

UNCAPTURED = "-1"
_STEP_INPUTS = ("input_ids", "attention_mask", "sampler.row_index", "sampler.uniform")
_EMPTY_INPUTS = ("sampler.prompt_rows", "sampler.prompt_targets")
_DTYPES = {"tensor(int64)": np.int64, "tensor(float)": np.float32}


def run_options(graph_id: str):
    """ONNX Runtime run options that pick captured graph `graph_id` (-1: run uncaptured)."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry("gpu_graph_id", graph_id)
    return options


@dataclass
class _Graph:
    """One bucket: its graph id, its binding and the device buffers it was bound with."""

    graph_id: int
    binding: Any
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    options: Any


class CapturedDecode:
    """Decode calls of a fixed-shape layout as CUDA graphs on `session` (see the module docs).

    `host_outputs` maps the outputs that come back to the host to their arrays (read after each
    step, as an uncaptured run would fill them).
    """

    def __init__(
        self,
        session,
        device: str,
        slots: SlotState,
        host_outputs: dict,
        allowed=None,
        device_outputs: dict | None = None,
    ) -> None:
        self.session, self.device, self.slots = session, device, slots
        self.allowed = allowed  # AllowedTokens, where the graph takes sampler.allowed
        self.host_outputs = host_outputs
        self.device_outputs = device_outputs or {}  # outputs into the caller's device buffers
        self.outputs = [o.name for o in session.get_outputs()]
        self._types = {i.name: i.type for i in session.get_inputs()}
        self._graphs: dict[tuple, _Graph] = {}
        self._next_id = 0

    @property
    def captured(self) -> int:
        """Buckets that have had a graph id (captured, or warming up to be)."""
        return len(self._graphs)

    def run(self, call: Call, uniform: np.ndarray | None, rows: int) -> dict[str, np.ndarray]:
        """Run decode `call` (from a fixed layout: ``call.reuse`` names its KV buffers and rows)
        as its bucket's graph, the sampler over the first `rows` slots; the host outputs by name
        (`rows` rows each)."""
        assert call.reuse is not None and not call.drafts, "a fixed decode call"
        self.slots.static()  # parameters rewritten in place when a slot changed
        key = (rows, *call.reuse, self.slots.parity)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._bind(call, key, rows)
        feeds = {
            "input_ids": call.input_ids,
            "attention_mask": call.mask,
            "sampler.row_index": call.row_index[:rows],
            "sampler.uniform": None if uniform is None else uniform[:rows],
        }
        for name, value in feeds.items():
            if name in graph.inputs and value is not None:
                graph.inputs[name].update_inplace(np.ascontiguousarray(value, _dtype(value)))
        self.session.run_with_iobinding(graph.binding, graph.options)
        self.slots.advance()
        return {name: graph.outputs[name].numpy() for name in self.host_outputs}

    def _bind(self, call: Call, key: tuple, rows: int) -> _Graph:
        import onnxruntime as ort

        if self._graphs and not any(k[1:-1] == key[1:-1] for k in self._graphs):
            log.info("the KV buffers changed: capturing new decode graphs (%s)", key)
        binding = self.session.io_binding()
        outputs: dict[str, Any] = {}
        for name in call.bind_kv(binding):
            outputs[name] = None  # bound by the layout, written in place
        inputs: dict[str, Any] = {}
        step = {
            "input_ids": call.input_ids,
            "attention_mask": call.mask,
            "sampler.row_index": call.row_index[:rows],
        }
        for name in (*_STEP_INPUTS, *_EMPTY_INPUTS):
            if name not in self._types:
                continue
            array = step.get(name)
            if array is None:
                shape = (rows,) if name == "sampler.uniform" else (0,)
                array = np.zeros(shape, _DTYPES[self._types[name]])
            inputs[name] = ort.OrtValue.ortvalue_from_numpy(
                np.ascontiguousarray(array), self.device, 0
            )
            binding.bind_ortvalue_input(name, inputs[name])
        self.slots.bind_static(binding, rows)
        if self.allowed is not None:
            bind_rows(binding, ALLOWED, self.allowed.rows_value, rows)
        self.slots.bind_counts(binding, rows)
        if self.slots.penalties:
            outputs[COUNTS_OUT] = None
        for name in self.outputs:
            if name in outputs:
                continue
            if name in self.host_outputs:
                host = self.host_outputs[name]
                value = ort.OrtValue.ortvalue_from_shape_and_type(
                    (rows, *host.shape[1:]), host.dtype, self.device, 0
                )
                binding.bind_ortvalue_output(name, value)
                outputs[name] = value
            elif name in self.device_outputs:
                bind_rows(binding, name, self.device_outputs[name], rows, output=True)
                outputs[name] = None  # read by the caller where it needs it
            else:  # the prompt outputs: empty in a decode step
                binding.bind_output(name, self.device)
        graph_id = self._next_id
        self._next_id += 1
        graph = _Graph(graph_id, binding, inputs, outputs, run_options(str(graph_id)))
        self._graphs[key] = graph
        log.debug("decode bucket %s is CUDA graph %d", key, graph_id)
        return graph


def _dtype(value: np.ndarray) -> type:
    return np.float32 if np.asarray(value).dtype.kind == "f" else np.int64
