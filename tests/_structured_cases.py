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
