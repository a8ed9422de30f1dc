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


# Phi-3's template writes user and assistant turns only; Gemma 2's refuses turns that do not
# alternate; ChatML writes any role.
_PHI3 = ("{% for m in messages %}{% if m['role'] == 'user' %}{{ '<|user|>\n' + m['content'] }}"
         "{{ '<|end|>\n' }}{% elif m['role'] == 'assistant' %}{{ '<|assistant|>\n' }}"
         "{{ m['content'] + '<|end|>\n' }}{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")  # fmt: skip
_ALTERNATING = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
                "{{ '<' + m['role'] + '>' + m['content'] + '\n' }}{% endfor %}")  # fmt: skip
_CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] }}"
           "{{ '<|im_end|>\n' }}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")  # fmt: skip


@pytest.mark.parametrize(
    ("template", "writes", "turn"),
    [
        (_PHI3, False, '<|user|>\n{"tool_response": '),
        (_ALTERNATING, False, '<user>{"tool_response": '),
        (_CHATML, True, '<|im_start|>tool\n{"tool_response": '),
    ],
    ids=["drops-tool-turns", "refuses-tool-turns", "writes-tool-turns"],
)
def test_a_tool_result_reaches_a_template_without_tool_turns(
    tiny_gqa_export, template, writes, turn
):
    """The envelope writes a tool result as {"tool_response": ...}; a template that drops a tool
    turn (Phi-3's) or refuses it (Gemma 2's) gets it in a user's turn, so the model sees it."""
    from onnxsample.serve import tools
    from onnxsample.serve.schemas import ChatRequest
    from onnxsample.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(tiny_gqa_export.output).with_chat_template(template)
    assert tokenizer.writes_tool_messages is writes
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    body = ChatRequest.model_validate({"messages": [
        {"role": "user", "content": "What is the weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24C"},
    ]})  # fmt: skip
    text = tools.chat_text(tokenizer, body, None, None)
    assert turn + '{"tool_call_id": "call_1", "content": "Sunny, 24C"}}' in text, text


def test_a_function_without_parameters_is_listed_to_the_template_as_llama_server_lists_it():
    """``"parameters": {}`` (the constraint still holds it to no arguments), not a schema the
    request did not write."""
    from onnxsample.serve import tools
    from onnxsample.serve.schemas import ChatRequest

    body = ChatRequest.model_validate(
        {"messages": [{"role": "user", "content": "Hi"}],
         "tools": [{"type": "function", "function": {"name": "ping"}}]}
    )  # fmt: skip
    [listed] = tools._listed_tools(body)
    assert listed["function"]["parameters"] == {}
