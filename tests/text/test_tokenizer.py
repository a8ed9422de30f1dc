"""The runtime tokenizer (tokenizers + jinja2) against transformers' AutoTokenizer on the same folder.

Folders: the tiny model's Hugging Face folder and its export, the embedded model's GQA export, and
small synthetic tokenizers built here for what SmolLM2's lacks: a Llama-2-style one (Metaspace,
byte fallback, BOS added by the config), one whose tokenizer.json adds a BOS the config turns off,
and a GPT-2-style one saved the legacy way (special_tokens_map.json, a pad token missing from the
vocabulary, the template in the config).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from onnxsample.errors import ContextExceeded, InvalidParameter, ModelError
from onnxsample.text import TextStream, Tokenizer, prompt_tokens, read_chat_template
from onnxsample.text._chat_template import fold_system

TEXTS = [
    "Hello world",
    "  leading and trailing  ",
    "lines\n\nand\ttabs\n",
    "naïve café, résumé, Ωμέγα",
    "emoji 🙂🚀 and CJK 日本語のテキスト",
    "<|im_start|>user\nspecial tokens inside<|im_end|> <s> </s> <|endoftext|>",
    "Don't stop . Really ? Yes ! It 's done , isn't it",
    "",
]
CHATS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why? 日本"}],
    [
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "An apple 🍎."},
        {"role": "user", "content": "Another one?"},
    ],
]
# Exercises what transformers' environment adds: tojson, raise_exception, loop controls, generation.
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}{{ eos_token }}"
    "{% endgeneration %}\n{% continue %}{% endif %}\n"
    "  {{ bos_token }}{{ m['role'] }}: {{ m['content'] | tojson }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
CORPUS = ["Hello world, hello there.", "The quick brown fox jumps over the lazy dog.",
          "naïve café résumé", "Don't stop . Really ? Yes !", "lines\n\tand tabs"] * 20  # fmt: skip


def _llama2(folder: Path, *, add_bos: bool, post_bos: bool, metaspace: bool = False) -> Path:
    """A Llama-2-style tokenizer: Metaspace normaliser, byte fallback, a decoder that strips the
    first space; `post_bos` puts a BOS post-processor in tokenizer.json whatever the config says;
    `metaspace` puts the space prefix in a Metaspace pre-tokenizer instead (transformers' newer
    conversion)."""
    from tokenizers import (
        AddedToken,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from tokenizers import Tokenizer as Backend

    norm = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained = Backend(models.BPE(unk_token="<unk>"))
    trained.normalizer = norm
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300))
    model = json.loads(trained.to_str())["model"]
    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>"])}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in sorted(model["vocab"], key=model["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    backend = Backend(
        models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    if metaspace:
        backend.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=False)
    else:
        backend.normalizer = norm
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )  # fmt: skip
    backend.add_special_tokens([AddedToken(t, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    if post_bos:
        backend.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
        )
    folder.mkdir(parents=True)
    backend.save(str(folder / "tokenizer.json"))
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, t in enumerate(["<unk>", "<s>", "</s>"])}  # fmt: skip
    config = {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": add_bos, "legacy": False,
              "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "added_tokens_decoder": added}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def _gpt2_legacy(folder: Path) -> Path:
    """A GPT-2-style byte-level tokenizer saved the legacy way: tokenizer.json's pre-tokenizer adds a
    prefix space (transformers turns it off), special tokens come from special_tokens_map.json and
    the pad and additional tokens are not in the vocabulary yet (transformers adds them)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, trainers

    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=alphabet, special_tokens=["<|endoftext|>"]
    )
    backend.train_from_iterator(CORPUS, trainer)
    folder.mkdir(parents=True)
    backend.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "GPT2Tokenizer", "clean_up_tokenization_spaces": True,
              "bos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "chat_template": TEMPLATE}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    specials = {"eos_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False,
                              "rstrip": False, "single_word": False},
                "pad_token": "<pad>", "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}  # fmt: skip
    (folder / "special_tokens_map.json").write_text(json.dumps(specials))
    return folder


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    return {
        "llama2-bos": _llama2(root / "llama2-bos", add_bos=True, post_bos=False),
        "llama2-no-bos": _llama2(root / "llama2-no-bos", add_bos=False, post_bos=True),
        "gpt2-legacy": _gpt2_legacy(root / "gpt2-legacy"),
        "llama2-metaspace": _llama2(
            root / "llama2-metaspace", add_bos=True, post_bos=False, metaspace=True
        ),
    }


@pytest.mark.parametrize("name", ["llama2-bos", "llama2-metaspace", "gpt2-legacy", "gpt2-prefix"])
def test_a_fragment_gets_no_space_prefix(synthetic, name, tmp_path):
    """encode_fragment (what a grammar forces text with): the tokens of the text alone, whose bytes
    are its own, where encode puts a space first (SentencePiece's prefix normaliser or Metaspace,
    a byte-level pre-tokenizer whose config sets add_prefix_space)."""
    folder = synthetic[name.replace("prefix", "legacy")]
    if name == "gpt2-prefix":
        folder = Path(shutil.copytree(folder, tmp_path / name))
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(
            json.dumps({**config, "add_prefix_space": True})
        )
    tokenizer = Tokenizer.from_folder(folder)
    text = "naïve café\n  lines"
    ids = tokenizer.encode_fragment(text)
    assert b"".join(tokenizer.token_bytes(i) for i in ids) == text.encode()
    whole = tokenizer.encode(text, add_special_tokens=False)
    if name != "gpt2-legacy":
        assert tokenizer.token_bytes(whole[0]).startswith(b" ") and whole != ids


FOLDERS = [
    "tiny-hf",
    "tiny-export",
    pytest.param("gguf-a4", marks=pytest.mark.integration),
    "llama2-bos",
    "llama2-no-bos",
    "gpt2-legacy",
]


@pytest.fixture(scope="module", params=FOLDERS)
def pair(request, synthetic):
    """(ours, transformers') tokenizer on one folder."""
    from transformers import AutoTokenizer

    if request.param == "tiny-hf":
        folder = request.getfixturevalue("tiny_hf")
    elif request.param == "tiny-export":
        folder = request.getfixturevalue("tiny_export").output
    elif request.param == "gguf-a4":
        folder = request.getfixturevalue("embedded_gqa_exports")["gguf-a4"].output
    else:
        folder = synthetic[request.param]
    return Tokenizer.from_folder(folder), AutoTokenizer.from_pretrained(
        folder, local_files_only=True
    )


def _chat_ids(tokenizer, chat, generation):
    return list(tokenizer.apply_chat_template(chat, add_generation_prompt=generation))


def test_special_ids_vocabulary_and_template(pair):
    ours, theirs = pair
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (
        theirs.bos_token_id,
        theirs.eos_token_id,
        theirs.pad_token_id,
    )
    assert ours.vocab_size == len(theirs)
    assert ours.chat_template == theirs.chat_template
    for i in (0, 1, 2, ours.vocab_size - 1):
        assert ours.token_to_text(i) == theirs.decode([i])


@pytest.mark.parametrize("special", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_encode_and_decode_as_transformers(pair, text, special):
    ours, theirs = pair
    ids = theirs(text, add_special_tokens=special).input_ids
    assert ours.encode(text, add_special_tokens=special) == ids
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
            ids, skip_special_tokens=skip
        )


@pytest.mark.parametrize(
    "final",
    ["The answer is", " spaced out \n"],
    ids=["text", "spaces"],
)
def test_continuing_the_final_message_as_transformers(pair, final):
    """transformers' and vLLM's continue_final_message: the text ends where the final message's
    text does (less the trailing spaces a template strips), so the answer continues it."""
    ours, theirs = pair
    if theirs.chat_template is None:
        return
    chat = [*CHATS[2], {"role": "assistant", "content": final}]
    want = theirs.apply_chat_template(chat, continue_final_message=True, tokenize=False)
    assert ours.render_chat(chat, add_generation_prompt=False, continue_final_message=True) == want
    ids = ours.apply_chat_template(chat, add_generation_prompt=False, continue_final_message=True)
    assert ids == list(theirs.apply_chat_template(chat, continue_final_message=True))
    with pytest.raises(InvalidParameter, match="cannot both be true"):
        ours.render_chat(chat, continue_final_message=True)
    with pytest.raises(InvalidParameter, match="no text"):
        empty = [*CHATS[0], {"role": "assistant", "content": None}]
        ours.render_chat(empty, add_generation_prompt=False, continue_final_message=True)


@pytest.mark.parametrize("generation", [True, False])
@pytest.mark.parametrize("chat", CHATS, ids=["user", "system-user", "multi-turn"])
def test_chat_templates_as_transformers(pair, chat, generation):
    ours, theirs = pair
    if theirs.chat_template is None:
        with pytest.raises(InvalidParameter, match="no chat template"):
            ours.apply_chat_template(chat, add_generation_prompt=generation)
        return
    text = theirs.apply_chat_template(chat, add_generation_prompt=generation, tokenize=False)
    assert ours.render_chat(chat, add_generation_prompt=generation) == text
    ids = _chat_ids(ours, chat, generation)
    assert ids == list(theirs.apply_chat_template(chat, add_generation_prompt=generation))
    for skip in (True, False):  # the rendered chat holds special tokens: both ways of decoding
        assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
            ids, skip_special_tokens=skip
        )


def test_decoding_part_of_a_character_as_transformers(pair):
    ours, theirs = pair
    ids = theirs("🙂日本é", add_special_tokens=False).input_ids
    assert len(ids) > 3  # pieces of characters (byte-level or byte-fallback)
    for end in range(len(ids) + 1):
        for start in range(end):
            part = ids[start:end]
            assert ours.decode(part) == theirs.decode(part, skip_special_tokens=True), part
    assert "\ufffd" in "".join(ours.decode(ids[:i]) for i in range(1, len(ids)))


@pytest.mark.parametrize("skip", [True, False])
def test_streamed_text_is_the_decoded_text(pair, skip):
    ours, theirs = pair
    for text in TEXTS:
        ids = theirs(text).input_ids
        stream = TextStream(ours, skip_special_tokens=skip)
        pieces = [stream.add(i) for i in ids]
        assert not any("\ufffd" in p for p in pieces), pieces
        assert "".join(pieces) + stream.flush() == theirs.decode(ids, skip_special_tokens=skip)
    prompt, answer = (
        theirs("Hello").input_ids,
        theirs(" world 🙂", add_special_tokens=False).input_ids,
    )
    stream = TextStream(ours, prompt_ids=prompt)  # the prompt's ids: the answer's leading space
    whole, before = theirs.decode(prompt + answer), theirs.decode(prompt)
    assert "".join(stream.add(i) for i in answer) + stream.flush() == whole[len(before) :]


def test_streaming_holds_an_unfinished_character_back(pair):
    ours, _ = pair
    ids = ours.encode("🙂", add_special_tokens=False)
    stream = TextStream(ours)
    if len(ids) > 1:
        assert [stream.add(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
        assert stream.flush() == ours.decode(ids[:-1])  # U+FFFD, as decode gives
    else:
        assert stream.add(ids[0]) == "🙂"


@pytest.mark.parametrize("name", ["gpt2-legacy", "llama2-bos"])
def test_streaming_random_ids_never_fails_nor_splits_a_character(synthetic, name):
    """Random ids (an untrained model's output) make invalid UTF-8. Byte-level text only grows, so
    the text out so far is always the start of the final text (a half character would show as
    U+FFFD there). Byte fallback rewrites valid bytes next to invalid ones (ByteFallback decodes a
    run of byte tokens as a whole) and DecodeStream gives up on it: no piece ends in U+FFFD."""
    tok = Tokenizer.from_folder(synthetic[name])
    rng = random.Random(0)
    for _ in range(100):
        ids = [
            rng.choice([rng.randrange(tok.vocab_size), rng.randrange(3, 300)]) for _ in range(30)
        ]
        stream = TextStream(tok)
        pieces = [stream.add(i) for i in ids]
        if name == "gpt2-legacy":
            final = tok.decode(ids)
            assert all(final.startswith("".join(pieces[:k])) for k in range(len(pieces)))
            assert "".join(pieces) + stream.flush() == final
        else:
            assert not any(p.endswith("\ufffd") for p in pieces), pieces


def test_many_threads_give_what_one_thread_gives(pair):
    ours, _ = pair
    cases = [(t, CHATS[i % len(CHATS)]) for i, t in enumerate(TEXTS)]
    chat = ours.chat_template is not None

    def run(text, messages):
        ids = ours.encode(text)
        stream = TextStream(ours)
        streamed = "".join(stream.add(i) for i in ids) + stream.flush()
        return ids, ours.decode(ids), streamed, _chat_ids(ours, messages, True) if chat else None

    expected = [run(*case) for case in cases]
    failures: list[int] = []

    def work(offset: int) -> None:
        for n in range(200):
            i = (n + offset) % len(cases)
            if run(*cases[i]) != expected[i]:
                failures.append(i)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def _folder_without(tmp: Path, source: Path, *, template: str | None) -> Path:
    tmp.mkdir()
    shutil.copy(source / "tokenizer.json", tmp / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    if template is not None:
        config["chat_template"] = template
    (tmp / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp


@pytest.mark.parametrize(
    ("case", "error", "match"),
    [
        ("no tokenizer.json", ModelError, r"no tokenizer\.json"),
        ("unreadable tokenizer.json", ModelError, r"cannot read .*tokenizer\.json"),
        ("no chat template", InvalidParameter, "no chat template"),
        ("broken chat template", ModelError, "chat template does not parse"),
        ("template refuses the messages", InvalidParameter, "refused the messages: unknown role"),
        ("message without content", InvalidParameter, "refused the messages"),
        ("negative token id", InvalidParameter, "non-negative"),
        ("text that is no string", InvalidParameter, "must be a string, got int"),
        ("system prompt, no template", InvalidParameter, "needs a chat template, and this model"),
        ("system prompt, chat off", InvalidParameter, "a system prompt needs chat mode"),
    ],
)
def test_errors(tmp_path, synthetic, case, error, match):
    source = synthetic["gpt2-legacy"]
    folder = tmp_path / "folder"
    with pytest.raises(error, match=match):
        if case == "no tokenizer.json":
            Tokenizer.from_folder(tmp_path)
        elif case == "unreadable tokenizer.json":
            folder.mkdir()
            (folder / "tokenizer.json").write_text('{"model": ')
            Tokenizer.from_folder(folder)
        elif case == "no chat template":
            Tokenizer.from_folder(_folder_without(folder, source, template=None)).render_chat(
                CHATS[0]
            )
        elif case == "broken chat template":
            tok = Tokenizer.from_folder(_folder_without(folder, source, template="{% for %}"))
            assert tok.encode("still usable for plain prompts")
            tok.apply_chat_template(CHATS[0])
        elif case == "template refuses the messages":
            Tokenizer.from_folder(source).render_chat([{"role": "tool", "content": "x"}])
        elif case == "message without content":
            Tokenizer.from_folder(source).render_chat([{"role": "user"}, {"role": "assistant"}])
        elif case.startswith("system prompt"):
            chat = False if case.endswith("chat off") else None
            plain = Tokenizer.from_folder(_folder_without(folder, source, template=None))
            prompt_tokens(plain, "Hi", chat, "Be brief.", plain.vocab_size)
        elif case == "negative token id":
            Tokenizer.from_folder(source).decode([5, -1])
        else:
            Tokenizer.from_folder(source).encode(42)


def test_a_given_chat_template_renders_as_transformers_renders_it(tmp_path, synthetic):
    """A template given in place of the folder's (`--chat-template`, vLLM's option): a folder with
    none gets one, transformers' ``chat_template=`` argument renders the same ids, and the
    folder's own tokenizer is left as it was."""
    from transformers import AutoTokenizer

    folder = shutil.copytree(synthetic["gpt2-legacy"], tmp_path / "folder")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    plain = Tokenizer.from_folder(folder)
    given = plain.with_chat_template(TEMPLATE)
    theirs = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    for chat in CHATS:
        want = theirs.apply_chat_template(chat, chat_template=TEMPLATE, add_generation_prompt=True)
        assert given.apply_chat_template(chat) == list(want)
    assert given.chat_template == TEMPLATE and plain.chat_template is None
    with pytest.raises(InvalidParameter, match="no chat template"):
        plain.render_chat(CHATS[0])
    assert given.encode("Hello world") == plain.encode("Hello world")


S, U, A = "system", "user", "assistant"


@pytest.mark.parametrize(
    ("messages", "folded"),
    [
        ([(S, "Be brief."), (U, "Why?")], [(U, "Be brief.\nWhy?")]),
        ([(S, "One."), (S, "Two."), (U, "Go")], [(U, "One.\nTwo.\nGo")]),
        ([(S, "Rules."), (U, "")], [(U, "Rules.")]),
        ([(S, "Rules."), (A, "Hi"), (U, "Go")], [(U, "Rules."), (A, "Hi"), (U, "Go")]),
        ([(U, "Go"), (S, "Late rule.")], [(U, "Go"), (U, "Late rule.")]),
        ([(U, "Go"), (A, "Ok")], [(U, "Go"), (A, "Ok")]),
    ],
    ids=["system-user", "two-systems", "empty-user", "before-assistant", "at-the-end", "none"],
)
def test_system_messages_fold_into_the_users_turn_as_llama_cpp_folds_them(messages, folded):
    """minja's polyfill in llama.cpp (common/chat.cpp) for a template that writes no system."""
    as_dicts = [{"role": r, "content": c} for r, c in messages]
    assert fold_system(as_dicts) == [{"role": r, "content": c} for r, c in folded]


# Phi-3's template (user and assistant turns only) and Gemma 2's (which refuses a system turn).
PHI3 = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
        "{{ '<|user|>\n' + m['content'] + '<|end|>\n' }}{% elif m['role'] == 'assistant' %}"
        "{{ '<|assistant|>\n' + m['content'] + '<|end|>\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")  # fmt: skip
GEMMA2 = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
          "{% endif %}{% for m in messages %}{{ '<' + m['role'] + '>' + m['content'] + '|' }}"
          "{% endfor %}")  # fmt: skip


@pytest.mark.parametrize(
    ("template", "want"),
    [
        (PHI3, "<|endoftext|><|user|>\nBe brief.\nWhy? 日本<|end|>\n<|assistant|>\n"),
        (GEMMA2, "<user>Be brief.\nWhy? 日本|"),
        (TEMPLATE, None),  # writes system turns: rendered as transformers renders it
    ],
    ids=["drops-system", "refuses-system", "writes-system"],
)
def test_a_template_without_system_turns_gets_the_system_prompt_in_the_users(
    synthetic, template, want
):
    """Rather than lose a system prompt without a word (transformers renders Phi-3's template
    without it) or refuse the chat (Gemma 2's raises), its text starts the user's turn, as in
    llama-server (checked against it in tests/exporters/test_gguf_llama_cpp_families.py)."""
    from transformers import AutoTokenizer

    tokenizer = Tokenizer.from_folder(synthetic["gpt2-legacy"]).with_chat_template(template)
    if want is None:
        theirs = AutoTokenizer.from_pretrained(synthetic["gpt2-legacy"], local_files_only=True)
        want = theirs.apply_chat_template(CHATS[1], chat_template=template, tokenize=False,
                                          add_generation_prompt=True)  # fmt: skip
    assert tokenizer.render_chat(CHATS[1]) == want


# A template that reads a content given as a list of parts (Gemma 3's: each part's text trimmed,
# nothing between them), and one that takes strings alone.
PARTS = ("{% for m in messages %}<{{ m['role'] }}>{% if m['content'] is string %}{{ m['content'] }}"
         "{% else %}{% for p in m['content'] %}{{ p['text'] | trim }}{% endfor %}{% endif %}|"
         "{% endfor %}")  # fmt: skip
STRINGS = "{% for m in messages %}{{ '<' + m['role'] + '>' + m['content'] + '|' }}{% endfor %}"
REPR = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}|{% endfor %}"


def _parts(*texts: str) -> list[dict]:
    return [{"type": "text", "text": t} for t in texts]


@pytest.mark.parametrize(
    ("template", "messages", "want"),
    [
        (PARTS, [(U, _parts("Hi ", " there"))], "<user>Hithere|"),
        (PARTS, [(S, "Be brief."), (U, _parts("a", "b"))], "<system>Be brief.|<user>ab|"),
        (STRINGS, [(U, _parts("Hi", "there"))], "<user>Hi\nthere|"),
        (REPR, [(U, _parts("Hi", "there"))], "<user>Hi\nthere|"),
        (STRINGS, [(U, _parts("", "Go", ""))], "<user>Go\n|"),  # llama.cpp's joining
        (PHI3, [(S, "Be brief."), (U, _parts("Hi", "there"))],
         "<|endoftext|><|user|>\nBe brief.\nHi\nthere<|end|>\n"),  # folded: joined first
    ],
    ids=["template-joins", "with-system", "string-template", "printed-content", "empty-parts",
         "folded-system"],
)  # fmt: skip
def test_text_parts_reach_a_template_that_reads_them_and_are_joined_for_another(
    synthetic, template, messages, want
):
    """OpenAI's content parts as llama.cpp renders them: a template that iterates a content
    (``supports_typed_content``) gets the list and joins the parts as it means to; another gets
    them joined by newlines (none before the first text), the library's prompts as the
    server's."""
    tokenizer = Tokenizer.from_folder(synthetic["gpt2-legacy"]).with_chat_template(template)
    chat = [{"role": r, "content": c} for r, c in messages]
    assert tokenizer.render_chat(chat, add_generation_prompt=False) == want
    ids = prompt_tokens(tokenizer, chat, None, None, tokenizer.vocab_size)
    assert ids == tokenizer.apply_chat_template(chat)


def test_template_variables_reach_the_template_as_transformers_passes_them(synthetic):
    """vLLM's and llama-server's ``chat_template_kwargs`` (Qwen3's ``enable_thinking``):
    transformers' keyword arguments of apply_chat_template; the names the template is given
    already are refused."""
    from transformers import AutoTokenizer

    template = (
        TEMPLATE + "{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}"
    )
    ours = Tokenizer.from_folder(synthetic["gpt2-legacy"]).with_chat_template(template)
    theirs = AutoTokenizer.from_pretrained(synthetic["gpt2-legacy"], local_files_only=True)
    for variables in ({}, {"enable_thinking": False}, {"enable_thinking": True}):
        want = theirs.apply_chat_template(CHATS[0], chat_template=template, tokenize=False,
                                          add_generation_prompt=True, **variables)  # fmt: skip
        assert ours.render_chat(CHATS[0], variables=variables) == want
    assert ours.render_chat(CHATS[0], variables={"enable_thinking": False}).endswith("<nothink>")
    for taken in ("messages", "add_generation_prompt", "bos_token"):
        with pytest.raises(InvalidParameter, match=f"chat_template_kwargs cannot set {taken}"):
            ours.render_chat(CHATS[0], variables={taken: "x"})


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ("TEMPLATE_FILE", None),
        (TEMPLATE, None),
        ("chatml", "neither a file nor jinja text"),
        ("{% for %}", "the chat template does not parse"),
        ("EMPTY_FILE", "non-empty jinja text"),
        ("BAD_FILE", "does not parse"),
        ("x" * 5000, "neither a file nor jinja text"),  # no file system takes the name
        (None, "jinja text or a file's path, got NoneType"),
        (b"{{ x }}", "jinja text or a file's path, got bytes"),
    ],
    ids=["file", "text", "a-name", "broken-text", "empty-file", "broken-file", "long", "none",
         "bytes"],
)  # fmt: skip
def test_a_chat_template_option_is_a_file_or_its_text(tmp_path, given, match):
    files = {"TEMPLATE_FILE": TEMPLATE, "EMPTY_FILE": "", "BAD_FILE": "{% if %}"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    value = str(tmp_path / given) if given in files else given
    if match is None:
        assert read_chat_template(value) == TEMPLATE
    else:
        with pytest.raises(InvalidParameter, match=match):
            read_chat_template(value)


_PROBE = """
import importlib.util, json, sys
import onnxsample.errors
before = set(sys.modules)
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
tokenizer, stream = load("probe_tokenizer", sys.argv[1]), load("probe_stream", sys.argv[2])
tok = tokenizer.Tokenizer.from_folder(sys.argv[3])
stream = stream.TextStream(tok)
[stream.add(i) for i in tok.apply_chat_template([{"role": "user", "content": "hi"}])]
tok.decode(tok.encode("hi"))
print(json.dumps(sorted(m.split(".")[0] for m in set(sys.modules) - before)))
"""


def test_the_tokenizer_never_imports_the_exporter_stack(tiny_export):
    """tokenizer.py's and _stream.py's own imports, lazy ones included, measured after importing
    the package (so that what other modules import does not count), and the plain import in a
    fresh process."""
    text = Path(__file__).resolve().parents[2] / "onnxsample" / "text"
    paths = [str(text / "tokenizer.py"), str(text / "_stream.py")]
    probe = [sys.executable, "-c", _PROBE, *paths, str(tiny_export.output)]
    new = set(json.loads(subprocess.run(probe, capture_output=True, text=True, check=True).stdout))
    assert {"tokenizers", "jinja2"} <= new
    assert not new & {"torch", "transformers", "optimum"}
    code = "import sys, onnxsample.text.tokenizer; print([m for m in ('torch', 'transformers', 'optimum') if m in sys.modules])"  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("text", ["Hello world", "  spaces  ", "naïve café 🙂 日本語", "a\n\tb"])
def test_token_bytes_add_up_to_the_text(tiny_export, text):
    """OpenAI's logprob ``bytes``: each token's raw bytes, half characters included."""
    ours = Tokenizer.from_folder(tiny_export.output)
    ids = ours.encode(text, add_special_tokens=False)
    assert b"".join(ours.token_bytes(i) for i in ids) == text.encode()
    assert ours.token_bytes(ours.eos_token_id) == ours.token_to_text(ours.eos_token_id).encode()


def test_a_lone_surrogate_is_invalid_text(pair):
    ours, _ = pair
    with pytest.raises(InvalidParameter, match=r"lone surrogate U\+D800 at character 2"):
        ours.encode("ab\ud800")
    if ours.chat_template:
        with pytest.raises(InvalidParameter, match="lone surrogate"):
            ours.apply_chat_template([{"role": "user", "content": "\udc80"}])


def test_max_token_chars_bounds_the_text_a_token_covers(pair):
    """The length check before tokenising must never refuse what would fit."""
    ours, _ = pair
    text = "The quick brown fox jumps over the lazy dog. " * 40 + "ünïcödé 日本語 " * 20
    ids = ours.encode(text, add_special_tokens=False)
    assert len(text) <= len(ids) * ours.max_token_chars


@pytest.mark.parametrize(
    ("prompt", "chars"),
    [
        ("x" * 100_000, 100_000),
        ([{"role": "user", "content": "y" * 100_000}], 100_000),
        ([{"role": "user", "content": [{"type": "text", "text": "z" * 100_000}]}], 100_000),
    ],
    ids=["text", "chat", "text-parts"],
)
def test_a_prompt_too_long_for_any_tokenisation_is_refused_by_its_length(pair, prompt, chars):
    ours, _ = pair
    with pytest.raises(ContextExceeded, match=f"the prompt is {chars} characters") as info:
        prompt_tokens(ours, prompt, None, None, 10**6, limit=8)
    assert info.value.context == 8 and info.value.prompt_tokens > 8  # at least that many


@pytest.mark.parametrize(
    "text",
    [
        "I don't think it 's fine . Yes , it is ! Is it ? We 're here , you 've seen , I 'm ok",
        "He said ' quoted ' words , and n't alone . Then 's and 'm at the end '",
        "The quick brown fox jumps over the lazy dog and runs to a tree in the park",
    ],
)
def test_streaming_holds_back_only_what_clean_up_could_still_change(pair, text):
    """Streamed text is decode's, clean-up included; and a token waits only when its text ends in
    what a following token could complete into a clean-up pattern (" n't", " 's", " ." ...)."""
    from onnxsample.text import TextStream

    ours, _ = pair
    ids = ours.encode(text, add_special_tokens=False)
    stream = TextStream(ours)
    pieces = [stream.add(i) for i in ids]
    assert "".join(pieces) + stream.flush() == ours.decode(ids)
    if text.startswith("The quick") and len(ids) == len(text.split()):
        assert all(pieces), pieces  # a token a word: every token's text is out at once


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: t.decode("12"), "token ids to decode are integers, got str"),
        (lambda t: t.decode([1.7]), "1.7 is not an integer"),  # it was token 1
        (lambda t: t.token_bytes(1.9), "a token id must be an integer, got 1.9"),
        (lambda t: t.piece(-1), r"a token id must be in \[0, 2\*\*32\), got -1"),
        (lambda t: t.token_bytes(2**70), r"a token id must be in \[0, 2\*\*32\)"),
        (lambda t: t.token_id(None), "a token's text must be a string, got NoneType"),
        (lambda t: t.encode_fragment(None), "text to encode must be a string, got NoneType"),
        (
            lambda t: t.render_chat([], add_generation_prompt=False, continue_final_message=True),
            "messages must be a non-empty list of chat messages",
        ),
    ],
    ids=["ids-as-text", "float-id", "float-bytes", "negative", "huge", "no-text", "no-fragment",
         "no-messages"],
)  # fmt: skip
def test_the_tokenizers_helpers_refuse_what_is_no_token(tiny_export, call, message):
    """A typed error naming what was wrong, not a bare OverflowError or IndexError, and never a
    float truncated into another token."""
    ours = Tokenizer.from_folder(tiny_export.output)
    with pytest.raises(InvalidParameter, match=message):
        call(ours)
