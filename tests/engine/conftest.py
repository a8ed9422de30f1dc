"""The engine tests' fixtures: the tiny model composed in both KV layouts, the `layout` each module
runs under (both, one after the other), an engine of that layout, and `fresh` for engines with other
settings."""

from __future__ import annotations

import pytest

from onnxsample.composer import compose
from onnxsample.engine import Engine

LAYOUTS = ["concat", "gqa"]


@pytest.fixture(scope="session")
def models(tiny_export, tiny_gqa_export, tmp_path_factory) -> dict:
    """Each layout composed with 4 slots, 3 top logprobs, prompt logprobs and the allowed-tokens
    mask; and with 2 slots."""
    folder = tmp_path_factory.mktemp("engine")
    out = {}
    for layout, export in (("concat", tiny_export), ("gqa", tiny_gqa_export)):
        for slots in (4, 2):
            path = compose(
                export.output,
                None,
                folder / f"{layout}-{slots}.onnx",
                max_slots=slots,
                top_logprobs=3,
                max_bias=2,
                prompt_logprobs=True,
                allowed_tokens=True,
            )
            out[layout, slots] = (path, export.output)
    return out


@pytest.fixture(scope="module", params=LAYOUTS)
def layout(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def engine(models, layout):
    path, folder = models[layout, 4]
    with Engine(path, tokenizer=folder, threads=1, prefill_chunk=32) as e:
        yield e


@pytest.fixture(scope="module")
def fresh(models, layout):
    """Engines of this layout with other settings, closed at the end of the module."""
    made = []

    def make(slots: int = 4, **options) -> Engine:
        path, folder = models[layout, slots]
        e = Engine(path, tokenizer=folder, threads=1, **options)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close(cancel=True)
