"""llama.cpp's ``infill`` sampler, which editors list last in ``samplers`` for code completion, as a
host sampler (:attr:`~onnxsample.SamplingParams.host_sampler`) over the graph's candidates.

``llama_sampler_infill_apply``, step for step, on the candidates the chain kept (most likely
first, their logits at the draw's temperature), in float32 as llama.cpp computes:

1. p = softmax of the kept logits. When 3 · p(end-of-generation tokens) · n > p(text tokens), only
   the end-of-generation tokens stay.
2. Otherwise a token whose text is a prefix of another's takes that one's probability (the more
   likely of the two takes the other's; pairs in order, most likely first), then the text tokens
   under 0.2 go. If none is left, the answer is the end-of-turn token (else end-of-sequence);
   otherwise the probabilities are normalised and the text tokens under 1 / (n + 1) go, n the text
   tokens left.

Then llama.cpp's ``dist`` draws from what is left, by the kept tokens' own logits (the merged
probabilities only decide what is kept), with the request's seed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np

__all__ = ["InfillSampler"]


class InfillSampler:
    """One request's infill sampler: `piece` a token's text as bytes (empty for a control token,
    as llama.cpp's ``token_to_piece`` without special tokens), `eog` the end-of-generation ids,
    `end` the token taken when no text token is left, `seed` the draw's generator."""

    def __init__(
        self, piece: Callable[[int], bytes], eog: Collection[int], end: int, seed: int
    ) -> None:
        self.piece, self.eog, self.end = piece, frozenset(eog), end
        self.rng = np.random.Generator(np.random.Philox(seed))

    def kept(self, ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ids and logits the sampler keeps of the candidates (``ids`` int64 [K], ``logits``
        float32 [K], most likely first, −inf where the chain dropped one)."""
        finite = np.isfinite(logits)
        ids, logits = ids[finite], logits[finite].astype(np.float32)
        p = np.exp(logits - logits[0]).astype(np.float32)
        p /= np.float32(sum(p, np.float32(0)))  # llama.cpp sums in order, in float32
        eog = np.array([int(t) in self.eog for t in ids], dtype=bool)
        p_eog, p_txt = np.float32(0), np.float32(0)
        for value, end in zip(p, eog, strict=True):
            if end:
                p_eog += value
            else:
                p_txt += value
        if np.float32(3) * p_eog * np.float32(len(p)) > p_txt:
            return ids[eog], logits[eog]
        alive = self._merge(ids, p)
        keep = (p >= np.float32(0.2)) | eog
        texts = int(np.count_nonzero(keep & ~eog))
        if texts == 0:
            return np.array([self.end], np.int64), np.array([1.0], np.float32)
        p = p / np.float32(sum(p[keep], np.float32(0)))
        keep &= (p >= np.float32(1.0 / (texts + 1))) | eog
        keep &= alive  # a merged-away end token stays in llama.cpp's list at -inf: never drawn
        return ids[keep], logits[keep]

    def _merge(self, ids: np.ndarray, p: np.ndarray) -> np.ndarray:
        """Tokens that are a prefix of another pool their probabilities (in place in `p`); the
        tokens still standing."""
        pieces = [self.piece(int(t)) for t in ids]
        alive = np.ones(len(ids), dtype=bool)
        for i in range(len(ids)):
            for j in range(len(ids)):
                if not alive[i]:
                    break
                if i == j or not alive[j]:
                    continue
                a, b = pieces[i], pieces[j]
                if a and len(a) <= len(b) and b.startswith(a):
                    dst, src = (j, i) if p[j] > p[i] else (i, j)
                    p[dst] += p[src]
                    p[src], alive[src] = 0, False
        return alive

    def __call__(self, ids: np.ndarray, logits: np.ndarray) -> int:
        """The token llama.cpp's ``dist`` draws from what :meth:`kept` leaves."""
        kept_ids, kept_logits = self.kept(ids, logits)
        u = self.rng.random()
        if len(kept_ids) == 1:
            return int(kept_ids[0])
        weights = np.exp(kept_logits - np.max(kept_logits)).astype(np.float64)
        cumulative = np.cumsum(weights)
        found = np.flatnonzero(cumulative >= u * cumulative[-1])
        return int(kept_ids[found[0] if len(found) else len(kept_ids) - 1])
