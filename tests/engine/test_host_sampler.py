"""Host samplers per sequence (the mixed device/host chain): a request's callable picks its token
from the candidates the graph's filters left, while the other rows of the batch sample in the
graph untouched; each row gets the tokens it gets alone."""

from __future__ import annotations

import numpy as np
import pytest

from onnxsample import Constraint, Engine, GenerationError, InvalidParameter, SamplingParams
from onnxsample.chain import SamplerChain
from onnxsample.composer import compose
from onnxsample.engine._slots import COUNTS, SlotState, host_copy
from onnxsample.metadata import ComposedMetadata

K = 8


@pytest.fixture(scope="module")
def engine(tiny_gqa_export, tmp_path_factory):
    path = compose(
        tiny_gqa_export.output,
        None,
        tmp_path_factory.mktemp("host") / "candidates.onnx",
        max_slots=4,
        output_candidates=K,
        allowed_tokens=True,
        top_logprobs=2,
    )
    with Engine(path, tokenizer=tiny_gqa_export.output, threads=1) as e:
        yield e


def _least_likely_kept(seen: list):
    def pick(ids: np.ndarray, logits: np.ndarray) -> int:
        assert ids.shape == logits.shape == (K,) and ids.dtype == np.int64
        assert np.all(np.diff(logits[np.isfinite(logits)]) <= 0)  # most likely first
        seen.append((ids.copy(), logits.copy()))
        return int(ids[np.isfinite(logits)][-1])

    return pick


def test_the_host_chooses_from_the_candidates(engine):
    seen: list = []
    params = SamplingParams(top_k=4, seed=1, host_sampler=_least_likely_kept(seen))
    done = engine.submit("Once upon", params, max_new_tokens=12, chat=False).result(60)
    assert len(done.token_ids) == len(seen) or done.finish_reason == "eos"
    for token, (ids, logits) in zip(done.token_ids, seen, strict=False):
        kept = ids[np.isfinite(logits)]
        assert len(kept) == 4 and token == kept[-1]  # top_k=4 filtered in the graph first


def test_a_mixed_batch_gives_each_row_its_tokens_alone(engine):
    requests = [
        ("Once upon", SamplingParams(top_k=5, seed=3, host_sampler=_least_likely_kept([]))),
        ("The weather", SamplingParams(temperature=0)),
        ("Hello", SamplingParams(temperature=0.9, seed=8, presence_penalty=1.5)),
        (
            "Pick:",
            SamplingParams(
                seed=2,
                repetition_penalty=1.3,
                constraint=Constraint.regex("[a-z]{2,5}( [a-z]{2,5}){1,3}"),
                host_sampler=_least_likely_kept([]),
            ),
        ),
    ]
    together = [engine.submit(p, sp, max_new_tokens=16, chat=False) for p, sp in requests]
    together = [r.result(60).token_ids for r in together]
    for (prompt, sp), tokens in zip(requests, together, strict=True):
        alone = engine.submit(prompt, sp, max_new_tokens=16, chat=False).result(60)
        assert alone.token_ids == tokens, prompt


@pytest.mark.parametrize(
    ("sampler", "message"),
    [
        (lambda ids, logits: 1 / 0, "division by zero"),
        (lambda ids, logits: "7", "not a token id"),
        (lambda ids, logits: 10**9, "not among the candidates"),
        (lambda ids, logits: int(ids[-1]), "not among the candidates"),  # dropped by top_k
    ],
)
def test_a_failing_host_sampler_fails_its_request_alone(engine, sampler, message):
    params = SamplingParams(top_k=2, host_sampler=sampler)
    bad = engine.submit("x", params, max_new_tokens=4, chat=False)
    good = engine.submit("x", SamplingParams(temperature=0), max_new_tokens=4, chat=False)
    with pytest.raises(GenerationError, match=message):
        bad.result(60)
    assert len(good.result(60).token_ids) == 4


def test_a_host_sampler_may_end_the_sequence(engine):
    """An end-of-sequence id ends it, among the candidates or not (llama.cpp's infill sampler
    answers its end of turn when it keeps no text)."""
    params = SamplingParams(top_k=2, host_sampler=lambda ids, logits: 2)  # the tiny model's EOS
    done = engine.submit("x", params, max_new_tokens=4, chat=False).result(60)
    assert done.finish_reason == "eos" and done.token_ids == []


def test_refusals(engine, tiny_gqa_export, tmp_path):
    pick = _least_likely_kept([])
    with pytest.raises(InvalidParameter, match="logprobs"):
        engine.submit("x", SamplingParams(host_sampler=pick, logprobs=True), chat=False)
    with pytest.raises(InvalidParameter, match="callable"):
        SamplingParams(host_sampler=3).validate()
    path = compose(tiny_gqa_export.output, None, tmp_path / "plain.onnx", max_slots=2)
    with (
        Engine(path, tokenizer=tiny_gqa_export.output, threads=1) as plain,
        pytest.raises(InvalidParameter, match="--candidates"),
    ):
        plain.submit("x", SamplingParams(host_sampler=pick), chat=False)


def test_the_penalty_counts_follow_the_hosts_choice():
    meta = ComposedMetadata(chain=SamplerChain("penalties,dist"), max_slots=2, vocab_size=5)
    state = SlotState(meta, {COUNTS}, "cpu")
    state.counts.update_inplace(np.array([[0, 1, 0, 0, 0], [0, 0, 2, 0, 0]], np.int32))
    state.retake([(1, 2, 4), (0, 3, 3)])  # (slot, taken, instead): the second moves nothing
    np.testing.assert_array_equal(host_copy(state.counts), [[0, 1, 0, 0, 0], [0, 0, 1, 0, 1]])
