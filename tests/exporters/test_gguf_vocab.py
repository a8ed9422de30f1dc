"""The tokenizer of a GGUF file from its metadata alone (exporters/_gguf_vocab.py) tokenises as
llama.cpp does: on llama.cpp's own vocabulary files and their expected ids (models/*.gguf.inp/.out),
and live against llama-tokenize on hard strings (whitespace runs, code, digits, accents, CJK, emoji,
control characters, special tokens written in the text), with and without BOS; decoding gives the
text back; what cannot be reproduced is refused with an ExportError that names it."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf
import pytest
from _hard_texts import HARD, hard_corpus

from onnxsample.errors import ExportError
from onnxsample.exporters import embedded_gguf
from onnxsample.exporters._gguf_vocab import GGUFVocab, write_tokenizer
from onnxsample.text import Tokenizer

pytestmark = pytest.mark.slow  # every vocabulary is read and llama-tokenize runs per string

# llama.cpp's vocabulary files (models/ggml-vocab-NAME.gguf, with .inp/.out), and "smollm": the
# embedded SmolLM2 GGUF (byte-level BPE, pre "smollm"). Live checks leave out qwen35 (llama-tokenize
# reads 150k tokens per string; its .inp cases cover its expression).
VOCABS = [
    "llama-spm",  # SentencePiece, Llama 2
    "phi-3",  # SentencePiece, Phi-3's right-stripping special tokens
    "gpt-2",
    "qwen2",
    "qwen35",
    "llama-bpe",  # Llama 3: ignore_merges, BOS by default
    "deepseek-llm",
    "deepseek-coder",
    "falcon",
    "starcoder",
    "mpt",
    "gemma-4",  # tokenizer.ggml.model "gemma4": BPE over text with spaces as ▁
]
# "gemma3": the real Gemma 3 270M Q4_K_M file (conftest's real_gguf: 262k SentencePiece tokens).
LIVE = ["smollm", "gemma3", *(n for n in VOCABS if n != "qwen35")]
# deepseek's single-character user-defined tokens that are letters of GPT-2's byte alphabet ("ö")
# decode through the byte-level decoder as one byte (transformers' tokenizer does the same).
ROUND_TRIP = [n for n in LIVE if not n.startswith("deepseek")]


def _path(llama_cpp, name: str, real_gguf: Path) -> Path:
    if name == "smollm":
        return embedded_gguf()
    if name == "gemma3":
        return real_gguf
    return llama_cpp.src / "models" / f"ggml-vocab-{name}.gguf"


@pytest.fixture(scope="module")
def written(llama_cpp, real_gguf, tmp_path_factory):
    """name -> (GGUF path, what write_tokenizer returned, Tokenizer.from_folder of its folder),
    written once per vocabulary."""
    cache: dict[str, tuple[Path, GGUFVocab, Tokenizer]] = {}

    def get(name: str) -> tuple[Path, GGUFVocab, Tokenizer]:
        if name not in cache:
            path = _path(llama_cpp, name, real_gguf)
            folder = tmp_path_factory.mktemp(f"vocab-{name}")
            vocab = write_tokenizer(path, folder)
            cache[name] = path, vocab, Tokenizer.from_folder(folder)
        return cache[name]

    return get


def _cases(path: Path) -> list[tuple[str, list[int]]]:
    """llama.cpp's test cases (tests/test-tokenizer-0.cpp's format): the .inp texts split by
    "\\n__ggml_vocab_test__\\n", one line of ids per text in .out (no BOS)."""
    texts = Path(f"{path}.inp").read_bytes().decode("utf-8").split("\n__ggml_vocab_test__\n")
    lines = Path(f"{path}.out").read_text(encoding="utf-8").split("\n")
    assert len(lines) >= len(texts)
    return [(t, [int(i) for i in line.split()]) for t, line in zip(texts, lines, strict=False)]


@pytest.mark.parametrize("name", VOCABS)
def test_llama_cpp_cases(written, name):
    """Every case of llama.cpp's own tokenizer test gives its expected ids (no BOS)."""
    path, _, tokenizer = written(name)
    cases = _cases(path)
    assert len(cases) > 40
    wrong = [
        (text, want, got)
        for text, want in cases
        if (got := tokenizer.encode(text, add_special_tokens=False)) != want
    ]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ, first: {wrong[0]}"


@pytest.mark.parametrize("name", LIVE)
def test_as_llama_tokenize(written, llama_cpp, name):
    """Hard strings and special tokens in the text tokenise as llama-tokenize does (special tokens
    parsed), with BOS as the vocabulary says and without."""
    path, _, tokenizer = written(name)
    corpus = hard_corpus(tokenizer)
    jobs = [(text, True) for text in corpus] + [(text, False) for text in corpus[:8]]
    with ThreadPoolExecutor(2) as pool:
        wants = list(pool.map(lambda job: llama_cpp.tokenize(path, job[0], bos=job[1]), jobs))
    wrong = [
        (text, bos, want, got)
        for (text, bos), want in zip(jobs, wants, strict=True)
        if (got := tokenizer.encode(text, add_special_tokens=bos)) != want
    ]
    assert not wrong, f"{len(wrong)} of {len(jobs)} differ, first: {wrong[0]}"


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_decode_round_trips(written, name):
    """decode(encode(text)) is the text: ▁ back to spaces, byte tokens back to bytes, the prefixed
    space dropped again (a literal ▁ in SentencePiece text cannot come back)."""
    _, vocab, tokenizer = written(name)
    lossy = vocab.model in ("llama", "gemma4")
    wrong = []
    for text in HARD:
        if lossy and "\u2581" in text:
            continue
        for bos in (True, False):
            if (back := tokenizer.decode(tokenizer.encode(text, add_special_tokens=bos))) != text:
                wrong.append((text, bos, back))
    assert not wrong, f"{len(wrong)} differ, first: {wrong[0]}"


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_a_fragments_tokens_spell_it(written, name):
    """encode_fragment, what a grammar forces text with (llguidance's tokenize): the tokens' bytes
    are the text's own, with no space prefix first (SentencePiece vocabularies put one before a
    text: forced, "no" came out "n o"), where the vocabulary does not normalise the text."""
    _, vocab, tokenizer = written(name)
    sentencepiece = vocab.model in ("llama", "gemma4")
    normaliser = tokenizer._unprefixed.normalizer
    wrong = []
    for text in HARD:  # special tokens' texts left out: Phi-3's swallow the spaces after them
        if sentencepiece and "\u2581" in text:
            continue  # a literal ▁ is a space to SentencePiece
        want = normaliser.normalize_str(text) if normaliser is not None else text
        want = want.replace("\u2581", " ") if sentencepiece else want
        spelled = b"".join(tokenizer.token_bytes(i) for i in tokenizer.encode_fragment(text))
        if spelled != want.encode():
            wrong.append((text, spelled))
    assert not wrong, f"{len(wrong)} differ, first: {wrong[0]}"


@pytest.mark.parametrize(
    ("name", "model", "pre", "bos", "add_bos", "eos", "template"),
    [
        ("llama-spm", "llama", "", 1, True, 2, False),
        ("phi-3", "llama", "", 1, True, 32000, True),
        ("gpt-2", "gpt2", "gpt-2", 50256, False, 50256, False),
        ("llama-bpe", "gpt2", "llama-bpe", 128000, True, 128001, False),  # BOS by default
        ("smollm", "gpt2", "smollm", 1, False, 2, True),  # add_bos_token = false in the GGUF
    ],
)
def test_special_tokens(written, name, model, pre, bos, add_bos, eos, template):
    """BOS/EOS ids and whether BOS is added, as llama.cpp reads them; the chat template kept;
    the runtime's tokenizer reports the same and knows every id."""
    _, vocab, tokenizer = written(name)
    assert (vocab.model, vocab.pre, vocab.bos_token_id, vocab.add_bos_token) == (
        model,
        pre,
        bos,
        add_bos,
    )
    assert vocab.eos_token_id == eos and eos in vocab.eog_token_ids
    assert tokenizer.bos_token_id == bos and tokenizer.eos_token_id == eos
    assert tokenizer.vocab_size == vocab.n_tokens
    assert (tokenizer.chat_template is not None) == template == (vocab.chat_template is not None)
    ids = tokenizer.encode("Hello")
    assert (ids[0] == bos) == add_bos
    assert eos in tokenizer.special_ids


def test_phi3_strips_after_special_tokens(written, llama_cpp):
    """Phi-3 (by model name): llama.cpp eats the whitespace after its special tokens."""
    path, _, tokenizer = written("phi-3")
    text = "<|user|>\n  Hi<|end|>\n<|assistant|>\n"
    assert tokenizer.encode(text) == llama_cpp.tokenize(path, text)
    assert tokenizer.encode(text)[:3] == [1, 32010, 6324]  # BOS, <|user|>, "▁Hi"


def test_reader_or_path(llama_cpp, tmp_path):
    """An open GGUFReader gives the same files as the path; the files are the three named."""
    path = llama_cpp.src / "models" / "ggml-vocab-llama-spm.gguf"
    a = write_tokenizer(path, tmp_path / "a")
    b = write_tokenizer(gguf.GGUFReader(path), tmp_path / "b")
    assert a == b
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(a.files)
    for name in a.files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    config = json.loads((tmp_path / "a" / "tokenizer_config.json").read_text())
    assert config["add_bos_token"] is True and config["bos_token"] == "<s>"


def _gguf(path: Path, model: str | None, *, pre: str | None = None, scores: bool = True,
          merges: bool = True) -> Path:  # fmt: skip
    """A tensorless GGUF with a small vocabulary's metadata."""
    tokens = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "ab", "\u2581a"]
    writer = gguf.GGUFWriter(str(path), "llama")
    if model is not None:
        writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([2, 3, 3, 1, 1, 1, 1, 1])
    if scores:  # "ab" outranks "▁a"
        writer.add_token_scores([0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0])
    if merges:
        writer.add_token_merges(["a b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"model": "gpt2", "pre": "no-such-pre"}, "pre-tokenizer 'no-such-pre'"),
        ({"model": "gpt2", "pre": "kimi-k2"}, "pre-tokenizer 'kimi-k2'"),
        ({"model": "bert"}, "tokenizer model 'bert' is not supported"),
        ({"model": "t5"}, "tokenizer model 't5' is not supported"),
        ({"model": "rwkv"}, "tokenizer model 'rwkv' is not supported"),
        (
            {"model": "llama", "scores": False},
            "SentencePiece vocabulary has no tokenizer.ggml.scores",
        ),
        ({"model": "gpt2", "pre": "gpt-2", "merges": False}, "no tokenizer.ggml.merges"),
        ({"model": None}, "no tokenizer.ggml.model"),
    ],
)
def test_refusals(tmp_path, options, message):
    """What cannot be reproduced is refused, named; nothing is written."""
    path = _gguf(tmp_path / "vocab.gguf", **options)
    with pytest.raises(ExportError, match=message.replace(".", r"\.")):
        write_tokenizer(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_small_vocabularies(tmp_path):
    """The same small vocabulary as SentencePiece and as byte-level BPE: "ab" merges either way."""
    spm = write_tokenizer(_gguf(tmp_path / "spm.gguf", "llama"), tmp_path / "spm")
    tokenizer = Tokenizer.from_folder(tmp_path / "spm")
    assert spm.add_bos_token and spm.bos_token_id == 1
    assert tokenizer.encode("ab") == [1, 3, 6]  # BOS, "▁" (prefixed), "ab" (merged first)
    assert tokenizer.encode("a", add_special_tokens=False) == [7]  # "▁a"
    bpe = write_tokenizer(_gguf(tmp_path / "bpe.gguf", "gpt2", pre="gpt-2"), tmp_path / "bpe")
    assert not bpe.add_bos_token
    assert Tokenizer.from_folder(tmp_path / "bpe").encode("ab") == [6]


def test_real_bert_refused(llama_cpp, tmp_path):
    """llama.cpp's BERT vocabulary (WordPiece) is refused by name."""
    with pytest.raises(ExportError, match="'bert'"):
        write_tokenizer(llama_cpp.src / "models" / "ggml-vocab-bert-bge.gguf", tmp_path)
