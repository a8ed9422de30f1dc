"""Tokenising and chat templates without transformers: Hugging Face ``tokenizers`` and ``jinja2``.

A deployment of composed models needs the tokenizer, not the exporter stack. :class:`Tokenizer`
reads what an export folder holds (``tokenizer.json``, ``tokenizer_config.json``,
``special_tokens_map.json``, ``chat_template.jinja``) and gives the same ids and text as
``transformers.AutoTokenizer`` on that folder: the same special tokens (BOS/EOS added as the config
says), the same decoding clean-up, and chat templates rendered the way transformers renders them
(a sandboxed jinja2 environment with ``trim_blocks``/``lstrip_blocks``, its ``tojson`` filter,
``raise_exception`` and ``strftime_now``). Every method is safe to call from several threads.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from onnxsample.errors import InvalidParameter, ModelError

__all__ = ["Tokenizer"]

log = logging.getLogger(__name__)

_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")
# transformers' clean_up_tokenization: spaces before punctuation and English contractions.
_CLEAN_UP = [
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
]


class Tokenizer:
    """The tokenizer of an export folder; see :meth:`from_folder`."""

    def __init__(
        self,
        backend: Any,
        *,
        special: dict[str, str],
        chat_template: str | None = None,
        add_bos: bool = False,
        add_eos: bool = False,
        clean_up: bool = False,
        extra_special: Sequence[str] = (),
    ) -> None:
        self._backend = backend
        self.special_tokens = dict(special)
        self.chat_template = chat_template
        self._clean_up = clean_up
        self._extra = list(extra_special)
        ids = {name: backend.token_to_id(text) for name, text in special.items()}
        self.bos_token_id: int | None = ids.get("bos_token")
        self.eos_token_id: int | None = ids.get("eos_token")
        self.pad_token_id: int | None = ids.get("pad_token")
        self.unk_token_id: int | None = ids.get("unk_token")
        # transformers' Llama/Gemma tokenizers add BOS/EOS themselves when the config says so;
        # add them here only when tokenizer.json's post-processor does not already.
        probe = backend.encode("a", add_special_tokens=True).ids
        self._prepend = (
            add_bos and self.bos_token_id is not None and probe[:1] != [self.bos_token_id]
        )
        self._append = (
            add_eos and self.eos_token_id is not None and probe[-1:] != [self.eos_token_id]
        )
        self._template = _compile(chat_template) if chat_template else None

    @classmethod
    def from_folder(cls, folder: str | Path) -> Tokenizer:
        """Read the tokenizer files of an export (or Hugging Face) folder."""
        from tokenizers import Tokenizer as Backend

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelError(f"no tokenizer.json in {folder}: pass the export folder")
        try:
            backend = Backend.from_file(str(path))
        except Exception as exc:
            raise ModelError(f"cannot read {path}: {str(exc).splitlines()[0]}") from exc
        config = _json(folder / "tokenizer_config.json")
        special = {**_json(folder / "special_tokens_map.json"), **config}
        tokens = {name: _content(special[name]) for name in _SPECIAL if special.get(name)}
        extra = [_content(t) for t in special.get("additional_special_tokens") or []]
        return cls(
            backend,
            special={k: v for k, v in tokens.items() if v},
            chat_template=_chat_template(folder, config),
            add_bos=bool(config.get("add_bos_token", False)),
            add_eos=bool(config.get("add_eos_token", False)),
            clean_up=bool(config.get("clean_up_tokenization_spaces", False)),
            extra_special=extra,
        )

    @property
    def vocab_size(self) -> int:
        """Every id the tokenizer can produce, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`, BOS/EOS added as the model's config says (unless told not to)."""
        ids = self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self._prepend:
            ids = [self.bos_token_id, *ids]
        if add_special_tokens and self._append:
            ids = [*ids, self.eos_token_id]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        text = self._backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        if self._clean_up:
            for old, new in _CLEAN_UP:
                text = text.replace(old, new)
        return text

    def token_to_text(self, token_id: int) -> str:
        """What one token decodes to on its own (special tokens shown), for logprob tables."""
        return self.decode([token_id], skip_special_tokens=False)

    def render_chat(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        """The chat template applied to `messages`, as text."""
        if self._template is None:
            raise InvalidParameter("this model's tokenizer has no chat template")
        import jinja2

        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                tools=None,
                documents=None,
                additional_special_tokens=self._extra,
                **self.special_tokens,
            )
        except jinja2.TemplateError as exc:
            raise InvalidParameter(f"the chat template refused the messages: {exc}") from exc

    def apply_chat_template(
        self, messages: list[dict], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of the rendered chat (its special tokens come from the template itself)."""
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt)
        return self.encode(text, add_special_tokens=False)


def _compile(template: str):
    """transformers' environment for chat templates."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateError as exc:
        raise ModelError(f"the chat template does not parse: {exc}") from exc


def _chat_template(folder: Path, config: dict) -> str | None:
    """chat_template.jinja, else chat_template.json, else tokenizer_config.json's entry (a string,
    or a list of named templates of which the one named 'default')."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = _json(folder / "chat_template.json").get("chat_template") or config.get(
        "chat_template"
    )
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template else None


def _content(token: Any) -> str | None:
    """A special token as saved: a string, or an AddedToken dict with its 'content'."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}
