"""A composed model leaves the model's shapes to ONNX Runtime: no dimension that ONNX's shape
inference made up (``unk__N``) is written into it.

Such a name wins over the one ONNX Runtime infers (``batch_size``); the first node that meets
both gives a dimension with no name, and every tensor after it has a shape the memory planner
cannot match, so no buffer of the model is reused and the planner scans all the freed ones for
each new tensor (a third of a session's creation for the embedded model, before this was fixed).
The check reads the shapes ONNX Runtime itself inferred, from the optimised model it saves.
"""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest

from onnxsample.composer import compose
from onnxsample.prepare import RUN_COMPOSE_OPTIONS

CASES = {
    "default": {},
    "run": RUN_COMPOSE_OPTIONS,
    "static": {"static": True},
    "inline": {"inline": True},
}


def _dims(info: onnx.ValueInfoProto) -> list:
    return [d.dim_value or d.dim_param for d in info.type.tensor_type.shape.dim]


def _invented(model: onnx.ModelProto) -> list[str]:
    return [
        info.name
        for info in (*model.graph.value_info, *model.graph.output)
        if any(str(dim).startswith("unk__") for dim in _dims(info))
    ]


def _unnamed_in_layers(path, tmp_path) -> list[str]:
    """The decoder layers' tensors whose shape, as ONNX Runtime inferred it, has a dimension with
    neither a size nor a name."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    options.optimized_model_filepath = str(tmp_path / "seen.onnx")
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", "seen.onnx.data"
    )
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    seen = onnx.load(tmp_path / "seen.onnx", load_external_data=False)
    producers = {out: node.name for node in seen.graph.node for out in node.output}
    return [
        info.name
        for info in seen.graph.value_info
        if producers.get(info.name, "").startswith("layers.")
        and info.type.tensor_type.HasField("shape")
        and any(dim == "" for dim in _dims(info))
    ]


@pytest.mark.parametrize("options", CASES.values(), ids=CASES.keys())
def test_no_dimension_is_made_up(embedded_gqa_exports, tmp_path, options):
    folder = embedded_gqa_exports["gguf-a4"].output
    out = compose(folder, None, tmp_path / "composed.onnx", **options)
    assert not _invented(onnx.load(out, load_external_data=False))
    if options is RUN_COMPOSE_OPTIONS:  # what `run` and `serve` load
        assert not _unnamed_in_layers(out, tmp_path)
