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


@pytest.mark.parametrize(
    ("min_tokens", "stop", "text"),
    [
        (0, " two", " one"),
        (1, " two", " one"),
        (2, " two", " one two three four"),
        (3, " two", " one two three four"),
        (5, " two", " one two three four two five"),
        (2, " two three", " one"),
        (2, "one two", " one two three four two five"),
        (3, " two three four", " one"),
    ],
)
def test_stop_strings_wait_for_min_tokens(tokenizer, min_tokens, stop, text):
    """As vLLM's min_tokens: a stop string must end in the text of a token past the first
    min_tokens, and may begin in theirs (their text's tail is held back as always)."""
    words = tokenizer.encode(" one two three four two five", add_special_tokens=False)
    assert len(words) == 6, words
    seq = _sequence(tokenizer, SamplingParams(min_tokens=min_tokens), max_new=50, stops=[stop])
    events = _feed(seq, words)
    finish = "stop" if text != " one two three four two five" else None
    assert seq.finish == finish and seq.completion().text == text
    assert "".join(e.text for e in events) == text


@pytest.mark.parametrize(
    ("min_tokens", "finish", "text"), [(0, "stop", " one"), (2, "length", " one \ufffd")]
)
def test_the_last_held_text_is_searched_as_the_last_token_is(tokenizer, min_tokens, finish, text):
    """The text still held when the answer ends (half an emoji: U+FFFD, as decode gives it) is
    the last token's: searched for stop strings only past min_tokens, and a match there is a
    stop, not a length."""
    ids = tokenizer.encode(" one 😀", add_special_tokens=False)[:2]
    seq = _sequence(tokenizer, SamplingParams(min_tokens=min_tokens), max_new=2, stops=[" \ufffd"])
    events = _feed(seq, ids)
    assert seq.finish == finish and seq.completion().text == text
    assert "".join(e.text for e in events) == text


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


def test_prompt_logprobs_0_list_no_alternatives_but_not_none(tokenizer):
    """``prompt_logprobs=0``: each token after the first has no alternatives (``[]``); ``None``
    is the first token's alone, which has no context."""
    import numpy as np

    seq = _sequence(tokenizer, SamplingParams(prompt_logprobs=0), prompt="one two three")
    n = len(seq.prompt)
    seq.record_prompt(np.arange(n - 1, dtype=np.float32), None, None)
    done = seq.cancel().completion
    assert done.prompt_top_logprobs == [None] + [[]] * (n - 1)


def test_the_same_seed_draws_the_same_uniforms(tokenizer):
    a, b = _sequence(tokenizer), _sequence(tokenizer)
    assert [a.uniform() for _ in range(5)] == [b.uniform() for _ in range(5)]
    assert all(0 <= a.uniform() < 1 for _ in range(1000))


# llama-server's n_indent, step for step (process_token): the check starts a piece after the one
# that let the first new line out, and looks at the line after the last new line it had found.
@pytest.mark.parametrize(
    ("pieces", "indent", "text", "stopped_at"),
    [
        (["if x:", "\n", "    a", "\n", "b", "c"], 4, "if x:\n    a\n", 4),
        (["if x:", "\n", "    a", "\n", "    b"], 4, "if x:\n    a\n    b", None),
        (["x", "\n", "y", "z"], 2, "x\n", 3),  # the first line's check comes a piece late
        (["x", "\n", "y"], 2, "x\ny", None),  # ...so a text that ends there keeps it
        (["a\n", "\tb", "\n", "c"], 1, "a\n\tb\n", 3),  # a tab counts as one
        (["a\n", "  ", "\n", "b"], 3, "a\n  ", 2),  # its new line is no space or tab
        (["if x:", "\n", "    a", "\n", "b", "c"], 0, "if x:\n    a\nbc", None),  # off
    ],
)
def test_n_indent_ends_the_text_as_llama_server(pieces, indent, text, stopped_at):
    stops = StopMatcher([], indent=indent)
    released, at = "", None
    for i, piece in enumerate(pieces):
        released += stops.add(piece)
        if stops.stopped:
            at = i
            break
    released += stops.flush()
    # a stream may have let out the start of the line that is cut, as llama-server's does
    assert stops.text == text and released.startswith(text)
    assert at == stopped_at and stops.indented == stops.stopped


@pytest.mark.parametrize(
    ("n_indent", "t_max_predict_ms", "finish", "tokens"),
    [
        (2, 0, "length", 3),  # the line after the first new line is unindented: cut before it
        (0, 0.001, "length", 4),  # the second piece with a new line comes after the time
        (0, 0, "length", 6),
    ],
)
def test_code_completion_endings_end_as_the_limit(
    tokenizer, n_indent, t_max_predict_ms, finish, tokens
):
    line, bare = tokenizer.encode("\nx", add_special_tokens=False), tokenizer.encode("y")[-1:]
    seq = _sequence(tokenizer, max_new=6)
    seq.end_lines(n_indent, t_max_predict_ms)
    events = _feed(seq, [*line, *bare, *line, *bare][:6] + line * 6)
    assert seq.finish == finish and len(seq.ids) <= tokens
    assert "".join(e.text for e in events).startswith(events[-1].completion.text)
