"""A standalone static sampler's flagged slots (``sampler.fallback``) drawn again on the host, as
the engine does: the tests that compare a static chain's outputs with the branching chain's or
the reference's compare them after this."""

from __future__ import annotations

import functools

import numpy as np

from onnxsample.composer.sampler_model import build_sampler_model
from onnxsample.engine._fallback import FALLBACK_FLAGS, FALLBACK_ROWS, HostFallback
from onnxsample.engine._session import input_names
from onnxsample.params import temperature_moves


@functools.cache
def host_fallback(chain: str, vocab: int, slots: int, **options) -> HostFallback:
    """The branching chain a static model of `chain` carries for its flagged slots."""
    model = build_sampler_model(chain, vocab, slots, static=True, **options)
    return HostFallback({p.key: p.value for p in model.metadata_props})


def redraw(fallback: HostFallback, outputs: dict, feeds: dict) -> list[int]:
    """Redraw the flagged slots of a standalone static sampler's `outputs` (run on `feeds`) in
    place, counts included, as the engine does; the slots redrawn. As the engine, flag too the
    slots whose temperature's place after the cuts (``sampler.temperature_last``, which a static
    chain does not read) changes what they draw."""
    flags = outputs[FALLBACK_FLAGS]
    if "sampler.temperature_last" in feeds:
        names = ["temperature_last", "temperature", "top_k", "top_p", "min_p", "typical_p"]
        neutral = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0}
        given = [feeds.get(f"sampler.{n}", neutral.get(n)) for n in names]
        flags = flags | temperature_moves(*given)
    flagged = [int(s) for s in np.flatnonzero(flags)]
    for s in flagged:
        for name, value in fallback.redraw(outputs[FALLBACK_ROWS][s : s + 1], feeds, s).items():
            outputs[name][s] = value[0]
    return flagged


def read_by(session, feeds: dict) -> dict:
    """The `feeds` that `session` reads, its inputs with a default included: a static chain
    reads no ``sampler.temperature_last``, a branching one defaults it to false."""
    names = input_names(session)
    return {k: v for k, v in feeds.items() if k in names}
