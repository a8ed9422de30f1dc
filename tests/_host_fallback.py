"""A standalone static sampler's flagged slots (``sampler.fallback``) drawn again on the host, as
the engine does: the tests that compare a static chain's outputs with the branching chain's or
the reference's compare them after this."""

from __future__ import annotations

import functools

import numpy as np

from onnxsample.composer.sampler_model import build_sampler_model
from onnxsample.engine._fallback import FALLBACK_FLAGS, FALLBACK_ROWS, HostFallback


@functools.cache
def host_fallback(chain: str, vocab: int, slots: int, **options) -> HostFallback:
    """The branching chain a static model of `chain` carries for its flagged slots."""
    model = build_sampler_model(chain, vocab, slots, static=True, **options)
    return HostFallback({p.key: p.value for p in model.metadata_props})


def redraw(fallback: HostFallback, outputs: dict, feeds: dict) -> list[int]:
    """Redraw the flagged slots of a standalone static sampler's `outputs` (run on `feeds`) in
    place, counts included, as the engine does; the slots redrawn."""
    flagged = [int(s) for s in np.flatnonzero(outputs[FALLBACK_FLAGS])]
    for s in flagged:
        for name, value in fallback.redraw(outputs[FALLBACK_ROWS][s : s + 1], feeds, s).items():
            outputs[name][s] = value[0]
    return flagged
