"""Which slot each sequence runs in: :class:`Placement`.

A new sequence takes the free slot whose cache shares the longest prefix with its prompt (those
tokens are not computed again); without one, where decode steps run a fixed number of rows (CUDA
graphs: :meth:`~onnxsample.engine._slots.SlotState.rows`, the occupied slots rounded up to 1, 2,
4, 8…), the slot that keeps that number lowest; then the one whose cache is worth least.

Where steps run a fixed number of rows, running sequences also move down into free slots below
them whenever they would fit in a smaller bucket (their keys and values and sampler state copied
where they live, their tokens unchanged), so that long requests do not keep every step as wide
as the slots they started in.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from onnxsample.engine._layout import KVLayout, common_prefix
from onnxsample.engine._sequence import Sequence
from onnxsample.engine._slots import SlotState, bucket

log = logging.getLogger(__name__)

# A reused prefix leaves at least this many prompt tokens to compute: a one-token call takes other
# kernels than a longer one, and the keys and values it writes would differ in the last bits from
# those of the request's prefill without reuse.
_RECOMPUTE = 2


class Placement:
    """The free slots of `slots` and the choice among them (only the engine's thread calls it)."""

    def __init__(
        self, slots: int, layout: KVLayout, state: SlotState, *, prefix_reuse: bool
    ) -> None:
        self.layout, self.state, self.prefix_reuse = layout, state, prefix_reuse
        self.free = list(range(slots))
        # decode steps bind a fixed number of rows (a SharedLayout for CUDA graphs)
        self.fixed = bool(getattr(layout, "fixed", False))

    def pick(self, seq: Sequence) -> tuple[int, int]:
        """The free slot for `seq` and how many of its cached tokens the prompt reuses."""
        rows = self.state.rows if self.fixed else (lambda slot: 0)
        if not (self.prefix_reuse and seq.reuse_prefix) or seq.wants_prompt_logprobs:
            return min(self.free, key=lambda s: (rows(s), len(self.layout.held(s)), s)), 0
        room = max(len(seq.prompt) - _RECOMPUTE, 0)
        best = None
        for slot in self.free:
            held = self.layout.held(slot)
            reused = min(common_prefix(held, seq.prompt), room)
            key = (-reused, rows(slot), len(held) if reused == 0 else 0, slot)
            if best is None or key < best[0]:
                best = (key, slot, reused)
        assert best is not None
        return best[1], best[2]

    def take(self, seq: Sequence, slot: int) -> None:
        """`seq` runs in `slot` from now on."""
        seq.slot = slot
        self.free.remove(slot)

    def give(self, slot: int) -> None:
        """`slot`'s sequence left."""
        self.state.release(slot)
        self.free.append(slot)
        self.free.sort()

    def compact(self, running: Iterable[Sequence]) -> int:
        """Where steps bind a fixed number of rows in buckets: when the running sequences would fit
        in a smaller bucket, move those above it into the free slots below it; how many moved. A
        device copy that fails leaves its sequence where it was (and says so)."""
        running = list(running)
        if not self.fixed or not self.state.buckets or not running:
            return 0
        target = bucket(len(running), self.state.meta.max_slots)
        if target >= self.state.rows():
            return 0
        movers = sorted((s for s in running if s.slot >= target), key=lambda s: -s.slot)
        moved = 0
        # into the free rows holding the fewest cached tokens: a kept conversation stays
        lows = sorted((f for f in self.free if f < target), key=lambda f: len(self.layout.held(f)))
        for seq, low in zip(movers, lows, strict=False):
            try:  # the device copies first: if one fails, nothing else has changed
                self.layout.copy(seq.slot, low)
                self.state.copy(seq.slot, low)
            except RuntimeError as exc:
                log.warning("request %s stays in slot %d: %s", seq.request.id, seq.slot, exc)
                break
            self.layout.move(seq, low)
            self.state.move(seq.slot, low)
            self.free[self.free.index(low)] = seq.slot
            self.free.sort()
            seq.slot = low
            moved += 1
        return moved
