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
model (``bert``, ``t5``, ``rwkv``, ...), a pre-tokenizer name outside :data:`._gguf_vocab_rules.PRE_TOKENIZERS` (llama.cpp's own
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

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxsample.errors import ExportError
from onnxsample.exporters._gguf_tokenizer_json import configs, dump, tokenizer_json
from onnxsample.exporters._gguf_vocab_rules import (
    A_CONTROL,
    A_NORMAL,
    A_USER,
    ATTR,
    EOG_TEXTS,
    EOT_TEXTS,
    FIM_TEXTS,
    ID_KEYS,
    PRE_TOKENIZERS,
    SPLIT,
    T_NORMAL,
    PreTokenizer,
)

__all__ = ["GGUFVocab", "write_tokenizer"]

log = logging.getLogger(__name__)


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
    vocab = LlamaVocab(meta)
    data = tokenizer_json(vocab)
    config, special_map = configs(vocab)
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        dump(folder / "tokenizer.json", data, indent=None)  # tens of MB: compact
        dump(folder / "tokenizer_config.json", config)
        dump(folder / "special_tokens_map.json", special_map)
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
            from onnxsample.exporters._gguf_reader import FastGGUFReader

            try:
                reader = FastGGUFReader(str(source))
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


class LlamaVocab:
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
            self.pre = PreTokenizer("default", add_bos=True)
        else:
            if meta.merges is None:
                raise ExportError(
                    f"the GGUF's {meta.model!r} vocabulary has no tokenizer.ggml.merges"
                )
            name = self.pre_name = "gemma4" if meta.model == "gemma4" else meta.pre
            if name in ("gemma4", "granite-embed-multi-311m"):
                self.pre = PreTokenizer("gemma4", add_bos=True)
            elif name in PRE_TOKENIZERS:
                self.pre = PRE_TOKENIZERS[name]
                if not name:
                    log.warning("the GGUF names no tokenizer.ggml.pre; llama.cpp uses 'default'")
            else:
                raise ExportError(
                    f"GGUF pre-tokenizer {meta.pre!r} (tokenizer.ggml.pre) is not supported; "
                    f"supported: {', '.join(sorted(n for n in PRE_TOKENIZERS if n))}"
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
        types = meta.types or [T_NORMAL] * n
        self.attr = [ATTR.get(t, 0) for t in types[:n]]
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
        self.special_ids = [i for i in range(n) if self.attr[i] & SPLIT]
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
        for name, key in ID_KEYS.items():
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
                attr[i] |= A_CONTROL
            return i

        if "eot" not in ids:
            for text in EOT_TEXTS:
                if (i := control(text)) is not None:
                    ids["eot"] = i
                    break
        if "eom" not in ids and (i := control("<|eom_id|>")) is not None:
            ids["eom"] = i
        for kind, texts in FIM_TEXTS.items():
            if kind not in ids:
                for text in texts:
                    if (i := control(text)) is not None:
                        ids[kind] = i
                        break
        eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if k in ids}
        for text in EOG_TEXTS:
            if (i := control(text)) is not None:
                eog.add(i)
        for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):  # gpt-oss
            if (i := to_id.get(text)) is not None:
                attr[i] = A_USER
        eog |= {ids[k] for k in ("eos", "eot", "eom") if k in ids}
        texts = {self.texts[i]: i for i in eog}
        if "<|end|>" in texts and (
            {"<|return|>", "<|call|>"} <= texts.keys() or {"<|calls|>", "<|flush|>"} <= texts.keys()
        ):
            eog.discard(texts["<|end|>"])
            attr[texts["<|end|>"]] = A_USER
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            eog.discard(texts["</s>"])
            attr[texts["</s>"]] = A_NORMAL
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
