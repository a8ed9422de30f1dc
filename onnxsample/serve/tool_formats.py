"""The tool-call formats models are trained on, read from their chat templates.

A chat template that writes ``tools`` has a call syntax of its own, and a model writes calls best
in the syntax it was trained on. These are recognised by the template's text:

==========  ==========================================================  ===========================
format      a call, as the model writes it                              templates
==========  ==========================================================  ===========================
hermes      ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``  Qwen2.5, Qwen3, Hermes 2/3
            (several, one per line)
llama3      ``{"name": ..., "parameters": {...}}`` (one call a turn)       Llama 3.1, 3.2, 3.3
mistral     ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]``  Mistral Nemo, 7B v0.3
==========  ==========================================================  ===========================

Any other template gets the generic envelope (:mod:`onnxsample.serve.tools`). For a native format
the template renders the tools (OpenAI's ``tools`` list) and the conversation's earlier calls and
``tool`` results, in its own words; a grammar (llguidance, Lark with embedded JSON schemas) holds
the answer to the syntax: calls only for ``tool_choice: "required"`` or a named function, text or
calls for ``"auto"``; the answer is read back into OpenAI's ``tool_calls``.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from dataclasses import dataclass
from typing import Any

from onnxsample.errors import InvalidParameter
from onnxsample.serve.envelope import Reading, call_of, parse_prefix
from onnxsample.text.tokenizer import Tokenizer

__all__ = ["NATIVE_FORMATS", "NativeFormat", "call_arguments", "detect"]

NATIVE_FORMATS = ("hermes", "llama3", "mistral")
# llguidance's JSON options for the embedded schemas: compact, as the templates write calls
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_THOUGHT = re.compile(r"<think>[\s\S]*?</think>\s*")
_MISTRAL_ID = re.compile(r"^[a-zA-Z0-9]{9}$")
_ALNUM = string.ascii_letters + string.digits


def detect(template: str | None) -> str | None:
    """The native tool-call format a chat template writes, or None (the generic envelope)."""
    if not template or "tools" not in template:
        return None
    if _OPEN in template:
        return "hermes"
    if "[TOOL_CALLS][" in template:  # not the later [TOOL_CALLS]name[ARGS]{...} (Small 3.2)
        return "mistral"
    if '"parameters": dictionary of argument name' in template:
        return "llama3"
    return None


def _held(text: str, marker: str) -> str:
    """`text` without a tail that may be the start of `marker` (it is not text until it is not)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return text[:-k]
    return text


def _read_hermes(text: str) -> Reading:
    body = text.lstrip()
    if body.startswith("<think>") or (body and "<think>".startswith(body)):
        closed = _THOUGHT.match(body)
        if closed is None:
            return Reading()  # a thought (Qwen3's, empty or not) is not the answer's text
        return _read_hermes(body[closed.end() :])
    first = text.find(_OPEN)
    if first < 0:
        return Reading(response=_held(text, _OPEN) or None)
    calls, at = [], first
    while at >= 0:
        node = parse_prefix(text, at + len(_OPEN))
        call = call_of(text, node, "arguments") if node is not None else None
        if call is None:
            break
        calls.append(call)
        if not node.complete:
            break
        at = text.find(_OPEN, node.end)
    return Reading(calls=tuple(calls), response=text[:first] or None)


def _read_json_calls(text: str, arguments: str, marker: str = "") -> Reading:
    """A text that is either an answer or (after `marker`, when the decoded text keeps it) a JSON
    object (one call) or array (several)."""
    body = text.lstrip()
    if marker and marker.startswith(body):
        return Reading()  # nothing yet, or the marker still being written
    if marker and body.startswith(marker):
        body = body[len(marker) :].lstrip()
    if not body:
        return Reading()
    if body[0] != ("[" if marker else "{"):
        return Reading(response=text)
    node = parse_prefix(body)
    if node is None:
        return Reading()
    items = node.items if node.kind == "array" else [node]
    calls = [call_of(body, item, arguments) for item in items]
    return Reading(calls=tuple(c for c in calls if c), complete=node.complete)


@dataclass(frozen=True)
class NativeFormat:
    """One native format (:data:`NATIVE_FORMATS`) over one tokenizer."""

    name: str
    tokenizer: Tokenizer

    @property
    def arguments_key(self) -> str:
        return "parameters" if self.name == "llama3" else "arguments"

    @property
    def thinks(self) -> bool:
        """Whether the template's model thinks first (``<think>…</think>``, Qwen3)."""
        return "<think>" in (self.tokenizer.chat_template or "")

    @property
    def parallel(self) -> bool:
        """Whether the format writes several calls in one turn (Llama 3's template refuses it)."""
        return self.name != "llama3"

    def read(self, text: str) -> Reading:
        """What an answer holds so far: its text, and its calls."""
        if self.name == "hermes":
            return _read_hermes(text)
        if self.name == "mistral":
            return _read_json_calls(text, "arguments", "[TOOL_CALLS]")
        return _read_json_calls(text, "parameters")

    def call_id(self, given: str) -> str:
        """The id a call goes by in the prompt: Mistral's templates take 9 letters and digits,
        so any other id maps to 9 of them (always the same for the same id)."""
        if self.name != "mistral" or _MISTRAL_ID.match(given):
            return given
        digest = int.from_bytes(hashlib.sha256(given.encode()).digest()[:8], "big")
        return "".join(_ALNUM[(digest >> (6 * k)) % len(_ALNUM)] for k in range(9))

    def new_id(self) -> str | None:
        """The id of a call the model writes (None: the stream's ``call_…``)."""
        return None

    def grammar(
        self, tools: list[dict], allow_response: bool, parallel: bool, defs: dict | None = None
    ) -> str:
        """The Lark grammar (llguidance) of an answer: calls of `tools` (each ``{"name",
        "parameters"}``, their ``$defs`` references pointing into `defs`), or with
        `allow_response` also plain text."""
        items = []
        for t in tools:
            props = {"name": {"const": t["name"]}, self.arguments_key: t["parameters"]}
            required = ["name", self.arguments_key]
            if self.name == "mistral":
                props["id"] = {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}
                required.append("id")
            items.append(
                {
                    "type": "object",
                    "properties": props,
                    "required": required,
                    "additionalProperties": False,
                }
            )
        item: dict[str, Any] = items[0] if len(items) == 1 else {"anyOf": items}
        if defs:
            item = {**item, "$defs": defs}
        several = parallel and self.parallel
        if self.name == "hermes":
            call = f'"{_OPEN}\\n" %json {_schema(item)} "\\n{_CLOSE}"'
            calls = f'call ("\\n" call)*\ncall: {call}' if several else f"call\ncall: {call}"
            text = r"/[^<][\s\S]*/"
            # a thought may come first, as Qwen3 writes them (its text without tags)
            thought = 'thought: "<think>" /[^<]*/ "</think>" /\\s*/'
        elif self.name == "llama3":
            calls, text = f"%json {_schema(item)}", r"/[^{\s][\s\S]*/"
        else:
            array: dict[str, Any] = {"type": "array", "items": item, "minItems": 1}
            if defs:  # the references resolve from the embedded schema's root
                array = {**array, "items": {k: v for k, v in item.items() if k != "$defs"}}
                array["$defs"] = defs
            if not several:
                array["maxItems"] = 1
            # SentencePiece vocabularies (Mistral 7B v0.3) write the array after a space
            marker = f'{self._mistral_marker()} " "?'
            calls, text = f"{marker} %json {_schema(array)}", r"/[^\[][\s\S]*/"
        start = "calls | TEXT" if allow_response else "calls"
        lines = [f"start: {start}", f"calls: {calls}"]
        if self.name == "hermes" and self.thinks:
            lines[0] = f"start: thought? ({start})"
            lines.append(thought)
        if allow_response:
            lines.append(f"TEXT: {text}")
        return "\n".join(lines) + "\n"

    def _mistral_marker(self) -> str:
        """``[TOOL_CALLS]`` in the grammar: its special token where the vocabulary has one."""
        ids = self.tokenizer.encode("[TOOL_CALLS]", add_special_tokens=False)
        if len(ids) == 1 and ids[0] in self.tokenizer.special_ids:
            return f"<[{ids[0]}]>"
        return '"[TOOL_CALLS]"'

    def messages(self, body: Any) -> list[dict]:
        """The chat's messages as the template reads them: an assistant's calls as
        ``tool_calls`` with arguments as objects, ``tool`` results with their call's id (and
        name, where an earlier call gives it)."""
        names: dict[str, str] = {}
        out: list[dict] = []
        for m in body.messages:
            role = "system" if m.role == "developer" else m.role
            content = m.text() if m.role == "tool" else m.template_content()
            message: dict[str, Any] = {"role": role, "content": content}
            if m.role == "assistant" and m.tool_calls:
                calls = []
                for c in m.tool_calls:
                    names[c.id] = c.function.name
                    calls.append(
                        {
                            "id": self.call_id(c.id),
                            "type": "function",
                            "function": {
                                "name": c.function.name,
                                "arguments": call_arguments(c.function.arguments),
                            },
                        }
                    )
                message["tool_calls"] = calls
            elif m.role == "tool":
                message["tool_call_id"] = self.call_id(m.tool_call_id or "")
                if m.tool_call_id in names:
                    message["name"] = names[m.tool_call_id]
            out.append(message)
        return out


def _schema(schema: dict) -> str:
    return json.dumps({**schema, "x-guidance": _COMPACT}, ensure_ascii=False)


def call_arguments(raw: str) -> Any:
    """An earlier call's ``function.arguments`` (JSON text) as the value it holds;
    InvalidParameter when it is not JSON."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        raise InvalidParameter(
            "messages: an assistant tool call's function.arguments must be a JSON text"
        ) from None
