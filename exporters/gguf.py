"""GGUF files: check what is inside, write their tokenizer, de-quantise to fp32 through transformers
into an HF folder (what optimum's exporter reads).

The tokenizer comes from the file's metadata alone, as llama.cpp builds it (:mod:`._gguf_vocab`):
transformers' GGUF tokenizer conversion splits SentencePiece words into pieces (Gemma's 262k
vocabulary), maps SmolLM2's EOS to `<|im_start|>` and prepends BOS where the file says not to.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxsample._gguf_file import GGUF_MAGIC
from onnxsample.errors import ExportError

__all__ = [
    "GGUFInfo",
    "check_architecture",
    "gguf_config",
    "gguf_generation_config",
    "gguf_model",
    "gguf_to_hf",
    "gguf_tokenizer",
    "inspect_gguf",
    "open_gguf",
    "split_count",
]

log = logging.getLogger(__name__)

# Float types transformers reads directly; the quantised ones are those gguf can de-quantise.
_FLOAT_TYPES = {"F32", "F16", "BF16"}
_TOKEN_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
}
# End-of-generation tokens besides EOS, as llama.cpp's vocabulary reads them.
_EOG_KEYS = ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


@dataclass
class GGUFInfo:
    """What :func:`inspect_gguf` read from a GGUF file's header."""

    architecture: str
    tensor_types: Counter
    n_params: int
    metadata: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, str] = field(default_factory=dict)  # name -> GGUF type name

    def token_id(self, key: str) -> int | None:
        value = self.metadata.get(_TOKEN_KEYS[key])
        return None if value is None else int(value)

    def eog_ids(self) -> list[int]:
        ids = [self.token_id("eos")] + [self.metadata.get(k) for k in _EOG_KEYS]
        return sorted({int(i) for i in ids if i is not None})


def _supported_types() -> set[str]:
    import gguf.quants

    # gguf has no public list of the types its numpy de-quantiser implements.
    return _FLOAT_TYPES | {t.name for t in gguf.quants._type_traits}


def _scalar(field_) -> Any:
    try:
        value = field_.contents()
    except Exception:  # a field gguf cannot decode is not one we need
        return None
    return value if isinstance(value, (int, float, str, bool)) else None


def inspect_gguf(path: Path) -> GGUFInfo:
    """Read a GGUF header and tensor table, and refuse a file without an architecture or with
    tensors that cannot be de-quantised. Whether transformers and optimum know the architecture is
    :func:`check_architecture`'s question (it imports them, which takes seconds)."""
    from gguf import GGUFValueType

    reader = open_gguf(path, arrays=False)  # a scalar's value, an array's type and length
    metadata = {
        name: _scalar(f)
        for name, f in reader.fields.items()
        if f.types[:1] != [GGUFValueType.ARRAY]
    }
    metadata = {k: v for k, v in metadata.items() if v is not None}
    architecture = str(metadata.get("general.architecture", ""))
    tensors = {t.name: t.tensor_type.name for t in reader.tensors}
    n_params = sum(int(t.n_elements) for t in reader.tensors)
    info = GGUFInfo(architecture, Counter(tensors.values()), n_params, metadata, tensors)
    _check(info, path)
    return info


def open_gguf(path: Path, *, arrays: bool = True):
    """`gguf.GGUFReader` over `path`, with one clear line for a file that is not a GGUF, is
    truncated, or holds a tensor type this gguf package does not know. The first part of a split
    GGUF reads as the whole model: its header (where llama.cpp writes the metadata) and the
    tensors of every part, as llama.cpp loads it. Without `arrays`, an array field keeps its type
    and length but not its items (the vocabulary's: most of a header's reading)."""
    from onnxsample.exporters._source import split_parts

    reader = _open_one(path, arrays)
    count = _split_count(reader)
    if count < 2:
        return reader
    parts = split_parts(path, count)
    if len(parts) != count:
        raise ExportError(
            f"{path.name} is the first of {count} parts of a split GGUF, but is not named as "
            "llama.cpp names them (PREFIX-00001-of-0000N.gguf), so the others cannot be found"
        )
    return _SplitReader(reader, [_open_one(p, arrays) for p in parts[1:]])


def split_count(path: Path) -> int:
    """How many files the GGUF `path` says it is in (its header's ``split.count``; 1 when the
    header says nothing), with :func:`open_gguf`'s line for a file it cannot read."""
    return _split_count(_open_one(path, arrays=False))


def _split_count(reader) -> int:
    field = reader.fields.get("split.count")
    return int(field.contents()) if field is not None else 1


class _SplitReader:
    """A split GGUF's first part's header, and the tensors of all its parts in order."""

    def __init__(self, first, rest: list) -> None:
        self.fields = first.fields
        self.tensors = [t for r in (first, *rest) for t in r.tensors]


_VERSIONS = (2, 3)


def _open_one(path: Path, arrays: bool = True):
    from onnxsample.exporters._gguf_reader import FastGGUFReader, HeaderReader, TruncatedGGUF

    with open(path, "rb") as f:
        magic, version = f.read(4), f.read(4)
    if magic != GGUF_MAGIC:
        raise ExportError(f"{path.name} is not a GGUF file (it does not start with 'GGUF')")
    number = int.from_bytes(version, "little")
    if number & 0xFFFF == 0:  # a big-endian file, as gguf reads it
        number = int.from_bytes(version, "big")
    if len(version) == 4 and number not in _VERSIONS:
        raise ExportError(  # as llama.cpp reads them: 2 and 3 (1 is long gone)
            f"{path.name} is GGUF version {number}, which this exporter does not read "
            f"(versions {', '.join(map(str, _VERSIONS))})"
        )
    size, reader_of = path.stat().st_size, FastGGUFReader if arrays else HeaderReader
    try:
        reader = reader_of(str(path))
    except TruncatedGGUF as exc:  # the header, and every tensor's data, end inside the file
        raise ExportError(f"{path.name} is truncated: {exc}") from exc
    except ValueError as exc:
        if "GGMLQuantizationType" in str(exc):
            raise ExportError(
                f"{path.name} holds a tensor of a type this exporter does not know ({exc}); "
                "a newer llama.cpp may have written it"
            ) from exc
        raise ExportError(f"{path.name} is truncated or damaged ({size} bytes): {exc}") from exc
    except Exception as exc:  # gguf raises what numpy raises on a short file
        raise ExportError(f"{path.name} is truncated or damaged ({size} bytes): {exc}") from exc
    return reader


def _check(info: GGUFInfo, path: Path) -> None:
    if not info.architecture:
        raise ExportError(f"{path} has no general.architecture: not a model GGUF")
    unsupported = sorted(set(info.tensor_types) - _supported_types())
    if unsupported:
        raise ExportError(
            f"{path.name} holds tensors of type {', '.join(unsupported)}, which cannot be de-quantised; "
            "supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants and the IQ types"
        )


# llama.cpp's classification head (LLM_TENSOR_CLS, _CLS_OUT, _CLS_NORM): a reranker's or a
# classifier's, whose output is a score per text, not a next token. transformers' GGUF loader skips
# it, so the optimum layout would export the file as a generator without it.
_CLASSIFIER = ("cls.weight", "cls.bias", "cls.output.", "cls.norm.")


def check_architecture(info: GGUFInfo, *, optimum: bool = True, what: str = "the GGUF") -> None:
    """Refuse a mixture of experts, a reranker, an architecture transformers cannot read from a
    GGUF, or (with `optimum`, the optimum layout's question) optimum cannot export as a decoder with
    a KV cache."""
    from onnxsample.exporters.families._family import refuse_experts
    from onnxsample.exporters.families.llama import ROPE_FREQS

    refuse_experts(info.metadata, what)
    if heads := sorted(name for name in info.tensors if name.startswith(_CLASSIFIER)):
        raise ExportError(
            f"{what} is a reranker or classifier (its {', '.join(heads)} scores a text, as "
            "llama.cpp's --rerank / --pooling rank run it): onnxsample exports text generators"
        )
    if optimum and ROPE_FREQS in info.tensors:
        raise ExportError(
            f"{what}: transformers' GGUF loader, which the optimum layout exports from, leaves out "
            f"its {ROPE_FREQS} (Llama 3.1+'s rope scaling); the gqa layout (the default) reads it"
        )
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    from onnxsample.exporters.hf import check_model_type

    if info.architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ExportError(
            f"GGUF architecture {info.architecture!r} is not supported; supported: "
            + ", ".join(_exportable(GGUF_SUPPORTED_ARCHITECTURES))
        )
    if optimum:
        check_model_type(info.architecture, f"GGUF architecture {info.architecture!r}")


def _exportable(readable: object) -> list[str]:
    """The GGUF architectures an export takes: the gqa layout's families, and of those
    transformers reads (`readable`), the ones optimum exports as a decoder with a KV cache that
    are not a mixture of experts (refused whatever reads them)."""
    from onnxsample.exporters.families import GGUF_ARCHITECTURES
    from onnxsample.exporters.hf import check_model_type

    def optimum_exports(architecture: str) -> bool:
        try:
            check_model_type(architecture, architecture)
        except ExportError:
            return False
        return True

    others = {a for a in readable if a not in ("general", "tokenizer") and "moe" not in a}
    return sorted(set(GGUF_ARCHITECTURES) | {a for a in others if optimum_exports(a)})


def gguf_tokenizer(path: Path, folder: Path):
    """Write the GGUF's tokenizer into `folder` from its metadata alone, as llama.cpp tokenises
    (:mod:`._gguf_vocab`), and read it back as the runtime does: (the vocabulary's facts,
    :class:`onnxsample.text.Tokenizer`)."""
    from onnxsample.exporters._gguf_vocab import write_tokenizer
    from onnxsample.text import Tokenizer

    vocab = write_tokenizer(path, folder)
    return vocab, Tokenizer.from_folder(folder)


def gguf_generation_config(info: GGUFInfo, eog_ids: Sequence[int] = ()):
    """EOS: llama.cpp's end-of-generation tokens (`eog_ids`, from the vocabulary) and the header's."""
    from transformers import GenerationConfig

    return GenerationConfig(
        bos_token_id=info.token_id("bos"),
        eos_token_id=sorted({*info.eog_ids(), *eog_ids}) or None,
        pad_token_id=info.token_id("pad"),
    )


def gguf_config(path: Path):
    """The transformers config of a GGUF model (no weights read)."""
    from transformers import AutoConfig

    from onnxsample.exporters._gguf_reader import VOCABULARY_SIZES, config_gguf_reader
    from onnxsample.exporters.hf import quiet

    try:
        with quiet(), config_gguf_reader():
            config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:
        raise ExportError(f"transformers cannot read the config of {path.name}: {exc}") from exc
    size = VOCABULARY_SIZES.pop(os.path.realpath(path), None)
    if size is not None:  # the header names none: the tokens' count, as transformers takes it
        config.vocab_size = size
    return config


def gguf_model(path: Path, info: GGUFInfo, eog_ids: Sequence[int] = ()):
    """The GGUF de-quantised to an fp32 transformers model."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from onnxsample.exporters._gguf_reader import fast_gguf_reader
    from onnxsample.exporters.families.llama import ROPE_FREQS
    from onnxsample.exporters.hf import quiet

    try:
        with quiet(), _no_dequantise_bar(), fast_gguf_reader():
            model = AutoModelForCausalLM.from_pretrained(
                path.parent, dtype=torch.float32, gguf_file=path.name
            )
    except Exception as exc:
        raise ExportError(f"transformers cannot load {path.name}: {exc}") from exc
    if ROPE_FREQS in info.tensors:  # the loader leaves them out: divided here, as llama.cpp does
        factors = next(t for t in open_gguf(path).tensors if t.name == ROPE_FREQS)
        rotary = model.model.rotary_emb  # original_inv_freq is the same tensor
        rotary.inv_freq.div_(torch.from_numpy(np.array(factors.data, np.float32).reshape(-1)))
    model.generation_config = gguf_generation_config(info, eog_ids)
    return model.eval()


def gguf_to_hf(path: Path, info: GGUFInfo, hf_dir: Path):
    """De-quantise a GGUF to an fp32 HF folder at `hf_dir` (its tokenizer as :func:`gguf_tokenizer`
    writes it); returns (model, vocabulary facts, tokenizer)."""
    vocab, tokenizer = gguf_tokenizer(path, hf_dir)
    model = gguf_model(path, info, vocab.eog_token_ids)
    model.save_pretrained(hf_dir)
    return model, vocab, tokenizer


@contextlib.contextmanager
def _no_dequantise_bar() -> Iterator[None]:
    """transformers draws its own tqdm bar while de-quantising; our stage progress replaces it."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    original = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original
