"""The llama.cpp-made GGUF fixtures themselves (tests/_llama_cpp_models.py, their tokenizers from
tests/_llama_cpp_vocab.py): each file is the family's architecture with the tensor types its mix
stands for, carries its real vocabulary token for token, and llama.cpp tokenizes with it as with
the source vocabulary (and transformers with the HF folder).

gguf.GGUFReader reads the Q4_K_M file of each family (seconds each over a 262k vocabulary); the
other tests read headers and vocabularies with the fixtures' own quick reader, which must agree with
GGUFReader on those files. The first run builds every fixture (minutes); later runs
read the cache.
"""

from __future__ import annotations

from pathlib import Path

import _llama_cpp_models as fixtures
import _llama_cpp_vocab as vocabs
import pytest
from _gguf_header import read_header
from _llama_cpp import LlamaCpp

pytestmark = pytest.mark.slow  # builds the fixtures once; llama-tokenize runs per string

ALL_MIXES = fixtures.FLOATS + fixtures.MIXES
# mix: (the type every 2-D weight has, or one of them must have; the other types allowed). 1-D
# tensors (norms, biases, rope factors) stay F32 in every mix. llama-quantize gives the output
# projection (or the tied embedding) Q6_K in the K-quant mixes and Q4_0, and Q6_K to some attn_v
# and ffn_down in the _M mixes.
TYPES = {
    "F32": ("F32", set()),
    "F16": ("F16", set()),
    "BF16": ("BF16", set()),
    "Q8_0": ("Q8_0", set()),
    "Q6_K": ("Q6_K", set()),
    "Q5_K_M": ("Q5_K", {"Q6_K"}),
    "Q4_K_M": ("Q4_K", {"Q6_K"}),
    "Q4_0": ("Q4_0", {"Q6_K"}),
}
PRE = {
    "llama": "default",
    "llama3": "llama-bpe",
    "mistral": "default",
    "qwen2": "qwen2",
    "qwen3": "qwen2",
    "phi3": "default",
    "gemma2": "default",
    "gemma3": "default",
}
LAYERS = {"gemma3": 6}  # the others: 2
TEXTS = [
    "The capital of France is Paris.",
    "  two spaces,\ta tab and\nnew lines\n\n",
    "数字 12345 и кириллица, emoji 🦙 and 3.14159",
]


def _need(family: str, llama_cpp: LlamaCpp) -> None:
    if reason := fixtures.missing(family, llama_cpp):
        pytest.skip(reason)


@pytest.mark.parametrize("mix", ALL_MIXES)
@pytest.mark.parametrize("family", fixtures.FAMILIES)
def test_architecture_and_tensor_types(family: str, mix: str, llama_cpp: LlamaCpp) -> None:
    _need(family, llama_cpp)
    header = read_header(fixtures.gguf(family, mix, llama_cpp))
    fields = header.fields
    arch = fixtures.ARCHITECTURES[family]
    assert fields["general.architecture"] == arch
    assert fields[f"{arch}.block_count"] == LAYERS.get(family, 2)
    assert fields[f"{arch}.embedding_length"] == 256
    assert fields["tokenizer.ggml.pre"] == PRE[family]
    main, others = TYPES[mix]
    flat = {name: kind for name, (kind, shape) in header.tensors.items() if len(shape) == 1}
    matrices = {name: kind for name, (kind, shape) in header.tensors.items() if len(shape) == 2}
    assert set(flat.values()) == {"F32"}, flat
    assert set(matrices.values()) == {main, *others}, matrices
    for name, (kind, shape) in header.tensors.items():  # rows of whole K-quant super-blocks
        assert len(shape) == 1 or shape[0] % 256 == 0, (name, kind, shape)
    # every mix carries the converted vocabulary and metadata but the file type
    converted = read_header(fixtures.gguf(family, "F32", llama_cpp)).fields
    assert {k: v for k, v in fields.items() if k != "general.file_type"} == {
        k: v for k, v in converted.items() if k != "general.file_type"
    }


@pytest.mark.parametrize("family", fixtures.FAMILIES)
def test_gguf_reader_loads(family: str, llama_cpp: LlamaCpp) -> None:
    """gguf.GGUFReader reads a quantised file as the quick header reader does."""
    import gguf

    _need(family, llama_cpp)
    path = fixtures.gguf(family, "Q4_K_M", llama_cpp)
    reader = gguf.GGUFReader(str(path))
    header = read_header(path)
    fields = {k: v.contents() for k, v in reader.fields.items() if not k.startswith("GGUF.")}
    assert fields == header.fields
    tensors = {t.name: (t.tensor_type.name, tuple(int(d) for d in t.shape)) for t in reader.tensors}
    assert tensors == header.tensors


@pytest.mark.parametrize("family", fixtures.FAMILIES)
def test_vocabulary_is_the_source(family: str, llama_cpp: LlamaCpp) -> None:
    """The converter wrote back the real vocabulary: tokens (and, for SentencePiece vocabularies
    from a GGUF, scores and types of every token but the padding the converter adds itself)."""
    _need(family, llama_cpp)
    path = fixtures.gguf(family, "F32", llama_cpp)
    ours = vocabs.read_vocab(path)
    assert ours.tokens == fixtures.expected_tokens(family, llama_cpp)
    source_path = vocabs.vocab_source(family, llama_cpp)
    source = vocabs.read_vocab(source_path)
    if source.merges is not None:
        assert ours.merges == source.merges
    if source_path.suffix == ".gguf" and source.scores is not None:
        kept = [i for i, t in enumerate(source.tokens) if not vocabs.is_padding(t)]
        assert [ours.types[i] for i in kept] == [source.types[i] for i in kept]
        assert [ours.scores[i] for i in kept] == [source.scores[i] for i in kept]
    for kind in ("bos", "eos", "unknown", "padding"):
        name = f"tokenizer.ggml.{kind}_token_id"
        if name in source.meta:
            assert ours.meta.get(name) == source.meta[name], name
    for name in ("tokenizer.ggml.add_space_prefix", "tokenizer.chat_template"):
        assert ours.meta.get(name) == source.meta.get(name), name


@pytest.mark.parametrize("family", [f for f in fixtures.FAMILIES if vocabs.VOCABS[f].kind == "spm"])
def test_sentencepiece_model_loads(family: str, llama_cpp: LlamaCpp) -> None:
    from sentencepiece import SentencePieceProcessor

    _need(family, llama_cpp)
    model = fixtures.hf_folder(family, llama_cpp) / "tokenizer.model"
    processor = SentencePieceProcessor(model_file=str(model))
    expected = fixtures.expected_tokens(family, llama_cpp)
    pieces = vocabs.VOCABS[family].pieces or len(expected)
    assert processor.vocab_size() == pieces
    assert processor.unk_id() >= 0 and processor.bos_id() >= 0
    ids = processor.encode("The capital of France is Paris.")
    assert ids and all(0 <= i < pieces for i in ids)


@pytest.mark.parametrize("family", fixtures.FAMILIES)
def test_llama_tokenize_as_the_source(family: str, llama_cpp: LlamaCpp) -> None:
    """llama-tokenize gives the same ids with the fixture as with the source vocabulary (or, for
    a tokenizer.model source, as SentencePiece), and transformers the same with the HF folder."""
    from transformers import AutoTokenizer

    _need(family, llama_cpp)
    path = fixtures.gguf(family, "Q4_K_M", llama_cpp)
    source = vocabs.vocab_source(family, llama_cpp)
    tokenizer = AutoTokenizer.from_pretrained(fixtures.hf_folder(family, llama_cpp))
    for text in [*TEXTS, fixtures.CHAT[family]]:
        ids = llama_cpp.tokenize(path, text)
        if source.suffix == ".gguf" or text in TEXTS:  # SentencePiece parses no special tokens
            assert ids == _source_ids(llama_cpp, source, text), text
        assert ids == tokenizer(text)["input_ids"], text


def _source_ids(llama_cpp: LlamaCpp, source: Path, text: str) -> list[int]:
    if source.suffix == ".gguf":
        return llama_cpp.tokenize(source, text)
    from sentencepiece import SentencePieceProcessor

    processor = SentencePieceProcessor(model_file=str(source))
    return [processor.bos_id(), *processor.encode(text)]
