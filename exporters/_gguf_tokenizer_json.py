"""The files :func:`._gguf_vocab.write_tokenizer` writes: a GGUF vocabulary as llama.cpp reads it
(:class:`._gguf_vocab.LlamaVocab`) in Hugging Face ``tokenizers``' JSON (a BPE model with the merges
that reproduce llama.cpp's, its normaliser and pre-tokenizer, the decoder, added tokens, BOS/EOS
as a template post-processor) and the ``tokenizer_config.json`` / ``special_tokens_map.json`` that
transformers and :class:`onnxsample.text.Tokenizer` read beside it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxsample.exporters._gguf_vocab_rules import A_BYTE, A_CONTROL, A_UNKNOWN, REGEXES

if TYPE_CHECKING:
    from onnxsample.exporters._gguf_vocab import LlamaVocab

__all__ = ["configs", "dump", "tokenizer_json"]

log = logging.getLogger(__name__)


def tokenizer_json(v: LlamaVocab) -> dict[str, Any]:
    """The tokenizers JSON: model, normaliser, pre-tokenizer, decoder, added tokens, BOS/EOS."""
    vocab = v.to_id
    merges = _spm_merges(v) if v.spm else _bpe_merges(v)
    unk = v.ids.get("unk")
    model = {
        "type": "BPE",
        "dropout": None,
        "unk_token": v.texts[unk] if unk is not None and v.spm else None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": not v.byte_level,
        "ignore_merges": v.pre.ignore_merges,
        "vocab": vocab,
        "merges": merges,
    }
    space = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    if v.byte_level:
        normalizer = None
        splits = [
            {"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
            for r in REGEXES[v.pre.regexes]
        ]
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                      "use_regex": False}  # fmt: skip
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [*splits, byte_level]}
        decoder = dict(byte_level)
    else:
        if v.spm and v.space_prefix:
            normalizer = {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "\u2581"}, space]}  # fmt: skip
        else:
            normalizer = space
        pre_tokenizer = None
        if not v.spm:  # Gemma 4: newline runs apart
            pre_tokenizer = {"type": "Split", "pattern": {"Regex": r"[^\n]+|[\n]+"},
                             "behavior": "Isolated", "invert": False}  # fmt: skip
        steps = [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
        ]
        if v.space_prefix:
            steps.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
        decoder = {"type": "Sequence", "decoders": steps}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added(v, i) for i in v.special_ids if vocab[v.texts[i]] == i],
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "model": model,
        "post_processor": _post_processor(v),
        "decoder": decoder,
    }


def _added(v: LlamaVocab, i: int) -> dict[str, Any]:
    return {
        "id": i,
        "content": v.texts[i],
        "single_word": False,
        "lstrip": False,
        "rstrip": i in v.rstrip,
        "normalized": False,
        "special": bool(v.attr[i] & (A_CONTROL | A_UNKNOWN)),
    }


def _post_processor(v: LlamaVocab) -> dict[str, Any] | None:
    ends = [(k, v.ids[k]) for k, on in (("bos", v.add_bos), ("eos", v.add_eos)) if on]
    if not ends:
        return None
    text = {k: v.texts[i] for k, i in ends}

    def template(seqs: list[str]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for type_id, seq in enumerate(seqs):
            if "bos" in text:
                out.append({"SpecialToken": {"id": text["bos"], "type_id": type_id}})
            out.append({"Sequence": {"id": seq, "type_id": type_id}})
            if "eos" in text:
                out.append({"SpecialToken": {"id": text["eos"], "type_id": type_id}})
        return out

    return {
        "type": "TemplateProcessing",
        "single": template(["A"]),
        "pair": template(["A", "B"]),
        "special_tokens": {
            v.texts[i]: {"id": v.texts[i], "ids": [i], "tokens": [v.texts[i]]} for _, i in ends
        },
    }


def _spm_merges(v: LlamaVocab) -> list[list[str]]:
    """Every split of a token into two tokens, ranked by the merged token's score (highest
    first): llama.cpp's SentencePiece merge order as BPE ranks. Byte tokens are never built."""
    scores, to_id, attr = v.meta.scores, v.to_id, v.attr
    assert scores is not None
    ranked = []
    for text, i in to_id.items():
        if len(text) < 2 or attr[i] & A_BYTE:
            continue
        for k in range(1, len(text)):
            left, right = text[:k], text[k:]
            if left in to_id and right in to_id:
                ranked.append((-scores[i], i, to_id[left], left, right))
    ranked.sort()
    return [[left, right] for *_, left, right in ranked]


def _bpe_merges(v: LlamaVocab) -> list[list[str]]:
    """The GGUF's merges ("left right", split at the first space after the first character as
    llama.cpp does); those whose parts or result are no token cannot be applied and are left out."""
    assert v.meta.merges is not None
    out, seen, dropped = [], set(), 0
    for merge in v.meta.merges:
        cut = merge.find(" ", 1)
        if cut < 0:
            dropped += 1
            continue
        pair = (merge[:cut], merge[cut + 1 :])
        if pair in seen:  # llama.cpp keeps the first rank
            continue
        seen.add(pair)
        if pair[0] in v.to_id and pair[1] in v.to_id and pair[0] + pair[1] in v.to_id:
            out.append(list(pair))
        else:
            dropped += 1
    if dropped:
        log.info("%d GGUF merges name no token and are left out", dropped)
    return out


def configs(v: LlamaVocab) -> tuple[dict[str, Any], dict[str, Any]]:
    """tokenizer_config.json and special_tokens_map.json. A special token is named only where it
    is one llama.cpp splits the text on (else naming it would make it one)."""
    special = set(v.special_ids)
    named: dict[str, str] = {}
    for key in ("bos", "eos", "unk", "pad"):
        i = v.ids.get(key)
        if i is None:
            continue
        if i in special:
            named[f"{key}_token"] = v.texts[i]
        else:
            log.info("%s token %d (%r) is an ordinary token; not named", key, i, v.texts[i])
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **named,
        "add_bos_token": v.add_bos,
        "add_eos_token": v.add_eos,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "added_tokens_decoder": {
            str(i): {k: v for k, v in _added(v, i).items() if k != "id"}
            for i in v.special_ids
            if v.to_id[v.texts[i]] == i
        },
    }
    template = v.meta.chat_template
    if v.meta.named_templates:
        config["chat_template"] = [
            *([{"name": "default", "template": template}] if template else []),
            *({"name": k, "template": t} for k, t in v.meta.named_templates.items()),
        ]
    elif template:
        config["chat_template"] = template
    return config, dict(named)


def dump(path: Path, data: dict[str, Any], *, indent: int | None = 2) -> None:
    separators = (",", ":") if indent is None else None
    text = json.dumps(data, ensure_ascii=False, indent=indent, separators=separators)
    path.write_text(text + "\n", encoding="utf-8")
