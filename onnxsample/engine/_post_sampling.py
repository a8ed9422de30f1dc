"""The final distribution's log-probabilities, llama-server's ``post_sampling_probs``.

Two sources, as the model was composed:

- ``sampler.probs`` [S, V] (``onnxsample compose --output-probs``, a branching chain): the
  distribution the draw uses, every kept token's probability (the graph's float32 softmax over
  the kept set), whatever the kept set's size.
- ``sampler.candidate_ids`` / ``sampler.candidate_logits`` [S, K] (``--candidates K``): the K
  most likely tokens after every filter, at the draw's temperature, −inf where a filter dropped
  one. The probabilities are computed as llama.cpp's ``dist`` sampler computes the ones it draws
  from: ``p = exp(z − z_max) / Σ exp(z − z_max)`` over the kept tokens, each exponential in
  float32 and their sum in float64. That needs every kept token among the candidates: fewer than
  K finite candidate logits say so (or K as large as the vocabulary); K of them may hide more,
  and the request fails rather than report another distribution.
"""

from __future__ import annotations

import numpy as np

from onnxsample.chain import GREEDY_BELOW
from onnxsample.engine.request import TopLogprobs
from onnxsample.errors import InvalidParameter
from onnxsample.metadata import ComposedMetadata
from onnxsample.params import SamplingParams

__all__ = ["PROBS", "post_sampling"]

PROBS = "sampler.probs"


def post_sampling(
    params: SamplingParams,
    slot: int,
    host: dict[str, np.ndarray],
    token: int,
    meta: ComposedMetadata,
) -> tuple[float, TopLogprobs]:
    """The chosen `token`'s log-probability and the ``params.post_sampling_probs`` most likely
    tokens' (most likely first, equal ones by id; probability 0 left out) under the final
    distribution of `slot`, read from the step's host outputs `host`. Greedy decoding (a
    temperature the graph takes as 0) gives `token` all of it.

    Raises:
        InvalidParameter: the model has only candidates, and the filters kept K tokens or more,
            past what they show.
    """
    if params.temperature < GREEDY_BELOW:
        return 0.0, [(int(token), 0.0)]
    n = params.post_sampling_probs or 0
    if meta.final_probs:
        return _from_probs(host[PROBS][slot], token, n)
    return _from_candidates(host, slot, token, n, meta)


def _from_probs(row: np.ndarray, token: int, n: int) -> tuple[float, TopLogprobs]:
    if not row.any():  # no finite logit: token 0, as the candidates' row [0, -inf...] gives it
        return 0.0, [(int(token), 0.0)][:n]
    n = min(n, int(np.count_nonzero(row > 0)))
    top = np.empty(0, np.int64)
    if n:  # the n largest without sorting the row: those above the n-th, then equal ones by id
        nth = np.partition(row, row.size - n)[row.size - n]
        above = np.flatnonzero(row > nth)
        top = np.concatenate([above, np.flatnonzero(row == nth)[: n - above.size]])
        top = top[np.lexsort((top, -row[top]))]
    with np.errstate(divide="ignore"):
        logp = np.log(row[top])
        chosen = float(np.log(row[token])) if row[token] > 0 else 0.0
    return chosen, [(int(t), float(v)) for t, v in zip(top, logp, strict=True)]


def _from_candidates(
    host: dict[str, np.ndarray], slot: int, token: int, n: int, meta: ComposedMetadata
) -> tuple[float, TopLogprobs]:
    ids, logits = host["sampler.candidate_ids"][slot], host["sampler.candidate_logits"][slot]
    finite = np.isfinite(logits)
    k = len(logits)
    if np.count_nonzero(finite) >= k and k < meta.vocab_size:
        raise InvalidParameter(
            f"post_sampling_probs: the filters kept {k} tokens or more, past the model's {k} "
            f"candidates; keep fewer (top_k below {k}), or serve the model with more "
            "(serve --candidates) or with the whole distribution (serve --output-probs)"
        )
    ids, z = ids[finite], logits[finite].astype(np.float32)
    e = np.exp(z - z[0]).astype(np.float32)
    p = (e.astype(np.float64) / np.sum(e, dtype=np.float64)).astype(np.float32)
    with np.errstate(divide="ignore"):
        logp = np.log(p)
    tops = [(int(t), float(v)) for t, v in zip(ids[:n], logp[:n], strict=True) if v > -np.inf]
    at = np.flatnonzero(ids == token)
    # llama-server reports 1 for a token its sampler did not list (none here: the draw is theirs)
    return (float(logp[at[0]]) if at.size else 0.0), tops
