"""A GGUF file's tokenizer from its ``tokenizer.*`` metadata alone, token for token as llama.cpp's.

:func:`write_tokenizer` writes ``tokenizer.json``, ``tokenizer_config.json`` and
``special_tokens_map.json`` that :class:`onnxsample.text.Tokenizer` (Hugging Face ``tokenizers``)
reads into the tokenizer llama.cpp builds from the same metadata (``src/llama-vocab.cpp``), with
special tokens in the text parsed (llama.cpp's ``parse_special``, which our prompts need):

- **Special tokens.** Tokens of type CONTROL, USER_DEFINED and UNKNOWN (after llama.cpp's fix-ups:
  end-of-generation and FIM texts such as ``<|im_end|>`` become CONTROL, gpt-oss's ``<|channel|>``
  USER_DEFINED, ...) split the text before anything else: they become added tokens, never normalised,
  CONTROL and UNKNOWN ones ``special`` (skipped when decoding), USER_DEFINED ones not (llama.cpp always
  renders them). Where the model name says Phi-3, every such token eats the whitespace after it
  (llama.cpp's RSTRIP), ``</s>`` too, but not ``<unk>``, ``<s>`` or ``<|endoftext|>``.
- **SentencePiece** (``tokenizer.ggml.model = "llama"``; Llama 2, Mistral, Phi-3, Gemma 2/3): each
  stretch of text between special tokens gets a ``▁`` in front when ``tokenizer.ggml.add_space_prefix``
  (default true), every space becomes ``▁``, then adjacent symbols merge, the merge whose result has the
  highest score first (ties: leftmost), and a character no token covers becomes its ``<0xNN>`` byte
  tokens. That is a ``tokenizers`` BPE model whose merges are every split of every token into two
  tokens, ranked by the merged token's score, with byte fallback, behind a Prepend + Replace normaliser
  (which ``tokenizers`` applies to each stretch between added tokens, as llama.cpp prefixes each).
- **Byte-level BPE** (``"gpt2"``): llama.cpp's regular expressions for ``tokenizer.ggml.pre`` (copied
  from ``llm_tokenizer_bpe``; each one splits the pieces the one before left, as Split pre-tokenizers
  with ``isolated`` behaviour do), GPT-2's byte alphabet, then ``tokenizer.ggml.merges`` by rank; the
  names llama.cpp sets ``ignore_merges`` for take a piece that is a token whole.
- **Gemma 4** (``"gemma4"``): BPE over raw UTF-8 with spaces as ``▁``, split at newline runs only, with
  ``<0xNN>`` byte fallback.
- **BOS/EOS**: ``tokenizer.ggml.add_bos_token`` / ``add_eos_token``, or llama.cpp's defaults when absent
  (SentencePiece: BOS yes; BPE: no, except the Llama 3 and Tekken pre-tokenizers; Gemma 4 always),
  are a template post-processor in ``tokenizer.json``. The ids are llama.cpp's (its defaults where
  the metadata is silent: SentencePiece BOS 1, EOS 2, UNK 0).
- **Decoding**: ``▁`` back to a space and byte tokens to bytes (a leading space dropped where a space
  was prefixed), or GPT-2's byte alphabet back to bytes; no clean-up of spaces before punctuation.

What cannot be reproduced raises :class:`~onnxsample.errors.ExportError` naming it: another tokenizer
model (``bert``, ``t5``, ``rwkv``, ...), a pre-tokenizer name outside the table below (llama.cpp's own
code for ``kimi-k2``, ``afmoe``, ``tiny_aya``, ... is not an expression), a SentencePiece vocabulary
without scores, BPE without merges. Known small differences (llama.cpp's test cases meet none):
llama.cpp splits special tokens longest first where ``tokenizers`` takes the leftmost-longest match
(they differ only where two special tokens overlap in the text); ``rstrip`` (Phi-3) also eats
non-ASCII whitespace (U+00A0, U+3000, ...) that llama.cpp keeps; SentencePiece merges of equal score
rank by id where llama.cpp takes the leftmost; Gemma 4 merges a run of newlines that is one token
where llama.cpp takes the token whole. Decoding: a user-defined token made of GPT-2 byte-alphabet
letters (deepseek's ``ö``) decodes as that one byte, as in transformers; an UNUSED token gives its
text where llama.cpp gives nothing.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxsample.errors import ExportError

__all__ = ["GGUFVocab", "write_tokenizer"]

log = logging.getLogger(__name__)

# llama.cpp's token types (gguf's TokenType) and the attributes it derives from them.
_UNDEFINED, _NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = range(7)
_A_UNKNOWN, _A_UNUSED, _A_NORMAL, _A_CONTROL, _A_USER, _A_BYTE = 1, 2, 4, 8, 16, 32
_ATTR = {_NORMAL: _A_NORMAL, _UNKNOWN: _A_UNKNOWN, _CONTROL: _A_CONTROL,
         _USER_DEFINED: _A_USER, _UNUSED: _A_UNUSED, _BYTE: _A_BYTE}  # fmt: skip
_SPLIT = _A_CONTROL | _A_USER | _A_UNKNOWN  # the tokens llama.cpp splits the text on

# Texts llama.cpp makes CONTROL when a vocabulary has them (llama_vocab::impl::load): the
# end-of-generation tokens, and the first of each FIM kind whose id the metadata does not give.
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
              "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
              "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
              "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")  # fmt: skip
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}  # fmt: skip
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")  # fmt: skip
_ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "eot": "eot_token_id",
            "eom": "eom_token_id", "unk": "unknown_token_id", "sep": "seperator_token_id",
            "pad": "padding_token_id", "mask": "mask_token_id", "fim_pre": "fim_pre_token_id",
            "fim_suf": "fim_suf_token_id", "fim_mid": "fim_mid_token_id",
            "fim_pad": "fim_pad_token_id", "fim_rep": "fim_rep_token_id",
            "fim_sep": "fim_sep_token_id"}  # fmt: skip

# llama.cpp's pre-tokenizer regular expressions (llm_tokenizer_bpe), as Oniguruma reads them. The
# GPT-2 one ends in `|\s+`: llama.cpp runs its own code for that expression, which matches so.
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_CASED = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+<c>"
          r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*<c>")  # fmt: skip
_DEEPSEEK3 = (r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
              r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_REGEXES: dict[str, tuple[str, ...]] = {
    "llama3": (_LLAMA3,),
    "deepseek-llm": (
        r"[\r\n]",
        "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
        "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
        "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
        "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
        "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
        "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
        "\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
        "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
        "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
        "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
        "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a"
        "\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
        "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+\z",  # llama.cpp's `$`: the end of the piece (Oniguruma's `$` is the end of a line)
        _CJK,
        r"\p{N}+",
    ),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "deepseek-v3": (r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", _DEEPSEEK3),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "starcoder": (r"\p{N}", _GPT2),
    "gpt-2": (_GPT2,),
    "qwen2": (_QWEN2,),
    "qwen35": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "bloom": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+",),
    "viking": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+", r"\p{N}"),
    "tekken": (
        _CASED.replace("<c>", "") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "gpt-4o": (
        _CASED.replace("<c>", _CONTRACTIONS + "?")
        + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "seed-coder": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
    ),
    "bailingmoe": (
        r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    "ufakzeka": (
        r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "laguna": (r"[^\n]+|[\n]+", _QWEN2),
    "minicpm5": (
        r"\p{N}{1,3}",
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
    ),
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gemma4": (r"[^\n]+|[\n]+",),
}


@dataclass(frozen=True)
class _Pre:
    """How llama.cpp reads one ``tokenizer.ggml.pre`` name: its expressions and flags."""

    regexes: str  # a key of _REGEXES
    ignore_merges: bool = False
    add_bos: bool = False  # llama.cpp's default when tokenizer.ggml.add_bos_token is absent
    no_bos: bool = False  # llama.cpp drops the BOS id (ChatGLM)


def _pres() -> dict[str, _Pre]:
    table: dict[str, _Pre] = {}
    groups: list[tuple[_Pre, tuple[str, ...]]] = [
        (_Pre("llama3", ignore_merges=True, add_bos=True),
         ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
          "jina-v5-nano")),
        (_Pre("llama3"), ("dbrx", "smaug-bpe")),
        (_Pre("deepseek-llm"), ("deepseek-llm",)),
        (_Pre("deepseek-coder"), ("deepseek-coder",)),
        (_Pre("deepseek-v3"), ("deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm")),
        (_Pre("falcon"), ("falcon",)),
        (_Pre("starcoder"), ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone",
                             "minerva-7b", "mellum2")),
        (_Pre("gpt-2"), ("gpt-2", "phi-2", "gigachat", "a.x-4.0", "mellum", "exaone4", "mpt",
                         "olmo", "jais", "trillion", "granite-docling")),
        (_Pre("qwen2"), ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2",
                         "hunyuan", "solar-open", "grok-2")),
        (_Pre("qwen35"), ("qwen35",)),
        (_Pre("bloom"), ("poro-chat", "bloom", "gpt3-finnish")),
        (_Pre("llama3", no_bos=True), ("chatglm-bpe",)),
        (_Pre("llama3", ignore_merges=True, no_bos=True), ("glm4", "glm5")),
        (_Pre("viking"), ("viking",)),
        (_Pre("tekken", ignore_merges=True, add_bos=True), ("tekken",)),
        (_Pre("gpt-4o"), ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2")),
        (_Pre("seed-coder"), ("seed-coder",)),
        (_Pre("bailingmoe"), ("bailingmoe", "bailingmoe2", "llada-moe")),
        (_Pre("ufakzeka"), ("ufakzeka",)),
        (_Pre("laguna"), ("laguna",)),
        (_Pre("minicpm5", ignore_merges=True), ("minicpm5",)),
        (_Pre("default"), ("default", "")),
    ]  # fmt: skip
    for pre, names in groups:
        table.update(dict.fromkeys(names, pre))
    return table


_PRES = _pres()


@dataclass(frozen=True)
class GGUFVocab:
    """What :func:`write_tokenizer` read: the vocabulary's kind and llama.cpp's special tokens."""

    model: str  # tokenizer.ggml.model: "llama", "gpt2" or "gemma4"
    pre: str  # tokenizer.ggml.pre as llama.cpp reads it ("" for SentencePiece)
    n_tokens: int
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    unk_token_id: int | None
    add_bos_token: bool
    add_eos_token: bool
    chat_template: str | None
    eog_token_ids: tuple[int, ...] = ()  # llama.cpp's end-of-generation set
    files: tuple[str, ...] = field(default=())  # the names written into the folder


def write_tokenizer(source: Path | str | Any, folder: Path | str) -> GGUFVocab:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` into
    `folder` from the GGUF's ``tokenizer.*`` metadata, so that
    ``onnxsample.text.Tokenizer.from_folder(folder)`` tokenises as llama.cpp does (special tokens
    in the text parsed). `source`: a GGUF path or an open ``gguf.GGUFReader``. Raises
    :class:`ExportError` naming what cannot be reproduced."""
    meta = _Metadata.read(source)
    vocab = _Vocab(meta)
    data = vocab.tokenizer_json()
    config, special_map = vocab.configs()
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _dump(folder / "tokenizer.json", data, indent=None)  # tens of MB: compact
        _dump(folder / "tokenizer_config.json", config)
        _dump(folder / "special_tokens_map.json", special_map)
    except OSError as exc:
        raise ExportError(f"cannot write the tokenizer into {folder}: {exc}") from exc
    names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
    log.info(
        "tokenizer from GGUF metadata: %s%s, %d tokens, %d special, BOS %s (add %s)",
        meta.model,
        f" / {meta.pre}" if meta.model == "gpt2" else "",
        vocab.n,
        len(vocab.special_ids),
        vocab.ids.get("bos"),
        vocab.add_bos,
    )
    return GGUFVocab(
        model=meta.model,
        pre=vocab.pre_name,
        n_tokens=vocab.n,
        bos_token_id=vocab.ids.get("bos"),
        eos_token_id=vocab.ids.get("eos"),
        pad_token_id=vocab.ids.get("pad"),
        unk_token_id=vocab.ids.get("unk"),
        add_bos_token=vocab.add_bos,
        add_eos_token=vocab.add_eos,
        chat_template=meta.chat_template,
        eog_token_ids=tuple(sorted(vocab.eog)),
        files=names,
    )


@dataclass
class _Metadata:
    """The tokenizer keys of a GGUF file."""

    name: str
    model: str
    pre: str
    tokens: list[str]
    scores: list[float] | None
    types: list[int] | None
    merges: list[str] | None
    values: dict[str, Any]  # the scalar tokenizer.ggml.* keys, without the prefix
    chat_template: str | None
    named_templates: dict[str, str]

    @classmethod
    def read(cls, source: Path | str | Any) -> _Metadata:
        if isinstance(source, (str, Path)):
            import gguf

            try:
                reader = gguf.GGUFReader(str(source))
            except Exception as exc:
                raise ExportError(f"cannot read GGUF file {source}: {exc}") from exc
        else:
            reader = source
        fields = reader.fields

        def get(key: str) -> Any:
            f = fields.get(key)
            if f is None:
                return None
            try:
                return f.contents()
            except Exception as exc:
                raise ExportError(f"the GGUF's {key} cannot be read: {exc}") from exc

        def strings(key: str) -> list[str] | None:
            f = fields.get(key)
            if f is None:
                return None
            out, bad = [], 0
            for i in f.data:
                raw = f.parts[i].tobytes()
                try:
                    out.append(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    out.append(raw.decode("utf-8", "replace"))
                    bad += 1
            if bad:
                log.warning("%d entries of %s are not UTF-8; read with U+FFFD", bad, key)
            return out

        model = get("tokenizer.ggml.model")
        if not isinstance(model, str):
            raise ExportError("the GGUF has no tokenizer.ggml.model: no tokenizer to export")
        tokens = strings("tokenizer.ggml.tokens")
        if not tokens:
            raise ExportError("the GGUF has no tokenizer.ggml.tokens: no vocabulary to export")
        prefix = "tokenizer.ggml."
        skip = {"tokens", "scores", "token_type", "merges", "precompiled_charsmap"}
        values = {}
        for key, f in fields.items():
            if key.startswith(prefix) and key[len(prefix) :] not in skip and len(f.data) == 1:
                try:
                    values[key[len(prefix) :]] = f.contents()
                except Exception:  # a key we cannot decode is not one we use
                    continue
        names = get("tokenizer.chat_templates") or []
        named = {n: t for n in names if isinstance(t := get(f"tokenizer.chat_template.{n}"), str)}
        template = get("tokenizer.chat_template")
        return cls(
            name=str(get("general.name") or ""),
            model=model,
            pre=str(get("tokenizer.ggml.pre") or ""),
            tokens=tokens,
            scores=[float(s) for s in get("tokenizer.ggml.scores") or []] or None,
            types=[int(t) for t in get("tokenizer.ggml.token_type") or []] or None,
            merges=strings("tokenizer.ggml.merges"),
            values=values,
            chat_template=template if isinstance(template, str) and template else None,
            named_templates=named,
        )


class _Vocab:
    """llama.cpp's vocabulary (llama_vocab::impl::load) from the metadata, as tokenizers JSON."""

    def __init__(self, meta: _Metadata) -> None:
        self.meta = meta
        self.n = n = len(meta.tokens)
        if meta.model not in ("llama", "gpt2", "gemma4"):
            raise ExportError(
                f"GGUF tokenizer model {meta.model!r} is not supported (tokenizer.ggml.model): "
                "supported are 'llama' (SentencePiece), 'gpt2' (byte-level BPE) and 'gemma4'"
            )
        self.spm = meta.model == "llama"
        self.pre_name = ""
        if self.spm:
            if meta.scores is None:
                raise ExportError(
                    "the GGUF's SentencePiece vocabulary has no tokenizer.ggml.scores: "
                    "its merges cannot be reproduced"
                )
            self.pre = _Pre("default", add_bos=True)
        else:
            if meta.merges is None:
                raise ExportError(
                    f"the GGUF's {meta.model!r} vocabulary has no tokenizer.ggml.merges"
                )
            name = self.pre_name = "gemma4" if meta.model == "gemma4" else meta.pre
            if name in ("gemma4", "granite-embed-multi-311m"):
                self.pre = _Pre("gemma4", add_bos=True)
            elif name in _PRES:
                self.pre = _PRES[name]
                if not name:
                    log.warning("the GGUF names no tokenizer.ggml.pre; llama.cpp uses 'default'")
            else:
                raise ExportError(
                    f"GGUF pre-tokenizer {meta.pre!r} (tokenizer.ggml.pre) is not supported; "
                    f"supported: {', '.join(sorted(n for n in _PRES if n))}"
                )
        if meta.scores is not None and len(meta.scores) < n:
            raise ExportError(f"the GGUF has {len(meta.scores)} scores for {n} tokens")
        if meta.types is not None and len(meta.types) < n:
            raise ExportError(f"the GGUF has {len(meta.types)} token types for {n} tokens")
        # Byte-level BPE (GPT-2's alphabet), or BPE over raw UTF-8 with spaces as ▁ (SentencePiece
        # and Gemma 4: both fall back to <0xNN> byte tokens).
        self.byte_level = not self.spm and self.pre.regexes != "gemma4"
        self.texts = [t or f"[EMPTY_{i}]" for i, t in enumerate(meta.tokens)]
        self.to_id: dict[str, int] = {}
        for i, t in enumerate(self.texts):
            self.to_id[t] = i  # llama.cpp: a repeated text names its last id
        if len(self.to_id) < n:
            log.warning("%d GGUF tokens repeat another's text; only the last id of each is kept",
                        n - len(self.to_id))  # fmt: skip
        types = meta.types or [_NORMAL] * n
        self.attr = [_ATTR.get(t, 0) for t in types[:n]]
        v = meta.values
        self.space_prefix = bool(v.get("add_space_prefix", self.spm))
        self._special_ids(v)
        bos_default = self.pre.add_bos if not self.spm else True
        self.add_bos = bool(v.get("add_bos_token", bos_default))
        self.add_eos = bool(v.get("add_eos_token", False))
        if self.pre.regexes == "gemma4":
            self.add_bos = True  # llama.cpp's Gemma 4 work-around
        for end, on in (("bos", self.add_bos), ("eos", self.add_eos)):
            if on and self.ids.get(end) is None:
                raise ExportError(f"the GGUF adds a {end.upper()} token but names none")
        self._fix_attributes()
        self.special_ids = [i for i in range(n) if self.attr[i] & _SPLIT]
        self.rstrip = self._rstrip()

    def _special_ids(self, v: dict[str, Any]) -> None:
        """llama.cpp's special ids: its defaults per model, then the metadata's (in range)."""
        if self.spm:
            ids: dict[str, int | None] = {"bos": 1, "eos": 2, "unk": 0}
        elif self.meta.model == "gpt2":
            ids = {"bos": 11, "eos": 11}
        else:
            ids = {}
        ids = {k: (i if i is not None and i < self.n else None) for k, i in ids.items()}
        for name, key in _ID_KEYS.items():
            value = v.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                if 0 <= value < self.n:
                    ids[name] = value
                else:
                    log.warning("GGUF %s = %d is outside the vocabulary; ignored", key, value)
        if self.pre.no_bos:
            ids["bos"] = None
        self.ids = {k: i for k, i in ids.items() if i is not None}

    def _fix_attributes(self) -> None:
        """llama.cpp's fix-ups of token attributes by text (llama_vocab::impl::load)."""
        attr, to_id, ids = self.attr, self.to_id, self.ids

        def control(text: str) -> int | None:
            i = to_id.get(text)
            if i is not None:
                attr[i] |= _A_CONTROL
            return i

        if "eot" not in ids:
            for text in _EOT_TEXTS:
                if (i := control(text)) is not None:
                    ids["eot"] = i
                    break
        if "eom" not in ids and (i := control("<|eom_id|>")) is not None:
            ids["eom"] = i
        for kind, texts in _FIM_TEXTS.items():
            if kind not in ids:
                for text in texts:
                    if (i := control(text)) is not None:
                        ids[kind] = i
                        break
        eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if k in ids}
        for text in _EOG_TEXTS:
            if (i := control(text)) is not None:
                eog.add(i)
        for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):  # gpt-oss
            if (i := to_id.get(text)) is not None:
                attr[i] = _A_USER
        eog |= {ids[k] for k in ("eos", "eot", "eom") if k in ids}
        texts = {self.texts[i]: i for i in eog}
        if "<|end|>" in texts and (
            {"<|return|>", "<|call|>"} <= texts.keys() or {"<|calls|>", "<|flush|>"} <= texts.keys()
        ):
            eog.discard(texts["<|end|>"])
            attr[texts["<|end|>"]] = _A_USER
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            eog.discard(texts["</s>"])
            attr[texts["</s>"]] = _A_NORMAL
        self.eog = eog

    def _rstrip(self) -> set[int]:
        """The special tokens llama.cpp strips the whitespace after (by model name: Phi-3)."""
        name = self.meta.name.lower()
        if "phi-3" not in name and "phi3" not in name:
            return set()
        ids = set(self.special_ids)
        if (i := self.to_id.get("</s>")) is not None:
            ids.add(i)
        ids -= {self.to_id[t] for t in ("<unk>", "<s>", "<|endoftext|>") if t in self.to_id}
        return ids

    def tokenizer_json(self) -> dict[str, Any]:
        """The tokenizers JSON: model, normaliser, pre-tokenizer, decoder, added tokens, BOS/EOS."""
        vocab = self.to_id
        merges = self._spm_merges() if self.spm else self._bpe_merges()
        unk = self.ids.get("unk")
        model = {
            "type": "BPE",
            "dropout": None,
            "unk_token": self.texts[unk] if unk is not None and self.spm else None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": not self.byte_level,
            "ignore_merges": self.pre.ignore_merges,
            "vocab": vocab,
            "merges": merges,
        }
        space = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
        if self.byte_level:
            normalizer = None
            splits = [
                {"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
                for r in _REGEXES[self.pre.regexes]
            ]
            byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                          "use_regex": False}  # fmt: skip
            pre_tokenizer = {"type": "Sequence", "pretokenizers": [*splits, byte_level]}
            decoder = dict(byte_level)
        else:
            if self.spm and self.space_prefix:
                normalizer = {"type": "Sequence", "normalizers": [
                    {"type": "Prepend", "prepend": "\u2581"}, space]}  # fmt: skip
            else:
                normalizer = space
            pre_tokenizer = None
            if not self.spm:  # Gemma 4: newline runs apart
                pre_tokenizer = {"type": "Split", "pattern": {"Regex": r"[^\n]+|[\n]+"},
                                 "behavior": "Isolated", "invert": False}  # fmt: skip
            steps = [
                {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ]
            if self.space_prefix:
                steps.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
            decoder = {"type": "Sequence", "decoders": steps}
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [self._added(i) for i in self.special_ids if vocab[self.texts[i]] == i],
            "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer,
            "model": model,
            "post_processor": self._post_processor(),
            "decoder": decoder,
        }

    def _added(self, i: int) -> dict[str, Any]:
        return {
            "id": i,
            "content": self.texts[i],
            "single_word": False,
            "lstrip": False,
            "rstrip": i in self.rstrip,
            "normalized": False,
            "special": bool(self.attr[i] & (_A_CONTROL | _A_UNKNOWN)),
        }

    def _post_processor(self) -> dict[str, Any] | None:
        ends = [(k, self.ids[k]) for k, on in (("bos", self.add_bos), ("eos", self.add_eos)) if on]
        if not ends:
            return None
        text = {k: self.texts[i] for k, i in ends}

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
                self.texts[i]: {"id": self.texts[i], "ids": [i], "tokens": [self.texts[i]]}
                for _, i in ends
            },
        }

    def _spm_merges(self) -> list[list[str]]:
        """Every split of a token into two tokens, ranked by the merged token's score (highest
        first): llama.cpp's SentencePiece merge order as BPE ranks. Byte tokens are never built."""
        scores, to_id, attr = self.meta.scores, self.to_id, self.attr
        assert scores is not None
        ranked = []
        for text, i in to_id.items():
            if len(text) < 2 or attr[i] & _A_BYTE:
                continue
            for k in range(1, len(text)):
                left, right = text[:k], text[k:]
                if left in to_id and right in to_id:
                    ranked.append((-scores[i], i, to_id[left], left, right))
        ranked.sort()
        return [[left, right] for *_, left, right in ranked]

    def _bpe_merges(self) -> list[list[str]]:
        """The GGUF's merges ("left right", split at the first space after the first character as
        llama.cpp does); those whose parts or result are no token cannot be applied and are left out."""
        assert self.meta.merges is not None
        out, seen, dropped = [], set(), 0
        for merge in self.meta.merges:
            cut = merge.find(" ", 1)
            if cut < 0:
                dropped += 1
                continue
            pair = (merge[:cut], merge[cut + 1 :])
            if pair in seen:  # llama.cpp keeps the first rank
                continue
            seen.add(pair)
            if pair[0] in self.to_id and pair[1] in self.to_id and pair[0] + pair[1] in self.to_id:
                out.append(list(pair))
            else:
                dropped += 1
        if dropped:
            log.info("%d GGUF merges name no token and are left out", dropped)
        return out

    def configs(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """tokenizer_config.json and special_tokens_map.json. A special token is named only where it
        is one llama.cpp splits the text on (else naming it would make it one)."""
        special = set(self.special_ids)
        named: dict[str, str] = {}
        for key in ("bos", "eos", "unk", "pad"):
            i = self.ids.get(key)
            if i is None:
                continue
            if i in special:
                named[f"{key}_token"] = self.texts[i]
            else:
                log.info("%s token %d (%r) is an ordinary token; not named", key, i, self.texts[i])
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **named,
            "add_bos_token": self.add_bos,
            "add_eos_token": self.add_eos,
            "clean_up_tokenization_spaces": False,
            "model_input_names": ["input_ids", "attention_mask"],
            "added_tokens_decoder": {
                str(i): {k: v for k, v in self._added(i).items() if k != "id"}
                for i in self.special_ids
                if self.to_id[self.texts[i]] == i
            },
        }
        template = self.meta.chat_template
        if self.meta.named_templates:
            config["chat_template"] = [
                *([{"name": "default", "template": template}] if template else []),
                *({"name": k, "template": t} for k, t in self.meta.named_templates.items()),
            ]
        elif template:
            config["chat_template"] = template
        return config, dict(named)


def _dump(path: Path, data: dict[str, Any], *, indent: int | None = 2) -> None:
    separators = (",", ":") if indent is None else None
    text = json.dumps(data, ensure_ascii=False, indent=indent, separators=separators)
    path.write_text(text + "\n", encoding="utf-8")
