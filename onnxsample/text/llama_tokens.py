"""The special tokens llama.cpp finds by their texts: fill-in-the-middle (code infill) and end of
turn.

llama.cpp takes a GGUF's ``tokenizer.ggml.fim_*_token_id`` and ``eot_token_id`` keys, and where a
key is absent the first token of the vocabulary written as one of :data:`FIM_TEXTS` or
:data:`EOT_TEXTS` (``llama_vocab::impl::load``: Qwen's ``<|fim_prefix|>``, StarCoder's and
Granite's ``<fim_prefix>``, CodeLlama's ``▁<PRE>``, DeepSeek's ``<｜fim▁begin｜>``...). The GGUF
exporter reads the keys and the tables when it builds the tokenizer; a served model finds its
tokens by the tables (:func:`fim_tokens`, :func:`end_of_turn`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EOT_TEXTS", "FIM_TEXTS", "FimTokens", "end_of_turn", "fim_tokens"]

# kind: the texts llama.cpp recognises, in its order (the first the vocabulary has is taken)
FIM_TEXTS = {
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
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")  # fmt: skip


def _first(tokenizer: Any, texts: tuple[str, ...]) -> int | None:
    found = (tokenizer.token_id(text) for text in texts)
    return next((i for i in found if i is not None), None)


def end_of_turn(tokenizer: Any) -> int | None:
    """The end-of-turn token of `tokenizer` (an :class:`~onnxsample.text.Tokenizer`), by
    llama.cpp's texts."""
    return _first(tokenizer, EOT_TEXTS)


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's FIM token ids (None where it has none): the prefix, suffix and middle
    markers infill needs, and the repository and file separators it uses when present."""

    pre: int | None
    suf: int | None
    mid: int | None
    rep: int | None
    sep: int | None

    def missing(self) -> list[str]:
        """What infill needs and the vocabulary lacks, in llama-server's words."""
        need = (("prefix", self.pre), ("suffix", self.suf), ("middle", self.mid))
        return [f"{name} token is missing. " for name, token in need if token is None]


def fim_tokens(tokenizer: Any) -> FimTokens:
    """The FIM tokens of `tokenizer` (an :class:`~onnxsample.text.Tokenizer`), by llama.cpp's
    texts."""

    kinds = ("fim_pre", "fim_suf", "fim_mid", "fim_rep", "fim_sep")
    return FimTokens(*(_first(tokenizer, FIM_TEXTS[k]) for k in kinds))
