"""RowCopy on the CPU: a span of rows to and from the host, and the runs of consecutive slots the
engine copies one span each (the device's copies are counted in tests/cuda_sim)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxsample.engine._row_copy import RowCopy, runs


@pytest.mark.parametrize(
    ("slots", "expected"),
    [
        ([], []),
        ([3], [(3, 4)]),
        ([0, 1, 2], [(0, 3)]),
        ([0, 2], [(0, 1), (2, 3)]),
        ({5, 0, 1}, [(0, 2), (5, 6)]),
        ([63, 0], [(0, 1), (63, 64)]),
        ([4, 4, 5], [(4, 6)]),
    ],
)
def test_runs_of_consecutive_slots(slots, expected) -> None:
    assert runs(slots) == expected


def test_a_span_goes_to_the_host_and_back() -> None:
    import onnxruntime as ort

    data = np.arange(24, dtype=np.int32).reshape(6, 4)
    value = ort.OrtValue.ortvalue_from_numpy(data.copy())
    copy = RowCopy("cpu")
    np.testing.assert_array_equal(copy.to_host(value, 2, 4), data[2:4])
    copy.from_host(value, 4, -data[:2])
    np.testing.assert_array_equal(value.numpy()[4:], -data[:2])
    np.testing.assert_array_equal(value.numpy()[:4], data[:4])


@pytest.mark.parametrize(
    ("rows", "lo"),
    [
        (np.zeros((2, 4), np.int64), 0),  # another element type
        (np.zeros((2, 5), np.int32), 0),  # another row shape
        (np.zeros((2, 4), np.int32), 5),  # past the last row
        (np.zeros((1, 4), np.int32), -1),
    ],
)
def test_a_span_that_does_not_fit_is_refused(rows, lo) -> None:
    import onnxruntime as ort

    value = ort.OrtValue.ortvalue_from_numpy(np.zeros((6, 4), np.int32))
    with pytest.raises(ValueError, match="do not fit"):
        RowCopy("cpu").from_host(value, lo, rows)
