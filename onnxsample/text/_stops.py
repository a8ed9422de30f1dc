"""Stop strings in streamed text: :class:`StopMatcher` holds back any tail that could still become a
stop string, so a stop string is never emitted, not even in part; and llama-server's indentation
rule for code completion (``n_indent``). (Turning ids into text as they arrive is
:class:`onnxsample.text.TextStream`.)"""

from __future__ import annotations

__all__ = ["StopMatcher"]


class StopMatcher:
    """Accumulates text; releases what cannot be part of a stop string and reports a match."""

    def __init__(self, stops: list[str], indent: int = 0) -> None:
        """`indent` > 0: llama-server's ``n_indent``: once the text has a new line, a line that
        starts with fewer spaces or tabs than that ends the text before its first other
        character (``indented`` is then True)."""
        self._stops = [s for s in stops if s]
        self._longest = max((len(s) for s in self._stops), default=0)
        self.text = ""
        self._released = 0
        self.stopped = False
        self.indented = False
        self.indent, self._new_line, self._line = indent, False, 0

    def add(self, piece: str, *, stops: bool = True) -> str:
        """Append `piece`; return the text now safe to show. After a match, `stopped` is True.
        A match must end in `piece`. With `stops` off (vLLM's ``min_tokens`` not reached yet) none
        is looked for, but the tail that could begin one is still held back: as in vLLM, a stop
        string may begin in those tokens' text and end in a later piece."""
        if self.stopped:
            return ""
        end = len(self.text)
        self.text += piece
        searched = self._stops if stops else []
        found = (self.text.find(s, max(self._released, end - len(s) + 1)) for s in searched)
        hits = [i for i in found if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True
            return self._release(len(self.text))
        if self._under_indented():
            self.stopped = self.indented = True
            return self._release(len(self.text))
        released = self._release(len(self.text) - self._held_tail())
        self._new_line = self._new_line or "\n" in released
        return released

    def _under_indented(self) -> bool:
        """llama-server's ``n_indent`` check, step for step (``process_token``): after a piece
        that let a new line out, each piece looks at the line after the last new line it found
        (none at first: the check starts a piece later) and cuts the text before that line's
        first character that is not a space or tab when fewer came before it; then it moves to
        the next new line."""
        if not (self.indent > 0 and self._new_line):
            return False
        if self._line > 0:
            pos = self._line
            while pos < len(self.text) and self.text[pos] in " \t":
                pos += 1
            if pos < len(self.text) and pos - self._line < self.indent:
                self.text = self.text[:pos]
                return True
        found = self.text.find("\n", self._line)
        if found >= 0:
            self._line = found + 1
        return False

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
