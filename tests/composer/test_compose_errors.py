"""The composer's refusals: bad models (no or malformed logits, an old opset, unreadable or
truncated files, unsafe or missing external data, name collisions, a model composed twice, a missing
file) refused with one clear line and no output, and invalid options."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxsample.composer import compose
from onnxsample.errors import InvalidParameter, ModelError
from onnxsample.metadata import composed_metadata

# ---- bad models -------------------------------------------------------------------------------


def _tiny_graph(
    output_name="logits",
    dtype=TensorProto.FLOAT,
    rank=3,
    input_name="x",
    opset=18,
    initializer=None,
) -> onnx.ModelProto:
    shape = ["b", "t", 8][:rank] if rank <= 3 else ["b", "t", 8, 1]
    x = helper.make_tensor_value_info(input_name, dtype, shape)
    y = helper.make_tensor_value_info(output_name, dtype, shape)
    inits = [initializer] if initializer is not None else []
    nodes = [helper.make_node("Identity", [input_name], [output_name])]
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _external(folder: Path, location: str, *, offset=0, length=32) -> onnx.ModelProto:
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[8])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        w.external_data.add(key=key, value=value)
    return _tiny_graph(initializer=w)


def _write(folder: Path, model: onnx.ModelProto, name="model.onnx") -> Path:
    path = folder / name
    path.write_bytes(model.SerializeToString())
    return path


def _case_truncated(tmp: Path, composed_file: Path) -> Path:
    data = composed_file.read_bytes()
    path = tmp / "cut.onnx"
    path.write_bytes(data[: len(data) // 3])
    return path


def _case_symlink(tmp: Path, _composed: Path) -> Path:
    (tmp / "real.bin").write_bytes(bytes(64))
    os.symlink(tmp / "real.bin", tmp / "w.bin")
    return _write(tmp, _external(tmp, "w.bin"))


def _case_hardlink(tmp: Path, _composed: Path) -> Path:
    (tmp / "real.bin").write_bytes(bytes(64))
    os.link(tmp / "real.bin", tmp / "w.bin")
    return _write(tmp, _external(tmp, "w.bin"))


def _case_beyond_end(tmp: Path, _composed: Path) -> Path:
    (tmp / "w.bin").write_bytes(bytes(16))
    return _write(tmp, _external(tmp, "w.bin", offset=8, length=32))


BAD_MODELS = {
    "no logits": (
        lambda t, c: _write(t, _tiny_graph(output_name="scores")),
        "has no 'logits' output",
    ),
    "integer logits": (
        lambda t, c: _write(t, _tiny_graph(dtype=TensorProto.INT64)),
        "'logits' must be a float tensor",
    ),
    "rank-2 logits": (lambda t, c: _write(t, _tiny_graph(rank=2)), "'logits' must have rank 3"),
    "old opset": (
        lambda t, c: _write(t, _tiny_graph(opset=13)),
        "opset 13; the samplers need opset >= 18",
    ),
    "truncated file": (_case_truncated, "not a readable ONNX model"),
    "not a model": (
        lambda t, c: _write(t, onnx.ModelProto(ir_version=10), "bare.onnx"),
        "fails the ONNX checker",
    ),
    "empty file": (
        lambda t, c: _write(t, onnx.ModelProto(), "empty.onnx"),
        "not a readable ONNX model",
    ),
    "external data with ..": (
        lambda t, c: _write(t, _external(t, "../secret.bin")),
        "'..' is refused",
    ),
    "external data absolute": (
        lambda t, c: _write(t, _external(t, "/etc/passwd")),
        "absolute paths are refused",
    ),
    "external data symlink": (_case_symlink, "is a symbolic link"),
    "external data hardlink": (_case_hardlink, "is hard-linked"),
    "external data beyond end": (_case_beyond_end, "lie beyond the file's end"),
    "external data missing": (lambda t, c: _write(t, _external(t, "gone.bin")), "does not exist"),
    "name collision": (
        lambda t, c: _write(t, _tiny_graph(input_name="sampler.temperature")),
        "already has a value named 'sampler.temperature'",
    ),
    "composed twice": (lambda t, c: c, "is composed already (sampler chain temperature,dist)"),
    "missing file": (lambda t, c: t / "nope.onnx", "no such model file"),
    "folder without model": (lambda t, c: t, "holds no model.onnx"),
}


@pytest.mark.parametrize("case", list(BAD_MODELS))
def test_bad_models_are_refused_clearly(case, tmp_path, tiny_export):
    make, message = BAD_MODELS[case]
    composed_file = tmp_path / "composed_once.onnx"
    if case in ("composed twice", "truncated file"):
        compose(tiny_export.output, "temperature,dist", composed_file, max_slots=2)
    (tmp_path / "work").mkdir()
    path = make(tmp_path / "work", composed_file)
    with pytest.raises(ModelError, match=None) as info:
        compose(path, None, tmp_path / "out.onnx")
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gather": "middle"}, "gather must be one of auto, lm_head, logits, got 'middle'"),
        ({"chain": "top_k,bogus"}, "bogus"),
        ({"max_slots": 0}, "max_slots must be"),
        ({"top_logprobs": 21}, "top_logprobs must be in [0, 20], got 21"),
        # a bool is not a count (Python's True == 1), a number not a chain
        ({"max_slots": True}, "max_slots must be an integer >= 1, got True"),
        ({"top_logprobs": True}, "top_logprobs must be"),
        ({"max_bias": True}, "max_bias must be"),
        ({"output_candidates": True}, "output_candidates must be"),
        ({"max_slots": 2.0}, "max_slots must be"),
        ({"chain": 5}, "a sampler chain is names"),
        # sizes no graph could hold (its per-slot state would fill memory before use)
        ({"max_slots": 10**9}, "max_slots must be at most 43690 for a vocabulary of 49152"),
        ({"max_bias": 10**12, "chain": "logit_bias,dist"}, "max_bias must be at most 268435456"),
        # a flag that is no bool would be read one way and recorded another
        ({"inline": 1}, "inline must be True or False, got 1"),
        ({"static": "no"}, "static must be True or False, got 'no'"),
        ({"progress": 5}, "progress must be a callable or None, got 5"),
    ],
)
def test_invalid_options(tiny_export, tmp_path, kwargs, message):
    chain = kwargs.pop("chain", None)
    with pytest.raises(InvalidParameter) as info:
        compose(tiny_export.output, chain, tmp_path / "x.onnx", **kwargs)
    assert message in str(info.value)


def test_numpy_integers_are_counts(tiny_gqa_export, tmp_path):
    """Sizes given as numpy integers compose as Python's do (onnx's shapes refused them)."""
    sizes = dict(max_slots=2, top_logprobs=3, max_bias=4, output_candidates=5)
    path = compose(tiny_gqa_export.output, None, tmp_path / "np.onnx",
                   **{k: np.int64(v) for k, v in sizes.items()})  # fmt: skip
    meta = composed_metadata(onnx.load(path, load_external_data=False))
    assert (meta.max_slots, meta.top_logprobs, meta.max_bias, meta.output_candidates) == (
        2,
        3,
        4,
        5,
    )


@pytest.mark.parametrize(("model", "message"), [(None, "model must be a path"), (3, "got int")])
def test_a_model_that_is_no_path(tmp_path, model, message):
    with pytest.raises(InvalidParameter, match=message):
        compose(model, None, tmp_path / "x.onnx")


def test_an_output_under_a_file_is_a_model_error(tiny_export, tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ModelError, match=r"cannot write .*afile"):
        compose(tiny_export.output, None, tmp_path / "afile" / "c.onnx")


def test_a_dead_compositions_temporary_file_goes_with_the_next(tiny_export, tmp_path):
    """Each process writes its own temporary file (two composing one file at once collided on a
    shared one); one a killed process left is removed by the next composition, one of a process
    still running is not."""
    dead = tmp_path / ".c.onnx.999999999.1.partial"  # no such process
    live = tmp_path / f".c.onnx.{os.getpid()}.7.partial"  # a composition running now
    for path in (dead, live):
        path.write_bytes(b"x" * 64)
    compose(tiny_export.output, None, tmp_path / "c.onnx")
    assert not dead.exists() and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, "c.onnx"]
