"""What a sampler chain contains (:class:`ChainConfig`) and the graph inputs and outputs that follow
from it, in contract order: the ``sampler.*`` names of the composed model's interface."""

from __future__ import annotations

from dataclasses import dataclass

from onnxsample.chain import SAMPLER_NAMES, SamplerChain
from onnxsample.graphs._common import T_BOOL, T_FLOAT, T_INT32, T_INT64

__all__ = [
    "ALLOWED",
    "CANONICAL_ORDER",
    "FALLBACK",
    "FALLBACK_LOGITS",
    "LOGPROBS",
    "PREFIX",
    "ChainConfig",
    "chain_inputs",
    "chain_outputs",
]

PREFIX = "sampler."
CANONICAL_ORDER = SAMPLER_NAMES
ALLOWED = "allowed"  # the allowed-tokens mask (structured output), when the chain has one
LOGPROBS = "logprobs"  # how many logprobs each slot asks for, when the chain reads it
# A static chain's slots whose token the host draws again (and the rows it draws from).
FALLBACK, FALLBACK_LOGITS = "fallback", "fallback_logits"
# Per-slot inputs of each sampler: (name without prefix, element type, trailing dims).
_SLOT = ("S",)
_ROW = ("S", "V")
_INPUTS = {
    "dist": [("uniform", T_FLOAT, _SLOT)],
    "temperature": [("temperature", T_FLOAT, _SLOT)],
    "temperature_last": [("temperature_last", T_BOOL, _SLOT)],
    "top_k": [("top_k", T_INT64, _SLOT)],
    "top_p": [("top_p", T_FLOAT, _SLOT)],
    "min_p": [("min_p", T_FLOAT, _SLOT)],
    "typical_p": [("typical_p", T_FLOAT, _SLOT)],
    "penalties": [
        ("repetition_penalty", T_FLOAT, _SLOT),
        ("presence_penalty", T_FLOAT, _SLOT),
        ("frequency_penalty", T_FLOAT, _SLOT),
    ],
    "logit_bias": [("bias_ids", T_INT64, ("S", "NB")), ("bias_values", T_FLOAT, ("S", "NB"))],
}
_STATE = [("prompt_mask", T_BOOL, _ROW), ("output_counts", T_INT32, _ROW)]


@dataclass(frozen=True)
class ChainConfig:
    """What one sampler graph contains. ``samplers`` is in canonical order; ``logit_bias`` is only
    effective with ``max_bias`` > 0 (its table has ``max_bias`` entries per slot). ``static``
    builds the chain without control flow or data-dependent shapes (CUDA graphs): every path the
    branching chain may skip is computed and each slot takes the result the branching chain gives
    it, except that no whole row is sorted: a slot whose top-k or top-p set reaches past the
    ``STATIC_CANDIDATES`` largest, or that asks for typical-p, is flagged (``fallback``) for the
    host, which takes its token from the branching chain over its row (``fallback_logits``).
    ``allowed_tokens`` adds the per-slot mask of allowed tokens (structured output), applied
    right after the logit bias. ``counts_out`` false leaves the updated penalty counts out of the
    outputs, for a graph that adds the step's tokens to its own copy of the state (the composer's
    scatter back to all slots). ``logprobs_on_request`` adds ``sampler.logprobs`` INT64[S], how
    many logprobs each slot asks for (−1 none, n ≥ 0 the chosen token's and the n most likely):
    the branching chain then computes the logprobs only on a step where some slot asks, and the
    top logprobs where some slot asks for one or more. A slot that asks for none reads what the
    step computed for the others, or zeros."""

    samplers: tuple[str, ...]
    top_logprobs: int = 0
    max_bias: int = 0
    output_probs: bool = False
    output_candidates: int = 0
    gather_rows: bool = True
    static: bool = False
    allowed_tokens: bool = False
    counts_out: bool = True
    logprobs_on_request: bool = False

    @property
    def temperature_last(self) -> bool:
        """Whether the chain reads ``temperature_last`` (``SamplerChain.reorders_temperature``):
        per slot, the temperature after the cuts (llama.cpp's order). Not a static chain: the
        host draws such a slot's token (see :attr:`flags_fallback`)."""
        return not self.static and SamplerChain(self.samplers).reorders_temperature

    def has(self, name: str) -> bool:
        if name == "logit_bias":
            return name in self.samplers and self.max_bias > 0
        return name in self.samplers

    @property
    def flags_fallback(self) -> bool:
        """Whether some slot may need the host's fallback: a static chain that draws, with a
        filter whose kept set can reach past the static candidates, or typical-p, or one where a
        slot may put the temperature after the cuts (the engine flags those slots itself: the
        static chain reads no ``temperature_last``); or one whose candidates output shows
        typical-p's kept set, greedy slots' included."""
        drawn = self.has("dist") and any(self.has(n) for n in ("top_k", "top_p", "typical_p"))
        reorders = SamplerChain(self.samplers).reorders_temperature
        return self.static and (drawn or reorders or self.typical_candidates)

    @property
    def typical_candidates(self) -> bool:
        """A static chain whose candidates output would show typical-p's kept set: the host
        takes every slot with typical-p on, drawing or not."""
        return self.static and self.has("typical_p") and self.output_candidates > 0


def chain_inputs(config: ChainConfig) -> list[tuple[str, int, tuple[str, ...]]]:
    """The graph inputs after ``logits``, in contract order: (full name, element type, dims)."""
    found = [(PREFIX + "row_index", T_INT64, _SLOT)]
    for name in ("dist", "temperature", "top_k", "top_p", "min_p", "typical_p", "penalties"):
        if config.has(name):
            found += [(PREFIX + n, t, d) for n, t, d in _INPUTS[name]]
        if name == "temperature" and config.temperature_last:
            found += [(PREFIX + n, t, d) for n, t, d in _INPUTS["temperature_last"]]
    if config.has("logit_bias"):
        found += [(PREFIX + n, t, d) for n, t, d in _INPUTS["logit_bias"]]
    if config.has("penalties"):
        found += [(PREFIX + n, t, d) for n, t, d in _STATE]
    if config.allowed_tokens:
        found.append((PREFIX + ALLOWED, T_BOOL, ("S", "A")))
    if config.logprobs_on_request and not config.static:
        found.append((PREFIX + LOGPROBS, T_INT64, _SLOT))
    return found


def chain_outputs(config: ChainConfig) -> list[tuple[str, int, tuple[str, ...]]]:
    """The graph outputs, in contract order: (full name, element type, dims)."""
    found = [(PREFIX + "next_token", T_INT64, _SLOT), (PREFIX + "logprob", T_FLOAT, _SLOT)]
    if config.top_logprobs > 0:
        found += [
            (PREFIX + "top_logprob_ids", T_INT64, ("S", "L")),
            (PREFIX + "top_logprobs", T_FLOAT, ("S", "L")),
        ]
    if config.has("penalties") and config.counts_out:
        found.append((PREFIX + "output_counts_out", T_INT32, _ROW))
    if config.output_probs:
        found.append((PREFIX + "probs", T_FLOAT, _ROW))
    if config.output_candidates > 0:
        found += [
            (PREFIX + "candidate_ids", T_INT64, ("S", "K")),
            (PREFIX + "candidate_logits", T_FLOAT, ("S", "K")),
        ]
    if config.flags_fallback:
        found += [(PREFIX + FALLBACK, T_BOOL, _SLOT), (PREFIX + FALLBACK_LOGITS, T_FLOAT, _ROW)]
    return found
