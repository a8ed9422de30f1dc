"""The JSON schema the structured-output tests constrain the tiny model with, and its check."""

from __future__ import annotations

import json

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["ok", "n", "color"],
    "additionalProperties": False,
}


# Tools the tool-call tests offer: an enum city and bounded days (a small model's arguments end
# soon), a time zone, and integer addition.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Oslo"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
# the weather of any city (a free string: a name like "Zürich" round-trips through a template)
ANY_CITY_WEATHER = {
    "type": "function",
    "function": {
        **WEATHER["function"],
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}


def matches_schema(text: str) -> bool:
    """Whether `text` is a JSON object SCHEMA accepts."""
    value = json.loads(text)
    return (
        isinstance(value, dict)
        and set(value) == {"ok", "n", "color"}
        and isinstance(value["ok"], bool)
        and isinstance(value["n"], int)
        and 0 <= value["n"] <= 99
        and value["color"] in ("red", "green", "blue")
    )


def streamed_calls(chunks) -> list[dict]:
    """The tool calls of an `openai` chat stream, assembled as a client does: a call's first
    delta carries its index, id and name, the rest carry fragments of its arguments. Each is
    {"id", "name", "arguments", "deltas"}."""
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for part in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if part.index not in calls:
                assert part.id and part.function.name, "a call's first delta names it"
                calls[part.index] = {"id": part.id, "name": part.function.name, "arguments": ""}
                calls[part.index]["deltas"] = 0
            else:
                assert not part.id and not part.function.name, "only the first delta names it"
            calls[part.index]["arguments"] += part.function.arguments or ""
            calls[part.index]["deltas"] += 1
    assert sorted(calls) == list(range(len(calls)))
    return [calls[k] for k in sorted(calls)]
