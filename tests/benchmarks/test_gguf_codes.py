"""benchmarks/gguf_codes.py: every form of a 4-, 5- or 8-bit GGUF code dequantises to the file's
weight ``d * q`` bit for bit and multiplies by it, and the script's report has a time, a ratio and
the bits read for each form."""

from __future__ import annotations

import json

import numpy as np
import pytest

# Error bounds as a fraction of max |x @ w.T|: float compute (level 0) rounds once per product
# (measured <= 5e-7); int8 activations (level 4) round x to 1/127 of its block's largest value
# (measured <= 7e-3).
_TOLERANCE = {0: 2e-6, 4: 2e-2}
_FORMS = [
    ("Q4_0", "four_bit"),
    ("Q5_0", "eight_bit"),
    ("Q5_0", "nibble_and_bit"),
    ("Q8_0", "eight_bit"),
    ("Q8_0", "two_nibbles"),
]


def _session(blob: bytes):
    import onnxruntime as ort

    return ort.InferenceSession(blob, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(("kind", "form"), _FORMS)
def test_every_form_dequantises_to_the_files_weight_bit_for_bit(bench, kind, form) -> None:
    codes = bench("gguf_codes")
    blob, weight = codes.projection_model(kind, form, accuracy=0)
    eye = np.eye(weight.shape[1], dtype=np.float32)[:, None, :]  # row k of x picks column k of w
    got = _session(blob).run(None, {"x": eye})[0][:, 0, :]
    np.testing.assert_array_equal(got, weight.T)


@pytest.mark.parametrize("accuracy", [0, 4])
@pytest.mark.parametrize(("kind", "form"), _FORMS)
def test_every_form_multiplies_by_the_files_weight(bench, kind, form, accuracy) -> None:
    codes = bench("gguf_codes")
    blob, weight = codes.projection_model(kind, form, accuracy)
    x = np.random.default_rng(1).standard_normal((1, 1, weight.shape[1])).astype(np.float32)
    got = _session(blob).run(None, {"x": x})[0].reshape(-1)
    want = x[0, 0].astype(np.float64) @ weight.T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=_TOLERANCE[accuracy] * np.abs(want).max())


@pytest.mark.parametrize(
    ("kind", "form", "bits"),
    [
        ("Q4_0", "four_bit", 5.0),  # 4-bit codes and an fp32 scale per 32
        ("Q5_0", "eight_bit", 9.0),
        ("Q5_0", "nibble_and_bit", 8.0),  # 4 + 2 bits, two scales per 32
        ("Q8_0", "eight_bit", 9.0),
        ("Q8_0", "two_nibbles", 10.25),  # 4 + 4 bits, two scales and two 4-bit zeros per 32
    ],
)
def test_the_bits_each_form_reads(bench, kind, form, bits) -> None:
    assert bench("gguf_codes").bits_per_weight(kind, form) == bits


def test_the_report_times_every_form(bench, tmp_path) -> None:
    codes = bench("gguf_codes")
    out = tmp_path / "gguf_codes.json"
    codes.main(["--layers", "1", "--threads", "1", "--repeats", "1", "--calls", "1",
                "--output", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    assert report["benchmark"] == "gguf_codes"
    (row,) = report["results"]
    names = {f"{kind}/{form}" for kind, form in _FORMS}
    assert (
        set(row["us_per_layer"]) == names == set(row["vs_export"]) == set(report["bits_per_weight"])
    )
    assert all(v["median"] > 0 for v in row["us_per_layer"].values())
    assert row["vs_export"]["Q5_0/eight_bit"] == row["vs_export"]["Q8_0/eight_bit"] == 1.0
