"""Strings llama.cpp's tokenisers are easy to get wrong on, for the tests that hold a tokenizer to
llama.cpp's (tests/exporters/test_gguf_vocab.py, test_gguf_llama_cpp_families.py)."""

from __future__ import annotations

from onnxsample.text import Tokenizer

HARD = [
    "",
    " ",
    "   ",
    "\t",
    "\n",
    "\n\n\n",
    " \n ",
    "Hello world",
    " Hello world",
    "Hello world ",
    "  Hello  world  ",
    "The capital of France is",
    "hello\tworld\n\n  foo\r\nbar",
    "def f(x):\n    return x**2  # square\n\tpass\n",
    "if (a != b) { return a->c[i] >= 0x1F; }",
    "1234567890 12345678901234567890 3.14159 -42 1,000,000",
    "café naïve résumé Ångström São Paulo ñ",
    "中文测试 日本語のテキスト 한국어 텍스트",
    "emoji 🦙🔥👍🏽 ❤️ 🇫🇷",
    "\x00\x01\x07\x1b[0m\x7f",
    "\u00a0non\u00a0breaking\u3000ideographic\u2003em",
    "zero\u200bwidth\u200djoiner",
    "e\u0301 combining a\u0308",
    "I'm you're we'll they've it's don't I'D",
    "\n\nnewlines first",
    "last newlines\n\n",
    "a" * 120,
    " " * 40,
    "\n" * 20,
    "\t" * 12,
    "العربية Ελληνικά Привет हिन्दी ไทย",
    "𝓗𝓮𝓵𝓵𝓸 𝟙𝟚𝟛 ½ Ⅻ ①",
    "\U0010ffff\ue000 private use",
]
# Special tokens written in the text, where the vocabulary has them.
SPECIAL_TEXTS = ["<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
                 "<|begin_of_text|>", "<|eot_id|>", "<|user|>", "<|assistant|>", "<|end|>",
                 "<start_of_turn>", "<end_of_turn>", "<bos>", "<|START_OF_TURN_TOKEN|>",
                 "<｜begin▁of▁sentence｜>", "<fim_prefix>", "<turn|>", "[INST]", "[/INST]"]  # fmt: skip


def hard_corpus(tokenizer: Tokenizer) -> list[str]:
    """HARD, and the vocabulary's special tokens in text: alone, glued to words, between spaces."""
    added = {t.content for t in tokenizer._backend.get_added_tokens_decoder().values()}
    specials = [s for s in SPECIAL_TEXTS if s in added][:3]
    out = list(HARD)
    for s in specials:
        out += [s, f"{s}Hello", f"Hello {s} world ", f"{s}\n{s}  x", f"x\n\n{s}\n"]
    return out
