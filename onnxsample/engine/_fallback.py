"""The host's fallback for a static chain's flagged slots.

A static chain (CUDA graphs) sorts no whole row: it finds top-k's k-th logit, top-p's nucleus and
typical-p's set among the ``STATIC_CANDIDATES`` largest, and flags (``sampler.fallback``) each
drawing slot whose set reaches past them. For such a slot the host runs the branching chain — the
same functions, with its wider and whole-row paths — over the rows the graph read
(``sampler.fallback_logits``) with the slots' parameters, penalty state, allowed tokens and
uniforms, on the CPU, and its outputs replace the slot's: the token, its logprob and whatever else
depends on the kept set. So a flagged slot gets the token the branching chain gives it, and the
others never wait for it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from onnxsample.graphs.chain import FALLBACK, FALLBACK_LOGITS, PREFIX
from onnxsample.metadata import ComposedMetadata

log = logging.getLogger(__name__)

__all__ = ["FALLBACK_FLAGS", "FALLBACK_ROWS", "HostFallback"]

FALLBACK_FLAGS, FALLBACK_ROWS = PREFIX + FALLBACK, PREFIX + FALLBACK_LOGITS


class HostFallback:
    """The branching chain of `meta`'s sampler over every slot's row, in a one-thread CPU session.

    It runs over all the slots, as the composed graph does, not over the flagged ones alone: ONNX
    Runtime's CPU reductions take other paths for other row counts, and a logprob's normaliser
    summed over a batch of one row can differ from the batch's in its last bit."""

    def __init__(self, meta: ComposedMetadata) -> None:
        from onnxsample.composer.sampler_model import sampler_session

        self.session = sampler_session(
            meta.chain,
            meta.vocab_size,
            meta.max_slots,
            check=False,
            top_logprobs=meta.top_logprobs,
            max_bias=meta.max_bias,
            output_probs=meta.output_probs,
            output_candidates=meta.output_candidates,
            gather_rows=False,
            allowed_tokens=meta.allowed_tokens,
        )
        self.inputs = [i.name for i in self.session.get_inputs() if i.name != "logits"]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def redraw(self, rows: np.ndarray, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The branching chain's outputs for every slot: `rows` the logits the graph read [S, V],
        `feeds` (at least) every ``sampler.*`` input it read, each [S, ...]."""
        inputs = {"logits": np.ascontiguousarray(rows, np.float32)}
        inputs.update({name: feeds[name] for name in self.inputs})
        return dict(zip(self.outputs, self.session.run(None, inputs), strict=True))

    def apply(self, outputs: dict[str, np.ndarray], feeds: Mapping[str, np.ndarray]) -> list[int]:
        """Redraw the flagged slots of a standalone static sampler's `outputs` (run on `feeds`)
        in place, counts included; the slots redrawn."""
        flagged = [int(s) for s in np.flatnonzero(outputs[FALLBACK_FLAGS])]
        if flagged:
            redrawn = self.redraw(outputs[FALLBACK_ROWS], feeds)
            for name, value in redrawn.items():
                outputs[name][flagged] = value[flagged]
        return flagged
