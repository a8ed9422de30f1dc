"""The ``sampler.allowed`` inputs of each call: the tokens each constrained sequence may take.

A call whose sampling sequences have no constraint binds one column of trues (``[S, 1]``), which
the branching chain skips; otherwise every row is bound (``[S, V]``): a constrained sequence's row
is filled by its grammar matcher just before the call, every other row is all true. A static
chain (CUDA graphs) always binds ``[S, V]``. The masks live on the device, each at one address,
and only the rows that changed are written, in place: a step without constrained sequences copies
nothing, one with them the rows that changed (a run of consecutive slots in one copy; a
constrained sequence's own row when it decodes alone), and the per-position masks only when a
constrained sequence drafts.

A graph that verifies drafts also takes ``sampler.draft_allowed`` ``[S, K, V]``: a constrained
drafting sequence's mask at each draft position, as its grammar stands after the drafts before it
(the matcher walks the draft and steps back).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from onnxsample.engine._row_copy import RowCopy, runs
from onnxsample.engine._sequence import Sequence
from onnxsample.engine._slots import ortvalue

ALLOWED, DRAFT_ALLOWED = "sampler.allowed", "sampler.draft_allowed"


class AllowedTokens:
    """Masks for a graph with `slots` slots and `vocab` tokens on `device` and, where it takes
    per-position masks, `draft_width` draft positions per slot; their changed rows are written
    through `copy` (the engine's :class:`RowCopy` on that device)."""

    def __init__(
        self,
        slots: int,
        vocab: int,
        device: str,
        copy: RowCopy,
        *,
        static: bool,
        draft_width: int = 0,
    ) -> None:
        self.static, self.draft_width = static, draft_width
        self.rows = np.ones((slots, vocab), bool)
        self.rows_value = ortvalue(self.rows, device)
        self._none = ortvalue(np.ones((slots, 1), bool), device)
        self.draft_rows = np.ones((slots, draft_width, vocab), bool) if draft_width else None
        self._draft_value = ortvalue(self.draft_rows, device) if draft_width else None
        self._draft_true = (
            ortvalue(np.ones((slots, draft_width, vocab), bool), device) if draft_width else None
        )
        self._draft_none = ortvalue(np.ones((slots, draft_width, 1), bool), device)
        self._filled: set[int] = set()
        self._drafted: set[int] = set()
        self._draft_stale: set[int] = set()  # rows reset on the host, not yet on the device
        self._copy = copy

    def for_call(
        self, sampling: Iterable[Sequence], drafts: Mapping[int, list[int]]
    ) -> tuple[Any, Any | None]:
        """The masks (device OrtValues) to bind for a call in which `sampling` sequences take a
        token (and verify their `drafts`, by slot): ``sampler.allowed``, and
        ``sampler.draft_allowed`` where the graph takes it."""
        changed = set(self._filled)
        self._draft_stale |= self._drafted  # reset below, written with the next drafts
        for slot in self._filled:
            self.rows[slot] = True
        for slot in self._drafted:
            self.draft_rows[slot] = True
        self._filled.clear()
        self._drafted.clear()
        for seq in sampling:
            if seq.matcher is None:
                continue
            seq.matcher.fill(self.rows[seq.slot])
            self._filled.add(seq.slot)
            draft = drafts.get(seq.slot)
            if draft:
                seq.matcher.fill_along(draft, self.draft_rows[seq.slot])
                self._drafted.add(seq.slot)
        constrained = bool(self._filled)
        self._write(self.rows_value, self.rows, changed | self._filled)
        if self._drafted:
            self._write(self._draft_value, self.draft_rows, self._draft_stale | self._drafted)
            self._draft_stale = set()
        allowed = self.rows_value if constrained or self.static else self._none
        if not self.draft_width:
            return allowed, None
        if not constrained:
            return allowed, self._draft_none
        return allowed, self._draft_value if self._drafted else self._draft_true

    def _write(self, value, rows: np.ndarray, slots: set[int]) -> None:
        """Rows `slots` of the host's `rows` into the device's `value`: one copy per run of
        consecutive slots, none when no row changed."""
        for lo, hi in runs(slots):
            self._copy.from_host(value, lo, rows[lo:hi])
