"""Integration: structured output on the real embedded SmolLM2 through `onnxsample serve` and the
official `openai` client: pydantic models through ``chat.completions.parse`` on 20 varied prompts,
``json_object``, a regex and a choice list, ``tool_choice="required"`` streamed and not, and an
invalid schema's 400."""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal

import openai
import pytest
from _http import get, metric, served
from _structured_cases import ADD, streamed_calls
from pydantic import BaseModel, Field

pytestmark = pytest.mark.integration


class Person(BaseModel):
    name: str = Field(max_length=40)
    occupation: Literal["engineer", "artist", "scientist", "teacher", "other"]
    age: int = Field(ge=0, le=120)


class Place(BaseModel):
    city: str = Field(max_length=40)
    country: str = Field(max_length=40)
    coastal: bool


class Review(BaseModel):
    sentiment: Literal["positive", "negative", "mixed"]
    stars: int = Field(ge=1, le=5)
    keywords: list[Annotated[str, Field(max_length=24)]] = Field(max_length=3)


PROMPTS = [
    (Person, "Invent a character for a novel about a lighthouse keeper."),
    (Person, "Describe Marie Curie."),
    (Person, "Who painted the Mona Lisa? Describe that person."),
    (Person, "Make up a friendly neighbour."),
    (Person, "Describe a retired maths teacher."),
    (Person, "Tell me about Ada Lovelace."),
    (Person, "Describe a young street artist in Berlin."),
    (Place, "Where is the Eiffel Tower?"),
    (Place, "Describe Tokyo."),
    (Place, "Name a city in the Alps."),
    (Place, "Where is the Sydney Opera House?"),
    (Place, "Describe a small town in Kansas."),
    (Place, "Name the capital of Norway."),
    (Place, "Describe Lisbon."),
    (Review, "Review: the soup was cold but the staff were lovely."),
    (Review, "Review: best headphones I have ever owned, great bass."),
    (Review, "Review: the film was far too long and the plot made no sense."),
    (Review, "Review: decent hotel, noisy street, fantastic breakfast."),
    (Review, "Review: the app crashes every time I open it."),
    (Review, "Review: a delightful little bookshop with a cat."),
]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def client(embedded_gqa_exports):
    model = embedded_gqa_exports["gguf-a4"].output
    with served(model, "--threads", "2", "--served-model-name", "smol", startup_s=300) as proc:
        yield openai.OpenAI(
            base_url=f"http://127.0.0.1:{proc.port}/v1", api_key="none", max_retries=0
        )


def _chat(client, content: str, **kwargs):
    messages = [{"role": "user", "content": content}]
    return client.chat.completions.create(model="smol", messages=messages, **kwargs)


def test_pydantic_models_parse_on_20_prompts(client):
    for model, prompt in PROMPTS:
        done = client.chat.completions.parse(
            model="smol",
            messages=[{"role": "user", "content": prompt}],
            response_format=model,
            temperature=0,
            max_tokens=120,
        )
        choice = done.choices[0]
        assert choice.finish_reason == "stop", (prompt, choice.message.content)
        assert isinstance(choice.message.parsed, model), (prompt, choice.message.content)


def test_json_object_regex_and_choice(client):
    done = _chat(
        client,
        "List three fruits as JSON.",
        response_format={"type": "json_object"},
        max_tokens=120,
        temperature=0,
    )
    if done.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(done.choices[0].message.content), dict)
    else:  # cut by the limit: still a compact prefix of an object
        assert done.choices[0].message.content.startswith("{")
    date = _chat(
        client,
        "When did the Berlin Wall fall?",
        extra_body={"structured_outputs": {"regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}"}},
        max_tokens=20,
    )
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", date.choices[0].message.content)
    mood = _chat(
        client,
        "Is 'I love this' positive or negative?",
        extra_body={"guided_choice": ["positive", "negative"]},
        max_tokens=5,
        temperature=0,
    )
    assert mood.choices[0].message.content in ("positive", "negative")


def _check_call(name: str, arguments: str) -> None:
    assert name == "get_weather"
    args = json.loads(arguments)
    assert set(args) == {"city", "unit", "days"} and isinstance(args["city"], str)
    assert args["unit"] in ("celsius", "fahrenheit") and 1 <= args["days"] <= 7


def test_required_tool_calls_streamed_and_not(client):
    ask = "What will the weather be in Paris for the next three days?"
    done = _chat(
        client,
        ask,
        tools=[TOOL],
        tool_choice="required",
        max_tokens=120,
        temperature=0,
        parallel_tool_calls=False,
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    for call in choice.message.tool_calls:
        _check_call(call.function.name, call.function.arguments)
    chunks = list(
        _chat(
            client,
            ask,
            tools=[TOOL],
            tool_choice="required",
            max_tokens=120,
            stream=True,
            parallel_tool_calls=False,
        )
    )
    calls = streamed_calls(chunks)
    assert calls
    # the message the client assembles has no content, as the unstreamed one
    assert choice.message.content is None
    assert all(c.choices[0].delta.content is None for c in chunks if c.choices)
    for call in calls:
        assert call["deltas"] > 1, "the arguments come in fragments as they are written"
        _check_call(call["name"], call["arguments"])


# (prompt, tools): with add alone the model writes add(2, 40) a second time, and the answer ends at
# the repeat; with both tools it writes different calls until the token limit
LOOPS = [
    ("What is 2 plus 40?", "add"),
    ("Add 2 and 40.", "add"),
    ("What is 2 plus 40?", "weather+add"),
    ("Compute 2 + 40 with the tool.", "weather+add"),
]
_ENDED = 'onnxsample_requests_total{finish_reason="tool_calls"}'


def _ended_at_repeats(client) -> float:
    """Answers the server ended at a repeated call, as /metrics counts them."""
    text = get(client.base_url.port, "/metrics")[1].decode()
    return metric(text, _ENDED) if _ENDED in text else 0.0


@pytest.mark.parametrize(("ask", "tools"), LOOPS)
def test_a_model_that_repeats_a_call_gets_it_once_and_never_the_envelope(client, ask, tools):
    asked = {
        "tools": [ADD] if tools == "add" else [TOOL, ADD],
        "tool_choice": "required",
        "max_tokens": 120,
    }
    before = _ended_at_repeats(client)
    done = _chat(client, ask, temperature=0, **asked)
    choice = done.choices[0]
    assert choice.message.content is None, "the envelope's text is never content"
    # One tool asked for again and again: the repeat ends the answer. With two tools the greedy
    # answer runs to the length on one CPU and ends its calls on another (ONNX Runtime's int8
    # kernels differ by instruction set, and so do this model's greedy tokens): never the envelope.
    assert choice.finish_reason in (("tool_calls",) if tools == "add" else ("tool_calls", "length"))
    assert choice.message.tool_calls
    pairs = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert len(set(pairs)) == len(pairs), "a call repeated is the same call"
    chunks = list(
        _chat(
            client,
            ask,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            **asked,
        )
    )
    calls = streamed_calls(chunks)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        (name, json.loads(arguments)) for name, arguments in pairs
    ]
    assert not any(c.choices and c.choices[0].delta.content for c in chunks)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == [choice.finish_reason]
    assert chunks[-1].usage.completion_tokens == done.usage.completion_tokens > 0
    # ended at the repeat, streamed and not: counted as the client saw it, not as cancelled
    ended = 2 if choice.finish_reason == "tool_calls" else 0
    assert _ended_at_repeats(client) - before == ended


def test_an_invalid_schema_is_a_400_naming_the_problem(client):
    bad = {"type": "object", "properties": {"a": {"type": "strnig"}}}
    with pytest.raises(openai.BadRequestError, match="strnig") as caught:
        _chat(
            client,
            "x",
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": bad}},
        )
    assert caught.value.body["type"] == "invalid_request_error"
