"""Grammar matching over a tokenizer's vocabulary (llguidance): which tokens may come next.

:class:`GrammarVocabulary` gives llguidance each token as the bytes it stands for (from
:meth:`~onnxsample.text.tokenizer.Tokenizer.token_bytes`, so byte-level and byte-fallback
vocabularies read the same way, whatever the tokenizer's decoder says), the model's vocabulary
size and its end-of-sequence ids. :class:`Matcher` follows one sequence through one grammar.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable

import numpy as np

from onnxsample.errors import InvalidParameter
from onnxsample.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

__all__ = ["GrammarVocabulary", "Matcher"]

_SPECIAL = b"\xff"  # llguidance's mark of a special token's bytes
_COMPILED = 64  # grammars kept compiled per vocabulary (a service sends the same schema often)


class _Tokens:
    """What llguidance's ``TokenizerWrapper`` reads from a tokenizer."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos: int) -> None:
        special = tokenizer.special_ids
        known = tokenizer.vocab_size
        self.tokens = [
            (
                _SPECIAL + tokenizer.token_to_text(i).encode()
                if i in special
                else tokenizer.token_bytes(i)
            )
            if i < known
            else _SPECIAL + f"<unused {i}>".encode()
            for i in range(vocab_size)
        ]
        self.special_token_ids = sorted(special)
        self.eos_token_id, self.bos_token_id = eos, tokenizer.bos_token_id
        self._tokenizer = tokenizer

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode_fragment(text)  # its tokens' bytes are the text's


class GrammarVocabulary:
    """A model's vocabulary as llguidance sees it; built on first use (about 0.2 s for 49k
    tokens), shared by every request's matcher. `eos_ids` end a sequence; the grammar allows
    them where it is complete. The last grammars compiled are kept: a request with the same
    grammar (the `n` choices of one request, a service's one schema) gets a copy of its matcher."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_ids: Iterable[int]) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.eos_ids = sorted(eos_ids)
        self._ll = None
        self._lock = threading.Lock()
        self._compiled: OrderedDict[str, object] = OrderedDict()

    def _tokenizer(self):
        import llguidance

        with self._lock:
            if self._ll is None:
                primary = self.eos_ids[0] if self.eos_ids else self.tokenizer.eos_token_id
                wrapper = llguidance.TokenizerWrapper(
                    _Tokens(self.tokenizer, self.vocab_size, primary)
                )
                self._ll = llguidance.LLTokenizer(
                    wrapper, n_vocab=self.vocab_size, eos_token=self.eos_ids or None
                )
            return self._ll

    def matcher(self, grammar: str) -> Matcher:
        """A fresh matcher for `grammar` (llguidance's grammar text); InvalidParameter with
        llguidance's reason when it does not compile."""
        import llguidance

        tokenizer = self._tokenizer()
        with self._lock:
            if grammar in self._compiled:
                self._compiled.move_to_end(grammar)
                return Matcher(self._compiled[grammar].deep_copy(), self.vocab_size, self.eos_ids)
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if failed:
            raise InvalidParameter(f"invalid constraint: {'; '.join(messages)}")
        for message in messages:
            log.info("constraint: %s", message)
        try:
            inner = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        except ValueError as exc:
            raise InvalidParameter(f"invalid constraint: {exc}") from None
        if inner.is_error():
            raise InvalidParameter(f"invalid constraint: {inner.get_error()}")
        with self._lock:
            self._compiled[grammar] = inner.deep_copy()
            while len(self._compiled) > _COMPILED:
                self._compiled.popitem(last=False)
        return Matcher(inner, self.vocab_size, self.eos_ids)


class Matcher:
    """One sequence's place in its grammar."""

    def __init__(self, inner, vocab_size: int, eos_ids: list[int]) -> None:
        self._inner, self.vocab_size, self._eos = inner, vocab_size, eos_ids
        self._words = np.zeros((vocab_size + 31) // 32, np.int32)

    def fill(self, row: np.ndarray) -> None:
        """Write the tokens allowed next into `row` (bool [V]). Where the grammar allows nothing
        more (it is complete, or the matcher failed), only end-of-sequence is allowed."""
        if self._inner.is_stopped() or self._inner.is_error():
            row[:] = False
            row[self._eos] = True
            return
        self._inner.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")
        row[:] = bits[: self.vocab_size].view(bool)
        if not row.any():
            row[self._eos] = True

    def consume(self, token: int) -> bool:
        """Advance past `token`; False when the grammar does not allow it (then the matcher is
        in error and allows only end-of-sequence)."""
        if self._inner.is_stopped():
            return token in self._eos
        ok = self._inner.consume_token(int(token))
        if not ok:  # once: the matcher stops here and allows only end-of-sequence from now on
            log.warning("the grammar refused token %d; only end-of-sequence may follow", token)
            log.debug("llguidance: %s", self._inner.get_error())
        return ok

    def fill_along(self, draft: list[int], rows: np.ndarray) -> None:
        """Write into ``rows[i]`` the tokens allowed after ``draft[: i + 1]`` (the masks of a
        draft's positions 1..k), leaving the matcher where it was."""
        taken = 0
        for i, token in enumerate(draft):
            if token in self._eos or not self._inner.consume_token(int(token)):
                break
            taken += 1
            self.fill(rows[i])
        if taken and not self._inner.rollback(taken):
            raise RuntimeError(f"the grammar matcher could not step back {taken} tokens")

    def valid_prefix(self, tokens: list[int]) -> list[int]:
        """The longest prefix of `tokens` the grammar allows from here, cut before its first
        rejected token and its first end-of-sequence (a draft ends where the text may end)."""
        for i, token in enumerate(tokens):
            if token in self._eos:
                tokens = tokens[:i]
                break
        return list(tokens[: self._inner.validate_tokens([int(t) for t in tokens])])

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens that the grammar forces from here (the only way it can go on)."""
        if limit <= 0 or self._inner.is_stopped():
            return []
        return list(self._inner.compute_ff_tokens()[:limit])

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing but end-of-sequence."""
        return self._inner.is_stopped()
