"""The running batch: which sequence sits in which batch row, its KV cache, mask and positions.

The KV cache stays in device OrtValues from step to step (IOBinding feeds each step's ``present.*``
back as the next ``past_key_values.*``). It is touched on the host only when the batch changes shape:
when newly admitted sequences join (their prefill cache is left-padded to a common length and
appended) and when finished ones leave (their rows are dropped, and columns that every remaining row
masks out are trimmed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


def _ortvalue(array: np.ndarray, device: str):
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), device, 0)


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
            merged[name] = _ortvalue(
                np.concatenate([_left_pad(old, length), _left_pad(new, length)]), self.device
            )
        self.pasts = merged
        self.mask = np.concatenate(
            [_left_pad(self.mask, length, axis=1), _left_pad(mask, length, axis=1)]
        )
        self.rows += rows

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
            name: _ortvalue(value.numpy()[keep][:, :, start:], self.device)
            for name, value in self.pasts.items()
        }


def _left_pad(array: np.ndarray, length: int, axis: int = 2) -> np.ndarray:
    missing = length - array.shape[axis]
    if missing <= 0:
        return array
    widths = [(0, 0)] * array.ndim
    widths[axis] = (missing, 0)
    return np.pad(array, widths)
