"""Sampler subgraphs written in onnxscript, one sampler per module.

Every sampler is an ONNX local function in the domain ``onnxsample``; :func:`build_chain_function`
assembles the ones a chain needs into one ``SamplerChain`` function, and
:func:`onnxsample.build_sampler_model` wraps it into a model.
"""

from onnxsample.graphs._common import DOMAIN, DOMAIN_VERSION
from onnxsample.graphs.candidates import (
    CANDIDATES,
    STATIC_CANDIDATES,
    WIDER_CANDIDATES,
    Candidates,
    Truncate,
)
from onnxsample.graphs.chain import CHAIN_FUNCTION, build_chain_function
from onnxsample.graphs.chain_config import (
    CANONICAL_ORDER,
    ChainConfig,
    chain_inputs,
    chain_outputs,
)
from onnxsample.graphs.dist import BLOCK, Dist, DistRows
from onnxsample.graphs.library import sampler_functions, used_functions
from onnxsample.graphs.logit_bias import LogitBias
from onnxsample.graphs.logprobs import Logprob, TopLogprobs
from onnxsample.graphs.min_p import MinP
from onnxsample.graphs.penalties import Penalties, UpdateCounts
from onnxsample.graphs.sanitize import FiniteRows, Sanitize
from onnxsample.graphs.temperature import Greedy, Temperature
from onnxsample.graphs.top_k import TopK
from onnxsample.graphs.top_p import TopP
from onnxsample.graphs.typical_p import TypicalP

__all__ = [
    "BLOCK",
    "CANDIDATES",
    "CANONICAL_ORDER",
    "CHAIN_FUNCTION",
    "DOMAIN",
    "DOMAIN_VERSION",
    "STATIC_CANDIDATES",
    "WIDER_CANDIDATES",
    "Candidates",
    "ChainConfig",
    "Dist",
    "DistRows",
    "FiniteRows",
    "Greedy",
    "LogitBias",
    "Logprob",
    "MinP",
    "Penalties",
    "Sanitize",
    "Temperature",
    "TopK",
    "TopLogprobs",
    "TopP",
    "Truncate",
    "TypicalP",
    "UpdateCounts",
    "build_chain_function",
    "chain_inputs",
    "chain_outputs",
    "sampler_functions",
    "used_functions",
]
