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
from collections.abc import Callable, Iterable

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
                inner = self._compiled[grammar].deep_copy()
                return Matcher(inner, self.vocab_size, self.eos_ids, lambda: self._forget(grammar))
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
        return Matcher(inner, self.vocab_size, self.eos_ids, lambda: self._forget(grammar))

    def _forget(self, grammar: str) -> None:
        """Compile `grammar` afresh next time: llguidance failed on it, and its copies share the
        lexer that gave up (a copy would allow no token and never say why)."""
        with self._lock:
            self._compiled.pop(grammar, None)


class Matcher:
    """One sequence's place in its grammar. ``failure`` says why the grammar cannot go on, once it
    cannot: llguidance failed (a regex past its limits), refused a token, or allows no token where
    the text does not complete it (a grammar whose language is empty, ``root ::= root``). The
    sequence then fails: an end-of-sequence there would end a text that does not match."""

    def __init__(
        self, inner, vocab_size: int, eos_ids: list[int], forget: Callable[[], None] = lambda: None
    ) -> None:
        self._inner, self.vocab_size, self._eos, self._forget = inner, vocab_size, eos_ids, forget
        self._words = np.zeros((vocab_size + 31) // 32, np.int32)
        self.failure: str | None = None

    def fill(self, row: np.ndarray) -> None:
        """Write the tokens allowed next into `row` (bool [V]). Where the grammar allows nothing
        more, only end-of-sequence is allowed: it is complete, or it failed (``failure``)."""
        inner = self._inner
        if inner.is_error():  # llguidance's error state is a stopped one too: this first
            self._fail(self._llguidance_error())
        elif not inner.is_stopped():
            inner.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
            bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")
            row[:] = bits[: self.vocab_size].view(bool)
            if not inner.is_accepting():  # llguidance's end where nothing else may come
                row[self._eos] = False
            if row.any():
                return
            self._fail("the grammar allows no token here, and the text does not complete it")
        row[:] = False
        row[self._eos] = True

    def consume(self, token: int) -> bool:
        """Advance past `token`; False when the grammar does not allow it (``failure`` says why)."""
        if self._inner.is_error():
            self._fail(self._llguidance_error())
            return False
        if self._inner.is_stopped():
            return token in self._eos
        ok = self._inner.consume_token(int(token))
        if not ok:
            refused = f"the grammar refused token {token}"
            self._fail(self._llguidance_error() if self._inner.is_error() else refused)
        return ok

    def check_token(self, token: int) -> None:
        """`token` comes next: a failure unless the grammar allows it (nothing is consumed)."""
        inner = self._inner
        if inner.is_error():
            self._fail(self._llguidance_error())
        elif inner.is_stopped():
            if token not in self._eos:
                self._fail(f"the grammar is complete and refused token {token}")
        elif inner.validate_tokens([int(token)]) != 1:
            self._fail(f"the grammar refused token {token}")

    def check_end(self) -> None:
        """An end-of-sequence comes: a failure unless the text completes the grammar."""
        inner = self._inner
        if inner.is_error():
            self._fail(self._llguidance_error())
        elif not inner.is_stopped() and not inner.is_accepting():
            self._fail("the text ends where it does not complete the grammar")

    def _llguidance_error(self) -> str:
        """llguidance's reason, its first line (the rest is its state); its grammar is compiled
        afresh for the next request."""
        self._forget()
        return f"llguidance failed: {self._inner.get_error().strip().splitlines()[0]}"

    def _fail(self, why: str) -> None:
        if self.failure is None:
            self.failure = why
            log.info("constraint failed: %s", why)

    def fill_along(self, draft: list[int], rows: np.ndarray) -> None:
        """Write into ``rows[i]`` the tokens allowed after ``draft[: i + 1]`` (the masks of a
        draft's positions 1..k), on a copy of the matcher: a draft's dead end or llguidance's
        failure along it is not the sequence's (its rows allow only end-of-sequence there, which
        the sequence refuses when it comes: :meth:`check_end`)."""
        along = Matcher(self._inner.deep_copy(), self.vocab_size, self._eos)
        for i, token in enumerate(draft):
            if token in self._eos or not along.consume(token):
                break
            along.fill(rows[i])

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
    def complete(self) -> bool:
        """The tokens so far make a whole match: the text may end here."""
        inner = self._inner
        return not inner.is_error() and (inner.is_stopped() or inner.is_accepting())

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing but end-of-sequence."""
        return self._inner.is_stopped()
