"""A Hugging Face tokenizer folder set up as transformers sets it up, without transformers.

:func:`read_folder` reads ``tokenizer.json``, ``tokenizer_config.json`` (and
``special_tokens_map.json`` where the config predates ``added_tokens_decoder``), the chat template
and, when the config names no tokenizer class, ``config.json``'s model type, and configures the
``tokenizers`` backend as ``PreTrainedTokenizerFast`` and its Llama/Gemma/Cohere/GPT-NeoX classes
do: the same special and added tokens, the BOS/EOS post-processor rebuilt from
``add_bos_token``/``add_eos_token``, the pre-tokenizer's ``add_prefix_space``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, NamedTuple

from onnxsample.errors import ModelError, first_line
from onnxsample.text._chat_template import chat_template_of

__all__ = ["Setup", "read_folder"]

log = logging.getLogger(__name__)

_SPECIAL = tuple(f"{n}_token" for n in ("bos", "eos", "unk", "sep", "pad", "cls", "mask"))
_LLAMA = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
# transformers' classes that rebuild the BOS/EOS post-processor, with what each assumes when
# tokenizer_config.json is silent: add_bos_token, and special tokens.
_FAMILIES: dict[str, tuple[bool, dict[str, str]]] = {
    "LlamaTokenizer": (True, _LLAMA),
    "CodeLlamaTokenizer": (True, _LLAMA),
    "GemmaTokenizer": (True, {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>"}),
    "CohereTokenizer": (True, {"bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>", "unk_token": "<UNK>"}),
    "GPTNeoXTokenizer": (False, dict.fromkeys(("bos_token", "eos_token", "unk_token"), "<|endoftext|>")),
}  # fmt: skip
# The class AutoTokenizer takes from config.json's model_type when tokenizer_config.json names none.
_MODEL_TYPES = {"llama": "LlamaTokenizer", "mistral": "LlamaTokenizer", "mixtral": "LlamaTokenizer",
                "gemma": "GemmaTokenizer", "gemma2": "GemmaTokenizer", "gemma3_text": "GemmaTokenizer",
                "cohere": "CohereTokenizer", "gpt_neox": "GPTNeoXTokenizer", "olmo": "GPTNeoXTokenizer"}  # fmt: skip


class Setup(NamedTuple):
    """What :class:`~onnxsample.text.tokenizer.Tokenizer` wraps: the configured backend, the
    special tokens' texts by name, the chat template, whether decoding cleans up spaces, and
    whether the pieces are in GPT-2's byte alphabet."""

    backend: Any
    special: dict[str, Any]
    chat_template: str | None
    clean_up: bool
    byte_level: bool


def read_folder(folder: str | Path) -> Setup:
    """The tokenizer of `folder`, set up as transformers' AutoTokenizer sets it up."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import pre_tokenizers

    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        raise ModelError(f"no tokenizer.json in {folder}: pass the export folder")
    path, config = folder / "tokenizer.json", _json(folder / "tokenizer_config.json")
    try:  # read by the backend itself: parsing the JSON in Python took longer than the load
        backend = Backend.from_file(str(path))
    except Exception as exc:
        raise ModelError(f"cannot read {path}: {first_line(exc)}") from exc
    family = config.get("tokenizer_class") or _MODEL_TYPES.get(
        _json(folder / "config.json").get("model_type"), ""
    )
    family = family.removesuffix("Fast")
    add_bos, defaults = _FAMILIES.get(family, (False, {}))
    init = {**defaults, **config}
    if "added_tokens_decoder" not in config:  # transformers' legacy path: this file wins
        for key, value in _json(folder / "special_tokens_map.json").items():
            if key == "additional_special_tokens" and isinstance(value, list):
                old = init.get(key) or []
                value = [*old, *(t for t in value if t not in old)]
            init[key] = value
    extra = init.get("extra_special_tokens")
    values = {
        **{n: init.get(n) for n in _SPECIAL},
        **(extra if isinstance(extra, dict) else {}),
    }
    additional = list(init.get("additional_special_tokens") or [])

    # The pre-tokenizer's add_prefix_space follows the config, else the class default (Llama's
    # None leaves it; a bool there makes transformers rebuild from the slow tokenizer's files).
    prefix_space = config.get("add_prefix_space", None if family == "LlamaTokenizer" else False)
    if isinstance(prefix_space, bool) and family == "LlamaTokenizer":
        log.warning("%s: transformers would rebuild this tokenizer from slow files", folder)
    elif isinstance(prefix_space, bool):  # as transformers does: the top pre-tokenizer only
        pre = _pre_tokenizer(backend)
        if isinstance(pre, dict) and pre.get("add_prefix_space", prefix_space) != prefix_space:
            try:
                kind = getattr(pre_tokenizers, pre.pop("type"))
                backend.pre_tokenizer = kind(**{**pre, "add_prefix_space": prefix_space})
            except Exception as exc:
                raise ModelError(f"cannot read {path}: {first_line(exc)}") from exc
    pre = _pre_tokenizer(backend)
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = bool(init.get("split_special_tokens", False))
    specials = [v for n in _SPECIAL if (v := values[n])] + additional
    _add_tokens(
        backend,
        config.get("added_tokens_decoder") or {},
        specials + [v for n, v in values.items() if n not in _SPECIAL and v],
    )
    if family in _FAMILIES:
        ends = {}
        for end, default in (("bos", add_bos), ("eos", False)):
            if init.get(f"add_{end}_token", default):
                if not (token := _text(values[f"{end}_token"])):
                    raise ModelError(f"{folder}: add_{end}_token is set but no {end}_token")
                ends[end] = token
        _set_post_processor(backend, ends.get("bos"), ends.get("eos"))
    special: dict[str, Any] = {n: t for n, v in values.items() if (t := _text(v))}
    if additional:
        special["additional_special_tokens"] = [_text(t) for t in additional]
    clean_up = bool(init.get("clean_up_tokenization_spaces", False))
    byte_level = "ByteLevel" in json.dumps(pre)
    template = chat_template_of(folder, config, _json(folder / "chat_template.json"))
    return Setup(backend, special, template, clean_up, byte_level)


def _add_tokens(backend: Any, saved: dict, specials: list) -> None:
    """As PreTrainedTokenizerFast.__init__: the config's added tokens that tokenizer.json lacks and
    the special tokens that are no added token yet join the vocabulary, marked special."""
    from tokenizers import AddedToken

    have = backend.get_added_tokens_decoder().values()
    seen = {repr(t) for t in have}
    todo = [
        t for i in sorted(saved, key=int) if repr(t := _added(saved[i], AddedToken)) not in seen
    ]
    known = {t.content for t in have} | {t.content for t in todo}
    for token in (_added(t, AddedToken) for t in specials):
        if token.content not in known:
            todo.append(token)
            known.add(token.content)
    special_text = {_text(t) for t in specials}
    for token in todo:
        token.special = token.special or token.content in special_text
    if todo:
        backend.add_tokens(todo)


def _set_post_processor(backend: Any, bos: str | None, eos: str | None) -> None:
    """LlamaTokenizerFast.update_post_processor: BOS and EOS as add_bos_token / add_eos_token say,
    whatever tokenizer.json had."""
    from tokenizers import processors

    single = f"{bos + ':0 ' if bos else ''}$A:0{' ' + eos + ':0' if eos else ''}"
    pair = f"{single}{' ' + bos + ':1' if bos else ''} $B:1{' ' + eos + ':1' if eos else ''}"
    ends = [(t, backend.token_to_id(t)) for t in (bos, eos) if t]
    backend.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=ends
    )


def _added(token: Any, added_token: type) -> Any:
    """A token as saved (a string, or an AddedToken dict) as a ``tokenizers.AddedToken``."""
    if isinstance(token, dict):
        return added_token(**{k: v for k, v in token.items() if k != "__type"})
    return added_token(str(token), special=True)


def _text(token: Any) -> str | None:
    token = token.get("content") if isinstance(token, dict) else token
    return token if isinstance(token, str) and token else None


def _pre_tokenizer(backend) -> dict | None:
    """The backend's pre-tokenizer as its JSON says (``None`` without one)."""
    pre = backend.pre_tokenizer
    return None if pre is None else json.loads(pre.__getstate__())


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}
