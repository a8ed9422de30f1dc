"""Request bodies of the OpenAI-compatible API, as pydantic models.

Fields follow OpenAI's API, plus the extensions vLLM and llama-server users send (``top_k``,
``min_p``, ``typical_p``, ``repetition_penalty``, ``ignore_eos``, ``min_tokens``, and structured
output: ``json_schema``, ``grammar``, ``structured_outputs``, ``guided_*``). Unknown fields are
accepted and ignored, as vLLM does. Types are checked here: booleans strictly, as OpenAI's API checks
them (no string or number read as a boolean), numbers as vLLM reads them (a number's text too, a
boolean never); ranges are checked by
:meth:`onnxsample.SamplingParams.validate`, whose messages the client gets. A ``null`` stands for
the field's default, as in OpenAI's API; in a request's body a string that is not Unicode text
(a lone surrogate, which JSON's ``\\ud800`` escapes can spell) is refused at any depth, the
extras it keeps included.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from onnxsample.text import join_text_parts


def _not_a_bool(value: Any) -> Any:
    if isinstance(value, bool):  # pydantic's lax float reads true as 1.0
        raise PydanticCustomError("float_type", "Input should be a number, not a boolean")
    return value


# A number as vLLM reads one (a number's text too, as some clients send it), never a boolean.
_Number = Annotated[float, BeforeValidator(_not_a_bool)]


def _has_lone_surrogate(value: Any) -> bool:
    """Whether a string in `value` (strings, lists and objects, keys included, at any depth)
    holds a lone surrogate; a walk without recursion, that builds nothing."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif kind is list:
            if not all(type(x) is int for x in item):  # token ids: nothing to look at
                stack.extend(item)
        elif kind is dict:
            stack.extend(item)
            stack.extend(item.values())
    return False


def _where_not_text(value: Any, path: str) -> str:
    """Where in `value` the first lone surrogate is (there is one), as a path."""
    stack = [(value, path)]
    while stack:
        item, at = stack.pop()
        if type(item) is str:
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"{at} (character {exc.start}: {item[exc.start]!r})"
        elif type(item) is list:
            stack.extend((x, f"{at}[{i}]") for i, x in reversed(list(enumerate(item))))
        elif type(item) is dict:
            for key, x in reversed(list(item.items())):
                stack += [(x, f"{at}.{key}"), (key, f"{at} (a key)")]
    return path


def _refuse_not_text(value: Any, name: str) -> None:
    if _has_lone_surrogate(value):
        raise PydanticCustomError(
            "unicode",
            "not Unicode text: a lone surrogate at {where}",
            {"where": _where_not_text(value, name)},
        )


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")
    # A request's body (not a part of one): its fields, and the extras it keeps, are looked at for
    # strings that are not Unicode text, at any depth, once.
    _request: ClassVar[bool] = False

    @field_validator("*", mode="before")
    @classmethod
    def _null_is_the_default(cls, value: Any, info: ValidationInfo) -> Any:
        """``null`` for a field with a default is that default; in a request, no string may be
        other than Unicode text."""
        field = cls.model_fields[info.field_name]
        if value is None:
            return None if field.is_required() else field.get_default(call_default_factory=True)
        if cls._request:
            _refuse_not_text(value, field.alias or info.field_name)
        return value

    @model_validator(mode="after")
    def _extras_are_text(self) -> _Body:
        if self._request:
            for name, value in (self.model_extra or {}).items():
                _refuse_not_text(value, name)
        return self


class StreamOptions(_Body):
    include_usage: StrictBool = False
    # vLLM's usage on every chunk: refused (the last chunk carries it, with include_usage)
    continuous_usage_stats: StrictBool = False

    @field_validator("continuous_usage_stats")
    @classmethod
    def _not_continuous(cls, value: bool) -> bool:
        if value:
            raise PydanticCustomError(
                "stream_options",
                "not supported (include_usage puts the usage on the last chunk)",
            )
        return value


class JsonSchemaFormat(_Body):
    """OpenAI's ``response_format.json_schema``."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(_Body):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # llama-server


class StructuredOutputs(_Body):
    """vLLM's ``structured_outputs``."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: StrictBool | None = None
    whitespace_pattern: str | None = None  # refused: not supported
    structural_tag: Any = None  # refused: not supported
    # objects that name their properties take no other keys unless they say so, either way
    disable_additional_properties: StrictBool | None = None

    def model_dump(self, **kwargs) -> dict[str, Any]:  # the API's names
        dumped = super().model_dump(**kwargs)
        dumped["json"] = dumped.pop("json_")
        return dumped


class SamplingFields(_Body):
    """What chat and text completions share. Fields it does not name are kept (``model_extra``)
    for :func:`~onnxsample.serve.peer_fields.refuse_unsupported`, then ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: StrictInt | None = None
    temperature: _Number | None = None
    top_p: _Number | None = None
    n: StrictInt = 1
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    timings_per_token: StrictBool = False  # llama-server: every streamed chunk has its timings
    return_progress: StrictBool = False  # llama-server: a stream says how far the prompt is
    logit_bias: dict[str, _Number] | None = None
    presence_penalty: _Number | None = None
    frequency_penalty: _Number | None = None
    user: str | None = None
    top_k: StrictInt | None = None
    min_p: _Number | None = None
    typical_p: _Number | None = None
    temperature_last: StrictBool | None = None  # text-generation-webui's: llama.cpp's order
    repetition_penalty: _Number | None = None
    ignore_eos: StrictBool = False
    cache_prompt: StrictBool = True  # llama-server: false computes the whole prompt anew
    min_tokens: StrictInt = 0
    response_format: ResponseFormat | None = None
    json_schema: dict[str, Any] | None = None  # llama-server
    grammar: str | None = None  # llama-server (GBNF or Lark)
    structured_outputs: StructuredOutputs | None = None  # vLLM
    guided_json: dict[str, Any] | str | None = None  # vLLM, older
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None  # refused: not supported

    @field_validator("stream_options")
    @classmethod
    def _only_with_a_stream(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and not info.data.get("stream"):  # as OpenAI and vLLM refuse it
            raise PydanticCustomError("stream_options", "only allowed with stream=true")
        return value


class ContentPart(_Body):
    type: str
    text: str | None = None


class FunctionCall(_Body):
    name: str
    arguments: str = "{}"


class ToolCall(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers

    @model_validator(mode="before")
    @classmethod
    def _has_content(cls, data: Any) -> Any:
        """A message has ``content`` (null too) or ``tool_calls``, as llama-server reads one
        ("Expected 'content' or 'tool_calls'"; OpenAI also needs it), and a text part its text."""
        if isinstance(data, dict) and "content" not in data and "tool_calls" not in data:
            raise PydanticCustomError("content", "a message needs content or tool_calls")
        parts = data.get("content") if isinstance(data, dict) else None
        for part in parts if isinstance(parts, list) else []:
            # OpenAI's API requires it (it read as an empty text)
            if isinstance(part, dict) and part.get("type") == "text" and part.get("text") is None:
                raise PydanticCustomError("content", "a text part needs its text")
        return data

    def text(self) -> str:
        """The message as one string: text parts joined as llama-server and vLLM join them for a
        template that takes a string; other parts are refused upstream."""
        content = self.template_content()
        return content if isinstance(content, str) else join_text_parts(content)

    def template_content(self) -> str | list[dict]:
        """The content as the chat template gets it: a string, or its text parts as a list (the
        tokenizer joins them for a template that takes a string)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return [{"type": "text", "text": part.text or ""} for part in self.content]


class FunctionDefinition(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(_Body):
    type: str
    function: FunctionDefinition | None = None


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction | None = None


class ChatPromptFields(_Body):
    """What, beside the messages, makes a chat's prompt: the chat route's and `/tokenize`'s."""

    chat_template_kwargs: dict[str, Any] | None = None  # the template's variables (vLLM's)
    reasoning_effort: StrictStr | None = None  # OpenAI's: a template variable, as peers pass it
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    # vLLM's: open the assistant's turn after the messages (the default), or leave the final
    # message open for the answer to continue it (transformers' rule)
    add_generation_prompt: StrictBool | None = None
    continue_final_message: StrictBool | None = None

    def template_options(self) -> dict[str, bool]:
        """The chat template's ``add_generation_prompt`` and ``continue_final_message``."""
        return {
            "add_generation_prompt": self.add_generation_prompt is not False,
            "continue_final_message": bool(self.continue_final_message),
        }


class ChatRequest(SamplingFields, ChatPromptFields):
    model_config = ConfigDict(extra="allow")  # SamplingFields': kept for refuse_unsupported

    _request: ClassVar[bool] = True
    messages: list[ChatMessage] = Field(min_length=1)
    parallel_tool_calls: StrictBool | None = None
    # llama-server's: a thought apart (auto, deepseek) or in the content (none, the default)
    reasoning_format: Literal["none", "auto", "deepseek"] | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None


class CompletionRequest(SamplingFields):
    _request: ClassVar[bool] = True
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    logprobs: StrictInt | None = None
    echo: StrictBool = False


class TokenizeRequest(ChatPromptFields):
    """llama-server's ``content`` or vLLM's ``prompt`` (text), or vLLM's ``messages`` (a chat, with
    its tools), each with its server's options (:func:`~onnxsample.serve.tokenize.tokenized`).
    Fields it does not name are kept (``model_extra``) for
    :func:`~onnxsample.serve.peer_fields.refuse_unsupported`."""

    model_config = ConfigDict(extra="allow")
    _request: ClassVar[bool] = True

    model: str | None = None  # vLLM's: another model's name is a 404 (its tokens would differ)
    content: str | list[str | StrictInt] | None = None  # llama-server's: text and ids mixed too
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_special: StrictBool | None = None  # llama-server's
    add_special_tokens: StrictBool | None = None  # vLLM's
    with_pieces: StrictBool = False  # llama-server's
    return_token_strs: StrictBool = False  # vLLM's


class DetokenizeRequest(_Body):
    _request: ClassVar[bool] = True
    model: str | None = None
    tokens: list[StrictInt]
