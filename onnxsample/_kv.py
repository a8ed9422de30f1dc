"""The running batch of a GroupQueryAttention graph: one shared KV buffer per layer, row = slot.

com.microsoft GroupQueryAttention reads each row's length from the attention mask (seqlens_k =
ReduceSum(mask) - 1) and keeps the cache right-padded: row b's tokens sit at positions 0..len_b-1.
When the same memory is bound as ``past_key_values.*`` and as ``present.*``, ONNX Runtime writes the
new keys and values in place (``past_present_share_buffer``), so the cache never moves or grows.

Each past input gets one device buffer [R, kv_heads, L, head_dim]; sequence slot r owns row r. A
contiguous range of rows [r0, r0 + n) is bound as a batch through raw pointers (row r starts at
``data_ptr() + r * row_bytes``), the same on the CPU and on CUDA:

* prefill: ids [n, S] right-padded, mask [n, S] with ones in each row's first len_b columns (GQA's
  "first prompt": sequence length == total length, rotary positions 0..S-1);
* decode: rows [0, hi), ids [hi, 1], mask [hi, T] with ones in row b's first len_b + 1 columns
  (T = longest + 1); GQA writes row b's new token at position len_b. Idle rows inside get the pad
  token and a single 1 (seqlens 0; a row of zeros is not allowed).

Row lengths are tracked here, on the host.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from onnxsample.errors import ModelError

log = logging.getLogger(__name__)

_PAST, _PRESENT = "past_key_values.", "present."
_ALIGN = 64
_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def kv_specs(pasts: dict[str, Any], head_size: int | None, model: str) -> dict[str, tuple]:
    """(kv heads, head size, numpy dtype) of each past input (an ORT NodeArg); `head_size` stands
    in for a symbolic last dimension (genai's ``kv_cache_dim``)."""
    specs = {}
    for name, arg in pasts.items():
        heads, size = arg.shape[1], head_size or arg.shape[3]
        if not isinstance(heads, int) or not isinstance(size, int):
            raise ModelError(
                f"{model}: {name} has shape {arg.shape}, not fixed heads and head size"
            )
        specs[name] = (heads, size, _ORT_DTYPES.get(arg.type, np.float32))
    return specs


def buffer_length(need: int, limit: int | None) -> int:
    """Positions to allocate: `need` (longest prompt + new tokens) up to `limit` (the context or
    max_len), rounded up to a multiple of 64 without passing `limit`."""
    length = need if limit is None else min(need, limit)
    length = -(-length // _ALIGN) * _ALIGN
    return length if limit is None else min(length, limit)


def contiguous_runs(sequences: list[Any]) -> list[list[Any]]:
    """`sequences` ordered by slot and cut where the slots stop being consecutive."""
    runs: list[list[Any]] = []
    for seq in sorted(sequences, key=lambda s: s.slot):
        if runs and runs[-1][-1].slot + 1 == seq.slot:
            runs[-1].append(seq)
        else:
            runs.append([seq])
    return runs


class SharedKV:
    """One [rows, heads, length, head_dim] device buffer per ``past_key_values.*`` input.

    `pasts` maps each past input to (heads, head_dim, numpy dtype). The buffers stay allocated across
    calls; :meth:`ensure` replaces them only when a call needs more rows or positions.
    """

    def __init__(self, pasts: dict[str, tuple[int, int, Any]], device: str) -> None:
        self.specs = pasts
        self.device = device
        self.rows = 0
        self.length = 0
        self.generation = 0  # bumped whenever the buffers are replaced
        self.buffers: dict[str, Any] = {}

    def ensure(self, rows: int, length: int) -> None:
        if rows <= self.rows and length <= self.length:
            return
        import onnxruntime as ort

        self.buffers = {}  # let the old buffers go before the new ones are allocated
        for name, (heads, head_dim, dtype) in self.specs.items():
            shape = [rows, heads, length, head_dim]
            value = ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, self.device, 0)
            value.update_inplace(np.zeros(shape, dtype))  # never uninitialised memory (NaN)
            self.buffers[name] = value
        self.rows, self.length = rows, length
        self.generation += 1
        total = sum(_row_bytes(spec, length) for spec in self.specs.values()) * rows
        log.info(
            "KV buffers: %d rows x %d positions, %d tensors, %.1f MiB on %s",
            rows,
            length,
            len(self.buffers),
            total / 2**20,
            self.device,
        )

    def bind(self, binding, r0: int, n: int) -> list[str]:
        """Bind rows [r0, r0 + n) as each past input and its present output; the outputs' names."""
        names = []
        for name, value in self.buffers.items():
            heads, head_dim, dtype = self.specs[name]
            shape = [n, heads, self.length, head_dim]
            ptr = value.data_ptr() + r0 * _row_bytes(self.specs[name], self.length)
            present = _PRESENT + name[len(_PAST) :]
            binding.bind_input(name, self.device, 0, dtype, shape, ptr)
            binding.bind_output(present, self.device, 0, dtype, shape, ptr)
            names.append(present)
        return names


def _row_bytes(spec: tuple[int, int, Any], length: int) -> int:
    heads, head_dim, dtype = spec
    return heads * length * head_dim * np.dtype(dtype).itemsize


class Step(NamedTuple):
    """One ORT call's host inputs, how to bind its KV rows, and the sampler row of each slot."""

    input_ids: np.ndarray
    mask: np.ndarray
    positions: np.ndarray
    bind: Callable[[Any], list[str]]
    row_index: np.ndarray


@dataclass
class SlotBatch:
    """The sequences running in a :class:`SharedKV`; `rows` in any order, each at row ``seq.slot``."""

    kv: SharedKV
    pad: int
    slots: int
    rows: list[Any] = field(default_factory=list)
    lens: np.ndarray = field(init=False)  # tokens in each buffer row

    def __post_init__(self) -> None:
        self.lens = np.zeros(self.kv.rows, np.int64)

    def prefill(self, run: list[Any]) -> Step:
        """Prompts of sequences in consecutive slots, right-padded; they join the batch."""
        r0, n = run[0].slot, len(run)
        length = max(len(seq.prompt) for seq in run)
        ids = np.full((n, length), self.pad, np.int64)
        mask = np.zeros((n, length), np.int64)
        row_index = np.zeros(self.slots, np.int64)
        for b, seq in enumerate(run):
            ids[b, : len(seq.prompt)] = seq.prompt
            mask[b, : len(seq.prompt)] = 1
            row_index[seq.slot] = 1 + b * length + len(seq.prompt) - 1
            self.lens[seq.slot] = len(seq.prompt)
        positions = np.tile(np.arange(length, dtype=np.int64), (n, 1))
        self.rows += run
        return Step(ids, mask, positions, lambda bd: self.kv.bind(bd, r0, n), row_index)

    def decode(self) -> Step:
        """Every running sequence's last token, at rows [0, highest slot + 1)."""
        hi = max(seq.slot for seq in self.rows) + 1
        active = np.zeros(hi, bool)
        ids = np.full((hi, 1), self.pad, np.int64)
        row_index = np.zeros(self.slots, np.int64)
        for seq in self.rows:
            active[seq.slot] = True
            ids[seq.slot, 0] = seq.ids[-1]
            row_index[seq.slot] = 1 + seq.slot
        lens = np.where(active, self.lens[:hi], 0)  # idle rows: one position (seqlens 0)
        mask = (np.arange(lens.max() + 1) <= lens[:, None]).astype(np.int64)
        return Step(ids, mask, lens[:, None].copy(), lambda bd: self.kv.bind(bd, 0, hi), row_index)

    def advance(self) -> None:
        """After a decode step: every running row holds one more token."""
        for seq in self.rows:
            self.lens[seq.slot] += 1

    def keep(self, keep: list[int]) -> None:
        self.rows = [self.rows[i] for i in keep]


# Outputs of a composed graph that come back to the host, and the penalty state fed back each step.
HOST_OUTPUTS = (
    "sampler.next_token",
    "sampler.logprob",
    "sampler.top_logprob_ids",
    "sampler.top_logprobs",
)
COUNTS, COUNTS_OUT = "sampler.output_counts", "sampler.output_counts_out"


def bind_step(
    binding, input_ids, mask, positions, row_index, uniform, with_positions: bool
) -> None:
    """Bind what changes every step, for either KV layout: ids, mask, positions, rows, uniforms."""
    binding.bind_cpu_input("input_ids", input_ids)
    binding.bind_cpu_input("attention_mask", mask)
    if with_positions:
        binding.bind_cpu_input("position_ids", positions)
    binding.bind_cpu_input("sampler.row_index", row_index)
    binding.bind_cpu_input("sampler.uniform", uniform)


class DecodeBinding:
    """One IOBinding reused across GQA decode steps.

    A decode step of a shared-buffer graph binds the same KV rows, the same sampler parameters and
    the same outputs as the one before; building all of that anew every step costs Python time
    comparable to the sampler itself. Here the binding is rebuilt only when the rows, the buffers or
    the parameters change (:meth:`invalidate`); each step rebinds what :func:`bind_step` binds and
    swaps two penalty-count buffers. Host outputs land in preallocated arrays.
    """

    def __init__(self, session, device: str, host: dict[str, np.ndarray]) -> None:
        self.session, self.device, self.host = session, device, host
        self.positions = any(i.name == "position_ids" for i in session.get_inputs())
        self.outputs = [o.name for o in session.get_outputs()]
        self.binding = None
        self.key: tuple | None = None
        self.spare = None  # the penalty-count buffer the next step writes

    @classmethod
    def for_session(cls, session, device: str) -> DecodeBinding | None:
        """None when a host output has a symbolic shape (then every step binds from scratch)."""
        types = {"tensor(int64)": np.int64, "tensor(float)": np.float32}
        host = {}
        for out in session.get_outputs():
            if out.name in HOST_OUTPUTS:
                if not all(isinstance(d, int) for d in out.shape) or out.type not in types:
                    return None
                host[out.name] = np.zeros(out.shape, types[out.type])
        return cls(session, device, host)

    def invalidate(self) -> None:
        self.key = None

    def run(self, step: Step, uniform: np.ndarray, kv: SharedKV, static: dict, counts):
        """One decode step: (host outputs, the new penalty counts or None)."""
        import onnxruntime as ort

        key = (step.input_ids.shape[0], kv.generation)
        if key != self.key:
            self.binding = self.session.io_binding()
            kv_outputs = step.bind(self.binding)
            for name, value in static.items():
                self.binding.bind_ortvalue_input(name, value)
            for name in self.outputs:
                if name in self.host:
                    value = ort.OrtValue.ortvalue_from_numpy(self.host[name])
                    self.binding.bind_ortvalue_output(name, value)
                elif name not in kv_outputs and name != COUNTS_OUT:
                    self.binding.bind_output(name, self.device)
            self.key = key
        b = self.binding
        bind_step(
            b, step.input_ids, step.mask, step.positions, step.row_index, uniform, self.positions
        )
        if counts is not None:
            if self.spare is None or self.spare.shape() != counts.shape():
                self.spare = ort.OrtValue.ortvalue_from_shape_and_type(
                    counts.shape(), np.int32, self.device, 0
                )
            b.bind_ortvalue_input(COUNTS, counts)
            b.bind_ortvalue_output(COUNTS_OUT, self.spare)
        self.session.run_with_iobinding(b)
        if counts is None:
            return self.host, None
        written, self.spare = self.spare, counts
        return self.host, written
