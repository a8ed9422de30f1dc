"""How a KV-cache layout turns the scheduler's work into ONNX Runtime calls: :class:`KVLayout`.

Two layouts implement it: :class:`~onnxsample.engine._kv_shared.SharedLayout` (GroupQueryAttention graphs:
one preallocated buffer per layer, row = slot, written in place) and
:class:`~onnxsample.engine._kv_concat.ConcatLayout` (optimum's graphs: explicit positions, a cache that
grows by concatenation). Both keep, per slot, the token ids whose keys and values they hold, so a new
request can reuse the longest common prefix (llama-server's ``cache_prompt``).

A :class:`Call` is one session run: host inputs, how to bind the cache, which sequences sample a
token in it (and so draw a uniform), and which prompt positions report logprobs (echo).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from onnxsample.engine._sequence import Sequence

_EMPTY = np.zeros(0, np.int64)


@dataclass
class Call:
    """One ORT call.

    ``bind_kv(binding)`` binds the past inputs (and, for a shared buffer, the present outputs) and
    returns the names of the outputs it bound; ``presents`` are the present outputs the layout wants
    back as device OrtValues. ``row_index`` is ``sampler.row_index`` [S]; ``sampling`` the sequences
    that draw a token here, in any order. ``reuse`` keys a binding that can serve the next call too.
    """

    kind: str  # "prefill" or "decode"
    input_ids: np.ndarray
    mask: np.ndarray
    positions: np.ndarray | None
    row_index: np.ndarray
    sampling: list[Sequence]
    bind_kv: Callable[[Any], list[str]]
    presents: list[str] = field(default_factory=list)
    prompt_rows: np.ndarray = field(default_factory=lambda: _EMPTY)
    prompt_targets: np.ndarray = field(default_factory=lambda: _EMPTY)
    prompt_seq: Sequence | None = None
    reuse: tuple | None = None
    end: int = 0  # prefill: the prompt position this call reaches
    # decode: the drafts fed after each drafting slot's last token, and (after the run) how many
    # of them each slot kept
    drafts: dict[int, list[int]] = field(default_factory=dict)
    accepted: dict[int, int] = field(default_factory=dict)


class KVLayout(Protocol):
    """What the scheduler needs of a cache layout. Only the engine's thread calls it."""

    def held(self, slot: int) -> list[int]:
        """The token ids whose keys and values the slot holds (a finished request's, for reuse)."""
        ...

    def reserve(self, slot: int, positions: int) -> None:
        """Make room for `positions` tokens in `slot`; raise OutOfMemory when that cannot be had."""
        ...

    def start(self, seq: Sequence, reused: int) -> None:
        """`seq` takes `seq.slot`, keeping the first `reused` tokens the slot holds."""
        ...

    def prefill(self, seq: Sequence, end: int) -> Call:
        """The call that computes prompt tokens [seq.computed, end) of `seq`."""
        ...

    def decode(self, seqs: list[Sequence], drafts: dict[int, list[int]] | None = None) -> Call:
        """The call that feeds every decoding sequence its last token, and a drafting slot its
        draft after it (trimmed to what the cache has room for)."""
        ...

    def commit(self, call: Call, presents: dict[str, Any]) -> None:
        """After `call` ran: record what the cache now holds."""
        ...

    def finish(self, seq: Sequence) -> None:
        """`seq` left its slot; keep what it leaves in the cache for reuse."""
        ...

    def discard(self, slot: int) -> None:
        """Forget whatever `slot` holds (its request failed mid-way)."""
        ...


def slot_rows(slots: int) -> np.ndarray:
    """A ``sampler.row_index`` with every slot inactive."""
    return np.zeros(slots, np.int64)


def prompt_positions(seq: Sequence, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """For a call that computes prompt positions [start, end) as rows 1 + (i − start): the rows
    whose logits give the logprob of the next prompt token, and those tokens (empty unless `seq`
    asked for prompt logprobs)."""
    if not seq.wants_prompt_logprobs:
        return _EMPTY, _EMPTY
    last = min(end, len(seq.prompt) - 1)
    positions = np.arange(start, last, dtype=np.int64)
    targets = np.asarray(seq.prompt[start + 1 : last + 1], dtype=np.int64)
    return 1 + positions - start, targets


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x, y = np.asarray(a[:n]), np.asarray(b[:n])
    differ = np.flatnonzero(x != y)
    return int(differ[0]) if differ.size else n
