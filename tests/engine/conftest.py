"""The engine tests' fixtures: the tiny model composed in both KV layouts, the `layout` each module
runs under (both, one after the other), an engine of that layout, and `fresh` for engines with other
settings."""

from __future__ import annotations

import numpy as np
import pytest

import onnxsample.engine._allowed as allowed_module
import onnxsample.engine._slots as slots_module
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


def _own_memory(array: np.ndarray, device: str):
    """An OrtValue of its own memory (a copy of `array`)."""
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_numpy(np.array(array, copy=True), device, 0)


@pytest.fixture
def own_memory_buffers(monkeypatch):
    """Call it to give the engines made after the call device buffers of their own memory, as on
    a GPU. A CPU OrtValue made from a numpy array shares the array's memory, so there a buffer
    row the engine forgot to write (penalty counts, prompt masks, allowed-token and draft masks)
    would still read the host's."""

    def apply() -> None:
        monkeypatch.setattr(slots_module, "ortvalue", _own_memory)
        monkeypatch.setattr(allowed_module, "ortvalue", _own_memory)

    return apply
