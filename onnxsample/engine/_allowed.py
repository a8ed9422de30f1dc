"""The ``sampler.allowed`` input of each call: the tokens each constrained sequence may take.

A call whose sampling sequences have no constraint binds one column of trues (``[S, 1]``), which
the branching chain skips; otherwise every row is bound (``[S, V]``): a constrained sequence's row
is filled by its grammar matcher just before the call, every other row is all true. A static
chain (CUDA graphs) always binds ``[S, V]``, at one address.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from onnxsample.engine._sequence import Sequence

ALLOWED = "sampler.allowed"


class AllowedTokens:
    """One host buffer of masks for a graph with `slots` slots and `vocab` tokens."""

    def __init__(self, slots: int, vocab: int, *, static: bool) -> None:
        self.rows = np.ones((slots, vocab), bool)
        self.none = np.ones((slots, 1), bool)
        self.static = static
        self._filled: set[int] = set()

    def for_call(self, sampling: Iterable[Sequence]) -> np.ndarray:
        """The mask to bind for a call in which `sampling` sequences take a token."""
        for slot in self._filled:
            self.rows[slot] = True
        self._filled.clear()
        for seq in sampling:
            if seq.matcher is not None:
                seq.matcher.fill(self.rows[seq.slot])
                self._filled.add(seq.slot)
        return self.rows if self._filled or self.static else self.none
