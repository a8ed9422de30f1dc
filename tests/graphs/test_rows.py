"""The row reductions every provider runs fast (graphs/_rows.py): ``RowMax`` and ``RowMaxStatic`` are
``ReduceMax``'s number for any vocabulary size, ``RowArgMax`` is ``ArgMax``'s index, and ``RunningSum`` is a running sum whose first n
values do not depend on the row's length; each run by ONNX Runtime and by ``onnx.reference``
(``RowMaxStatic`` by ONNX Runtime only: the reference's ``GatherElements`` takes at most 64 values
along its axis)."""

import numpy as np
import onnxruntime as ort
import pytest
from _function_model import function_model
from onnx import helper
from onnx.reference import ReferenceEvaluator

from onnxsample.graphs._rows import (
    SCAN_BLOCK,
    RowArgMax,
    RowMax,
    RowMaxStatic,
    RunningSum,
    row_blocks_for,
)


def _both(
    fn, value: np.ndarray, out_shape: list, reference: bool = True, vocab: int = 0
) -> list[np.ndarray]:
    """One call of the library function `fn` (its functions specialised to `vocab` if given),
    from ONNX Runtime and (`reference`) from onnx.reference."""
    elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    model = function_model(
        fn,
        [helper.make_tensor_value_info("x", elem, ["S", "N"])],
        [helper.make_tensor_value_info("y", elem, out_shape)],
        vocab=vocab,
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    found = [session.run(None, {"x": value})[0]]
    if reference:
        found.append(ReferenceEvaluator(model).run(None, {"x": value})[0])
    return found


# Block widths (the largest power of two up to 256 dividing V): 256, 256, 128 (Qwen2's 151936),
# 64 (Phi-3's 32064), 1 (GPT-2's 50257), 1.
# A composed model's RowBlocks is one Reshape by its vocabulary's sizes (``for_vocabulary``):
# "known" runs that one, "generic" the body that reads them from the row's shape.
KNOWN = pytest.mark.parametrize("known", [False, True], ids=["generic", "known"])


@pytest.mark.parametrize(
    ("vocab", "width"), [(256, 256), (49152, 256), (151936, 128), (32064, 64), (50257, 1), (7, 1)]
)
def test_a_known_vocabulary_makes_row_blocks_one_reshape(vocab: int, width: int) -> None:
    function = row_blocks_for(vocab)
    assert [n.op_type for n in function.node if n.op_type != "Constant"] == ["Reshape"]
    constants = {n.output[0]: n.attribute[0].t for n in function.node if n.op_type == "Constant"}
    assert list(constants["width"].int64_data) == [width]
    assert list(constants["shape"].int64_data) == [0, vocab // width, width]


@pytest.mark.parametrize("vocab", [256, 49152, 151936, 32064, 50257, 7])
@pytest.mark.parametrize("rows", [0, 1, 3])
@pytest.mark.parametrize("fn", [RowMax, RowMaxStatic], ids=["RowMax", "RowMaxStatic"])
@KNOWN
def test_row_max_is_the_maximum(fn, vocab: int, rows: int, known: bool) -> None:
    z = np.random.default_rng(vocab + rows).normal(0, 3, (rows, vocab)).astype(np.float32)
    if rows:
        z[0, :] = -np.inf  # a row with no finite logit keeps −inf
        z[-1, vocab // 2] = np.float32(3.4e38)
        z[-1, vocab - 1] = np.float32(3.4e38)  # tied maxima: the value is the same
    for got in _both(fn, z, ["S", 1], reference=fn is RowMax, vocab=vocab if known else 0):
        assert got.shape == (rows, 1) and got.dtype == np.float32
        np.testing.assert_array_equal(got[:, 0], z.max(axis=1, initial=-np.inf))


@pytest.mark.parametrize("vocab", [256, 49152, 151936, 32064, 50257, 262144, 7])
@pytest.mark.parametrize("rows", [0, 1, 4])
@KNOWN
def test_row_argmax_is_the_first_index_of_the_maximum(vocab: int, rows: int, known: bool) -> None:
    z = np.random.default_rng(vocab + rows).normal(0, 3, (rows, vocab)).astype(np.float32)
    if rows:
        z[0, :] = -np.inf  # no finite logit: index 0, as ArgMax
        z[-1, :] = np.round(z[-1, :])  # ties everywhere
        z[-1, [vocab - 1, vocab // 2, 1]] = 50.0  # the maximum three times: the lowest id
    if rows > 2:
        z[1, :] = 2.0  # a flat row
        z[2, vocab - 1] = 99.0  # the maximum in the last block's last place
    model = function_model(
        RowArgMax,
        [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(z.dtype), ["S", "N"])],
        [
            helper.make_tensor_value_info(
                "y", helper.np_dtype_to_tensor_dtype(np.dtype(np.int64)), ["S"]
            )
        ],
        vocab=vocab if known else 0,
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": z})[0]
    assert got.shape == (rows,) and got.dtype == np.int64
    np.testing.assert_array_equal(got, np.argmax(z, axis=1) if rows else np.zeros(0, np.int64))


@pytest.mark.parametrize(
    "length", [1, SCAN_BLOCK - 1, SCAN_BLOCK, SCAN_BLOCK + 1, 3 * SCAN_BLOCK + 17]
)
@pytest.mark.parametrize("rows", [0, 2])
def test_running_sum_is_a_prefix_sum_whatever_the_row_length(length: int, rows: int) -> None:
    x = np.random.default_rng(length).random((rows, length))
    n = min(length, SCAN_BLOCK + 5)
    head = _both(RunningSum, np.ascontiguousarray(x[:, :n]), ["S", "N"])
    for got, cut in zip(_both(RunningSum, x, ["S", "N"]), head, strict=True):
        assert got.shape == (rows, length) and got.dtype == np.float64
        np.testing.assert_allclose(got, np.cumsum(x, axis=1), rtol=1e-14, atol=0)
        if length <= SCAN_BLOCK:  # one block: CumSum's own numbers
            np.testing.assert_array_equal(got, np.cumsum(x, axis=1))
        # the first n sums are the same numbers for the row cut at n (candidates vs whole row)
        np.testing.assert_array_equal(got[:, :n], cut)


def test_the_candidates_fit_in_one_block() -> None:
    """Top-p sums the candidates' prefix with CumSum and longer rows with RunningSum; the two agree
    on the leading sums only while the candidates fit in one block."""
    from onnxsample.graphs.candidates import CANDIDATES

    assert CANDIDATES <= SCAN_BLOCK
