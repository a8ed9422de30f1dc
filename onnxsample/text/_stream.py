"""One sequence's text as its ids arrive (:class:`TextStream`), never half a character, with
transformers' decoding clean-up applied as :meth:`Tokenizer.decode` applies it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from onnxsample.errors import InvalidParameter, first_line
from onnxsample.text._clean_up import PATTERNS, clean_up
from onnxsample.text.tokenizer import Tokenizer

__all__ = ["TextStream"]

log = logging.getLogger(__name__)

_CONTEXT = 6  # ids a stream keeps before its pending ones: a prefix space, a 4-byte character


class TextStream:
    """One sequence's text as its ids arrive. :meth:`add` returns what each id completes and
    :meth:`flush` what is left: together ``decode(ids)``, read after `prompt_ids` when given (the
    context of a leading space). Text never ends inside a UTF-8 character: such ids wait for the
    rest. It runs on ``tokenizers``' DecodeStream, which lacks clean-up and a flush and gives up on
    some invalid UTF-8 (windows of decode take over then). One per sequence: not for sharing."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        skip_special_tokens: bool = True,
        prompt_ids: Sequence[int] = (),
    ) -> None:
        self._tok, self._skip = tokenizer, skip_special_tokens
        self._context = [int(i) for i in prompt_ids][-_CONTEXT:]  # ids whose text is out
        self._pending: list[int] = []  # ids whose text is not out yet
        self._held = ""  # text out of the decoder that clean-up may still change
        self._stream = _decode_stream(self._context, skip_special_tokens)

    @property
    def holding(self) -> int:
        """Characters decoded and not yet returned (held for clean-up): the next id's text
        begins after them."""
        return len(self._held)

    def add(self, token_id: int) -> str:
        """Take the next id; return the text now complete (often "")."""
        if (token_id := int(token_id)) < 0:
            raise InvalidParameter(f"token ids must be non-negative, got {token_id}")
        self._pending.append(token_id)
        piece = None
        if self._stream is not None:
            try:
                piece = self._stream.step(self._tok._backend, token_id)
            except Exception as exc:  # "Invalid prefix encountered" (huggingface/tokenizers#1705)
                log.debug("DecodeStream gave up (%s); decoding windows from here", first_line(exc))
                self._stream = None
        if self._stream is None:
            piece = self._window(final=False)
        if piece is not None:
            self._context, self._pending = (self._context + self._pending)[-_CONTEXT:], []
        return self._cleaned(piece or "", final=False)

    def flush(self) -> str:
        """The text held back (an unfinished character as U+FFFD, as decode gives it)."""
        piece = self._window(final=True) or ""
        self._context, self._pending = (self._context + self._pending)[-_CONTEXT:], []
        if self._stream is not None:
            self._stream = _decode_stream(self._context, self._skip)
        return self._cleaned(piece, final=True)

    def _window(self, *, final: bool) -> str | None:
        """The pending ids' text: decoded after the context, less the context's own text."""
        decode = self._tok._backend.decode
        before = decode(self._context, skip_special_tokens=self._skip)
        after = decode(self._context + self._pending, skip_special_tokens=self._skip)
        if final or (len(after) > len(before) and not after.endswith("\ufffd")):
            return after[len(before) :]
        return None

    def _cleaned(self, piece: str, *, final: bool) -> str:
        """Clean-up as decode's. Patterns start with a space and are at most 4 long: only a tail
        that what follows could complete into one (a space and at most 2 more characters that
        begin a pattern: " ", " n", " '", ...) waits; the rest cleans up now as it would later."""
        if not self._tok._clean_up:
            return piece
        self._held += piece
        cut = len(self._held)
        if not final:
            for start in range(max(0, cut - 3), cut):
                tail = self._held[start:]
                if tail[0] == " " and any(
                    len(p) > len(tail) and p.startswith(tail) for p, _ in PATTERNS
                ):
                    cut = start
                    break
        out, self._held = self._held[:cut], self._held[cut:]
        return clean_up(out)


def _decode_stream(ids: list[int], skip_special_tokens: bool) -> Any:
    """tokenizers' DecodeStream primed with `ids`; None before tokenizers 0.22 (no priming)."""
    try:
        from tokenizers.decoders import DecodeStream

        return DecodeStream(ids=ids, skip_special_tokens=skip_special_tokens)
    except (ImportError, TypeError):
        return None
