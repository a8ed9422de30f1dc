"""The engine: requests from any thread onto one composed model in one ONNX Runtime session.

Owns the session (providers, IOBinding), the scheduler thread, the slots and their sampler state,
the KV-cache layouts, chunked prefill, prefix reuse, speculative drafts, and the request/result
types (:class:`Request`, :class:`Completion`, :class:`StreamEvent`, :class:`Timings`);
:class:`Generator` runs prompts given together on top of it. It may import the shared contract at
the package's top (``params``, ``chain``, ``metadata``, ``errors``) and :mod:`onnxsample.text`,
never the composer: it runs a composed file, whoever wrote it, without onnxscript or torch.
"""

from onnxsample.engine._engine import (
    DEFAULT_DRAFT_TOKENS,
    DEFAULT_NGRAM,
    DEFAULT_PREFILL_CHUNK,
    Engine,
)
from onnxsample.engine._stats import Stats
from onnxsample.engine.generator import Generator
from onnxsample.engine.request import (
    Completion,
    PromptProgress,
    Request,
    StreamEvent,
    Timings,
)
from onnxsample.text import Prompt

__all__ = [
    "DEFAULT_DRAFT_TOKENS",
    "DEFAULT_NGRAM",
    "DEFAULT_PREFILL_CHUNK",
    "Completion",
    "Engine",
    "Generator",
    "Prompt",
    "PromptProgress",
    "Request",
    "Stats",
    "StreamEvent",
    "Timings",
]
