"""The composer: graph surgery that splices a sampler chain after an exported model's ``logits``.

Owns reading models safely (:mod:`~onnxsample.composer.loading`), what the splice needs to know
about a model, the splice itself (with the draft-verification columns), the row gather moved
before the LM head, the standalone sampler model and ``inspect``. It builds graphs, so it imports
onnxscript and onnx-ir; it may import the shared contract at the package's top (``chain``,
``params``, ``metadata``, ``errors``) and the samplers in :mod:`onnxsample.graphs`, never the engine,
the text tools or the server: a composed model is one file that any ONNX Runtime host can run.

(The room is ``composer`` rather than ``compose`` so that it never shadows the public
:func:`onnxsample.compose`.)
"""

from onnxsample.composer._compose import (
    COMPOSER_REVISION,
    CONTRACT_VERSION,
    GATHER_MODES,
    MAX_DRAFT_TOKENS,
    STAGES,
    compose,
    composed_metadata,
)
from onnxsample.composer.inspection import ModelSummary, ValueSummary, inspect_model
from onnxsample.composer.sampler_model import build_sampler_model, sampler_feeds

__all__ = [
    "COMPOSER_REVISION",
    "CONTRACT_VERSION",
    "GATHER_MODES",
    "MAX_DRAFT_TOKENS",
    "STAGES",
    "ModelSummary",
    "ValueSummary",
    "build_sampler_model",
    "compose",
    "composed_metadata",
    "inspect_model",
    "sampler_feeds",
]
