"""benchmarks/gguf_minimums.py: every form of the GGUF minimums' correction multiplies by the same
weight ``s * (code - 8) + m`` (the floor, ``none``, by ``s * (code - 8)`` alone), and the script's
report has a time and a cost for each form."""

from __future__ import annotations

import json

import numpy as np
import pytest

# Error bounds over |x @ w.T| ~ 3: float compute (level 0) rounds once per product; int8
# activations (level 4) round x to 1/127 of its block's largest value, and the block sums of
# nbits_block_sums are sums of those rounded values (float_zero_points dequantises: float).
_TOLERANCE = {0: 2e-6, 4: 2e-2}
_FORMS = (
    "reduce_sum",
    "indicator_matmul",
    "gemm_2d",
    "nbits_block_sums",
    "duplicated_k",
    "cached_minimums",
    "float_zero_points",
)


@pytest.mark.parametrize("accuracy", [0, 4])
@pytest.mark.parametrize("form", _FORMS)
def test_every_form_multiplies_by_the_weight_with_its_minimums(bench, form, accuracy) -> None:
    import onnxruntime as ort

    minimums = bench("gguf_minimums")
    blob, weight = minimums.projection_model(form, accuracy)
    session = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((1, weight.shape[1])).astype(np.float32)
    feed = x if form == "gemm_2d" else x[None]
    got = session.run(None, {"x": feed})[0].reshape(-1)
    want = x[0].astype(np.float64) @ weight.T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=_TOLERANCE[accuracy])


def test_the_floor_leaves_the_minimums_out(bench) -> None:
    import onnxruntime as ort

    minimums = bench("gguf_minimums")
    blob, weight = minimums.projection_model("none", 0)
    session = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    x = np.ones((1, 1, weight.shape[1]), np.float32)
    got = session.run(None, {"x": x})[0].reshape(-1)
    assert np.abs(got - weight.sum(axis=1)).max() > 1e-2  # without the minimums: not the weight


def test_the_report_times_every_form(bench, tmp_path) -> None:
    minimums = bench("gguf_minimums")
    out = tmp_path / "gguf_minimums.json"
    minimums.main(["--layers", "1", "--slow-layers", "1", "--threads", "1", "--repeats", "1",
                   "--calls", "1", "--output", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    assert report["benchmark"] == "gguf_minimums"
    (row,) = report["results"]
    assert set(row["us_per_layer"]) == set(minimums.FORMS)
    assert all(v["median"] > 0 for v in row["us_per_layer"].values())
    assert set(row["correction_us_per_layer"]) == set(_FORMS) == set(row["vs_reduce_sum"])
    assert row["vs_reduce_sum"]["reduce_sum"] == 1.0
