"""Text out of token ids as they arrive: incremental detokenisation and stop strings.

A byte-level BPE token can end in the middle of a UTF-8 character; decoding it alone gives U+FFFD.
:class:`Detokenizer` decodes a sliding window of ids and only releases text once it no longer ends in
a replacement character (the approach of transformers' TextStreamer and vLLM's detokenizer).
:class:`StopMatcher` holds back any tail that could still become a stop string, so a stop string is
never emitted, not even in part.
"""

from __future__ import annotations

__all__ = ["Detokenizer", "StopMatcher"]

_REPLACEMENT = "\ufffd"


class Detokenizer:
    """Feed token ids one at a time; get back the new text each one completes."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids before this are already released as text

    def add(self, token_id: int) -> str:
        self._ids.append(token_id)
        decode = self._tokenizer.decode
        before = decode(self._ids[self._prefix : self._read], skip_special_tokens=True)
        after = decode(self._ids[self._prefix :], skip_special_tokens=True)
        if len(after) > len(before) and not after.endswith(_REPLACEMENT):
            self._prefix, self._read = self._read, len(self._ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back at the end (an incomplete character stays as U+FFFD)."""
        decode = self._tokenizer.decode
        before = decode(self._ids[self._prefix : self._read], skip_special_tokens=True)
        after = decode(self._ids[self._prefix :], skip_special_tokens=True)
        self._prefix = self._read = len(self._ids)
        return after[len(before) :]


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
