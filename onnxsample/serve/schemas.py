"""Request bodies of the OpenAI-compatible API, as pydantic models.

Fields follow OpenAI's API, plus the extensions vLLM and llama-server users send (``top_k``,
``min_p``, ``typical_p``, ``repetition_penalty``, ``ignore_eos``, ``min_tokens``). Unknown fields
are accepted and ignored, as vLLM does. Types are checked here; ranges are checked by
:meth:`onnxsample.SamplingParams.validate`, whose messages the client gets.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class SamplingFields(_Body):
    """What chat and text completions share."""

    model: str | None = None
    max_tokens: StrictInt | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: StrictInt = 1
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None
    top_k: StrictInt | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: StrictInt = 0


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        """The message as one string (text parts joined); other parts are refused upstream."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None
    logprobs: bool = False
    top_logprobs: StrictInt | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    logprobs: StrictInt | None = None
    echo: bool = False


class TokenizeRequest(_Body):
    """llama-server's ``content`` or vLLM's ``prompt`` (text), or vLLM's ``messages`` (a chat)."""

    content: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special: bool = True


class DetokenizeRequest(_Body):
    tokens: list[StrictInt]
