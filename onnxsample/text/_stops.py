"""Stop strings in streamed text: :class:`StopMatcher` holds back any tail that could still become a
stop string, so a stop string is never emitted, not even in part. (Turning ids into text as they
arrive is :class:`onnxsample.text.TextStream`.)"""

from __future__ import annotations

__all__ = ["StopMatcher"]


class StopMatcher:
    """Accumulates text; releases what cannot be part of a stop string and reports a match."""

    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._longest = max((len(s) for s in self._stops), default=0)
        self.text = ""
        self._released = 0
        self.stopped = False

    def add(self, piece: str) -> str:
        """Append `piece`; return the text now safe to show. After a match, `stopped` is True."""
        if self.stopped:
            return ""
        start = max(0, len(self.text) - self._longest + 1)
        self.text += piece
        hits = [i for i in (self.text.find(s, start) for s in self._stops) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True
            return self._release(len(self.text))
        return self._release(len(self.text) - self._held_tail())

    def flush(self) -> str:
        return self._release(len(self.text))

    def _held_tail(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of some stop string."""
        for n in range(min(self._longest - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0

    def _release(self, end: int) -> str:
        end = max(end, self._released)
        piece = self.text[self._released : end]
        self._released = end
        return piece
