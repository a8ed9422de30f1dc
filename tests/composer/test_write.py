"""Writing, checking and reading a composed model without holding its weights again: the
single-file writer gives the model protobuf would, one weight at a time; the LM-head check reads
the export's own files; a file's graph is read without its weights' bytes, and a single-file
model's weights are mapped from it as an export's data file is."""

from __future__ import annotations

import os
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from onnxsample._wire import read_with_weight_refs, read_without_weights
from onnxsample.composer import compose, composed_metadata
from onnxsample.composer._lm_head import _check_session
from onnxsample.composer._write import write_single_file
from onnxsample.composer.loading import check_model, load_model

WEIGHTS, ROWS = 16, 256  # sixteen 256 KB weights


def _chain_model(folder: Path, *, subgraph: bool = False) -> Path:
    """y = x + w0 + ... + w15 (and, with `subgraph`, an If whose branch has a weight of its
    own), saved with every weight in external data."""
    rng = np.random.default_rng(0)
    x = ir.Value(name="x", shape=ir.Shape([ROWS, ROWS]), type=ir.TensorType(ir.DataType.FLOAT))
    nodes, current, weights = [], x, []
    for i in range(WEIGHTS):
        w = ir.Value(name=f"w{i}", const_value=ir.tensor(rng.random((ROWS, ROWS), np.float32)))
        weights.append(w)
        node = ir.node("Add", [current, w], name=f"add{i}")
        nodes.append(node)
        current = node.outputs[0]
    if subgraph:
        inner = ir.Value(name="inner_w", const_value=ir.tensor(rng.random(ROWS, np.float32)))
        add = ir.node("Add", [current, inner], name="then_add")
        add.outputs[0].name = "then_y"
        branch = ir.Graph([], [add.outputs[0]], nodes=[add], initializers=[inner], name="then")
        keep = ir.node("Identity", [current], name="else_keep")
        keep.outputs[0].name = "else_y"
        other = ir.Graph([], [keep.outputs[0]], nodes=[keep], name="else")
        flag = ir.Value(name="flag", const_value=ir.tensor(np.array(True)))
        weights.append(flag)
        node = ir.node(
            "If", [flag], attributes={"then_branch": branch, "else_branch": other}, name="if"
        )
        nodes.append(node)
        current = node.outputs[0]
    current.name = "y"
    current.shape, current.type = ir.Shape([ROWS, ROWS]), ir.TensorType(ir.DataType.FLOAT)
    graph = ir.Graph(
        [x], [current], nodes=nodes, initializers=weights, opset_imports={"": 21}, name="chain"
    )
    path = folder / "model.onnx"
    ir.save(ir.Model(graph, ir_version=10), path, external_data="model.onnx.data")
    return path


def _protobufs_model(path: Path) -> onnx.ModelProto:
    """The reference: the whole model loaded and serialised by protobuf in one piece."""
    model = ir.load(path)
    ir.external_data.load_to_model(model)
    return onnx.load_from_string(ir.to_proto(model).SerializeToString())


@pytest.mark.parametrize("subgraph", [False, True], ids=["graph", "with-subgraph"])
def test_the_single_file_is_the_model_protobuf_writes(tmp_path, subgraph):
    source = _chain_model(tmp_path, subgraph=subgraph)
    model = ir.load(source)
    out = tmp_path / "one.onnx"
    with out.open("wb") as file:
        write_single_file(model, file)
    written = onnx.load(str(out))
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in written.graph.initializer)
    assert written == _protobufs_model(source)
    onnx.checker.check_model(written, full_check=True)
    x = np.ones((ROWS, ROWS), np.float32)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    want = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(got[0], want[0])


def test_the_writer_holds_one_weight_at_a_time(tmp_path):
    """Python-allocated bytes at the peak of each way of writing: one 256 KB weight (and the small
    graph) here, every weight at once when protobuf serialises the whole model."""
    source = _chain_model(tmp_path)
    weight = ROWS * ROWS * 4

    def peak(write) -> int:
        model = ir.load(source)
        tracemalloc.start()
        try:
            write(model)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    ours = peak(lambda m: write_single_file(m, _Sink()))

    def whole(m):
        ir.external_data.load_to_model(m)
        _Sink().write(ir.to_proto(m).SerializeToString())

    assert peak(whole) > WEIGHTS * weight  # the measure sees every weight held at once
    assert ours < 3 * weight


class _Sink:
    """A file that keeps nothing."""

    def write(self, data: bytes) -> int:
        return len(data)


def test_the_lm_head_check_reads_the_exports_files(tmp_path):
    """The check's session maps the weights from their file, even from another working
    directory, and the model's tensors stay mapped (nothing is copied into the graph)."""
    source = _chain_model(tmp_path)
    model = ir.load(source)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(elsewhere)
        session = _check_session(model)
    x = np.zeros((ROWS, ROWS), np.float32)
    want = sum(
        ir.load(source).graph.initializers[f"w{i}"].const_value.numpy() for i in range(WEIGHTS)
    )
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-6)
    assert all(
        isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()
    )


def test_a_composed_export_keeps_the_moved_gather_and_passes_the_checker(tiny_gqa_export, tmp_path):
    out = compose(tiny_gqa_export.output, output=tmp_path / "composed.onnx", max_slots=2)
    model = onnx.load(str(out))
    assert composed_metadata(model).gather == "lm_head"
    assert not (tmp_path / "composed.onnx.data").exists()
    check_model(out)  # the file on disk, read back whole


def _without_data(model: onnx.ModelProto) -> onnx.ModelProto:
    data = ("float_data", "int32_data", "string_data", "int64_data", "raw_data", "double_data")
    for tensor in model.graph.initializer:
        for name in (*data, "uint64_data"):
            tensor.ClearField(name)
    return model


def test_a_files_graph_is_read_without_its_weights(tiny_gqa_export, tmp_path):
    """The graph, functions, metadata and every initializer's name, type, shape and external
    reference, as onnx reads them; of the weights inside the file, no byte is copied."""
    composed = compose(tiny_gqa_export.output, output=tmp_path / "c.onnx", max_slots=2)
    export = tiny_gqa_export.output / "model.onnx"
    for path in (composed, export):
        want = _without_data(onnx.load(str(path), load_external_data=False))
        assert read_without_weights(path) == want
    tracemalloc.start()
    try:
        read_without_weights(composed)
        ours = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        onnx.load(str(composed), load_external_data=False)
        whole = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    size = composed.stat().st_size
    assert whole > size  # the measure sees the file read whole
    assert ours < size / 10


def _single_file(export: Path, folder: Path) -> Path:
    """`export`'s folder with its model saved as one file, every weight inside it."""
    shutil.copytree(export, folder, ignore=shutil.ignore_patterns("model.onnx.data"))
    onnx.save(onnx.load(str(export / "model.onnx")), str(folder / "model.onnx"))
    return folder / "model.onnx"


@pytest.mark.parametrize("min_bytes", [1024, 1])
def test_a_single_files_weights_are_read_as_references_into_it(tmp_path, min_bytes):
    """Every initializer whose raw bytes reach `min_bytes` becomes a reference to those bytes
    in the file itself (a subgraph's stay inline); loading the references gives back the model
    onnx reads whole."""
    source = _chain_model(tmp_path, subgraph=True)
    single = tmp_path / "single.onnx"
    onnx.save(_protobufs_model(source), str(single))
    read = read_with_weight_refs(single, min_bytes=min_bytes)
    external = {
        t.name for t in read.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
    }
    assert external == {f"w{i}" for i in range(WEIGHTS)} | ({"flag"} if min_bytes == 1 else set())
    assert {
        e.value for t in read.graph.initializer for e in t.external_data if e.key == "location"
    } == {single.name}
    onnx.external_data_helper.load_external_data_for_model(read, str(tmp_path))
    for tensor in read.graph.initializer:
        tensor.ClearField("data_location")
    assert read == onnx.load(str(single))


def test_a_single_file_source_composes_as_its_external_data_twin(tiny_gqa_export, tmp_path):
    """Composing an export whose weights are inside its model.onnx reads them from that file as
    it would from model.onnx.data: no weight is parsed into memory when loading, a symbolic link
    to the file (a hub cache's layout) is followed, and the composed model is the same."""
    export = tiny_gqa_export.output
    single = _single_file(export, tmp_path / "single")
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(single, linked / "model.onnx")
    tracemalloc.start()
    try:
        model = load_model(linked / "model.onnx")
        ours = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    big = [v for v in model.graph.initializers.values() if v.const_value.nbytes >= 1024]
    assert big and all(isinstance(v.const_value, ir.ExternalTensor) for v in big)
    assert ours < single.stat().st_size / 10
    twin = onnx.load(str(compose(export, output=tmp_path / "twin.onnx", max_slots=2)))
    got = onnx.load(str(compose(linked, output=tmp_path / "got.onnx", max_slots=2)))
    assert composed_metadata(got).gather == "lm_head"
    assert got.graph == twin.graph
    assert got.metadata_props == twin.metadata_props
