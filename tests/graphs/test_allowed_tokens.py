"""The allowed-tokens mask (structured output): forbidden tokens are never drawn nor taken
greedily, whatever the bias, penalties or temperature; a one-column mask changes nothing; the
graph agrees with the numpy reference and with ``onnx.reference``."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx.reference
import pytest
from _host_fallback import host_fallback, read_by, redraw

from onnxsample import SamplingParams, sampler_feeds
from onnxsample.composer.sampler_model import build_sampler_model, sampler_session
from onnxsample.reference import run_chain

FULL = "logit_bias,penalties,temperature,top_k,top_p,min_p,typical_p,dist"
V = 64
_session = functools.cache(sampler_session)


def _rows(seed: int, slots: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.vstack([np.zeros((1, V)), rng.normal(0, 3, (slots, V))]).astype(np.float32)


def _run(chain, logits, slots, allowed, static=False, **kwargs):
    """The chain's outputs (a static chain's flagged slots drawn on the host) and its feeds."""
    session = _session(chain, V, len(slots), max_bias=4, allowed_tokens=True, static=static)
    feeds = sampler_feeds(chain, logits, slots, max_bias=4, allowed=allowed, **kwargs)
    names = [o.name for o in session.get_outputs()]
    out = dict(zip(names, session.run(None, read_by(session, feeds)), strict=True))
    if static:
        options = dict(max_bias=4, allowed_tokens=True)
        redraw(host_fallback(chain, V, len(slots), **options), out, feeds)
    return out, feeds


def _mask(seed: int, slots: int, keep: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    allowed = np.zeros((slots, V), bool)
    for s in range(slots):
        allowed[s, rng.choice(V, keep, replace=False)] = True
    return allowed


PARAMS = [
    SamplingParams(temperature=0),
    SamplingParams(seed=1),
    SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, seed=2),
    SamplingParams(typical_p=0.5, seed=3),
    # a large positive bias on a forbidden token must not re-open it
    SamplingParams(temperature=0, logit_bias={7: 100.0, 9: 100.0}),
    SamplingParams(repetition_penalty=0.5, presence_penalty=-2.0, seed=4),
]


@pytest.mark.parametrize("static", [False, True], ids=["branching", "static"])
@pytest.mark.parametrize("keep", [1, 3, 40])
def test_only_allowed_tokens_are_taken(static, keep):
    slots = len(PARAMS)
    logits = _rows(keep, slots)
    allowed = _mask(keep, slots, keep)
    allowed[4, [7, 9]] = False
    prompt_mask = np.ones((slots, V), bool)  # every token was in the prompt: penalties apply
    for u in np.linspace(0.01, 0.99, 9):
        uniform = np.full(slots, u, np.float32)
        out, feeds = _run(
            FULL, logits, PARAMS, allowed, static, uniform=uniform, prompt_mask=prompt_mask
        )
        tokens = out["sampler.next_token"]
        assert allowed[np.arange(slots), tokens].all(), (u, tokens)
        reference = run_chain(FULL, feeds, max_bias=4)
        np.testing.assert_array_equal(reference["sampler.next_token"], tokens)
        np.testing.assert_allclose(reference["sampler.logprob"], out["sampler.logprob"], atol=1e-5)
    greedy_allowed = np.where(allowed[0], logits[1], -np.inf).argmax()
    assert tokens[0] == greedy_allowed


@pytest.mark.parametrize("static", [False, True], ids=["branching", "static"])
def test_a_one_column_mask_changes_nothing(static):
    slots = len(PARAMS)
    logits = _rows(5, slots)
    with_mask, _ = _run(FULL, logits, PARAMS, np.ones((slots, 1), bool), static)
    session = _session(FULL, V, slots, max_bias=4, static=static)
    feeds = sampler_feeds(FULL, logits, PARAMS, max_bias=4)
    names = [o.name for o in session.get_outputs()]
    without = dict(zip(names, session.run(None, read_by(session, feeds)), strict=True))
    for name in ("sampler.next_token", "sampler.logprob"):
        np.testing.assert_array_equal(with_mask[name], without[name])


def test_logprobs_stay_the_models():
    """The reported logprob is the model's (raw log-softmax), as without a mask: the mask chooses,
    it does not renormalise what is reported."""
    logits = _rows(6, 1)
    allowed = np.zeros((1, V), bool)
    allowed[0, 3] = True
    out, _ = _run(FULL, logits, [SamplingParams(temperature=0)], allowed)
    assert out["sampler.next_token"][0] == 3
    raw = logits[1].astype(np.float64)
    expected = raw[3] - raw.max() - np.log(np.exp(raw - raw.max()).sum())
    np.testing.assert_allclose(out["sampler.logprob"][0], expected, atol=1e-5)


def test_graph_checks_and_matches_onnx_reference():
    model = build_sampler_model("temperature,dist", V, 2, allowed_tokens=True)
    onnx.checker.check_model(model, full_check=True)
    logits = _rows(7, 2)
    allowed = _mask(7, 2, 4)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.8, seed=0)]
    feeds = sampler_feeds("temperature,dist", logits, params, allowed=allowed)
    expected = onnx.reference.ReferenceEvaluator(model).run(None, feeds)
    session = _session("temperature,dist", V, 2, allowed_tokens=True)
    got = session.run(None, feeds)
    np.testing.assert_array_equal(expected[0], got[0])
    assert allowed[np.arange(2), got[0]].all()
