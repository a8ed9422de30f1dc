"""Tool calls (OpenAI's ``tools``, ``tool_choice``, ``parallel_tool_calls``) on any model.

A chat template without a tool-call format of its own (the embedded model's has none) gets the
generic JSON envelope llama-server uses for such models: the tools and the envelope are described
in a system message, and a JSON schema constrains the answer to

- ``{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}`` (one item when
  ``parallel_tool_calls`` is false), each name one of the tools and its arguments that tool's
  ``parameters`` schema, or
- ``{"response": "..."}``, a plain answer, which ``tool_choice: "auto"`` allows beside the calls;
  ``"required"`` and a named function allow calls only (of that function).

A function's ``parameters`` must be an object schema (``strict: true`` holds it to OpenAI's
structured-output rules); a function without them takes none (its arguments are ``{}``).
``tool_choice: "none"`` leaves the tools out of the prompt and the output free. The answer is read
back (:mod:`onnxsample.serve.envelope`) into ``message.tool_calls`` (``finish_reason:
"tool_calls"``) or ``message.content``, streamed as OpenAI streams them; an answer cut by the token
limit keeps the calls it wrote whole (``finish_reason: "length"``), and one that repeats a call ends
at the repeat.
Earlier turns are written back in the same envelope: an assistant message's ``tool_calls`` as its
JSON, a ``tool`` message as ``{"tool_response": {"tool_call_id", "content"}}``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from onnxsample.constraint import Constraint
from onnxsample.errors import InvalidParameter
from onnxsample.serve.convert import FINISH
from onnxsample.serve.envelope import EnvelopeStream, Reading, read
from onnxsample.serve.reasoning import split_thought
from onnxsample.serve.schemas import ChatRequest, FunctionDefinition
from onnxsample.serve.structured import check_strict
from onnxsample.serve.tool_formats import NativeFormat, call_arguments, detect
from onnxsample.text.tokenizer import Tokenizer

__all__ = [
    "ToolPlan",
    "ToolWatch",
    "answer",
    "chat_prompt",
    "chat_text",
    "envelope_messages",
    "loop_watch",
    "native_format",
    "plan_tools",
]

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# A function without `parameters` takes none: its arguments are {} (OpenAI's rule).
_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class ToolPlan:
    """What a chat request's tools make of it: the system text to add, the constraint, and how
    to read the answer back."""

    tools: tuple[dict, ...]
    constraint: Constraint
    allow_response: bool
    native: NativeFormat | None = None  # the template's own format; None: the envelope

    def read(self, text: str) -> Reading:
        """What the answer holds so far (its text and its calls), in the plan's format."""
        return self.native.read(text) if self.native is not None else read(text)

    def system_text(self) -> str:
        listed = json.dumps(
            [
                {
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "parameters": t["parameters"],
                }
                for t in self.tools
            ],
            ensure_ascii=False,
        )
        either = (
            'either with "tool_calls" (a request to call tools) or with "response" (your reply '
            "to the user's request)"
            if self.allow_response
            else 'with "tool_calls" (a request to call tools)'
        )
        return (
            f"You can call the following tools:\n{listed}\n\nRespond in JSON format, {either}. "
            'A tool call is {"name": <tool name>, "arguments": <its arguments as a JSON object>}.'
        )


def native_format(tokenizer: Tokenizer) -> NativeFormat | None:
    """The tool-call format of the model's chat template, or None for the envelope."""
    found = detect(tokenizer.chat_template)
    return NativeFormat(found, tokenizer) if found else None


def plan_tools(body: ChatRequest, native: NativeFormat | None = None) -> ToolPlan | None:
    """The tool plan of a chat request, or None when it has no tools or ``tool_choice`` is
    ``none``; InvalidParameter for a malformed tool or choice. With `native`, calls are held to
    the chat template's own syntax."""
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none"):
            raise InvalidParameter("tool_choice needs tools")
        return None
    tools = []
    for i, tool in enumerate(body.tools):
        if tool.type != "function":
            raise InvalidParameter(f"tools[{i}]: only tools of type function are supported")
        if tool.function is None:
            raise InvalidParameter(f"tools[{i}].function is missing: a function needs its name")
        name = tool.function.name
        if not _NAME.match(name):
            raise InvalidParameter(
                f"tools[{i}].function.name must be 1 to 64 letters, digits, _ or -, got {name!r}"
            )
        parameters = _parameters(tool.function, f"tools[{i}].function.parameters")
        tools.append(
            {
                "name": name,
                "description": tool.function.description or "",
                "parameters": parameters,
            }
        )
    names = [t["name"] for t in tools]
    if len(set(names)) != len(names):
        raise InvalidParameter("tools: function names must be unique")
    if choice == "none":
        return None
    allow_response = choice in (None, "auto")
    if choice not in (None, "auto", "required"):
        named = choice.function.name if choice.function is not None else None
        if named is None:
            raise InvalidParameter("tool_choice names no function: give function.name")
        if named not in names:
            raise InvalidParameter(
                f"tool_choice names function {named!r}, which is not among the tools"
            )
        tools = [t for t in tools if t["name"] == named]
    if native is None:
        return ToolPlan(tuple(tools), _envelope(tools, allow_response, body), allow_response)
    defs: dict[str, Any] = {}
    hoisted = [
        {"name": t["name"], "parameters": _hoisted(t["parameters"], f"{t['name']}__", defs)}
        for t in tools
    ]
    grammar = native.grammar(hoisted, allow_response, body.parallel_tool_calls is not False, defs)
    return ToolPlan(tuple(tools), Constraint.grammar(grammar), allow_response, native)


def _parameters(function: FunctionDefinition, where: str) -> dict:
    """A function's arguments schema: a JSON object's (OpenAI refuses any other type), held to
    OpenAI's rules when the function is ``strict``; none when it has no `parameters`."""
    parameters = function.parameters or _NO_PARAMETERS
    kind = parameters.get("type", "object")
    if kind != "object":
        raise InvalidParameter(
            f"{where}: arguments are a JSON object, so its type is object, got {kind!r}"
        )
    for key in ("$defs", "definitions"):
        if not isinstance(parameters.get(key, {}), dict):
            raise InvalidParameter(f"{where}: {key} must be an object of schemas")
    if function.strict:
        check_strict(parameters, where)
    return parameters


def _listed_tools(body: ChatRequest) -> list[dict] | None:
    """The request's tools as a template with its own tool format is given them (none when
    ``tool_choice`` is ``none``)."""
    if not body.tools or body.tool_choice == "none":
        return None
    return [
        {
            "type": "function",
            "function": {
                "name": t.function.name,
                "description": t.function.description or "",
                # as llama-server lists it: the constraint holds it to no arguments
                "parameters": t.function.parameters if t.function.parameters is not None else {},
            },
        }
        for t in body.tools
    ]


def check_text_only(body: ChatRequest) -> None:
    """InvalidParameter for a message with content parts other than text."""
    for m in body.messages:
        if isinstance(m.content, list) and any(p.type != "text" for p in m.content):
            raise InvalidParameter("messages: only text content parts are supported")


def _template_call(
    tokenizer: Tokenizer, body: ChatRequest, native: NativeFormat | None, plan: ToolPlan | None
) -> tuple[list[dict], list[dict] | None, dict[str, Any] | None]:
    """The chat template's messages, tools and variables for a chat: a template with its own tool
    format writes the tools, calls and results itself; any other gets them in the envelope (the
    results in a user's turn where it writes no ``tool`` message)."""
    if native is not None:
        return native.messages(body), _listed_tools(body), template_variables(body)
    role = "tool" if tokenizer.writes_tool_messages else "user"
    return envelope_messages(body, plan, role), None, template_variables(body)


def chat_prompt(
    tokenizer: Tokenizer, body: ChatRequest, native: NativeFormat | None, plan: ToolPlan | None
) -> list[int] | list[dict]:
    """What the engine is given for a chat: token ids where the template writes the tools or takes
    the request's variables, else the messages (tool calls and results in the envelope), which the
    engine renders as :meth:`~onnxsample.text.Tokenizer.apply_chat_template` does."""
    messages, listed, variables = _template_call(tokenizer, body, native, plan)
    options = body.template_options()
    engines = options == {"add_generation_prompt": True, "continue_final_message": False}
    if native is None and variables is None and engines:  # as the engine renders messages
        return messages
    return tokenizer.apply_chat_template(messages, tools=listed, variables=variables, **options)


def chat_text(
    tokenizer: Tokenizer, body: ChatRequest, native: NativeFormat | None, plan: ToolPlan | None
) -> str:
    """The text the chat template makes of a chat: what :func:`chat_prompt` tokenises."""
    messages, listed, variables = _template_call(tokenizer, body, native, plan)
    options = body.template_options()
    return tokenizer.render_chat(messages, tools=listed, variables=variables, **options)


def template_variables(body: ChatRequest) -> dict[str, Any] | None:
    """The chat template's variables beyond the messages: ``chat_template_kwargs``, and OpenAI's
    ``reasoning_effort`` as llama-server passes it (the variable ``reasoning_effort``; ``none``
    sets ``enable_thinking`` false instead), over a variable of the same name."""
    variables = dict(body.chat_template_kwargs or {})
    if body.reasoning_effort == "none":
        variables.pop("reasoning_effort", None)
        variables["enable_thinking"] = False
    elif body.reasoning_effort:
        variables["reasoning_effort"] = body.reasoning_effort
    return variables or None


def _hoisted(parameters: dict, prefix: str, defs: dict) -> dict:
    """A tool's `parameters` schema with its local definitions (``$defs``/``definitions``) moved
    into the envelope's `defs` under `prefix`, and its ``#/$defs/...`` references rewritten, so they
    still resolve once the schema sits inside the envelope."""
    own = {**parameters.get("definitions", {}), **parameters.get("$defs", {})}
    names = {name: f"{prefix}{name}" for name in own}

    def rewrite(node: Any) -> Any:
        if isinstance(node, list):
            return [rewrite(item) for item in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            if key in ("$defs", "definitions") and node is parameters:
                continue
            if key == "$ref" and isinstance(value, str):
                for root in ("#/$defs/", "#/definitions/"):
                    if value.startswith(root) and value[len(root) :].split("/")[0] in names:
                        rest = value[len(root) :]
                        head, _, tail = rest.partition("/")
                        value = f"#/$defs/{names[head]}" + (f"/{tail}" if tail else "")
            out[key] = rewrite(value)
        return out

    for name, schema in own.items():
        defs[names[name]] = rewrite(schema)
    return rewrite(parameters)


def _envelope(tools: list[dict], allow_response: bool, body: ChatRequest) -> Constraint:
    defs: dict[str, Any] = {}
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["name"]},
                "arguments": _hoisted(t["parameters"], f"{t['name']}__", defs),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    items: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    array: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if body.parallel_tool_calls is False:
        array["maxItems"] = 1
    options: list[dict] = [
        {
            "type": "object",
            "properties": {"tool_calls": array},
            "required": ["tool_calls"],
            "additionalProperties": False,
        }
    ]
    if allow_response:
        options.append(
            {
                "type": "object",
                "properties": {"response": {"type": "string"}},
                "required": ["response"],
                "additionalProperties": False,
            }
        )
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    if defs:
        schema = {**schema, "$defs": defs}
    return Constraint.json_schema(schema)


def envelope_messages(
    body: ChatRequest, plan: ToolPlan | None, tool_role: str = "tool"
) -> list[dict]:
    """The chat's messages for the template: earlier tool calls and tool results written in the
    envelope (a result in a `tool_role` message), and the tools' system text first (joined to a
    system message already there)."""
    messages = []
    for m in body.messages:
        content = m.template_content()  # a string, or text parts the tokenizer joins or passes
        if m.role == "assistant" and m.tool_calls:
            calls = [
                {"name": c.function.name, "arguments": call_arguments(c.function.arguments)}
                for c in m.tool_calls
            ]
            content = json.dumps({"tool_calls": calls}, ensure_ascii=False)
        role = "system" if m.role == "developer" else m.role
        if m.role == "tool":
            response = {"tool_call_id": m.tool_call_id, "content": m.text()}
            content = json.dumps({"tool_response": response}, ensure_ascii=False)
            role = tool_role
        messages.append({"role": role, "content": content})
    if plan is not None:
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = f"{body.messages[0].text()}\n\n{plan.system_text()}"
        else:
            messages.insert(0, {"role": "system", "content": plan.system_text()})
    return messages


def answer(completion, plan: ToolPlan | None, opened: bool | None = None) -> tuple[dict, str]:
    """A finished choice as OpenAI's ``message`` and ``finish_reason``: with tools, the calls it
    wrote whole (a cut answer keeps those before the cut, a looping one those before its first
    repeat) or its response's text, never the envelope's own text. `opened` (not None: the
    thought goes apart, :mod:`~onnxsample.serve.reasoning`) says whether the prompt opened it."""
    finish = FINISH[completion.finish_reason]
    thought, text = None, completion.text
    if opened is not None:
        thought, text = split_thought(text, opened)
    if plan is None:
        message: dict[str, Any] = {"role": "assistant", "content": text}
    else:
        stream = EnvelopeStream(plan.read)
        stream.feed(text)
        content, calls, finish = stream.message(finish)
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
    if thought:
        message["reasoning_content"] = thought
    return message, finish


class ToolWatch:
    """Each choice's answer read as it grows, in the plan's format: the stream deltas it adds
    (:class:`~onnxsample.serve.envelope.EnvelopeStream`), and whether it repeated a call it
    already wrote (the answer ends there)."""

    def __init__(self, plan: ToolPlan, choices: int) -> None:
        self.streams = [EnvelopeStream(plan.read) for _ in range(choices)]
        self._written = [""] * choices

    def feed(self, k: int, event) -> list[dict]:
        """The deltas choice `k`'s stream event adds (its completion: the whole text)."""
        done = event.completion
        self._written[k] = done.text if done is not None else self._written[k] + event.text
        return self.feed_text(k, self._written[k])

    def feed_text(self, k: int, text: str) -> list[dict]:
        """The deltas choice `k`'s answer adds, `text` being all of it so far."""
        return self.streams[k].feed(text)

    def repeated(self, k: int) -> bool:
        return self.streams[k].repeated


def loop_watch(plan: ToolPlan | None, choices: int):
    """For :func:`~onnxsample.serve.relay.collect`: whether a choice's answer repeated a call
    it already wrote, so that it ends there."""
    if plan is None:
        return lambda k, event: False
    watch = ToolWatch(plan, choices)

    def ends(k: int, event) -> bool:
        watch.feed(k, event)
        return watch.repeated(k)

    return ends
