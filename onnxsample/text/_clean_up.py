"""transformers' decoding clean-up (``clean_up_tokenization``), for tokenizers whose config asks
for it: :meth:`Tokenizer.decode` applies it to a whole text, :class:`TextStream` as text arrives."""

from __future__ import annotations

__all__ = ["PATTERNS", "clean_up"]

# replaced in this order; every pattern starts with a space and is at most 4 characters long
PATTERNS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))  # fmt: skip


def clean_up(text: str) -> str:
    """Spaces before punctuation and contractions go, as transformers removes them."""
    for old, new in PATTERNS:
        text = text.replace(old, new)
    return text
