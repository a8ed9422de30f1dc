"""GGUF quantised weights transplanted onto MatMulNBits and a gathered embedding: every linear ggml
type de-quantises to `gguf.quants.dequantize` bit for bit, and ONNX Runtime computes with it."""

from __future__ import annotations

import itertools

import gguf
import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from gguf import GGMLQuantizationType as QT

from onnxsample.errors import ExportError
from onnxsample.exporters import _gguf_quant, _store
from onnxsample.exporters._gguf_blocks import FORMATS
from onnxsample.exporters._gguf_nodes import gather_nodes, linear_nodes
from onnxsample.exporters._gguf_quant import (
    SUPPORTED,
    TRANSPLANTABLE,
    QuantizedWeight,
    concat_rows,
    from_gguf,
    permute_rows,
)
from onnxsample.exporters._gqa_graph import concat_weights

SHAPES = [(96, 256), (5, 512), (7, 768)]  # (N, K): K a multiple of the K-quants' 256
# (type, bits, block size, minimums): what each type becomes
LAYOUTS = [
    ("Q4_0", 4, 32, False),
    ("Q4_1", 4, 32, True),
    ("Q5_0", 8, 32, False),
    ("Q5_1", 8, 32, True),
    ("Q8_0", 8, 32, False),
    ("Q2_K", 4, 16, True),
    ("Q3_K", 4, 16, False),
    ("Q4_K", 4, 32, True),
    ("Q5_K", 8, 32, True),
    ("Q6_K", 8, 16, False),
    ("IQ4_NL", 8, 32, False),
    ("IQ4_XS", 8, 32, False),
    ("IQ3_XXS", 8, 32, False),
    ("IQ3_S", 8, 32, False),
    ("IQ2_XXS", 8, 32, False),
    ("IQ2_XS", 8, 16, False),
    ("IQ2_S", 8, 16, False),
    ("IQ1_S", 8, 32, False),
    ("IQ1_M", 8, 16, False),
]
# where each type keeps its fp16 fields (d, dmin, m), byte offsets in a block
_FP16_AT = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
            "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0],
            "IQ4_XS": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ2_XXS": [0], "IQ2_XS": [0],
            "IQ2_S": [0], "IQ1_S": [0], "IQ1_M": []}  # fmt: skip


def _quantized(qtype: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """GGUF data of an [N, K] weight, uint8 [N, row_bytes]: random codes and scales (finite fp16
    of a weight's magnitude), or gguf's own quantiser where it has one."""
    rng = np.random.default_rng(seed)
    if qtype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        w = rng.standard_normal((n, k)).astype(np.float32) * 0.1
        if qtype in ("Q4_1", "Q5_1"):  # a minimum that matters
            w += (
                rng.standard_normal((n, k // 32, 1)).astype(np.float32).repeat(32, -1).reshape(n, k)
            )
        return gguf.quants.quantize(w, QT[qtype])
    fmt = FORMATS[qtype]
    blocks = rng.integers(0, 256, (n, k // fmt.block, fmt.nbytes), dtype=np.uint8)
    for at in _FP16_AT[qtype]:
        halves = (rng.standard_normal(blocks.shape[:2]) * 0.02).astype(np.float16)
        blocks[..., at : at + 2] = halves[..., None].view(np.uint8)
    if qtype == "IQ1_M":  # its fp16 scale is the top nibbles of four 16-bit words
        halves = (rng.standard_normal(blocks.shape[:2]) * 0.02).astype(np.float16).view(np.uint16)
        words = blocks[..., 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
        nibbles = (halves[..., None] >> np.array([0, 4, 8, 12], np.uint16)) & np.uint16(0xF)
        blocks[..., 48:56] = (words | (nibbles << np.uint16(12))).view(np.uint8)
    return blocks.reshape(n, -1)


def _reference(data: np.ndarray, qtype: str) -> np.ndarray:
    return gguf.quants.dequantize(data, QT[qtype])


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal float32 numbers, element for element (a signed zero equals zero: Q2_K's reference
    writes -0.0 where the centred form writes 0.0, which no product can tell apart)."""
    return a.dtype == b.dtype == np.float32 and np.array_equal(a, b) and not np.isnan(a).any()


def _model(build, inputs: list[ir.Value]) -> tuple[onnx.ModelProto, ort.InferenceSession]:
    """A model of the nodes `build(tape, initializer)` records; its output is what it returns."""
    tape = ir.tape.Tape()
    names: dict[str, ir.Value] = {}

    def initializer(name: str, array: np.ndarray) -> ir.Value:
        if name not in names:
            names[name] = tape.initializer(ir.tensor(np.ascontiguousarray(array), name=name))
        return names[name]

    outputs = build(tape, initializer)
    graph = ir.Graph(
        inputs,
        outputs,
        nodes=tape.nodes,
        initializers=tape.initializers,
        opset_imports={"": 21, "com.microsoft": 1},
        name="weights",
    )
    proto = ir.serde.serialize_model(ir.Model(graph, ir_version=10))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return proto, session


def _x(shape: list | None, dtype: ir.DataType = ir.DataType.FLOAT) -> ir.Value:
    return ir.Value(
        name="x", type=ir.TensorType(dtype), shape=None if shape is None else ir.Shape(shape)
    )


def _session(
    w: QuantizedWeight, accuracy_level: int, x_shape: list | None = None, dtype=ir.DataType.FLOAT
):
    """A one-layer model `x -> linear_nodes(x)`; x is [b, s, K] unless `x_shape` says otherwise
    ([] leaves its rank unknown: linear_nodes then takes it to be [B, S, K])."""
    x = _x(["b", "s", w.k] if x_shape is None else (x_shape or None), dtype)
    return _model(
        lambda tape, init: [linear_nodes(tape, x, w, "layer", accuracy_level, init, dtype)], [x]
    )


@pytest.mark.parametrize(("qtype", "bits", "block", "mins"), LAYOUTS)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_dequantize_is_bit_exact(qtype, bits, block, mins, n, k):
    data = _quantized(qtype, n, k)
    w = from_gguf(data, qtype, k, name="w")
    assert isinstance(w, QuantizedWeight)
    assert (w.qtype, w.n, w.k, w.bits, w.block_size) == (qtype, n, k, bits, block)
    assert w.packed.shape == (n, k // block, block * bits // 8) and w.packed.dtype == np.uint8
    assert w.scales.shape == (n, k // block) and w.scales.dtype == np.float32
    assert (w.mins is not None) == mins
    out = w.dequantize()
    assert out.dtype == np.float32
    assert _same(out, _reference(data, qtype))


@pytest.mark.parametrize("qtype", TRANSPLANTABLE)
def test_a_tensor_unpacks_the_same_a_few_rows_at_a_time(qtype, monkeypatch):
    """Unpacking goes a few million weights at a time (it takes several bytes a weight in
    passing); the weight is the same as in one go, a block without an exact moved minimum
    (a zero point of its own) in a middle chunk included."""
    data = _quantized(qtype, 16, 256)
    if qtype == "Q4_K":  # row 7: d = 1, dmin * 6-bit minimum = -2**-24 (see the test below)
        blocks = data.reshape(16, -1, FORMATS[qtype].nbytes).copy()
        blocks[7, 0, 0:2] = np.array([1.0], np.float16).view(np.uint8)
        blocks[7, 0, 2:4] = np.array([-(2.0**-24)], np.float16).view(np.uint8)
        blocks[7, 0, 4], blocks[7, 0, 8] = 1, 1
        data = blocks.reshape(16, -1)
    whole = from_gguf(data, qtype, 256)
    monkeypatch.setattr(_gguf_quant, "_CHUNK_WEIGHTS", 3 * 256)  # 3 rows, then 1
    rows = from_gguf(data, qtype, 256)
    assert (qtype == "Q4_K") == (whole.zeros is not None)
    for field in ("bits", "block_size", "k", "n", "qtype"):
        assert getattr(rows, field) == getattr(whole, field), field
    for field in ("packed", "scales", "zeros", "mins"):
        a, b = getattr(rows, field), getattr(whole, field)
        assert (a is None) == (b is None) and (a is None or np.array_equal(a, b)), field


@pytest.mark.parametrize("per_block", [False, True])
def test_bit_planes_are_the_same_a_few_rows_at_a_time(per_block, monkeypatch):
    codes = np.random.default_rng(5).integers(100, 164, (10, 4, 32), dtype=np.uint8)
    base = codes.min(axis=-1, keepdims=True) if per_block else np.uint8(codes.min())
    whole = _store._planes(codes - base, 2)
    monkeypatch.setattr(_store, "_CHUNK_CODES", 3 * 4 * 32)
    rows = _store._planes_by_rows(codes, np.asarray(base), 2)
    assert all(np.array_equal(a, b) for a, b in zip(rows, whole, strict=True))


def test_every_transplantable_type_has_a_layout():
    assert sorted(TRANSPLANTABLE) == sorted(q for q, *_ in LAYOUTS)
    assert set(SUPPORTED) == {*TRANSPLANTABLE, "F32", "F16", "BF16"}


@pytest.mark.parametrize("qtype", ["Q4_1", "Q4_K", "Q2_K", "Q5_1", "Q5_K"])
def test_minimums_are_centred_where_exact(qtype):
    """Codes centred on MatMulNBits' default zero point (no zero-point input) and the minimums
    moved by centre * scale, where every moved minimum is exact; where one is not, 4-bit codes
    keep a zero point of 0 and the weight is still exact."""
    data = _quantized(qtype, 16, 256)
    w = from_gguf(data, qtype, 256)
    assert w.zeros is None and w.zero_points is None
    codes = w.codes().astype(np.int32) - (1 << (w.bits - 1))
    assert codes.min() < 0 < codes.max()  # centred
    if qtype not in ("Q4_1", "Q4_K"):
        return
    fmt = FORMATS[qtype]
    blocks = data.reshape(16, -1, fmt.nbytes).copy()
    # d = 1.0 and a minimum of 2**-24: 8 + 2**-24 needs more than float32's 24 bits
    blocks[0, 0, 0:2] = np.array([1.0], np.float16).view(np.uint8)
    if qtype == "Q4_1":
        blocks[0, 0, 2:4] = np.array([2.0**-24], np.float16).view(np.uint8)
    else:  # dmin * 6-bit minimum of the first sub-block; its scale 1
        blocks[0, 0, 2:4] = np.array([-(2.0**-24)], np.float16).view(np.uint8)
        blocks[0, 0, 4], blocks[0, 0, 8] = 1, 1
    data = blocks.reshape(16, -1)
    w = from_gguf(data, qtype, 256)
    assert w.zeros is not None and w.zeros[0, 0] == 0 and (w.zeros[1:] == 8).all()
    assert w.zero_points is not None and w.zero_points[0, 0] & 0x0F == 0  # block 0: low nibble
    assert _same(w.dequantize(), _reference(data, qtype))


@pytest.mark.parametrize("accuracy_level", [0, 1])
@pytest.mark.parametrize(("qtype", "bits", "block", "mins"), LAYOUTS)
def test_ort_multiplies_by_the_exact_weight(qtype, bits, block, mins, accuracy_level):
    """Fed an identity matrix, MatMulNBits (plus the minimums' correction) gives gguf's
    de-quantised weight bit for bit: nothing is rounded on the way into the graph."""
    data = _quantized(qtype, 24, 256)
    w = from_gguf(data, qtype, 256)
    proto, session = _session(w, accuracy_level)
    onnx.checker.check_model(proto, full_check=True)
    (y,) = session.run(None, {"x": np.eye(256, dtype=np.float32)[None]})
    assert _same(y[0].T, _reference(data, qtype))


@pytest.mark.parametrize(
    ("accuracy_level", "tolerance"),
    [(0, 1e-4), (4, 2e-2)],  # 4: int8-quantised activations
)
@pytest.mark.parametrize("qtype", TRANSPLANTABLE)
def test_ort_matches_the_dequantised_matmul(qtype, accuracy_level, tolerance):
    n, k = 96, 512
    data = _quantized(qtype, n, k)
    _proto, session = _session(from_gguf(data, qtype, k), accuracy_level)
    x = np.random.default_rng(1).standard_normal((2, 3, k)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    expected = x.astype(np.float64) @ _reference(data, qtype).T.astype(np.float64)
    assert y.shape == (2, 3, n)
    assert np.max(np.abs(y - expected)) <= tolerance * np.max(np.abs(expected))


@pytest.mark.parametrize("qtype", TRANSPLANTABLE)
def test_fp16_activations_keep_the_blocks(qtype):
    """The GPU export's linear layers: fp16 activations, scales and minimums in fp16 (exact for
    Q4_0/Q5_0/Q8_0/IQ4_NL's fp16 d; a product d * sc of the K-quants rounds once, relative error
    <= 2**-11), 8-bit blocks kept as MatMulNBits too (CUDA's fp16 kernel has a fused 8-bit path)."""
    n, k = 96, 512
    data = _quantized(qtype, n, k)
    w = from_gguf(data, qtype, k)
    proto, session = _session(w, 0, dtype=ir.DataType.FLOAT16)
    initializers = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    assert initializers["layer.scales"].dtype == np.float16
    assert np.array_equal(initializers["layer.scales"], w.scales.astype(np.float16))
    if qtype in ("Q4_0", "Q5_0", "Q8_0", "IQ4_NL"):
        assert np.array_equal(initializers["layer.scales"].astype(np.float32), w.scales)
    x = np.random.default_rng(1).standard_normal((2, 3, k)).astype(np.float16)
    (y,) = session.run(None, {"x": x})
    assert y.dtype == np.float16 and y.shape == (2, 3, n)
    expected = x.astype(np.float64) @ _reference(data, qtype).T.astype(np.float64)
    assert np.max(np.abs(y - expected)) <= 3e-3 * np.max(np.abs(expected))


def test_node_names_and_correction_graph():
    w = from_gguf(_quantized("Q4_1", 96, 256), "Q4_1", 256)
    proto, _ = _session(w, 0)
    ops = [(node.op_type, node.domain, node.name) for node in proto.graph.node]
    # the fp16 d of Q4_1 stored as fp16 (its Cast folds when the session loads, see below)
    assert ("Cast", "", "layer.scales/Cast") in ops
    ops = [op for op in ops if not op[2].startswith("layer.")]
    assert ops == [
        ("MatMulNBits", "com.microsoft", "layer/MatMulNBits"),
        ("Reshape", "", "layer/BlockSum/Reshape"),
        ("ReduceSum", "", "layer/BlockSum/ReduceSum"),
        ("MatMul", "", "layer/MinsMatMul"),
        ("Add", "", "layer/AddMins"),
    ]
    node = next(n for n in proto.graph.node if n.op_type == "MatMulNBits")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"K": 256, "N": 96, "bits": 4, "block_size": 32, "accuracy_level": 0}
    assert len(node.input) == 3  # centred: the default zero point
    assert proto.graph.output[0].name == "layer/AddMins/output_0"
    w0 = from_gguf(_quantized("Q4_0", 96, 256), "Q4_0", 256)
    proto0, _ = _session(w0, 0)
    assert [node.op_type for node in proto0.graph.node] == ["Cast", "MatMulNBits"]


def test_projections_of_one_input_sum_its_blocks_once():
    """Q/K/V or gate/up of one input share one block sum per block size (block_sums)."""
    a, b = (from_gguf(_quantized("Q4_K", 8, 256, seed), "Q4_K", 256) for seed in (1, 2))
    c = from_gguf(_quantized("Q2_K", 8, 256, 3), "Q2_K", 256)  # blocks of 16: a sum of its own
    x = _x(["b", "s", 256])
    sums: dict = {}

    def build(tape, init):
        return [
            linear_nodes(tape, x, w, name, 0, init, block_sums=sums)
            for w, name in ((a, "a"), (b, "b"), (c, "c"))
        ]

    proto, session = _model(build, [x])
    assert [n.name for n in proto.graph.node if n.op_type == "ReduceSum"] == [
        "a/BlockSum/ReduceSum",
        "c/BlockSum/ReduceSum",
    ]
    xs = np.random.default_rng(0).standard_normal((1, 2, 256)).astype(np.float32)
    for y, w in zip(session.run(None, {"x": xs}), (a, b, c), strict=True):
        np.testing.assert_allclose(y, xs @ w.dequantize().T, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("x_shape", "input_shape", "block_shape"),
    [
        ([], (2, 3, 64), [0, 0, 2, 32]),
        (["m", 64], (4, 64), [0, 2, 32]),
        (["a", "b", "c", 64], (2, 1, 3, 64), [0, 0, 0, 2, 32]),
    ],
)
def test_minimum_correction_follows_the_input_rank(x_shape, input_shape, block_shape):
    data = _quantized("Q4_1", 5, 64)
    proto, session = _session(from_gguf(data, "Q4_1", 64), 0, x_shape)
    shape = next(i for i in proto.graph.initializer if i.name == "layer.block_shape")
    assert onnx.numpy_helper.to_array(shape).tolist() == block_shape
    x = np.random.default_rng(5).standard_normal(input_shape).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    expected = x @ _reference(data, "Q4_1").T
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("qtype", TRANSPLANTABLE)
def test_embedding_rows_are_gathered_exactly(qtype):
    """A quantised token_embd gathered from its blocks: rows bit for bit gguf's de-quantised
    rows; the tied LM head on the same weight name adds no second copy of the blocks."""
    v, k = 40, 256
    data = _quantized(qtype, v, k)
    w = from_gguf(data, qtype, k)
    ids = ir.Value(name="ids", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(["b", "s"]))
    x = _x(["xb", "xs", k])

    def build(tape, init):
        rows = gather_nodes(tape, ids, w, "embed", init, weight_name="tok")
        logits = linear_nodes(tape, x, w, "head", 4, init, weight_name="tok")
        return [rows, logits]

    proto, session = _model(build, [ids, x])
    onnx.checker.check_model(proto, full_check=True)
    names = [t.name for t in proto.graph.initializer]
    assert len(names) == len(set(names)) and not any(n.startswith("head.q") for n in names)
    assert any(n.startswith("tok.qweight") for n in names)
    index = np.array([[0, 39, 7], [7, 3, 1]], np.int64)
    rows, _ = session.run(None, {"ids": index, "x": np.zeros((1, 1, k), np.float32)})
    assert rows.shape == (2, 3, k) and rows.dtype == np.float32
    assert _same(rows, _reference(data, qtype)[index])


@pytest.mark.parametrize("qtype", TRANSPLANTABLE)
def test_permute_rows_matches_the_float_permutation(qtype):
    data = _quantized(qtype, 96, 256)
    w = from_gguf(data, qtype, 256)
    order = np.random.default_rng(2).permutation(96)
    permuted = permute_rows(w, order)
    assert isinstance(permuted, QuantizedWeight)
    assert _same(permuted.dequantize(), _reference(data, qtype)[order])
    floats = _reference(data, qtype)
    assert np.array_equal(permute_rows(floats, order), floats[order])


@pytest.mark.parametrize("order", [np.arange(95), np.zeros(96, dtype=np.int64), np.arange(96.0)])
def test_permute_rows_rejects_a_non_permutation(order):
    w = from_gguf(_quantized("Q4_0", 96, 256), "Q4_0", 256)
    with pytest.raises(ValueError, match="permutation"):
        permute_rows(w, order)


@pytest.mark.parametrize(
    "qtypes", [["Q4_0"] * 3, ["Q4_K"] * 3, ["Q4_K", "Q4_K", "Q4_0"], ["Q6_K"] * 3]
)
def test_concat_rows_matches_the_float_concatenation(qtypes):
    """Q, K and V stacked, also of different types with the same bits and blocks (Q4_0 rows get
    zero minimums beside Q4_K's)."""
    parts = [
        _quantized(q, n, 256, seed)
        for seed, (q, n) in enumerate(zip(qtypes, (8, 3, 5), strict=False))
    ]
    weights = [from_gguf(part, q, 256) for part, q in zip(parts, qtypes, strict=True)]
    joined = concat_rows(weights)
    mixed = len(set(qtypes)) > 1
    assert (joined.n, joined.k, joined.qtype) == (16, 256, "mixed" if mixed else qtypes[0])
    expected = np.concatenate([_reference(p, q) for p, q in zip(parts, qtypes, strict=True)])
    assert _same(joined.dequantize(), expected)
    _, session = _session(joined, 0)
    x = np.random.default_rng(3).standard_normal((1, 2, 256)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, x @ expected.T, rtol=1e-4, atol=1e-4 * np.abs(y).max())


@pytest.mark.parametrize(
    ("qtypes", "parts"),
    [
        (["Q4_K"] * 3, [3]),  # one QKV weight
        (["Q4_K", "Q4_K", "Q6_K"], [2, 1]),  # Q4_K_M's layers with a Q6_K value: Q and K stacked
        (["Q5_K", "Q5_K", "Q6_K"], [2, 1]),  # Q5_K_M's (blocks of 32 beside blocks of 16)
        (["Q4_K", "Q6_K", "Q4_K"], [1, 1, 1]),  # only consecutive parts stack: rows keep order
        (["Q4_0", "Q4_K", "Q8_0"], [2, 1]),
    ],
)
def test_concat_weights_stacks_each_run_that_stacks(qtypes, parts):
    """A projection's row parts become as few MatMulNBits as their blocks allow (each stacked
    weight one linear and one minimums' correction), in the parts' order, the same numbers."""
    rows = [8, 3, 5]
    data = [
        _quantized(q, n, 256, seed) for seed, (q, n) in enumerate(zip(qtypes, rows, strict=True))
    ]
    joined = concat_weights([from_gguf(d, q, 256) for d, q in zip(data, qtypes, strict=True)])
    joined = joined if isinstance(joined, list) else [joined]
    ends = np.cumsum([0, *parts])
    assert [w.n for w in joined] == [sum(rows[a:b]) for a, b in itertools.pairwise(ends)]
    got = np.concatenate([w.dequantize() for w in joined])
    assert _same(got, np.concatenate([_reference(d, q) for d, q in zip(data, qtypes, strict=True)]))


@pytest.mark.parametrize(
    ("a", "b"), [("Q4_0", "Q8_0"), ("Q4_K", "Q6_K"), ("Q4_K", "Q2_K"), ("Q4_0@512", "Q4_0@256")]
)
def test_concat_rows_rejects_weights_that_do_not_stack(a, b):
    def make(spec: str) -> QuantizedWeight:
        qtype, _, k = spec.partition("@")
        return from_gguf(_quantized(qtype, 4, int(k or 256)), qtype, int(k or 256))

    with pytest.raises(ValueError, match="must match"):
        concat_rows([make(a), make(b)])
    with pytest.raises(ValueError):
        concat_rows([])


@pytest.mark.parametrize(
    ("qtype", "dtype"),
    [("F32", np.float32), ("F16", np.float16), ("BF16", ml_dtypes.bfloat16)],
)
def test_float_tensors_are_their_own_rows(qtype, dtype):
    """The file's values in their own type, not copied: an F16 or BF16 tensor costs its bytes
    once."""
    w = np.random.default_rng(4).standard_normal((6, 40)).astype(dtype)
    for data in (w, w.view(np.uint8)):
        out = from_gguf(data, qtype, 40)
        assert out.dtype == dtype and out.shape == (6, 40)
        assert np.array_equal(out.view(np.uint8), w.view(np.uint8)) and np.shares_memory(out, w)
    theirs = gguf.quants.dequantize(w.view(np.uint8), QT[qtype]).reshape(6, 40)
    assert np.array_equal(out.astype(np.float32), theirs)


@pytest.mark.parametrize("qtype", ["TQ1_0", "TQ2_0", "MXFP4"])
def test_unsupported_types_are_refused_by_name(qtype):
    with pytest.raises(ExportError) as info:
        from_gguf(np.zeros((4, 64), np.uint8), qtype, 256, name="blk.3.ffn_down.weight")
    message = str(info.value)
    assert "\n" not in message
    for part in ("blk.3.ffn_down.weight", qtype, "Q4_K", "Q6_K", "Q8_0", "F16"):
        assert part in message


@pytest.mark.parametrize(
    ("qtype", "data", "k", "match"),
    [
        ("Q4_0", np.zeros((4, 18), dtype=np.uint8), 48, "multiple"),
        ("Q4_K", np.zeros((4, 144), dtype=np.uint8), 128, "multiple of Q4_K's 256"),
        ("Q4_0", np.zeros((4, 19), dtype=np.uint8), 32, "rows"),
        ("Q6_K", np.zeros((4, 200), dtype=np.uint8), 256, "rows"),
        ("Q4_0", np.zeros((4, 16), dtype=np.float32), 32, "float32"),
    ],
)
def test_malformed_data_is_an_export_error(qtype, data, k, match):
    with pytest.raises(ExportError, match=match):
        from_gguf(data, qtype, k, name="w")


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
    assert _same(w.dequantize(), gguf.quants.dequantize(tensor.data, tensor.tensor_type))


# Bytes on disk a weight takes over its GGUF bytes, as measured (`_store`): 5- and 6-bit codes
# as bit planes, fp16 scales and minimums as fp16. K-quant scales (d * sc) and minimums stay float32,
# a float32 a block of 16 for Q2_K and Q3_K; IQ4_NL and IQ4_XS codes (a 16-value table) take 8 bits,
# the IQ3, IQ2 and IQ1 codes (a grid's values with a sign) the bit planes their range needs.
STORED = {
    "Q4_0": 1.01, "Q4_1": 1.11, "Q5_0": 1.01, "Q5_1": 1.09, "Q8_0": 1.01, "Q2_K": 3.05,
    "Q3_K": 1.75, "Q4_K": 1.37, "Q5_K": 1.32, "Q6_K": 1.23, "IQ4_NL": 1.89, "IQ4_XS": 2.12,
    "IQ3_XXS": 2.94, "IQ3_S": 1.75, "IQ2_XXS": 4.37, "IQ2_XS": 4.33, "IQ2_S": 3.91,
    "IQ1_S": 3.85, "IQ1_M": 4.01,
}  # fmt: skip


@pytest.mark.parametrize("qtype", TRANSPLANTABLE)
def test_the_file_keeps_few_bytes_and_the_session_the_same_arrays(qtype, tmp_path):
    """The compact initializers fold, when the session loads, into the very arrays MatMulNBits
    would get stored whole: one MatMulNBits left, and the same bits out at accuracy level 4."""
    n, k = 96, 512
    data = _quantized(qtype, n, k)
    w = from_gguf(data, qtype, k)
    proto, session = _session(w, 4)
    stored = sum(onnx.numpy_helper.to_array(t).nbytes for t in proto.graph.initializer)
    stored -= sum(  # the correction's small shape constants are not the weight
        onnx.numpy_helper.to_array(t).nbytes for t in proto.graph.initializer if "block_" in t.name
    )
    assert stored <= STORED[qtype] * data.nbytes, stored / data.nbytes
    whole = _whole_arrays_model(w)
    x = np.random.default_rng(3).standard_normal((2, 3, k)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    (expected,) = whole.run(None, {"x": x})
    assert np.array_equal(y, expected)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    folded = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    assert folded.count("MatMulNBits") == 1
    assert not {"Cast", "BitShift", "BitwiseOr", "Concat"} & set(folded), folded


def _whole_arrays_model(w: QuantizedWeight) -> ort.InferenceSession:
    """MatMulNBits (+ the minimums' correction) over the arrays themselves as initializers."""
    h = onnx.helper
    arrays = {"q": w.packed, "s": w.scales}
    if w.zero_points is not None:
        arrays["z"] = w.zero_points
    nodes = [
        h.make_node(
            "MatMulNBits",
            ["x", *arrays],
            ["y" if w.mins is None else "y0"],
            domain="com.microsoft",
            K=w.k,
            N=w.n,
            bits=w.bits,
            block_size=w.block_size,
            accuracy_level=4,
        )
    ]
    if w.mins is not None:
        arrays |= {"m": w.mins, "shape": np.array([0, 0, w.n_blocks, w.block_size], np.int64)}
        arrays["axes"] = np.array([-1], np.int64)
        nodes += [
            h.make_node("Reshape", ["x", "shape"], ["blocks"]),
            h.make_node("ReduceSum", ["blocks", "axes"], ["sums"], keepdims=0),
            h.make_node("MatMul", ["sums", "m"], ["c"]),
            h.make_node("Add", ["y0", "c"], ["y"]),
        ]
    f = onnx.TensorProto.FLOAT
    graph = h.make_graph(
        nodes,
        "whole",
        [h.make_tensor_value_info("x", f, [2, 3, w.k])],
        [h.make_tensor_value_info("y", f, [2, 3, w.n])],
        [onnx.numpy_helper.from_array(np.ascontiguousarray(a), name) for name, a in arrays.items()],
    )
    opsets = [h.make_opsetid("", 21), h.make_opsetid("com.microsoft", 1)]
    model = h.make_model(graph, ir_version=10, opset_imports=opsets)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
