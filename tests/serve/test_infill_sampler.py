"""llama.cpp's infill sampler as the host runs it (onnxsample/serve/infill_sampler.py), on
candidates made by hand: each case follows ``llama_sampler_infill_apply`` step by step (the
probabilities in the comments). A real llama-server on the same file: test_infill_llama_server.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from onnxsample.serve.infill_sampler import InfillSampler

END, EOG = 99, 9  # the end-of-turn token, and an end-of-generation token among the candidates
PIECES = {1: b"abc", 2: b"ab", 3: b"q", 4: b"zz", 5: b"w", EOG: b"", 6: b""}


def _sampler(seed: int = 0) -> InfillSampler:
    return InfillSampler(lambda t: PIECES.get(t, b"t%d" % t), {EOG, END}, END, seed)


@pytest.mark.parametrize(
    ("ids", "logits", "kept"),
    [
        # p = .367 .332 .300: 3 * p(end) * 3 > p(text): only the end-of-generation tokens stay
        ([EOG, 3, 4], [2.0, 1.9, 1.8], [EOG]),
        # p = .500 .452 .025 .023: two over 0.2, both over 1/3 once normalised
        ([3, 4, 5, 10], [0.0, -0.1, -3.0, -3.1], [3, 4]),
        # p = .464 .281 .255: "ab" is a prefix of "abc", the likelier takes its .281; then .745 and
        # .255, and .255 is under 1/3
        ([1, 2, 3], [1.0, 0.5, 0.4], [1]),
        # without the prefix (q, zz, w): three over 0.2, all over 1/4
        ([3, 4, 5], [1.0, 0.5, 0.4], [3, 4, 5]),
        # ten tokens at .1: none over 0.2, so the end of turn, candidate or not
        (list(range(10, 20)), [0.0] * 10, [END]),
        # a control token's empty text is no one's prefix; the end token stays whatever its p
        ([6, EOG, 3], [1.0, -1.0, 0.9], [6, EOG, 3]),
        # what the chain dropped (-inf) is not a candidate
        ([3, 4, 5], [0.0, -0.1, -np.inf], [3, 4]),
    ],
)
def test_it_keeps_what_llama_cpp_keeps(ids, logits, kept):
    found, _ = _sampler().kept(np.array(ids, np.int64), np.array(logits, np.float32))
    assert found.tolist() == kept


def test_it_draws_from_the_kept_tokens_by_their_logits():
    sampler = _sampler(seed=7)
    ids, logits = np.array([3, 4, 5, 10], np.int64), np.array([0.0, -0.1, -3.0, -3.1], np.float32)
    draws = [sampler(ids, logits) for _ in range(4000)]
    assert set(draws) == {3, 4}
    assert abs(draws.count(3) / len(draws) - 1 / (1 + np.exp(-0.1))) < 0.03  # .525
    again = _sampler(seed=7)
    assert [again(ids, logits) for _ in range(50)] == draws[:50]  # the seed decides the draws
