"""A request's own bookkeeping, without ONNX Runtime: `Sequence.accept` decides when a request
ends and what text each token releases."""

from __future__ import annotations

import pytest

from onnxsample.engine._sequence import Sequence
from onnxsample.engine.request import Request
from onnxsample.params import SamplingParams
from onnxsample.text import TextStream, Tokenizer
from onnxsample.text._stops import StopMatcher

EOS = 2


@pytest.fixture(scope="module")
def tokenizer(tiny_export) -> Tokenizer:
    return Tokenizer.from_folder(tiny_export.output)


def _sequence(tokenizer, params=None, *, max_new=8, stops=(), limit=None, prompt="Hello"):
    return Sequence(
        Request("r", 3, lambda: None),
        tokenizer.encode(prompt),
        params or SamplingParams(),
        max_new,
        TextStream(tokenizer),
        StopMatcher(list(stops)),
        seed=1,
        eos_ids=frozenset({EOS}),
        limit=limit,
    )


def _feed(seq, text_ids):
    events = []
    for token in text_ids:
        events.append(seq.accept(token, -0.5, [(token, -0.5)]))
        if seq.finish:
            break
    return events


@pytest.mark.parametrize(
    ("case", "finish", "tokens"),
    [
        ("eos", "eos", 3),  # the EOS token is not part of the output
        ("max_new", "length", 5),
        ("limit", "length", 4),  # the KV buffer's end: prompt + output fills `limit`
        ("stop", "stop", None),
        ("ignore_eos", "length", 5),
    ],
)
def test_what_ends_a_request(tokenizer, case, finish, tokens):
    words = tokenizer.encode(" one two three four five six seven", add_special_tokens=False)
    params = SamplingParams(ignore_eos=case == "ignore_eos", logprobs=True, top_logprobs=1)
    kwargs = {"max_new": 5 if case in ("max_new", "ignore_eos") else 50}
    if case == "limit":
        kwargs["limit"] = len(tokenizer.encode("Hello")) + 4
    if case == "stop":
        kwargs["stops"] = ["three"]
    seq = _sequence(tokenizer, params, **kwargs)
    stream = [*words[:3], EOS, *words[3:]] if case in ("eos", "ignore_eos") else words
    events = _feed(seq, stream)
    done = events[-1].completion
    assert done is not None and all(e.completion is None for e in events[:-1])
    assert done.finish_reason == finish and seq.finish == finish
    if tokens is not None:
        assert len(done.token_ids) == tokens
    assert "".join(e.text for e in events) == done.text
    assert len(done.logprobs) == len(done.token_ids) == len(done.top_logprobs)
    if case == "stop":
        assert done.text == " one two " and "three" not in done.text
    if case == "ignore_eos":
        assert EOS in done.token_ids
    assert done.index == 3 and done.timings.generated_tokens == len(events)


def test_cancel_keeps_what_was_generated(tokenizer):
    seq = _sequence(tokenizer)
    ids = tokenizer.encode(" one two", add_special_tokens=False)
    _feed(seq, ids)
    event = seq.cancel()
    assert event.completion.finish_reason == "cancelled"
    assert event.completion.token_ids == ids and event.token_id is None


def test_prompt_logprobs_are_recorded_in_prompt_order(tokenizer):
    import numpy as np

    seq = _sequence(tokenizer, SamplingParams(prompt_logprobs=2), prompt="one two three four")
    n = len(seq.prompt)
    seq.record_prompt(np.array([-1.0, -2.0]), np.array([[5, 6], [7, 8]]), np.array([[-1, -2]] * 2))
    seq.record_prompt(np.arange(n - 3, dtype=np.float32), None, None)
    done = seq.cancel().completion
    assert done.prompt_logprobs[0] is None and len(done.prompt_logprobs) == n
    assert done.prompt_top_logprobs[1] == [(5, -1.0), (6, -2.0)]


def test_the_same_seed_draws_the_same_uniforms(tokenizer):
    a, b = _sequence(tokenizer), _sequence(tokenizer)
    assert [a.uniform() for _ in range(5)] == [b.uniform() for _ in range(5)]
    assert all(0 <= a.uniform() < 1 for _ in range(1000))
