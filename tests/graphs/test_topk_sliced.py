"""``TopKSliced`` (graphs/candidates.py), the static chain's wide selections: the values and ids
one ``TopK`` gives (ties lowest id first), for rows that fill whole slices, part of one, or less
than one, with ties and −inf, run by ONNX Runtime (onnx.reference 1.23's GatherElements fails
on this graph with a reshape error)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from _function_model import function_model
from onnx import TensorProto, helper

from onnxsample.graphs.candidates import TopKSliced


def _model(k: int, width: int) -> onnx.ModelProto:
    return function_model(
        TopKSliced,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["S", "V"])],
        [
            helper.make_tensor_value_info("v", TensorProto.FLOAT, ["S", "K"]),
            helper.make_tensor_value_info("i", TensorProto.INT64, ["S", "K"]),
        ],
        {"k": k, "width": width},
    )


def _rows(rows: int, vocab: int) -> np.ndarray:
    rng = np.random.default_rng(rows * 1000 + vocab)
    x = np.round(rng.normal(0, 2, (rows, vocab)), 1).astype(np.float32)  # many ties
    if rows:
        x[0, rng.integers(0, vocab, vocab // 3 + 1)] = -np.inf
    if rows > 2:
        x[2] = -np.inf
    return x


@pytest.mark.parametrize(
    ("vocab", "k", "width"),
    [
        (10000, 64, 4096),  # 3 slices, the last part-filled
        (16384, 300, 8192),  # whole slices
        (5000, 1024, 4096),
        (300, 64, 4096),  # less than one slice
        (5, 64, 4096),  # k past the row
        (1, 4, 8),
    ],
)
@pytest.mark.parametrize("rows", [0, 1, 3])
def test_sliced_top_k_is_one_top_k(vocab: int, k: int, width: int, rows: int) -> None:
    x = _rows(rows, vocab)
    model = _model(k, width)
    count = min(k, vocab)
    order = np.argsort(-x, axis=1, kind="stable")[:, :count]  # ties: lowest id first
    expected = (np.take_along_axis(x, order, 1), order)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    values, ids = session.run(None, {"x": x})
    np.testing.assert_array_equal(values, expected[0])
    np.testing.assert_array_equal(ids, expected[1])
