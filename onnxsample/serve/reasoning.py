"""A thinking model's thought apart from its answer: llama-server's ``reasoning_format``.

Models such as Qwen3 and the DeepSeek-R1 distillations write ``<think>…</think>`` before their
answer; some templates open the thought in the prompt already (it ends with ``<think>``), so the
answer starts inside it. With ``reasoning_format`` ``auto`` (or ``deepseek``), as llama-server
does, the thought goes to the message's ``reasoning_content`` (stripped) and the rest, from its
first non-space character, is the ``content`` that tool calls are read from; streamed, the thought
arrives as ``reasoning_content`` deltas, then the answer as ``content`` ones. A thought the answer
never closes (cut by ``max_tokens``) is all reasoning. ``none`` (the default, as vLLM without a
reasoning parser) leaves the text as the model wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxsample.errors import InvalidParameter

__all__ = ["FORMATS", "ThoughtStream", "check_format", "opens_thought", "split_thought"]

# llama-server's reasoning formats this server takes: "none" leaves the text as the model wrote it
FORMATS = ("none", "auto", "deepseek")


def check_format(value: str) -> str:
    """`value`, or :class:`InvalidParameter` where it is none of :data:`FORMATS`."""
    if value not in FORMATS:
        raise InvalidParameter(
            f"reasoning_format must be one of {', '.join(FORMATS)}, got {value!r}"
        )
    return value


OPEN, CLOSE = "<think>", "</think>"


def opens_thought(prompt_tail: str) -> bool:
    """Whether a prompt ending in `prompt_tail` leaves the answer inside an open thought."""
    tail = prompt_tail.rstrip()
    return tail.endswith(OPEN)


def _held(text: str, marker: str) -> int:
    """How many of `text`'s last characters may start `marker` (held back while streaming)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def split_thought(text: str, opened: bool, final: bool = True) -> tuple[str | None, str]:
    """(thought, answer) of `text`, the answer so far; `opened`: the prompt opened the thought.

    While the answer is still being written (`final` false), what may be the start of a marker
    is held back from both, and text that may yet become ``<think>`` counts as neither: each
    call's thought and answer then begin with the previous call's."""
    start = len(text) - len(text.lstrip())
    if not opened:
        rest = text[start:]
        if rest.startswith(OPEN):
            start += len(OPEN)
        elif not final and OPEN.startswith(rest):
            return None, ""  # "<thi": a thought or not, said once known
        else:
            return None, text
    end = text.find(CLOSE, start)
    if end < 0:
        body = text[start:]
        if not final:
            body = body[: len(body) - _held(body, CLOSE)]
        return body.strip(), ""
    return text[start:end].strip(), text[end + len(CLOSE) :].lstrip()


@dataclass
class ThoughtStream:
    """One choice's stream: :meth:`feed` the whole text so far, get the thought's new part and
    the answer's text so far (what follows the thought; reads as a non-streamed answer's)."""

    opened: bool
    _sent: int = 0

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        thought, answer = split_thought(text, self.opened, final)
        new = (thought or "")[self._sent :]
        self._sent += len(new)
        return new, answer
