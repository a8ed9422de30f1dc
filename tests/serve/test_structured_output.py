"""Structured output and tool calls through the API, as clients send them (the `openai` client
against a real server on 127.0.0.1, the tiny model): OpenAI's ``response_format``, llama-server's
``json_schema`` / ``grammar``, vLLM's ``structured_outputs`` / ``guided_*``, ``tools`` with every
``tool_choice``; and the 400s for what cannot be honoured."""

from __future__ import annotations

import http.client
import json
import re

import openai
import pytest
from _http import ask_chat_page, chat, open_chat_page
from _structured_cases import SCHEMA, TIME, WEATHER, matches_schema, streamed_calls


def _schema_format(strict: bool = True, schema: dict = SCHEMA) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict}}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_response_format_json_schema(client, temperature):
    done = chat(
        client,
        max_tokens=60,
        seed=4,
        n=2,
        temperature=temperature,
        response_format=_schema_format(),
    )
    for choice in done.choices:
        assert choice.finish_reason == "stop"
        assert matches_schema(choice.message.content), choice.message.content


def test_response_format_json_object_streamed(client):
    chunks = list(
        chat(
            client,
            max_tokens=200,
            seed=2,
            stream=True,
            response_format={"type": "json_object"},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert text.startswith("{") and "\n" not in text
    if finish == ["stop"]:
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"structured_outputs": {"regex": "[0-9]{3}-[0-9]{2}"}}, r"[0-9]{3}-[0-9]{2}"),
        ({"structured_outputs": {"choice": ["left", "right"]}}, r"left|right"),
        ({"guided_regex": "(ab){2,3}"}, r"(ab){2,3}"),
        ({"guided_choice": ["yes", "no"]}, r"yes|no"),
        ({"grammar": 'root ::= "x" [0-9] [0-9]'}, r"x[0-9]{2}"),
        ({"structured_outputs": {"grammar": 'start: "id-" /[a-f]{4}/'}}, r"id-[a-f]{4}"),
    ],
)
def test_vllm_and_llama_server_fields_on_completions(client, extra, check):
    done = client.completions.create(
        model="tiny", prompt="Answer:", max_tokens=20, seed=1, extra_body=extra
    )
    assert re.fullmatch(check, done.choices[0].text), done.choices[0].text
    assert done.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "extra",
    [{"json_schema": SCHEMA}, {"structured_outputs": {"json": SCHEMA}}, {"guided_json": SCHEMA}],
)
def test_schema_fields_on_chat(client, extra):
    done = chat(client, max_tokens=60, seed=9, extra_body=extra)
    assert matches_schema(done.choices[0].message.content)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"response_format": _schema_format(strict=False, schema={"type": "strin"})}, "strin"),
        (
            {"response_format": _schema_format(schema={**SCHEMA, "additionalProperties": True})},
            "additionalProperties",
        ),
        (
            {"response_format": _schema_format(schema={**SCHEMA, "required": ["ok"]})},
            "required",
        ),
        ({"response_format": {"type": "json_schema"}}, "json_schema.schema"),
        (  # OpenAI's strict rules: an object at the root
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "p", "strict": True, "schema": {"type": "array"}},
                }
            },
            "with strict, the root must be an object schema",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"extra_body": {"guided_regex": "a("}}, "regex"),
        ({"extra_body": {"grammar": "root ::= nowhere"}}, "nowhere"),
        ({"extra_body": {"guided_choice": []}}, "choice"),
        (
            {"extra_body": {"structured_outputs": {"json": SCHEMA, "structural_tag": {}}}},
            "structural_tag is not supported",
        ),
        (
            {"extra_body": {"structured_outputs": {"regex": "a", "whitespace_pattern": " "}}},
            "whitespace_pattern is not supported",
        ),
        ({"extra_body": {"guided_whitespace_pattern": " "}}, "guided_whitespace_pattern"),
        (
            {"response_format": {"type": "json_object"}, "extra_body": {"guided_regex": "a"}},
            "one output constraint per request",
        ),
        (
            {
                "response_format": {"type": "json_object"},
                "tools": [WEATHER],
                "tool_choice": "required",
            },
            "cannot be combined",
        ),
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "not among the tools",
        ),
        ({"tools": [{**WEATHER, "function": {"name": "bad name"}}]}, "function.name"),
        ({"tools": [WEATHER, WEATHER]}, "unique"),
        ({"tools": [{"type": "retrieval"}]}, "type function"),
        ({"tools": [{"type": "function"}]}, r"tools\[0\].function is missing"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function"}},
            "tool_choice names no function: give function.name",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "string"}},
                    }
                ]
            },
            "arguments are a JSON object",
        ),
        (  # strict, but extra keys allowed: OpenAI refuses it, as for response_format
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "strict": True,
                            "parameters": {
                                "type": "object",
                                "properties": {"a": {"type": "string"}},
                                "required": ["a"],
                            },
                        },
                    }
                ]
            },
            r"tools\[0\].function.parameters: with strict, 'additionalProperties'",
        ),
        ({"tools": [WEATHER], "logprobs": True}, "logprobs are not returned with tools"),
        ({"tools": [WEATHER], "logprobs": True, "stream": True}, "logprobs are not returned"),
        # compiles, then cannot go on: never an end that the grammar does not match
        ({"extra_body": {"grammar": "root ::= root"}}, "invalid constraint: the grammar allows"),
        ({"extra_body": {"guided_regex": "a{1000000}"}}, "invalid constraint: llguidance failed"),
    ],
)
def test_what_cannot_be_honoured_is_a_400(client, kwargs, message):
    with pytest.raises(openai.BadRequestError, match=message) as caught:
        chat(client, max_tokens=4, **kwargs)
    assert caught.value.status_code == 400


_BAD_TYPE = {"type": "object", "properties": {"a": {"type": "strin"}}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"response_format": _schema_format(strict=False, schema={"type": "strin"})},
            "response_format",
        ),
        ({"grammar": "root ::= nowhere"}, "grammar"),
        ({"grammar": "root ::= root"}, "grammar"),  # compiles, fails at the first step
        ({"json_schema": {"type": "strin"}}, "json_schema"),
        ({"guided_regex": "a("}, "guided_regex"),
        ({"guided_regex": "a{1000000}"}, "guided_regex"),  # fails at the first step
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_grammar": "root ::= nowhere"}, "guided_grammar"),
        ({"structured_outputs": {"regex": "a("}}, "structured_outputs"),
        # an empty structured_outputs asks for nothing: the field that does is named
        ({"structured_outputs": {"json_object": False}, "guided_regex": "a("}, "guided_regex"),
        (
            {"tools": [{**WEATHER, "function": {"name": "f", "parameters": _BAD_TYPE}}]},
            "tools",
        ),
    ],
    ids=[
        "response_format",
        "grammar",
        "grammar-at-a-step",
        "json_schema",
        "guided_regex",
        "guided_regex-at-a-step",
        "guided_choice",
        "guided_grammar",
        "structured_outputs",
        "empty-structured_outputs",
        "tools",
    ],
)
def test_a_constraint_error_names_the_field_that_asked_for_it(client, fields, param, stream):
    """Whichever of the accepted fields holds a bad constraint, the 400 (or the stream's error)
    names that field, whether the constraint fails to compile or at a step."""
    extra = {k: v for k, v in fields.items() if k not in ("response_format", "tools")}
    kwargs = {k: v for k, v in fields.items() if k in ("response_format", "tools")}
    with pytest.raises(openai.APIError) as caught:
        answer = chat(client, max_tokens=4, stream=stream, extra_body=extra, **kwargs)
        if stream:
            list(answer)
    assert caught.value.param == param, caught.value.body


def test_a_text_completion_constraint_error_names_its_field(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(
            model="tiny", prompt="hi", max_tokens=2, extra_body={"guided_regex": "a("}
        )
    assert caught.value.param == "guided_regex", caught.value.body


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_llama_server_completion_constraint_error_names_its_field(port, stream):
    """/completion's stream ends with the error (llama-server's way), naming the field too."""
    body = {"prompt": "hi", "n_predict": 4, "grammar": "root ::= root", "stream": stream}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
    answer = conn.getresponse()
    text = answer.read().decode()
    conn.close()
    if stream:
        events = [line[5:] for line in text.splitlines() if line.startswith("data:")]
        error = json.loads(events[-1])["error"]
    else:
        assert answer.status == 400, text
        error = json.loads(text)["error"]
    assert error["param"] == "grammar" and "invalid constraint" in error["message"], error


def test_a_chat_prompt_past_the_context_names_the_messages(client):
    """The chat route has no ``prompt``: a chat too long for the context is the messages' fault."""
    with pytest.raises(openai.BadRequestError, match="does not fit") as caught:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi " * 9000}], max_tokens=2
        )
    assert caught.value.param == "messages", caught.value.body


def test_a_function_without_parameters_is_called_with_none(client):
    """OpenAI's rule: a function without `parameters` takes none, so its arguments are {} (not an
    object of whatever keys the model makes up); strict holds the same."""
    for strict in (None, True):
        now = {"type": "function", "function": {"name": "now", "strict": strict}}
        done = chat(client, max_tokens=40, seed=3, tools=[now], tool_choice="required")
        assert _calls(done.choices[0]) == [("now", {})], done.choices[0]


def _calls(choice) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]


@pytest.mark.parametrize("parallel", [True, False])
def test_tool_choice_required(client, parallel):
    done = chat(
        client,
        max_tokens=120,
        seed=3,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=parallel,
    )
    [choice] = done.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = _calls(choice)
    assert calls and (parallel or len(calls) == 1)
    for name, arguments in calls:
        assert name in ("get_weather", "get_time")
        if name == "get_weather":
            assert arguments["city"] in ("Paris", "Oslo") and 1 <= arguments["days"] <= 7
        else:
            assert arguments == {"zone": "UTC"} or arguments == {"zone": "CET"}
    ids = [c.id for c in choice.message.tool_calls]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == len(ids)


def test_named_tool_choice_streamed(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    chunks = list(
        chat(
            client,
            max_tokens=120,
            seed=5,
            tools=[WEATHER, TIME],
            tool_choice=named,
            parallel_tool_calls=False,
            stream=True,
        )
    )
    [call] = streamed_calls(chunks)
    assert call["id"].startswith("call_") and call["name"] == "get_time"
    assert json.loads(call["arguments"])["zone"] in ("UTC", "CET")
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["tool_calls"]


def test_tool_choice_auto_answers_or_calls(client):
    done = chat(client, max_tokens=80, seed=8, tools=[WEATHER], temperature=0)
    [choice] = done.choices
    if choice.finish_reason == "tool_calls":
        assert [name for name, _ in _calls(choice)] == ["get_weather"]
    else:
        assert isinstance(choice.message.content, str) and not choice.message.tool_calls


def test_tool_choice_none_leaves_the_output_free(client):
    free = chat(client, max_tokens=12, seed=1, temperature=0)
    none = chat(client, max_tokens=12, seed=1, temperature=0, tools=[WEATHER], tool_choice="none")
    assert none.choices[0].message.content == free.choices[0].message.content
    assert not none.choices[0].message.tool_calls


def test_a_conversation_with_tool_results(client):
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 12 C"},
    ]
    done = client.chat.completions.create(
        model="tiny", messages=messages, tools=[WEATHER], max_tokens=40, seed=2
    )
    assert done.choices[0].finish_reason in ("stop", "length", "tool_calls")
    bad = [
        *messages[:1],
        {
            **messages[1],
            "tool_calls": [
                {
                    **messages[1]["tool_calls"][0],
                    "function": {"name": "get_weather", "arguments": "{oops"},
                }
            ],
        },
    ]
    with pytest.raises(openai.BadRequestError, match="arguments"):
        client.chat.completions.create(model="tiny", messages=bad, max_tokens=4)


def test_the_chat_page_asks_for_json(port, chromium):
    """The page's "Answer as" control sends response_format: the answer is the schema's JSON; a
    schema that is not JSON is said on the page, not sent."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = chromium
    wait = open_chat_page(driver, port)
    Select(driver.find_element(By.ID, "format")).select_by_value("json_schema")
    schema = driver.find_element(By.ID, "schema")
    assert schema.is_displayed()
    schema.send_keys(json.dumps(SCHEMA))
    answer = ask_chat_page(driver, wait, "Give me a record.")
    assert matches_schema(answer), answer
    schema.clear()
    schema.send_keys("{not json")
    driver.find_element(By.ID, "input").send_keys("Again?")
    driver.find_element(By.ID, "send").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".message.error"))
    error = driver.find_element(By.CSS_SELECTOR, ".message.error").text
    assert "not valid JSON" in error


def test_tool_parameters_with_local_definitions(client):
    """Nested models (pydantic's ``$defs``, as ``openai.pydantic_function_tool`` writes them) keep
    their references inside the tool-call envelope."""
    place = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    }
    trip = {
        "type": "function",
        "function": {
            "name": "book_trip",
            "parameters": {
                "$defs": {"Place": place},
                "type": "object",
                "properties": {
                    "start": {"$ref": "#/$defs/Place"},
                    "end": {"$ref": "#/$defs/Place"},
                },
                "required": ["start", "end"],
                "additionalProperties": False,
            },
        },
    }
    done = chat(
        client,
        max_tokens=80,
        seed=1,
        tools=[trip],
        tool_choice="required",
        parallel_tool_calls=False,
    )
    [(name, arguments)] = _calls(done.choices[0])
    assert name == "book_trip"
    assert {arguments["start"]["city"], arguments["end"]["city"]} <= {"Paris", "Oslo"}
