"""Which samplers a graph contains: :class:`SamplerChain`.

A chain is written as a comma-separated string (``"penalties,temperature,top_k,top_p,min_p,dist"``)
or a list of names. Whatever order the user lists, the samplers run in the canonical order that
transformers' ``generate`` uses: logit bias → repetition → frequency/presence → temperature → top-k →
top-p → min-p → typical → draw, or, per request, with the temperature after the cuts (llama.cpp's
order, ``SamplingParams.temperature_last``). Greedy decoding needs no name: it is temperature 0, and a chain
without ``dist`` decodes greedily.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from onnxsample.errors import InvalidParameter

logger = logging.getLogger(__name__)

__all__ = ["CUTS", "GREEDY_BELOW", "SAMPLER_NAMES", "TEMPERATURE_LAST", "SamplerChain"]

# The canonical order (transformers' generate order); the graph builder follows it too.
SAMPLER_NAMES: tuple[str, ...] = (
    "logit_bias",
    "penalties",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "dist",
)
# Temperatures below this are greedy (vLLM's threshold): z / t would overflow to ±inf. The graphs,
# the reference and the parameters share it.
GREEDY_BELOW = 1e-5
# The samplers that keep some tokens and drop the rest (llama.cpp's "truncation" samplers).
CUTS: tuple[str, ...] = ("top_k", "top_p", "min_p", "typical_p")
# The branching chain's per-slot input that moves the temperature after the cuts (a static chain
# reads none): the composer, the parameters, the engine and the reference share its name.
TEMPERATURE_LAST = "sampler.temperature_last"


class SamplerChain:
    """An ordered, duplicate-free set of sampler names; iteration follows the canonical order.

    ``SamplerChain()`` and :meth:`SamplerChain.full` are the full canonical chain; ``SamplerChain("")``
    is the greedy chain. ``str(chain)`` gives the comma-separated spec, which parses back to an equal
    chain.
    """

    __slots__ = ("_names",)

    def __init__(self, samplers: str | Iterable[str] | SamplerChain | None = None) -> None:
        if samplers is None:
            names: list[str] = list(SAMPLER_NAMES)
        elif isinstance(samplers, SamplerChain):
            names = list(samplers.names)
        elif isinstance(samplers, str):
            names = [part.strip() for part in samplers.split(",") if part.strip()]
        elif isinstance(samplers, Iterable):
            names = [str(part).strip() for part in samplers]
        else:
            raise InvalidParameter(
                f"a sampler chain is names (a list, or a string split by commas), got {samplers!r}"
            )
        valid = ", ".join(SAMPLER_NAMES)
        seen: set[str] = set()
        for name in names:
            if name not in SAMPLER_NAMES:
                raise InvalidParameter(f"unknown sampler {name!r}; valid samplers: {valid}")
            if name in seen:
                raise InvalidParameter(f"sampler {name!r} is listed twice; valid samplers: {valid}")
            seen.add(name)
        self._names = tuple(name for name in SAMPLER_NAMES if name in seen)
        logger.debug("sampler chain %s", self)

    @classmethod
    def full(cls) -> SamplerChain:
        """Every sampler, in canonical order (the default chain of the CLI and the API)."""
        return cls(SAMPLER_NAMES)

    @classmethod
    def greedy(cls) -> SamplerChain:
        """No sampler at all: the graph returns the argmax of the logits."""
        return cls(())

    @property
    def names(self) -> tuple[str, ...]:
        """The samplers in canonical order."""
        return self._names

    @property
    def samples(self) -> bool:
        """Whether the chain draws a token (has ``dist``); otherwise it decodes greedily."""
        return "dist" in self._names

    @property
    def reorders_temperature(self) -> bool:
        """Whether a request may put the temperature after the cuts (llama.cpp's order,
        ``SamplingParams.temperature_last``): the chain draws, with a temperature and some cut.
        Its graph then reads ``sampler.temperature_last``; in any other chain the order changes
        nothing."""
        names = self._names
        return "dist" in names and "temperature" in names and any(n in names for n in CUTS)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SamplerChain):
            return self._names == other._names
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._names)

    def __str__(self) -> str:
        return ",".join(self._names)

    def __repr__(self) -> str:
        return f"SamplerChain({str(self)!r})"
