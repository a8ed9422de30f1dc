"""The KV layout of optimum's graphs: explicit positions, a cache that grows by concatenation.

Decoding sequences form one left-padded batch (:class:`KVBatch`) whose ``present.*`` outputs are fed
back as the next step's ``past_key_values.*``, as device OrtValues. A sequence being prefilled keeps
its own cache [1, H, n, D] between chunks and joins the batch with its last chunk. A finished
sequence leaves its row behind (copied out of the batch) so the slot's next request can start from
the longest common prefix. The cache is touched on the host only when the batch changes shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnxsample.engine._layout import Call, prompt_positions, slot_rows
from onnxsample.engine._sequence import Sequence
from onnxsample.engine._slots import host_copy, ortvalue
from onnxsample.errors import ModelError

_PAST, _PRESENT = "past_key_values.", "present."


@dataclass
class KVBatch:
    """Batch rows in order; `pasts` maps each ``past_key_values.*`` input to a [B, H, P, D] OrtValue."""

    device: str
    rows: list[Any] = field(default_factory=list)
    pasts: dict[str, Any] = field(default_factory=dict)
    mask: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    def positions(self) -> np.ndarray:
        """Position id of each row's next token: the number of real tokens it has so far."""
        return self.mask.sum(axis=1).astype(np.int64)

    def advance(self, presents: dict[str, Any]) -> None:
        """After a decode step: every row got one more real token, and the cache grew by one."""
        self.pasts = presents
        self.mask = np.concatenate([self.mask, np.ones((self.size, 1), np.int64)], axis=1)

    def join(self, rows: list[Any], pasts: dict[str, Any], mask: np.ndarray) -> None:
        """Append newly prefilled rows, left-padding whichever side is shorter."""
        if not self.rows:
            self.rows, self.pasts, self.mask = list(rows), dict(pasts), mask
            return
        length = max(self.length, mask.shape[1])
        merged = {}
        for name, value in self.pasts.items():
            old, new = value.numpy(), pasts[name].numpy()
            merged[name] = ortvalue(
                np.concatenate([_left_pad(old, length), _left_pad(new, length)]), self.device
            )
        self.pasts = merged
        self.mask = np.concatenate(
            [_left_pad(self.mask, length, axis=1), _left_pad(mask, length, axis=1)]
        )
        self.rows += rows

    def take(self, row: Any) -> dict[str, np.ndarray]:
        """Remove `row` from the batch; its cache [1, H, n, D] without the left padding."""
        b = self.rows.index(row)
        start = int(np.argmax(self.mask[b])) if self.mask[b].any() else self.length
        # A copy of the row while the batch's tensors are alive (numpy() is a view of them).
        own = {
            name: np.array(value.numpy()[b : b + 1, :, start:], copy=True, order="C")
            for name, value in self.pasts.items()
        }
        self.keep([i for i in range(self.size) if i != b])
        return own

    def keep(self, keep: list[int]) -> None:
        """Keep only the rows at indices `keep` (in order); trim columns no remaining row uses."""
        if len(keep) == self.size:
            return
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.pasts, self.mask = {}, np.zeros((0, 0), np.int64)
            return
        mask = self.mask[keep]
        used = np.flatnonzero(mask.any(axis=0))
        start = int(used[0]) if used.size else mask.shape[1]
        self.mask = mask[:, start:]
        self.pasts = {
            name: ortvalue(value.numpy()[keep][:, :, start:], self.device)
            for name, value in self.pasts.items()
        }


def _left_pad(array: np.ndarray, length: int, axis: int = 2) -> np.ndarray:
    missing = length - array.shape[axis]
    if missing <= 0:
        return array
    widths = [(0, 0)] * array.ndim
    widths[axis] = (missing, 0)
    return np.pad(array, widths)


def _host(value: Any) -> np.ndarray:
    return value if isinstance(value, np.ndarray) else host_copy(value)


def _bind_pasts(binding, pasts: dict[str, Any]) -> list[str]:
    """Bind each past (host arrays must stay alive until the run: ORT keeps only their address)."""
    for name, value in pasts.items():
        if isinstance(value, np.ndarray):
            assert value.flags.c_contiguous, name
            binding.bind_cpu_input(name, value)
        else:
            binding.bind_ortvalue_input(name, value)
    return []


class ConcatLayout:
    """:class:`~onnxsample.engine._layout.KVLayout` for graphs whose cache grows by concatenation.

    `specs` maps each past input to (heads, head_dim, numpy dtype); with `keep_prefix` a finished
    sequence's cache is kept (on the host) for its slot's next request.
    """

    def __init__(
        self, specs: dict[str, tuple], slots: int, device: str, keep_prefix: bool = True
    ) -> None:
        self.specs, self.slots, self.keep_prefix = specs, slots, keep_prefix
        self.batch = KVBatch(device)
        self.tokens: list[list[int]] = [[] for _ in range(slots)]
        self.partial: dict[int, dict[str, Any]] = {}  # slot -> cache of a prompt mid-prefill
        self.kept: dict[int, dict[str, Any]] = {}  # slot -> cache a finished request left
        self.presents = [_PRESENT + name[len(_PAST) :] for name in specs]

    def held(self, slot: int) -> list[int]:
        return self.tokens[slot]

    def reserve(self, slot: int, positions: int) -> None:
        pass  # ONNX Runtime allocates each step's presents

    def start(self, seq: Sequence, reused: int) -> None:
        slot = seq.slot
        kept = self.kept.pop(slot, None)
        del self.tokens[slot][reused:]
        self.partial.pop(slot, None)
        if reused and kept is not None:
            self.partial[slot] = {
                name: np.ascontiguousarray(v[:, :, :reused]) for name, v in kept.items()
            }
        seq.computed = reused if slot in self.partial else 0
        if not seq.computed:
            self.tokens[slot] = []

    def prefill(self, seq: Sequence, end: int) -> Call:
        start, slot = seq.computed, seq.slot
        pasts = self.partial.get(slot) or {
            name: np.zeros((1, heads, 0, dim), dtype)
            for name, (heads, dim, dtype) in self.specs.items()
        }
        rows = slot_rows(self.slots)
        sampling = []
        if end == len(seq.prompt):
            rows[slot] = end - start
            sampling = [seq]
        prompt_rows, targets = prompt_positions(seq, start, end)
        return Call(
            "prefill",
            np.asarray([seq.prompt[start:end]], np.int64),
            np.ones((1, end), np.int64),
            np.arange(start, end, dtype=np.int64)[None],
            rows,
            sampling,
            lambda binding: _bind_pasts(binding, pasts),
            presents=self.presents,
            prompt_rows=prompt_rows,
            prompt_targets=targets,
            prompt_seq=seq,
            end=end,
        )

    def decode(self, seqs: list[Sequence], drafts: dict[int, list[int]] | None = None) -> Call:
        if drafts:
            raise ModelError("speculative decoding needs a GroupQueryAttention graph")
        batch = self.batch
        assert {id(s) for s in seqs} == {id(s) for s in batch.rows}, "decode the whole batch"
        rows = slot_rows(self.slots)
        for b, seq in enumerate(batch.rows):
            rows[seq.slot] = 1 + b
        pasts = batch.pasts
        return Call(
            "decode",
            np.asarray([[seq.ids[-1]] for seq in batch.rows], np.int64),
            np.concatenate([batch.mask, np.ones((batch.size, 1), np.int64)], axis=1),
            batch.positions()[:, None],
            rows,
            list(batch.rows),
            lambda binding: _bind_pasts(binding, pasts),
            presents=self.presents,
        )

    def commit(self, call: Call, outputs: dict[str, Any]) -> None:
        presents = {name: outputs[_PRESENT + name[len(_PAST) :]] for name in self.specs}
        if call.kind == "decode":
            self.batch.advance(presents)
            for seq in call.sampling:  # before the new tokens are accepted: the fed ones are last
                self.tokens[seq.slot].append(seq.ids[-1])
            return
        seq = call.prompt_seq
        self.tokens[seq.slot] = list(seq.prompt[: call.end])
        if call.end < len(seq.prompt):
            self.partial[seq.slot] = presents
            return
        self.partial.pop(seq.slot, None)
        self.batch.join([seq], presents, np.ones((1, call.end), np.int64))

    def finish(self, seq: Sequence) -> None:
        slot = seq.slot
        if any(row is seq for row in self.batch.rows):
            own = self.batch.take(seq)
        else:
            partial = self.partial.pop(slot, None) or {}
            own = {name: _host(value) for name, value in partial.items()} or None
        if self.keep_prefix and own is not None:
            self.kept[slot] = own
        else:
            self.tokens[slot] = []

    def discard(self, slot: int) -> None:
        self.tokens[slot] = []
        self.kept.pop(slot, None)
        self.partial.pop(slot, None)
        for row in list(self.batch.rows):
            if row.slot == slot:
                self.batch.take(row)
