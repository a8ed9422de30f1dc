"""Text: what a prompt becomes and what tokens become, without transformers.

Owns the runtime tokenizer (``tokenizers`` + the chat template rendered with jinja2, as
transformers renders it), incremental detokenisation that never splits a UTF-8 character, stop
strings, and turning a prompt (text, ids or chat messages) into token ids. It may import only
``errors`` from the package: the engine and the server build on it, never the reverse.
"""

from onnxsample.text._chat_template import (
    check_chat_template,
    join_text_parts,
    read_chat_template,
)
from onnxsample.text._prompt import Prompt, prompt_tokens, stop_strings
from onnxsample.text._stops import StopMatcher
from onnxsample.text._stream import TextStream
from onnxsample.text.tokenizer import Tokenizer

__all__ = [
    "Prompt",
    "StopMatcher",
    "TextStream",
    "Tokenizer",
    "check_chat_template",
    "join_text_parts",
    "prompt_tokens",
    "read_chat_template",
    "stop_strings",
]
