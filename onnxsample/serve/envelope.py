"""Reading the tool-call envelope while it is written: what OpenAI's API streams, and what a cut
answer still holds.

The envelope (:mod:`onnxsample.serve.tools`) is JSON that a grammar keeps well formed, so every
prefix of it is a prefix of valid JSON: ``{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}``
or ``{"response": "..."}``. :func:`read` parses such a prefix and says how far each part got;
:class:`EnvelopeStream` turns the growing text into OpenAI's deltas: a call's index, id and name
once its name is written, then its arguments in fragments of the model's own text, and a response's
text as it grows.

A call written again with the same name and arguments (the same text) in one answer is the same
call: a model that loops on one call (small models do) is :attr:`EnvelopeStream.repeated` at the
first repeat, and the server ends the answer there with the calls before it (``finish_reason:
"tool_calls"``). Nothing of a call that may still turn out to be a repeat is streamed until its
text differs from the earlier call's.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Call", "EnvelopeStream", "Reading", "call_of", "parse_prefix", "read"]

_WS = " \t\r\n"
_SCALAR = set("-+0123456789.eEtruefalsn")


@dataclass
class _Node:
    """A JSON value in a prefix: its kind, where it starts and ends (`end` is the text's length
    while it is open), whether it is complete, and what it holds so far."""

    kind: str  # object, array, string, scalar
    start: int
    end: int
    complete: bool
    items: list = field(default_factory=list)  # object: (key, node); array: node
    text: str = ""  # string: the characters decoded so far


def _skip(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _string(s: str, i: int) -> _Node:
    j, n = i + 1, len(s)
    while j < n:
        if s[j] == "\\":
            j += 2
            continue
        if s[j] == '"':
            return _Node("string", i, j + 1, True, text=json.loads(s[i : j + 1]))
        j += 1
    raw, k = s[i + 1 : n], 0
    while k < len(raw):  # leave out an escape that is not whole yet (\ or \u with < 4 digits)
        if raw[k] == "\\":
            step = 6 if raw[k + 1 : k + 2] == "u" else 2
            if k + step > len(raw):
                raw = raw[:k]
                break
            k += step
        else:
            k += 1
    text = json.loads(f'"{raw}"')
    if text and "\ud800" <= text[-1] <= "\udbff":
        text = text[:-1]  # the first half of a surrogate pair: its character is not whole yet
    return _Node("string", i, n, False, text=text)


def _value(s: str, i: int) -> _Node | None:
    i = _skip(s, i)
    if i >= len(s):
        return None
    c = s[i]
    if c == '"':
        return _string(s, i)
    if c in "{[":
        node = _Node("object" if c == "{" else "array", i, len(s), False)
        close = "}" if c == "{" else "]"
        j = i + 1
        while True:
            j = _skip(s, j)
            if j >= len(s):
                return node
            if s[j] == close:
                node.end, node.complete = j + 1, True
                return node
            if s[j] == ",":
                j += 1
                continue
            key = None
            if node.kind == "object":
                if s[j] != '"':
                    return node
                name = _string(s, j)
                if not name.complete:
                    return node
                j = _skip(s, name.end)
                if j >= len(s) or s[j] != ":":
                    return node
                key, j = name.text, j + 1
            item = _value(s, j)
            if item is None:
                return node
            node.items.append((key, item) if node.kind == "object" else item)
            if not item.complete:
                return node
            j = item.end
    j = i
    while j < len(s) and s[j] in _SCALAR:
        j += 1
    if j == i:
        return None  # not JSON: nothing more is read
    return _Node("scalar", i, j, j < len(s))


@dataclass(frozen=True)
class Call:
    """A call as far as it is written: its name once whole, its arguments' text so far (the
    model's own JSON), whether the call is complete."""

    name: str | None
    arguments: str
    complete: bool


@dataclass(frozen=True)
class Reading:
    """What a prefix of the envelope holds: calls, or a response's text (``None``: neither yet)."""

    calls: tuple[Call, ...] = ()
    response: str | None = None
    complete: bool = False  # the whole envelope is written


def call_of(text: str, node: _Node, arguments: str) -> Call | None:
    """The call a JSON object of `text` holds so far (`node`, from :func:`parse_prefix`): its
    ``name`` once whole, and the text of its `arguments` key; None for a value not an object."""
    if node.kind != "object":
        return None
    parts = dict(node.items)
    name, args = parts.get("name"), parts.get(arguments)
    return Call(
        name.text if name is not None and name.complete else None,
        text[args.start : args.end] if args is not None else "",
        node.complete,
    )


def parse_prefix(text: str, start: int = 0) -> _Node | None:
    """The JSON value that starts at `start` (after whitespace), as far as `text` holds it;
    None when nothing of it is written yet."""
    return _value(text, start)


def read(text: str) -> Reading:
    """Parse a prefix of the envelope (see the module's docstring)."""
    root = _value(text, 0)
    if root is None or root.kind != "object":
        return Reading()
    for key, node in root.items:
        if key == "response" and node.kind == "string":
            return Reading(response=node.text, complete=root.complete)
        if key == "tool_calls" and node.kind == "array":
            calls = [call_of(text, item, "arguments") for item in node.items]
            return Reading(calls=tuple(c for c in calls if c), complete=root.complete)
    return Reading(complete=root.complete)


class EnvelopeStream:
    """One choice's envelope as OpenAI's stream deltas: :meth:`feed` the whole text so far, get
    the ``delta`` dicts to send (``tool_calls`` entries, or ``content``)."""

    def __init__(self, reader: Callable[[str], Reading] = read) -> None:
        self.reader = reader
        self.text = ""
        self.ids: list[str] = []  # the id of every call started
        self._sent_args: list[int] = []
        self._sent_response = 0
        self._kept = 0  # complete calls before a repeat
        self.repeated = False  # a complete call repeated an earlier one: the answer ends

    def feed(self, text: str) -> list[dict]:
        self.text = text
        reading = self.reader(text)
        deltas: list[dict] = []
        said: list[dict] = []
        if reading.response is not None:
            new = reading.response[self._sent_response :]
            self._sent_response = len(reading.response)
            said = [{"content": new}] if new else []
        for k, call in enumerate(reading.calls):
            if self.repeated or call.name is None:
                break
            earlier = [c.arguments for c in reading.calls[:k] if c.name == call.name]
            if call.complete and call.arguments in earlier:
                self.repeated = True  # the same call again: the answer ends before it
                break
            if call.complete:
                self._kept = k + 1
            elif any(e.startswith(call.arguments) for e in earlier):
                break  # it may be a repeat: nothing of it is sent until it differs
            if k == len(self.ids):
                self.ids.append(f"call_{secrets.token_hex(12)}")
                self._sent_args.append(0)
                function = {"name": call.name, "arguments": ""}
                deltas.append(
                    {"index": k, "id": self.ids[k], "type": "function", "function": function}
                )
            fragment = call.arguments[self._sent_args[k] :]
            if fragment:
                self._sent_args[k] = len(call.arguments)
                deltas.append({"index": k, "function": {"arguments": fragment}})
        return said + [{"tool_calls": [d]} for d in deltas]

    def message(self, finish: str) -> tuple[str | None, list[dict], str]:
        """(content, tool_calls, finish_reason) of the answer as written, `finish` being the
        engine's reason: the complete calls (those before a repeat), each with the id it was
        streamed under; the response's text; never the envelope's own text."""
        reading = self.reader(self.text)
        content = reading.response
        calls = [c for c in reading.calls if c.complete]
        if not calls and not reading.calls:
            return content, [], finish
        content = (content or "").strip() or None  # text before the calls (a native format's)
        if self.repeated:
            calls, finish = calls[: self._kept], "tool_calls"
        while len(self.ids) < len(calls):
            self.ids.append(f"call_{secrets.token_hex(12)}")
        out = [
            {
                "id": self.ids[k],
                "type": "function",
                "function": {"name": c.name, "arguments": _compact(c.arguments)},
            }
            for k, c in enumerate(calls)
        ]
        if out and finish == "stop":
            finish = "tool_calls"
        return content, out, finish


def _compact(arguments: str) -> str:
    value: Any = json.loads(arguments)
    return json.dumps(value, ensure_ascii=False)
