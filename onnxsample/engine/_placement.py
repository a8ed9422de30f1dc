"""Which slot each sequence runs in: :class:`Placement`.

A new sequence takes the free slot whose cache shares the longest prefix with its prompt (those
tokens are not computed again); without one, where decode steps run a fixed number of rows (CUDA
graphs: :meth:`~onnxsample.engine._slots.SlotState.rows`, the occupied slots rounded up to 1, 2,
4, 8…), the slot that keeps that number lowest; then the one whose cache is worth least.

Where steps run a fixed number of rows, a running sequence also moves down into a free slot below
it whenever that lowers the number (its keys and values and its sampler state copied where they
live, its tokens unchanged), so that a long request does not keep every step as wide as the
slot it started in.
"""

from __future__ import annotations

from collections.abc import Iterable

from onnxsample.engine._layout import KVLayout, common_prefix
from onnxsample.engine._sequence import Sequence
from onnxsample.engine._slots import SlotState, bucket

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
        if not self.prefix_reuse or seq.wants_prompt_logprobs:
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
        """Move the sequence in the highest occupied slot into the lowest free one while that
        lowers the rows a step binds (fixed rows only); how many moved."""
        running = list(running)
        moved = 0
        while self.fixed and running and self.free:
            top = max(running, key=lambda s: s.slot)
            low = self.free[0]
            rest = max([low, *(s.slot for s in running if s is not top)])
            if low > top.slot or bucket(rest + 1, self.state.meta.max_slots) >= self.state.rows():
                break
            self.layout.move(top, low)
            self.state.move(top.slot, low)
            self.free[0] = top.slot
            self.free.sort()
            top.slot = low
            moved += 1
        return moved
