"""Tokenising and chat templates without transformers: Hugging Face ``tokenizers`` and ``jinja2``.

A deployment of composed models needs the tokenizer, not the exporter stack. :class:`Tokenizer`
reads an export (or Hugging Face) folder and gives the same ids and text as
``transformers.AutoTokenizer.from_pretrained(folder)``: the same special and added tokens, the
BOS/EOS post-processor that transformers' Llama/Gemma/Cohere/GPT-NeoX classes rebuild from
``add_bos_token``/``add_eos_token``, the same decoding clean-up, and chat templates rendered as
transformers renders them (a sandboxed jinja2 environment with ``trim_blocks``/``lstrip_blocks``,
its ``tojson`` filter, ``raise_exception``, ``strftime_now`` and the ``{% generation %}`` tag).
All that is set up once, when the folder is read: no call changes shared state, so one
:class:`Tokenizer` serves any number of threads (transformers' fast tokenizer resets truncation
and padding on every call, which fails with "Already borrowed" under threads).
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnxsample.errors import InvalidParameter, ModelError, check_unicode, first_line
from onnxsample.text import _clean_up
from onnxsample.text._chat_template import (
    check_chat_template,
    compile_template,
    fold_system,
    has_text_parts,
    joined_text_parts,
    renders_system,
    renders_tool,
    takes_text_parts,
)
from onnxsample.text._hf_folder import read_folder

__all__ = ["Tokenizer"]

log = logging.getLogger(__name__)


class Tokenizer:
    """The tokenizer of an export folder, as transformers' AutoTokenizer; see :meth:`from_folder`."""

    chat_template: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None

    def __init__(
        self,
        backend: Any,
        special: dict,
        chat_template: str | None,
        clean_up: bool,
        byte_level: bool = False,
    ) -> None:
        """Wrap a configured ``tokenizers.Tokenizer``; :meth:`from_folder` makes one.
        `byte_level`: its pieces are in GPT-2's byte alphabet (a ByteLevel pre-tokenizer)."""
        self._backend, self._special, self._clean_up = backend, special, clean_up
        self._byte_level = byte_level
        self._special_ids = {
            i for i, token in backend.get_added_tokens_decoder().items() if token.special
        }
        ids = {k: backend.token_to_id(v) for k, v in special.items() if isinstance(v, str)}
        self.bos_token_id, self.eos_token_id = ids.get("bos_token"), ids.get("eos_token")
        self.pad_token_id = ids.get("pad_token")
        self.chat_template, self._template, self._template_error = chat_template, None, None
        try:  # a broken template leaves plain prompts usable; chat raises
            self._template = compile_template(chat_template) if chat_template else None
        except Exception as exc:
            self._template_error = f"the chat template does not parse: {first_line(exc)}"
            log.warning("%s", self._template_error)
        self._folds_system = self._writes_no_system()
        self._writes_tool: bool | None = None  # writes_tool_messages, probed when first asked
        self._takes_parts: bool | None = None  # takes_text_parts, probed when first needed

    @classmethod
    def from_folder(cls, folder: str | Path) -> Tokenizer:
        """Read ``tokenizer.json``, ``tokenizer_config.json`` (and ``special_tokens_map.json`` where
        the config predates ``added_tokens_decoder``), the chat template and, when the config names
        no tokenizer class, ``config.json``'s model type; set the tokenizer up as transformers does."""
        return cls(*read_folder(folder))

    def with_chat_template(self, template: str) -> Tokenizer:
        """This tokenizer with `template` (jinja text) in place of its folder's chat template, for
        a model whose file has none or a wrong one; a template that does not parse raises
        :class:`InvalidParameter`. The copy shares the backend (no call changes its state)."""
        compiled = check_chat_template(template)
        other = copy.copy(self)
        other.chat_template, other._template, other._template_error = template, compiled, None
        other._folds_system = other._writes_no_system()
        other._writes_tool = other._takes_parts = None
        return other

    @property
    def writes_tool_messages(self) -> bool:
        """Whether the chat template writes a ``tool`` message (Phi-3's leaves it out, Gemma 2's
        refuses it): where it does not, a chat's tool results go in a user's turn."""
        if self._writes_tool is None:
            self._writes_tool = self._template is not None and renders_tool(
                lambda probe: self._render(probe, add_generation_prompt=False)
            )
        return self._writes_tool

    def _reads_parts(self) -> bool:
        """Whether the template joins a message's text parts itself (else they come joined)."""
        if self._takes_parts is None:
            self._takes_parts = takes_text_parts(
                lambda probe: self._render(probe, add_generation_prompt=False)
            )
        return self._takes_parts

    def _writes_no_system(self) -> bool:
        """A template that drops system messages, or refuses them: chats then fold them into the
        user's turn as llama.cpp does, rather than lose the system prompt without a word."""
        if self._template is None or renders_system(
            lambda probe: self._render(probe, add_generation_prompt=False)
        ):
            return False
        log.info("the chat template writes no system message: it goes into the user's turn")
        return True

    @property
    def vocab_size(self) -> int:
        """Every id the tokenizer knows, added tokens included (``len(AutoTokenizer)``)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(
        self, text: str, *, add_special_tokens: bool = True, parse_special: bool = True
    ) -> list[int]:
        """Token ids of `text`, BOS/EOS added as the config says unless `add_special_tokens` is off.
        With `parse_special` off, a special token written in `text` is ordinary text (llama.cpp's
        ``parse_special = false``; added tokens that are not special still match, as its
        user-defined tokens do)."""
        if not isinstance(text, str):
            raise InvalidParameter(f"text to encode must be a string, got {type(text).__name__}")
        check_unicode(text, "the text")
        backend = self._backend if parse_special else self._literal
        return backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_fragment(self, text: str) -> list[int]:
        """Token ids of `text` as a piece of a longer text: no BOS/EOS, and no SentencePiece space
        prefix (Llama 2, Mistral and Phi-3 start a text with one), so the tokens' bytes are the
        text's own. A grammar engine forces text with them (llguidance's tokenize)."""
        if not isinstance(text, str):
            raise InvalidParameter(f"text to encode must be a string, got {type(text).__name__}")
        check_unicode(text, "the text")
        return self._unprefixed.encode(text, add_special_tokens=False).ids

    @functools.cached_property
    def _unprefixed(self) -> Any:
        """A copy of the backend that adds no space prefix: a ``Prepend`` normalizer left out, a
        ``Metaspace`` pre-tokenizer's ``prepend_scheme`` set to ``never``, a ``ByteLevel`` one's
        ``add_prefix_space`` off."""
        config = json.loads(self._backend.to_str())
        config["normalizer"] = _without_prepend(config.get("normalizer"))
        config["pre_tokenizer"] = _never_prepend(config.get("pre_tokenizer"))
        backend = type(self._backend).from_str(json.dumps(config))
        backend.encode_special_tokens = self._backend.encode_special_tokens  # not in the JSON
        return backend

    @functools.cached_property
    def _literal(self) -> Any:
        """A copy of the backend that encodes special tokens' texts as text."""
        backend = type(self._backend).from_str(self._backend.to_str())
        backend.encode_special_tokens = True
        return backend

    @functools.cached_property
    def adds_bos(self) -> bool:
        """Whether :meth:`encode` puts the BOS token first (llama.cpp's ``add_bos``)."""
        bos = self.bos_token_id
        return bos is not None and self._backend.encode("").ids[:1] == [bos]

    def token_id(self, text: str) -> int | None:
        """The id of the token written `text` in the vocabulary (added tokens included), or None."""
        if not isinstance(text, str):
            raise InvalidParameter(f"a token's text must be a string, got {type(text).__name__}")
        return self._backend.token_to_id(text)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters of text one token can stand for: its longest piece (a byte-level
        or byte-fallback piece is at least as long as the text it covers), or added token."""
        pieces = self._backend.get_vocab(with_added_tokens=True)
        return max((len(piece) for piece in pieces), default=1)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """The text of `ids` (an id past the vocabulary gives nothing, as in transformers)."""
        if isinstance(ids, (str, bytes)):
            raise InvalidParameter(f"token ids to decode are integers, got {type(ids).__name__}")
        try:
            text = self._backend.decode(
                [_token(i) for i in ids], skip_special_tokens=skip_special_tokens
            )
        except (OverflowError, TypeError, ValueError) as exc:
            raise InvalidParameter(
                f"token ids must be non-negative integers: {first_line(exc)}"
            ) from exc
        return _clean_up.clean_up(text) if self._clean_up else text

    @property
    def special_ids(self) -> frozenset[int]:
        """The ids of special tokens (end-of-turn, padding, ...)."""
        return frozenset(self._special_ids)

    def token_to_text(self, token_id: int) -> str:
        """What one token decodes to on its own, special tokens shown (for logprob tables)."""
        return self.decode([token_id], skip_special_tokens=False)

    def piece(self, token_id: int) -> str:
        """The vocabulary's own string for one token (``Ġworld``, ``▁world``, ``<0x0A>``:
        transformers' ``convert_ids_to_tokens``); empty for an id it does not know."""
        return self._backend.id_to_token(_checked_token(token_id)) or ""

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (OpenAI's ``bytes``): a byte-level piece maps back
        through GPT-2's byte alphabet, a ``<0xNN>`` byte-fallback piece is that byte, a special
        token is its text; half a UTF-8 character stays half a character."""
        piece = self._backend.id_to_token(_checked_token(token_id))
        if piece is None:
            return b""
        if token_id in self._special_ids:
            return piece.encode()
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        if self._byte_level and all(c in _BYTE_OF for c in piece):
            return bytes(_BYTE_OF[c] for c in piece)
        return piece.replace("\u2581", " ").encode()

    def render_chat(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        variables: dict[str, Any] | None = None,
        continue_final_message: bool = False,
    ) -> str:
        """The chat template applied to `messages` (and `tools`, in OpenAI's shape, for a template
        that writes them), as text. For a template that writes no system message (Phi-3's,
        Gemma 2's), a system message's text starts the next user message, as llama.cpp renders
        it. A content that is a list of text parts (OpenAI's) goes to a template that reads such
        a list as it is, so the template joins the parts as it means to, and to another joined
        by newlines (as llama.cpp renders them). `variables` are more of the template's
        variables (``enable_thinking``: vLLM's and llama-server's ``chat_template_kwargs``,
        transformers' keyword arguments); one of the names the template is given already raises
        :class:`InvalidParameter`.

        `continue_final_message` (transformers' and vLLM's) leaves the final message open: the
        text ends where that message's text does (its trailing spaces too where the template
        keeps them), so an answer continues it; it excludes `add_generation_prompt`."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise InvalidParameter("messages must be a non-empty list of chat messages")
        if add_generation_prompt and continue_final_message:
            raise InvalidParameter(
                "continue_final_message and add_generation_prompt cannot both be true: send "
                "add_generation_prompt false to continue the final message"
            )
        if self._template_error:
            raise ModelError(self._template_error)
        if self._template is None:
            raise InvalidParameter(
                "this model has no chat template: send a plain completion, or give one "
                "(--chat-template, Engine(chat_template=...))"
            )
        if continue_final_message:
            messages = _tag_final(messages)
        if has_text_parts(messages) and (self._folds_system or not self._reads_parts()):
            messages = joined_text_parts(messages)
        if self._folds_system:
            messages = fold_system(messages)
        try:
            text = self._render(messages, add_generation_prompt, tools, variables)
        except InvalidParameter:
            raise
        except Exception as exc:  # raise_exception(), a missing key, None + str: the messages'
            raise InvalidParameter(
                f"the chat template refused the messages: {first_line(exc)}"
            ) from exc
        check_unicode(text, "the text")
        return _open_final(text) if continue_final_message else text

    def _render(
        self,
        messages: list[dict],
        add_generation_prompt: bool,
        tools: list[dict] | None = None,
        variables: dict[str, Any] | None = None,
    ) -> str:
        """The template over `messages` as given, with what transformers gives a template."""
        given = {
            "messages": messages,
            "tools": tools,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
            **self._special,
        }
        if taken := sorted(set(variables or ()) & set(given)):
            raise InvalidParameter(f"chat_template_kwargs cannot set {', '.join(taken)}")
        return self._template.render(**(variables or {}), **given)

    def apply_chat_template(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        variables: dict[str, Any] | None = None,
        continue_final_message: bool = False,
    ) -> list[int]:
        """Token ids of the rendered chat (:meth:`render_chat`); as in transformers, no special
        tokens are added to it."""
        text = self.render_chat(
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            variables=variables,
            continue_final_message=continue_final_message,
        )
        return self._backend.encode(text, add_special_tokens=False).ids  # checked by render_chat


def _token(value: object) -> int:
    """`value` as a token id: an integer (a numpy one too), not a bool or a float (a float was
    truncated to another token)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{value!r} is not an integer")
    return int(value)


def _checked_token(value: object) -> int:
    """`value` as a token id in [0, 2**32) (the backend's), else InvalidParameter."""
    try:
        token = _token(value)
    except TypeError as exc:
        raise InvalidParameter(f"a token id must be an integer, got {value!r}") from exc
    if not 0 <= token < 2**32:
        raise InvalidParameter(f"a token id must be in [0, 2**32), got {token}")
    return token


_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _tag_final(messages: list[dict]) -> list[dict]:
    """`messages` with a tag after the final message's text (its last text part), where
    :func:`_open_final` cuts, as transformers marks it."""
    final = dict(messages[-1])
    content = final.get("content")
    if isinstance(content, list):
        parts = [dict(p) if isinstance(p, dict) else p for p in content]
        texts = [p for p in parts if isinstance(p, dict) and "text" in p]
        if not texts:
            raise InvalidParameter("continue_final_message: the final message has no text")
        texts[-1]["text"] = f"{texts[-1]['text']}{_CONTINUE_TAG}"
        final["content"] = parts
    elif isinstance(content, str):
        final["content"] = content + _CONTINUE_TAG
    else:
        raise InvalidParameter("continue_final_message: the final message has no text")
    return [*messages[:-1], final]


def _open_final(text: str) -> str:
    """`text`, rendered from :func:`_tag_final`'s messages, cut where the tag is: the final
    message left open (less its trailing spaces where the template strips them), as transformers
    cuts it."""
    tag = _CONTINUE_TAG.strip()
    if tag not in text:
        raise InvalidParameter(
            "continue_final_message: the final message's text does not appear in the chat the "
            "template writes, so there is nothing to continue"
        )
    at = text.rindex(tag)
    return text[:at] if text.startswith(_CONTINUE_TAG, at) else text[:at].rstrip()


def _without_prepend(normalizer: dict | None) -> dict | None:
    """`normalizer` (tokenizer.json's) without its ``Prepend`` steps."""
    if normalizer is None or normalizer.get("type") == "Prepend":
        return None
    if normalizer.get("type") == "Sequence":
        steps = [n for n in map(_without_prepend, normalizer["normalizers"]) if n is not None]
        return {**normalizer, "normalizers": steps}
    return normalizer


def _never_prepend(pre: dict | None) -> dict | None:
    """`pre` (tokenizer.json's pre-tokenizer) with nothing put before a text: every ``Metaspace``
    and ``ByteLevel`` without its space prefix."""
    if pre is None:
        return None
    if pre.get("type") == "Sequence":
        return {**pre, "pretokenizers": [_never_prepend(p) for p in pre["pretokenizers"]]}
    if pre.get("type") == "ByteLevel":  # GPT-2's own space before a text
        return {**pre, "add_prefix_space": False}
    if pre.get("type") == "Metaspace":
        never = {"prepend_scheme": "never", "add_prefix_space": False}  # today's key, and older
        return {**pre, **{k: v for k, v in never.items() if k in pre}}
    return pre


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the printable character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_OF = _byte_alphabet()
