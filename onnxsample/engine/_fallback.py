"""The host's fallback for a static chain's flagged slots.

A static chain (CUDA graphs) sorts no whole row: it finds top-k's k-th logit and top-p's nucleus
among the ``STATIC_CANDIDATES`` largest logits and flags (``sampler.fallback``) each drawing slot
whose set reaches past them, and each drawing slot with typical-p on (its set follows another order
than the logits'). For such a slot the host runs the branching chain — the
same functions, with its wider and whole-row paths, a small model the composed file carries in
its metadata — over the row the graph read (``sampler.fallback_logits``; only the flagged rows'
span comes back to the host) with the slot's parameters, penalty state, allowed tokens and
uniform, on the CPU, and its outputs replace the slot's: the token, its logprob and whatever else
depends on the kept set. So a flagged slot gets the token the branching chain gives it, and the
others never wait for it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from onnxsample.engine._session import input_names
from onnxsample.errors import ModelError
from onnxsample.metadata import FALLBACK_MODEL, decode_model

__all__ = ["FALLBACK_FLAGS", "FALLBACK_ROWS", "HostFallback"]

FALLBACK_FLAGS, FALLBACK_ROWS = "sampler.fallback", "sampler.fallback_logits"


class HostFallback:
    """The branching chain for one slot, carried in the static model's metadata
    (``onnxsample.fallback_model``), in a one-thread CPU session: a flagged slot costs its own
    row's work, whatever the batch (the chain gives a row the same numbers alone as in any
    batch)."""

    def __init__(self, props: Mapping[str, str]) -> None:
        import onnxruntime as ort

        encoded = props.get(FALLBACK_MODEL)
        if encoded is None:
            raise ModelError(
                "the model flags slots for the host's fallback (sampler.fallback) but carries no "
                f"fallback chain ({FALLBACK_MODEL}): compose it again"
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(
            decode_model(encoded), options, providers=["CPUExecutionProvider"]
        )
        self.inputs = sorted(input_names(self.session) - {"logits"})
        self.outputs = [o.name for o in self.session.get_outputs()]

    def redraw(
        self, row: np.ndarray, feeds: Mapping[str, np.ndarray], slot: int
    ) -> dict[str, np.ndarray]:
        """The branching chain's outputs for `slot` ([1, ...] each): `row` the logits the graph
        read for it [1, V], `feeds` (at least) every ``sampler.*`` input it read, each [S, ...];
        an input with a default that `feeds` lacks keeps it."""
        inputs = {"logits": np.ascontiguousarray(row, np.float32)}
        inputs.update({n: feeds[n][slot : slot + 1] for n in self.inputs if n in feeds})
        return dict(zip(self.outputs, self.session.run(None, inputs), strict=True))
