"""The final distribution's log-probabilities, llama-server's ``post_sampling_probs``, read from a
slot's candidates (``sampler.candidate_ids`` / ``sampler.candidate_logits``: the K most likely
tokens after every filter, at the draw's temperature, −inf where a filter dropped one).

Computed as llama.cpp's ``dist`` sampler computes the probabilities it draws from:
``p = exp(z − z_max) / Σ exp(z − z_max)`` over the kept tokens, each exponential in float32 and
their sum in float64. That needs every kept token among the candidates: fewer than K finite
candidate logits say so (or K as large as the vocabulary); K of them may hide more, and the
request fails rather than report another distribution.
"""

from __future__ import annotations

import numpy as np

from onnxsample.chain import GREEDY_BELOW
from onnxsample.engine.request import TopLogprobs
from onnxsample.errors import InvalidParameter
from onnxsample.params import SamplingParams

__all__ = ["post_sampling"]


def post_sampling(
    params: SamplingParams, slot: int, host: dict[str, np.ndarray], token: int, vocab_size: int
) -> tuple[float, TopLogprobs]:
    """The chosen `token`'s log-probability and the ``params.post_sampling_probs`` most likely
    tokens' (probability 0 left out) under the final distribution of `slot`, whose candidates
    are in the step's host outputs `host`. Greedy decoding (a temperature the graph takes as 0)
    gives `token` all of it.

    Raises:
        InvalidParameter: the filters kept K tokens or more, past what the candidates show.
    """
    if params.temperature < GREEDY_BELOW:
        return 0.0, [(int(token), 0.0)]
    ids, logits = host["sampler.candidate_ids"][slot], host["sampler.candidate_logits"][slot]
    finite = np.isfinite(logits)
    k = len(logits)
    if np.count_nonzero(finite) >= k and k < vocab_size:
        raise InvalidParameter(
            f"post_sampling_probs: the filters kept {k} tokens or more, past the model's {k} "
            f"candidates; keep fewer (top_k below {k}) or serve the model with more "
            "(--candidates)"
        )
    ids, z = ids[finite], logits[finite].astype(np.float32)
    e = np.exp(z - z[0]).astype(np.float32)
    p = (e.astype(np.float64) / np.sum(e, dtype=np.float64)).astype(np.float32)
    with np.errstate(divide="ignore"):
        logp = np.log(p)
    n = params.post_sampling_probs or 0
    tops = [(int(t), float(v)) for t, v in zip(ids[:n], logp[:n], strict=True) if v > -np.inf]
    at = np.flatnonzero(ids == token)
    # llama-server reports 1 for a token its sampler did not list (none here: the draw is theirs)
    return (float(logp[at[0]]) if at.size else 0.0), tops
