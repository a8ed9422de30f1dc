"""The tool-call envelope read while it is written: streamed deltas that reassemble into the calls,
an answer cut anywhere that keeps only whole calls and never returns the envelope's text, and a
model that loops on one call ended at the repeat."""

from __future__ import annotations

import json
import random

import pytest

from onnxsample.serve.envelope import EnvelopeStream, read

ADD = {"name": "add", "arguments": {"a": 2, "b": 40}}
WEATHER = {"name": "get_weather", "arguments": {"city": 'Zürich "old" \\ 😀', "days": [1, 2.5e3]}}
NOW = {"name": "now", "arguments": {}}


def _text(calls: list[dict], indent: int | None = None) -> str:
    return json.dumps({"tool_calls": calls}, ensure_ascii=False, indent=indent)


def _streamed(text: str, seed: int) -> tuple[list[dict], EnvelopeStream]:
    """Feed `text` in random pieces of 1 to 6 characters, as tokens arrive."""
    rng, stream, deltas, at = random.Random(seed), EnvelopeStream(), [], 0
    while at < len(text):
        at = min(len(text), at + rng.randint(1, 6))
        deltas += stream.feed(text[:at])
    return deltas, stream


def _assembled(deltas: list[dict]) -> list[dict]:
    """Calls as an OpenAI client assembles them from the stream."""
    calls: dict[int, dict] = {}
    for delta in deltas:
        for part in delta["tool_calls"]:
            call = calls.setdefault(part["index"], {"name": None, "arguments": "", "id": None})
            call["id"] = part.get("id", call["id"])
            call["name"] = part["function"].get("name", call["name"])
            call["arguments"] += part["function"].get("arguments", "")
    return [calls[k] for k in sorted(calls)]


CALLS = [
    pytest.param([ADD], None, id="one"),
    pytest.param([ADD, WEATHER, NOW], None, id="three"),
    pytest.param([WEATHER, ADD], 2, id="indented"),
    pytest.param([ADD, {**ADD, "arguments": {"a": 2, "b": 41}}], None, id="same-name-other-args"),
]


@pytest.mark.parametrize("calls, indent", CALLS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streamed_fragments_reassemble_into_the_calls(calls, indent, seed):
    deltas, stream = _streamed(_text(calls, indent), seed)
    firsts = [d["tool_calls"][0] for d in deltas if "id" in d["tool_calls"][0]]
    assert [f["index"] for f in firsts] == list(range(len(calls)))
    assert all(
        f["function"] == {"name": c["name"], "arguments": ""}
        for f, c in zip(firsts, calls, strict=True)
    )
    got = _assembled(deltas)
    assert [(c["name"], json.loads(c["arguments"])) for c in got] == [
        (c["name"], c["arguments"]) for c in calls
    ]
    content, message_calls, finish = stream.message("stop")
    assert content is None and finish == "tool_calls"
    assert [c["id"] for c in message_calls] == [c["id"] for c in got]


@pytest.mark.parametrize("cut", range(0, len(_text([ADD, WEATHER])) + 1, 3))
def test_a_cut_answer_keeps_its_whole_calls_and_never_its_text(cut):
    text = _text([ADD, WEATHER])
    stream = EnvelopeStream()
    stream.feed(text[:cut])
    content, calls, finish = stream.message("length")
    assert content is None and finish == "length"
    whole = [c for c in read(text[:cut]).calls if c.complete]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (call["name"], call["arguments"]) for call in [ADD, WEATHER][: len(whole)]
    ]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_call_repeated_ends_the_answer_before_the_repeat_is_sent(seed):
    text = _text([ADD, NOW, ADD, ADD])
    deltas, stream = _streamed(text, seed)
    assert stream.repeated
    assert [c["name"] for c in _assembled(deltas)] == ["add", "now"]
    content, calls, finish = stream.message("length")
    assert content is None and finish == "tool_calls"
    assert [c["function"]["name"] for c in calls] == ["add", "now"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_response_streams_its_text_and_a_cut_keeps_it(seed):
    said = 'Zürich is "old" \\ 😀\n'
    text = json.dumps({"response": said}, ensure_ascii=True)
    deltas, stream = _streamed(text, seed)
    assert "".join(d["content"] for d in deltas) == said
    assert stream.message("stop") == (said, [], "stop")
    cut = EnvelopeStream()
    cut.feed(text[: len(text) // 2])
    content, calls, finish = cut.message("length")
    assert said.startswith(content) and content and not calls and finish == "length"
