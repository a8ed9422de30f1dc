"""The runtime tokenizer (tokenizers + jinja2) against transformers' AutoTokenizer on the same folder."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from onnxsample.errors import InvalidParameter, ModelError
from onnxsample.tokenizer import Tokenizer

TEXTS = [
    "Hello world",
    "  leading and trailing  ",
    "lines\n\nand\ttabs\n",
    "naïve café, Ωμέγα, 日本語のテキスト, emoji 🙂🚀",
    "<|im_start|>user\nspecial tokens inside<|im_end|>",
    "Don't stop . Really ? Yes !",
    "",
]
CHATS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}],
    [
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "An apple 🍎."},
        {"role": "user", "content": "Another one?"},
    ],
]


@pytest.fixture(scope="module", params=["tiny-hf", "tiny-export"])
def pair(request):
    folder = (
        request.getfixturevalue("tiny_hf")
        if request.param == "tiny-hf"
        else request.getfixturevalue("tiny_export").output
    )
    from transformers import AutoTokenizer

    return Tokenizer.from_folder(folder), AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("special", [True, False])
def test_encode_and_decode_as_transformers(pair, text, special):
    ours, theirs = pair
    ids = theirs(text, add_special_tokens=special).input_ids
    assert ours.encode(text, add_special_tokens=special) == ids
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
            ids, skip_special_tokens=skip
        )


@pytest.mark.parametrize("chat", CHATS)
@pytest.mark.parametrize("generation", [True, False])
def test_chat_templates_as_transformers(pair, chat, generation):
    ours, theirs = pair
    text = theirs.apply_chat_template(chat, add_generation_prompt=generation, tokenize=False)
    assert ours.render_chat(chat, add_generation_prompt=generation) == text
    ids = theirs.apply_chat_template(chat, add_generation_prompt=generation, tokenize=True)
    assert ours.apply_chat_template(chat, add_generation_prompt=generation) == list(ids)


def test_special_ids_and_vocabulary(pair):
    ours, theirs = pair
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (
        theirs.bos_token_id,
        theirs.eos_token_id,
        theirs.pad_token_id,
    )
    assert ours.vocab_size == len(theirs)
    assert ours.token_to_text(ours.eos_token_id) == theirs.eos_token


def test_decoding_half_a_character_gives_the_replacement_character(pair):
    ours, theirs = pair
    ids = ours.encode("🙂")
    if len(ids) > 1:  # byte-level pieces of one character
        assert ours.decode(ids[:1]) == theirs.decode(ids[:1])
        assert "\ufffd" in ours.decode(ids[:1])


def test_many_threads_at_once(pair):
    ours, _ = pair
    cases = list(zip(TEXTS, (CHATS * 3)[: len(TEXTS)], strict=True))
    expected = [(ours.encode(t), ours.apply_chat_template(c)) for t, c in cases]
    failures = []

    def work():
        for _ in range(100):
            for (t, c), want in zip(cases, expected, strict=True):
                got = (ours.encode(t), ours.apply_chat_template(c))
                if got != want or ours.decode(want[0]) != ours.decode(got[0]):
                    failures.append(t)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_errors(tmp_path, tiny_export):
    with pytest.raises(ModelError, match=r"no tokenizer\.json"):
        Tokenizer.from_folder(tmp_path)
    plain = Tokenizer.from_folder(tiny_export.output)
    plain.chat_template = None
    plain._template = None
    with pytest.raises(InvalidParameter, match="no chat template"):
        plain.apply_chat_template(CHATS[0])


def test_importing_the_runtime_does_not_import_the_exporter_stack():
    code = (
        "import sys, onnxsample.tokenizer, onnxsample.engine;"
        "print(sorted(m for m in ('torch', 'transformers', 'optimum') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
