"""What a request's prompt becomes: token ids, and its stop strings, checked before any work."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np

from onnxsample.errors import ContextExceeded, InvalidParameter
from onnxsample.text._chat_template import is_text_parts
from onnxsample.text.tokenizer import Tokenizer

__all__ = ["Prompt", "prompt_tokens", "stop_strings"]

# A prompt: text, token ids, or a chat (a list of {"role", "content"} messages).
Prompt = str | Seq[int] | Seq[dict]


def prompt_tokens(
    tok: Tokenizer,
    prompt: Prompt,
    chat: bool | None,
    system: str | None,
    vocab_size: int,
    limit: int | None = None,
) -> list[int]:
    """The token ids of a prompt: text (through the chat template when `chat` is true or, with
    `chat` None, when the tokenizer has one), token ids as they are, or a chat's messages.

    With `limit` (the positions a sequence may hold), text longer than `limit` tokens could ever
    cover is refused before it is tokenised (a token stands for at most ``tok.max_token_chars``
    characters of normalised text), so a multi-megabyte prompt costs a length check, not seconds
    of tokenising."""
    if chat is not None and not isinstance(chat, (bool, np.bool_)):
        raise InvalidParameter(f"chat must be a bool or None, got {chat!r}")
    if system is not None and not isinstance(system, str):
        raise InvalidParameter(f"system must be a string, got {type(system).__name__}")
    if limit is not None:
        _check_length(tok, prompt, system, limit)
    if isinstance(prompt, str):
        use_chat = bool(tok.chat_template) if chat is None else chat
        if use_chat:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": prompt}
            ]
            ids = tok.apply_chat_template(messages, add_generation_prompt=True)
        else:
            if system and chat is None:  # chat mode was not refused: there is no template
                raise InvalidParameter(
                    "a system prompt needs a chat template, and this model has none: give one "
                    "(--chat-template, or chat_template=)"
                )
            if system:
                raise InvalidParameter("a system prompt needs chat mode")
            ids = tok.encode(prompt)
    elif isinstance(prompt, Seq) and prompt and all(isinstance(m, dict) for m in prompt):
        messages = [_message(m) for m in prompt]
        if system and any(m["role"] == "system" for m in messages):
            raise InvalidParameter("the messages hold a system message already: leave out system")
        messages = ([{"role": "system", "content": system}] if system else []) + messages
        ids = tok.apply_chat_template(messages, add_generation_prompt=True)
    elif isinstance(prompt, Seq) and not isinstance(prompt, (bytes, bytearray)):
        if chat or system is not None:
            raise InvalidParameter(
                "token ids are the prompt as it is: chat and system apply to text or messages"
            )
        ids = list(prompt)
        bad = [t for t in ids if not isinstance(t, (int, np.integer)) or isinstance(t, bool)]
        bad += [t for t in ids if isinstance(t, (int, np.integer)) and not 0 <= t < vocab_size]
        if bad:
            raise InvalidParameter(
                f"token ids must be integers in [0, {vocab_size}), got {bad[0]!r}"
            )
    else:
        raise InvalidParameter(
            f"a prompt is a string, a list of token ids or a list of chat messages, "
            f"got {type(prompt).__name__}"
        )
    ids = [int(i) for i in ids]
    if not ids:
        raise InvalidParameter("the prompt is empty after tokenisation")
    if (past := max(ids)) >= vocab_size:  # the tokenizer's own ids: it is not the model's
        raise InvalidParameter(
            f"the prompt holds token {past} ({tok.decode([past], skip_special_tokens=False)!r}), "
            f"past the model's vocabulary of {vocab_size}: this tokenizer does not belong to "
            "this model"
        )
    return ids


def _message(m: dict) -> dict:
    """A chat message, checked: its content a string or a list of text parts (OpenAI's
    ``{"type": "text", "text": ...}``, which the tokenizer gives the template as it reads them)."""
    content = m.get("content")
    if not isinstance(m.get("role"), str) or not (
        isinstance(content, str) or is_text_parts(content)
    ):
        raise InvalidParameter(
            "each chat message needs a string 'role' and a 'content' that is a string or a list "
            "of text parts"
        )
    return m


def _check_length(tok: Tokenizer, prompt: Prompt, system: str | None, limit: int) -> None:
    if isinstance(prompt, str):
        chars = len(prompt)
    elif isinstance(prompt, Seq) and all(isinstance(m, dict) for m in prompt):
        chars = sum(_content_chars(m.get("content")) for m in prompt)
    else:
        return  # token ids: their count is checked as it is
    chars += len(system or "")
    # 4x: a normaliser may fold several characters into one (combining accents stripped)
    if chars <= 4 * limit:  # within reach of any vocabulary: its longest token is not needed
        return  # (a dict of every piece: half a second for a 262k vocabulary)
    most = 4 * limit * tok.max_token_chars
    if chars > most:
        raise ContextExceeded(
            f"the prompt is {chars} characters, more than the model's context of {limit} tokens "
            f"could ever hold (at most {most} characters)",
            prompt_tokens=-(-chars // (4 * tok.max_token_chars)),  # at least this many
            context=limit,
        )


def _content_chars(content: object) -> int:
    """Characters of a message's content: a string, or text parts (``{"type": "text", ...}``)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(
            len(p["text"])
            for p in content
            if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return 0


def stop_strings(stop: str | Seq[str] | None) -> list[str]:
    """`stop` as a list: a plain string is one stop string, not its characters. An empty one is
    refused, as vLLM refuses it (llama-server ends the answer at once; it was ignored)."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, Seq):
        raise InvalidParameter(f"stop must be a string or a list of strings, got {stop!r}")
    stops = list(stop)
    if not all(isinstance(s, str) for s in stops):
        raise InvalidParameter("stop must be a string or a list of strings")
    if "" in stops:
        raise InvalidParameter("stop must not contain an empty string")
    return stops
