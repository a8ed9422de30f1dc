"""Draft tokens for speculative decoding, from the sequence itself: n-gram prompt lookup.

For each decoding sequence, the last n tokens of prompt + output are looked up earlier in the same
history (n from ``ngram`` down to 1, the most recent match of the longest n wins) and the tokens
that followed that occurrence are the draft. This is vLLM's ``ngram`` speculator and llama.cpp's
prompt lookup: free to compute, and right often wherever the answer repeats the context (editing
code, quoting a document, rewriting text).

Decoding alone, a sequence drafts every step: its n-gram draft, else its last token again (a free
guess), since a second position costs a one-row step only 3-9% (``benchmarks/positions.py``) and
every call then has several positions, so decode, verification, echo and chunked prefill take the
same kernels. With other sequences decoding (an exact-attention export only: on
GroupQueryAttention a sequence drafts only alone, see the scheduler), the drafts of all sequences
are verified in one call, whose extra positions a sequence's draft must pay for by keeping at least
``BATCHED_NEED`` tokens; a sequence whose drafts keep failing then stops drafting for a while (1, 2,
4, ... 16 steps), and its steps cost what plain decoding costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from onnxsample.errors import InvalidParameter
from onnxsample.metadata import ComposedMetadata

if TYPE_CHECKING:
    from onnxsample.engine._sequence import Sequence

SPECULATIVE_METHODS = ("ngram",)
DEFAULT_NGRAM = 3
# 8 beat 4 at batch 8 (4 lost up to 12%) and matched it at batch 1: docs/benchmarks.md
DEFAULT_DRAFT_TOKENS = 8
BATCHED_NEED = 2
_MAX_BACKOFF = 16


@dataclass
class DraftStats:
    """One sequence's drafting record: tokens drafted and accepted, its back-off, and how long
    its next draft may be."""

    drafted: int = 0
    accepted: int = 0
    misses: int = 0  # consecutive verification steps that kept nothing
    skip: int = 0  # steps left without drafting
    length: int = 0  # the next draft's cap (0: the drafter's draft_tokens)


class NgramDrafter:
    """Proposes up to `draft_tokens` tokens by n-gram lookup (n = `ngram` .. 1)."""

    def __init__(self, draft_tokens: int, ngram: int = DEFAULT_NGRAM) -> None:
        for name, value in (("draft_tokens", draft_tokens), ("ngram", ngram)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidParameter(f"{name} must be an integer >= 1, got {value!r}")
        self.draft_tokens, self.ngram = draft_tokens, ngram
        self.batched = False  # other sequences decode in the same step

    def draft(self, stats: DraftStats, history: np.ndarray, limit: int) -> list[int]:
        """A sequence's draft this step, at most `limit` tokens. Decoding alone, a sequence always
        drafts (its n-gram draft, else its last token again: a free guess) and never backs off:
        a second position costs a step little (3-9%, benchmarks/positions.py), and every call is
        then one of several positions, whose kernels verification, echo and prefill share.
        Batched, none while it backs off."""
        if self.batched and not self.allowed(stats):
            return []
        found = self.propose(history, min(limit, stats.length or self.draft_tokens))
        if not found and not self.batched and limit >= 1 and len(history):
            found = [int(history[-1])]
        return found

    def propose(self, history: np.ndarray, limit: int) -> list[int]:
        """Up to min(`limit`, draft_tokens) tokens to follow `history` (int64 [L]); [] when no
        suffix of it occurred before."""
        k = min(limit, self.draft_tokens)
        size = len(history)
        if k < 1 or size < 2:
            return []
        for n in range(min(self.ngram, size - 1), 0, -1):
            # Windows over history[:-1], so the suffix itself (starting at size - n) is never one.
            windows = np.lib.stride_tricks.sliding_window_view(history[:-1], n)
            found = np.flatnonzero((windows == history[-n:]).all(axis=1))
            if found.size:
                start = int(found[-1]) + n
                return history[start : start + k].tolist()
        return []

    @staticmethod
    def allowed(stats: DraftStats) -> bool:
        """Whether the sequence drafts this step (counts down its back-off)."""
        if stats.skip > 0:
            stats.skip -= 1
            return False
        return True

    def record(self, stats: DraftStats, drafted: int, accepted: int) -> None:
        """After a verification: the next draft may be one longer than this one when all of it
        was kept, else one longer than what was kept; a miss (nothing kept; fewer than
        ``BATCHED_NEED`` when batched) backs off 1, 2, 4, ... steps (at most 16), anything better
        resets the back-off."""
        stats.drafted += drafted
        stats.accepted += accepted
        stats.length = min(self.draft_tokens, accepted + 1)
        if accepted >= (BATCHED_NEED if self.batched else 1):
            stats.misses = 0
            return
        stats.misses += 1
        stats.skip = min(2 ** (stats.misses - 1), _MAX_BACKOFF)


def draft_for(drafter: NgramDrafter, seq: Sequence) -> list[int]:
    """`seq`'s draft this step: up to its token limit, never past its context; a constrained
    sequence drafts the tokens its grammar forces, else its n-gram draft cut at the first token
    the grammar rejects."""
    room = seq.max_new_tokens - len(seq.ids)
    context = seq.limit - len(seq.prompt) - len(seq.ids) if seq.limit else room
    # Alone, the last token's step carries a guess too (kept or not, the request ends there), so
    # that no call of the sequence computes one position; never past the context, and the layout
    # trims a draft its buffer has no room for.
    ahead = max(room - 1, 1) if not drafter.batched else room - 1
    ahead = min(ahead, context - 1)
    if seq.matcher is None:
        return drafter.draft(seq.draft, seq.history(), ahead)
    width = min(ahead, drafter.draft_tokens)
    return seq.matcher.forced(width) or seq.matcher.valid_prefix(
        drafter.draft(seq.draft, seq.history(), ahead)
    )


def check_method(method: str | None) -> None:
    """Raise :class:`InvalidParameter` unless `method` is a speculative method or None (off)."""
    if method is not None and method not in SPECULATIVE_METHODS:
        raise InvalidParameter(
            f"speculative must be {' or '.join(map(repr, SPECULATIVE_METHODS))} (None: off), "
            f"got {method!r}"
        )


def speculation(
    meta: ComposedMetadata, method: str | None, draft_tokens: int | None, ngram: int
) -> tuple[str | None, int]:
    """The speculative method and draft length an engine on a model described by `meta` uses:
    `draft_tokens` (default ``DEFAULT_DRAFT_TOKENS``) checked against what the graph verifies,
    and `ngram` checked too; either given without a method is refused (it would change
    nothing)."""
    check_method(method)
    if method is None:
        if draft_tokens is not None or ngram != DEFAULT_NGRAM:
            given = "draft_tokens" if draft_tokens is not None else "ngram"
            raise InvalidParameter(f"{given} needs speculative='ngram' (speculation is off)")
        return None, 0
    if meta.kv_layout != "gqa":
        raise InvalidParameter(
            "speculative decoding needs a GroupQueryAttention export "
            "(onnxsample export --layout gqa); this model grows its cache by concatenation"
        )
    if not meta.draft_tokens:
        raise InvalidParameter(
            "speculative decoding needs a model composed with draft tokens "
            "(onnxsample compose --draft-tokens K)"
        )
    k = min(DEFAULT_DRAFT_TOKENS, meta.draft_tokens) if draft_tokens is None else draft_tokens
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= meta.draft_tokens:
        raise InvalidParameter(
            f"draft_tokens must be in [1, {meta.draft_tokens}] (the model's), got {draft_tokens!r}"
        )
    NgramDrafter(k, ngram)
    return method, k
