"""The KV layout of GroupQueryAttention graphs: one shared buffer per layer, row = slot.

com.microsoft GroupQueryAttention reads each row's length from the attention mask (seqlens_k =
ReduceSum(mask) - 1) and keeps the cache right-padded: row b's tokens sit at positions 0..len_b-1.
When the same memory is bound as ``past_key_values.*`` and as ``present.*``, ONNX Runtime writes the
new keys and values in place (``past_present_share_buffer``), so the cache never moves.

Each past input gets one device buffer [R, kv_heads, L, head_dim]; slot r owns row r. Rows are bound
through raw pointers (row r starts at ``data_ptr() + r * row_bytes``), the same on the CPU and CUDA:

* prefill of one sequence: row [slot, slot + 1), ids [1, C] = prompt tokens [start, end), mask
  [1, end] of ones. With start = 0 this is GQA's "first prompt"; with start > 0 (a chunk after the
  first, or the rest of a reused prefix) GQA attends to the cached positions and writes at
  start..end-1. Both give bit-identical keys and values to a single prefill of the whole prompt.
* decode: rows [lo, hi) around the decoding slots, ids [hi - lo, 1], mask [hi - lo, T] with ones in
  row r's first n_r + 1 columns, where n_r is what row r holds; GQA writes row r's fed token at
  position n_r. Rows in between that are not decoding (idle, mid-prefill, or holding a finished
  request's tokens for reuse) get the pad token, which lands just past what they hold, where the
  next real write overwrites it.

The buffers hold a row for every slot from the first request on and grow in positions on demand
(doubling, contents copied); an allocation that fails leaves the old buffers in place and fails only
the request that asked. When the requests that needed a long buffer have ended, it shrinks back
(when a request ends, or the engine has nothing to run: to what the running requests reserved
and what the requests that ended in the last ``KEEP_SECONDS`` hold, at least 512 positions): a conversation's next turn finds its whole history
cached, however long, and one long prompt does not keep every slot's memory for good. Older
finished requests' cached tokens past the new length are dropped (prefix reuse keeps what fits).

With ``fixed`` (CUDA graphs), every decode call has one shape while the buffers and the occupied
rows' bucket stay: the first ``rows()`` rows (the occupied slots rounded up to 1, 2, 4, 8…, see
:meth:`~onnxsample.engine._slots.SlotState.rows`), one token each, a mask as wide as the buffer.
GQA reads each row's length from the mask, so the extra columns cost no attention; the call is
the same whichever slots of the bucket decode.
"""

from __future__ import annotations

import logging
import mmap
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from onnxsample._memory import give_back_freed_memory
from onnxsample.engine._layout import Call, prompt_positions, slot_rows
from onnxsample.engine._row_copy import RowCopy
from onnxsample.engine._sequence import Sequence
from onnxsample.errors import ModelError, OutOfMemory, first_line

log = logging.getLogger(__name__)

_PAST, _PRESENT = "past_key_values.", "present."
_ALIGN = 64
_FIRST_LENGTH = 512
# A finished request's cached tokens outlive a shrink this long: a chat's next turn, or another
# request on the same prefix, as OpenAI's prompt cache keeps a prefix (5-10 minutes idle).
KEEP_SECONDS = 300.0
ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


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
        specs[name] = (heads, size, ORT_DTYPES.get(arg.type, np.float32))
    return specs


def buffer_length(need: int, limit: int | None) -> int:
    """Positions to allocate: `need` up to `limit` (the context or max_len), rounded up to a
    multiple of 64 without passing `limit`."""
    length = need if limit is None else min(need, limit)
    length = -(-length // _ALIGN) * _ALIGN
    return length if limit is None else min(length, limit)


def _zeroed(shape: list[int], dtype: Any) -> np.ndarray:
    """A zeroed array in memory fresh from the system (an anonymous mapping, unmapped with the
    array), whose pages are only committed where they are written.

    Not ``np.zeros``: numpy asks for transparent huge pages on arrays over 4 MB, and where the
    kernel then compacts memory to fault them in (THP defrag ``madvise``, the default of Debian and
    Ubuntu), growing 8 slots' cache of the embedded model to 2,048 and 4,096 positions took 2.1–6.3 s
    instead of 0.26–0.62 s: a stall of every running stream."""
    count = int(np.prod(shape))
    size = max(count * np.dtype(dtype).itemsize, 1)
    if hasattr(mmap, "MAP_ANONYMOUS"):
        memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    else:  # Windows: an anonymous mapping is all `mmap(-1, size)` makes
        memory = mmap.mmap(-1, size)
    return np.frombuffer(memory, dtype, count).reshape(shape)


def _row_bytes(spec: tuple[int, int, Any], length: int) -> int:
    heads, head_dim, dtype = spec
    return heads * length * head_dim * np.dtype(dtype).itemsize


class SharedKV:
    """One [rows, heads, length, head_dim] device buffer per ``past_key_values.*`` input."""

    def __init__(self, specs: dict[str, tuple[int, int, Any]], device: str) -> None:
        self.specs = specs
        self.device = device
        self.rows = 0
        self.length = 0
        self.generation = 0  # bumped whenever the buffers are replaced
        self.buffers: dict[str, Any] = {}
        self._copy = RowCopy(device)

    def nbytes(self, rows: int, length: int) -> int:
        return sum(_row_bytes(spec, length) for spec in self.specs.values()) * rows

    def grow(self, rows: int, length: int) -> None:
        """At least `rows` × `length`, contents kept; raises OutOfMemory and keeps the old buffers
        when the new ones cannot be allocated."""
        if rows <= self.rows and length <= self.length:
            return
        self._reallocate(max(rows, self.rows), max(length, self.length))

    def shrink(self, length: int) -> None:
        """Down to `length` positions per row (the first `length` kept), memory given back."""
        if length < self.length:
            self._reallocate(self.rows, length)
            give_back_freed_memory()

    def _reallocate(self, rows: int, length: int) -> None:
        import onnxruntime as ort

        kept = min(length, self.length)
        fresh = {}
        try:
            for name, (heads, head_dim, dtype) in self.specs.items():
                shape = [rows, heads, length, head_dim]
                data = _zeroed(shape, dtype)  # never uninitialised memory (NaN)
                if name in self.buffers:
                    data[: self.rows, :, :kept] = self.buffers[name].numpy()[:, :, :kept]
                # On the CPU the OrtValue uses `data` itself (its Python wrapper keeps it alive);
                # on CUDA this copies it to the device.
                fresh[name] = ort.OrtValue.ortvalue_from_numpy(data, self.device, 0)
                del data
        except (MemoryError, OSError, OverflowError, RuntimeError) as exc:  # OSError: mmap ENOMEM
            fresh.clear()
            need = self.nbytes(rows, length) / 2**20
            raise OutOfMemory(
                f"cannot allocate the KV cache: {rows} rows x {length} positions need "
                f"{need:.0f} MiB on {self.device} ({first_line(exc)})"
            ) from exc
        self.buffers = fresh
        self.rows, self.length = rows, length
        self.generation += 1
        log.info(
            "KV buffers: %d rows x %d positions, %.1f MiB on %s",
            rows,
            length,
            self.nbytes(rows, length) / 2**20,
            self.device,
        )

    def copy_row(self, src: int, dst: int) -> None:
        """Row `src` of every buffer into row `dst` (every position)."""
        for value in self.buffers.values():
            self._copy(value, src, dst)

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


class SharedLayout:
    """:class:`~onnxsample.engine._layout.KVLayout` over :class:`SharedKV`; `limit` caps the positions
    (the context or ``max_len``)."""

    def __init__(
        self,
        kv: SharedKV,
        slots: int,
        pad: int,
        limit: int | None,
        *,
        fixed: bool = False,
        rows: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        keep_seconds: float = KEEP_SECONDS,
    ) -> None:
        self.kv, self.slots, self.pad, self.limit = kv, slots, pad, limit
        self.fixed = fixed
        self.rows = rows or (lambda: slots)  # how many rows a fixed decode call binds
        self.reserved: dict[int, int] = {}  # positions each running request asked for
        self.tokens: list[list[int]] = [[] for _ in range(slots)]
        self.decoding: set[int] = set()
        self.clock, self.keep_seconds = clock, keep_seconds
        self.ended: dict[int, float] = {}  # when each free row's request ended (kept tokens)

    def held(self, slot: int) -> list[int]:
        return self.tokens[slot]

    def reserve(self, slot: int, positions: int) -> None:
        # Every slot's row at once: a row added later would copy the whole cache mid-stream.
        # Positions: at least 512 at first, then doubling, so that a growing chat copies the cache
        # (a stall for every sequence running) a few times, not every turn.
        rows = self.slots
        length = self.kv.length
        if positions > length:
            length = buffer_length(max(positions, 2 * length, _FIRST_LENGTH), self.limit)
        self.kv.grow(rows, max(length, positions))
        self.reserved[slot] = max(self.reserved.get(slot, 0), positions)

    def start(self, seq: Sequence, reused: int) -> None:
        self.ended.pop(seq.slot, None)
        del self.tokens[seq.slot][reused:]
        seq.computed = reused

    def prefill(self, seq: Sequence, end: int) -> Call:
        start, slot = seq.computed, seq.slot
        ids = np.asarray([seq.prompt[start:end]], np.int64)
        mask = np.ones((1, end), np.int64)
        rows = slot_rows(self.slots)
        sampling = []
        if end == len(seq.prompt):
            rows[slot] = end - start  # 1 + the last position of the call's one batch row
            sampling = [seq]
        prompt_rows, targets = prompt_positions(seq, start, end)
        return Call(
            "prefill",
            ids,
            mask,
            np.arange(start, end, dtype=np.int64)[None],
            rows,
            sampling,
            lambda binding: self.kv.bind(binding, slot, 1),
            prompt_rows=prompt_rows,
            prompt_targets=targets,
            prompt_seq=seq,
            end=end,
        )

    def decode(self, seqs: list[Sequence], drafts: dict[int, list[int]] | None = None) -> Call:
        if self.fixed:
            lo, hi = 0, self.rows()
            for r in set(range(hi)) - {seq.slot for seq in seqs}:
                del self.tokens[r][self.kv.length - 1 :]  # room for the pad it is fed
        else:
            lo = min(seq.slot for seq in seqs)
            hi = max(seq.slot for seq in seqs) + 1
        lens = np.asarray([len(self.tokens[r]) for r in range(lo, hi)], np.int64)
        # Every row feeds t tokens (GQA's one sequence length); each writes at its own length, so
        # the drafts are trimmed to what the fullest row has room for, leaving it one position
        # free (where the pad of a later call that spans the row lands).
        room = self.kv.length - int(lens.max()) - 2
        drafts = {s: d[:room] for s, d in (drafts or {}).items() if room > 0 and d}
        t = 1 + max((len(d) for d in drafts.values()), default=0)
        ids = np.full((hi - lo, t), self.pad, np.int64)
        rows = slot_rows(self.slots)
        for seq in seqs:
            fed = [seq.ids[-1], *drafts.get(seq.slot, ())]
            ids[seq.slot - lo, : len(fed)] = fed
            rows[seq.slot] = 1 + (seq.slot - lo) * t
        width = np.arange(self.kv.length if self.fixed else lens.max() + t)
        mask = (width < lens[:, None] + t).astype(np.int64)
        return Call(
            "decode",
            ids,
            mask,
            lens[:, None] + np.arange(t),
            rows,
            list(seqs),
            lambda binding: self.kv.bind(binding, lo, hi - lo),
            reuse=(lo, hi, self.kv.generation),
            drafts=drafts,
        )

    def commit(self, call: Call, presents: dict[str, Any]) -> None:
        if call.kind == "prefill":
            seq = call.prompt_seq
            self.tokens[seq.slot] = list(seq.prompt[: call.end])
            return
        for seq in call.sampling:  # before the new tokens are accepted: the fed ones are last
            kept = call.drafts.get(seq.slot, [])[: call.accepted.get(seq.slot, 0)]
            self.tokens[seq.slot] += [seq.ids[-1], *kept]

    def copy(self, src: int, dst: int) -> None:
        """Copy the keys and values of row `src` into the free row `dst`, whose cache is
        forgotten first (a copy that fails half-way leaves nothing claimed there)."""
        self.tokens[dst] = []
        self.ended.pop(dst, None)
        self.kv.copy_row(src, dst)

    def move(self, seq: Sequence, slot: int) -> None:
        """`seq` continues in `slot`, where :meth:`copy` put its keys and values; its old row
        keeps them as a finished request's (for prefix reuse)."""
        self.tokens[slot] = list(self.tokens[seq.slot])
        self.reserved[slot] = self.reserved.pop(seq.slot)
        self.ended[seq.slot] = self.clock()

    def finish(self, seq: Sequence) -> None:
        # The row keeps its tokens until the slot is taken again (prefix reuse).
        self.reserved.pop(seq.slot, None)
        self.ended[seq.slot] = self.clock()
        self._shrink()

    def discard(self, slot: int) -> None:
        self.tokens[slot] = []
        self.reserved.pop(slot, None)
        self.ended.pop(slot, None)
        self._shrink()

    def idle(self) -> float | None:
        """The engine has nothing to run: shrink if the kept tokens allow, and return in how many
        seconds the next kept row stops holding the buffers' length (None: none does), when
        this is to be called again, so an idle engine gives its memory back too."""
        self._shrink()
        if self.kv.length < 4 * _FIRST_LENGTH or not self.ended:
            return None
        return max(0.0, min(self.ended.values()) + self.keep_seconds - self.clock()) + 0.01

    def _shrink(self) -> None:
        """Give memory back once what the running requests reserved, and what the requests that
        ended in the last ``keep_seconds`` hold (one position more), fit in a quarter of it."""
        recent = self.clock() - self.keep_seconds
        for slot in [s for s, at in self.ended.items() if at < recent]:
            del self.ended[slot]  # its tokens stay while they fit, as any older row's
        kept = [len(self.tokens[s]) + 1 for s in self.ended]
        need = max([_FIRST_LENGTH, *kept, *self.reserved.values()])
        if self.kv.length < 4 * need:
            return
        length = buffer_length(need, self.limit)
        try:
            self.kv.shrink(length)
        except OutOfMemory as exc:  # the copy could not be made: keep the larger buffers
            log.warning("keeping the KV buffers: %s", exc)
            return
        for tokens in self.tokens:
            del tokens[length - 1 :]  # the last position stays free for a pad
