"""GGUF quantised weights transplanted onto MatMulNBits: exact dequantisation and ORT agreement."""

from __future__ import annotations

import gguf
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from gguf import GGMLQuantizationType as QT

from onnxsample.errors import ExportError
from onnxsample.exporters._gguf_quant import (
    TRANSPLANTABLE,
    QuantizedWeight,
    concat_rows,
    from_gguf,
    linear_nodes,
    permute_rows,
)

SHAPES = [(96, 256), (5, 32), (7, 96)]  # (N, K): ordinary, one block, odd block count


def _quantized(qtype: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """GGUF data of a random [N, K] weight: uint8 [N, row_bytes]."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.1
    if qtype == "Q4_1":
        w += rng.standard_normal((n, k // 32, 1)).astype(np.float32).repeat(32, -1).reshape(n, k)
    return gguf.quants.quantize(w, QT[qtype])


def _reference(data: np.ndarray, qtype: str) -> np.ndarray:
    return gguf.quants.dequantize(data, QT[qtype])


def _session(
    w: QuantizedWeight,
    accuracy_level: int,
    x_shape: list | None = None,
    dtype: ir.DataType = ir.DataType.FLOAT,
) -> tuple[onnx.ModelProto, ort.InferenceSession]:
    """A one-layer model `x -> linear_nodes(x)`; x is [b, s, K] unless `x_shape` says otherwise."""
    tape = ir.tape.Tape()
    shape = ir.Shape(["b", "s", w.k] if x_shape is None else x_shape)
    x = ir.Value(name="x", type=ir.TensorType(dtype), shape=shape)
    if x_shape == []:
        x.shape = None  # type: ignore[assignment]  # unknown rank: linear_nodes assumes [B, S, K]

    def initializer(name: str, array: np.ndarray) -> ir.Value:
        return tape.initializer(ir.tensor(array, name=name))

    y = linear_nodes(tape, x, w, "layer", accuracy_level, initializer)
    graph = ir.Graph(
        [x],
        [y],
        nodes=tape.nodes,
        initializers=tape.initializers,
        opset_imports={"": 21, "com.microsoft": 1},
        name="linear",
    )
    proto = ir.serde.serialize_model(ir.Model(graph, ir_version=10))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return proto, session


@pytest.mark.parametrize("qtype", TRANSPLANTABLE)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_dequantize_is_bit_exact(qtype, n, k):
    data = _quantized(qtype, n, k)
    w = from_gguf(data, qtype, k, name="w")
    assert isinstance(w, QuantizedWeight)
    assert (w.qtype, w.n, w.k, w.packed.shape) == (qtype, n, k, (n, k // 32, w.bits * 4))
    assert w.packed.dtype == np.uint8 and w.scales.dtype == np.float32
    assert w.scales.shape == (n * (k // 32),)
    out = w.dequantize()
    assert out.dtype == np.float32
    assert np.array_equal(out, _reference(data, qtype))


@pytest.mark.parametrize(
    ("qtype", "bits", "zero_points", "mins"),
    [("Q4_0", 4, None, None), ("Q4_1", 4, (96, 4), (8, 96)), ("Q8_0", 8, None, None)],
)
def test_matmulnbits_layout(qtype, bits, zero_points, mins):
    w = from_gguf(_quantized(qtype, 96, 256), qtype, 256)
    assert w.bits == bits
    assert (None if w.zero_points is None else w.zero_points.shape) == zero_points
    assert (None if w.mins is None else w.mins.shape) == mins
    if w.zero_points is not None:
        assert w.zero_points.dtype == np.uint8 and not w.zero_points.any()


@pytest.mark.parametrize(
    ("accuracy_level", "tolerance"),
    [(0, 1e-4), (4, 2e-2)],  # 4: int8-quantised activations
)
@pytest.mark.parametrize("qtype", TRANSPLANTABLE)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_ort_matches_the_dequantised_matmul(qtype, n, k, accuracy_level, tolerance):
    data = _quantized(qtype, n, k)
    w = from_gguf(data, qtype, k)
    proto, session = _session(w, accuracy_level)
    onnx.checker.check_model(proto, full_check=True)
    x = np.random.default_rng(1).standard_normal((2, 3, k)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    expected = x.astype(np.float64) @ _reference(data, qtype).T.astype(np.float64)
    assert y.shape == (2, 3, n)
    assert np.max(np.abs(y - expected)) <= tolerance * np.max(np.abs(expected))


@pytest.mark.parametrize("qtype", TRANSPLANTABLE)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_fp16_activations_keep_the_blocks(qtype, n, k):
    """The GPU export's linear layers: fp16 activations, the GGUF's fp16 scales and minimums as they
    are, 8-bit blocks kept as MatMulNBits too (CUDA's fp16 kernel has a fused 8-bit path)."""
    data = _quantized(qtype, n, k)
    w = from_gguf(data, qtype, k)
    proto, session = _session(w, 0, dtype=ir.DataType.FLOAT16)
    onnx.checker.check_model(proto, full_check=True)
    initializers = {t.name: t for t in proto.graph.initializer}
    assert initializers["layer.scales"].data_type == onnx.TensorProto.FLOAT16
    assert np.array_equal(
        onnx.numpy_helper.to_array(initializers["layer.scales"]).astype(np.float32), w.scales
    )  # GGUF stores d in fp16: nothing is rounded
    x = np.random.default_rng(1).standard_normal((2, 3, k)).astype(np.float16)
    (y,) = session.run(None, {"x": x})
    assert y.dtype == np.float16 and y.shape == (2, 3, n)
    expected = x.astype(np.float64) @ _reference(data, qtype).T.astype(np.float64)
    assert np.max(np.abs(y - expected)) <= 3e-3 * np.max(np.abs(expected))


def test_node_names_and_correction_graph():
    w = from_gguf(_quantized("Q4_1", 96, 256), "Q4_1", 256)
    proto, _ = _session(w, 0)
    ops = [(node.op_type, node.domain, node.name) for node in proto.graph.node]
    assert ops == [
        ("MatMulNBits", "com.microsoft", "layer/MatMulNBits"),
        ("Reshape", "", "layer/BlockSum/Reshape"),
        ("ReduceSum", "", "layer/BlockSum/ReduceSum"),
        ("MatMul", "", "layer/MinsMatMul"),
        ("Add", "", "layer/AddMins"),
    ]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in proto.graph.node[0].attribute}
    assert attrs == {"K": 256, "N": 96, "bits": 4, "block_size": 32, "accuracy_level": 0}
    assert proto.graph.output[0].name == "layer/AddMins/output_0"
    w0 = from_gguf(_quantized("Q4_0", 96, 256), "Q4_0", 256)
    proto0, _ = _session(w0, 0)
    assert [node.op_type for node in proto0.graph.node] == ["MatMulNBits"]
    assert len(proto0.graph.node[0].input) == 3  # default zero point


@pytest.mark.parametrize(
    ("x_shape", "input_shape", "block_shape"),
    [
        ([], (2, 3, 64), [0, 0, 2, 32]),
        (["m", 64], (4, 64), [0, 2, 32]),
        (["a", "b", "c", 64], (2, 1, 3, 64), [0, 0, 0, 2, 32]),
    ],
)
def test_q4_1_correction_follows_the_input_rank(x_shape, input_shape, block_shape):
    data = _quantized("Q4_1", 5, 64)
    proto, session = _session(from_gguf(data, "Q4_1", 64), 0, x_shape)
    shape = next(i for i in proto.graph.initializer if i.name == "layer.block_shape")
    assert onnx.numpy_helper.to_array(shape).tolist() == block_shape
    x = np.random.default_rng(5).standard_normal(input_shape).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    expected = x @ _reference(data, "Q4_1").T
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("qtype", TRANSPLANTABLE)
def test_permute_rows_matches_the_float_permutation(qtype):
    data = _quantized(qtype, 96, 256)
    w = from_gguf(data, qtype, 256)
    order = np.random.default_rng(2).permutation(96)
    permuted = permute_rows(w, order)
    assert isinstance(permuted, QuantizedWeight)
    assert np.array_equal(permuted.dequantize(), _reference(data, qtype)[order])
    floats = _reference(data, qtype)
    assert np.array_equal(permute_rows(floats, order), floats[order])


@pytest.mark.parametrize("order", [np.arange(95), np.zeros(96, dtype=np.int64), np.arange(96.0)])
def test_permute_rows_rejects_a_non_permutation(order):
    w = from_gguf(_quantized("Q4_0", 96, 256), "Q4_0", 256)
    with pytest.raises(ValueError, match="permutation"):
        permute_rows(w, order)


@pytest.mark.parametrize("qtype", TRANSPLANTABLE)
def test_concat_rows_matches_the_float_concatenation(qtype):
    parts = [_quantized(qtype, n, 64, seed) for seed, n in enumerate((8, 3, 5))]
    weights = [from_gguf(part, qtype, 64) for part in parts]
    joined = concat_rows(weights)
    assert (joined.n, joined.k, joined.qtype) == (16, 64, qtype)
    expected = np.concatenate([_reference(part, qtype) for part in parts])
    assert np.array_equal(joined.dequantize(), expected)
    _, session = _session(joined, 0)
    x = np.random.default_rng(3).standard_normal((1, 2, 64)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, x @ expected.T, rtol=1e-4, atol=1e-4 * np.abs(y).max())


@pytest.mark.parametrize(
    ("a", "b"), [("Q4_0", "Q4_1"), ("Q4_0", "Q8_0"), ("Q4_1", "Q8_0"), ("Q4_0@64", "Q4_0@32")]
)
def test_concat_rows_rejects_mixed_weights(a, b):
    def make(spec: str) -> QuantizedWeight:
        qtype, _, k = spec.partition("@")
        return from_gguf(_quantized(qtype, 4, int(k or 64)), qtype, int(k or 64))

    with pytest.raises(ValueError, match="must match"):
        concat_rows([make(a), make(b)])
    with pytest.raises(ValueError):
        concat_rows([])


@pytest.mark.parametrize(("qtype", "dtype"), [("F32", np.float32), ("F16", np.float16)])
def test_float_tensors_become_float32_rows(qtype, dtype):
    w = np.random.default_rng(4).standard_normal((6, 40)).astype(dtype)
    for data in (w, w.view(np.uint8)):
        out = from_gguf(data, qtype, 40)
        assert out.dtype == np.float32 and out.shape == (6, 40)
        assert np.array_equal(out, w.astype(np.float32))


@pytest.mark.parametrize(
    ("qtype", "data"),
    [
        ("Q6_K", np.zeros((4, 210), dtype=np.uint8)),
        ("Q4_K", np.zeros((4, 144), dtype=np.uint8)),
        ("Q5_0", gguf.quants.quantize(np.ones((4, 64), np.float32), QT.Q5_0)),
        ("BF16", np.zeros((4, 64), dtype=np.uint8)),
    ],
)
def test_unsupported_types_are_refused_by_name(qtype, data):
    with pytest.raises(ExportError) as info:
        from_gguf(data, qtype, 256, name="blk.3.ffn_down.weight")
    message = str(info.value)
    assert "\n" not in message
    for part in ("blk.3.ffn_down.weight", qtype, "Q4_0", "Q4_1", "Q8_0", "F16", "F32"):
        assert part in message


@pytest.mark.parametrize(
    ("data", "k", "match"),
    [
        (np.zeros((4, 18), dtype=np.uint8), 48, "multiple"),
        (np.zeros((4, 19), dtype=np.uint8), 32, "rows"),
        (np.zeros((4, 16), dtype=np.float32), 32, "float32"),
    ],
)
def test_malformed_data_is_an_export_error(data, k, match):
    with pytest.raises(ExportError, match=match):
        from_gguf(data, "Q4_0", k, name="w")


@pytest.fixture(scope="module")
def embedded_reader():
    from onnxsample.exporters import embedded_gguf

    return gguf.GGUFReader(embedded_gguf())  # installed by the README's commands: never a skip


@pytest.mark.parametrize(
    ("tensor_name", "qtype"), [("blk.0.attn_q.weight", "Q4_1"), ("token_embd.weight", "Q8_0")]
)
def test_embedded_tensors_dequantize_exactly(embedded_reader, tensor_name, qtype):
    (tensor,) = [t for t in embedded_reader.tensors if t.name == tensor_name]
    assert tensor.tensor_type.name == qtype
    k, n = (int(d) for d in tensor.shape)
    w = from_gguf(tensor.data, tensor.tensor_type.name, k, name=tensor.name)
    assert isinstance(w, QuantizedWeight) and (w.n, w.k) == (n, k)
    assert np.array_equal(w.dequantize(), gguf.quants.dequantize(tensor.data, tensor.tensor_type))
