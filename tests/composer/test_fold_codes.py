"""A GGUF export's narrow weight codes are widened once, when composing: the graph the engine
loads has the 8-bit codes themselves, and computes the same logits, bit for bit, as the export
whose codes ONNX Runtime widens at every load."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from onnxsample.composer._fold_codes import fold_weight_codes
from onnxsample.exporters._verify import _empty_pasts

PROMPT = [2, 818, 5279, 529, 7001, 563]  # "<bos>The capital of France is", Gemma 3's ids
_WIDENING = {"BitShift", "BitwiseAnd", "BitwiseOr"}


def _logits(path) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ids = np.asarray([PROMPT], dtype=np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    feed.update(_empty_pasts(session, 1, ids.shape[1]))
    return session.run(["logits"], feed)[0]


def test_weight_codes_are_widened_once_to_the_same_logits(real_gguf_export, tmp_path):
    source = real_gguf_export.output / "model.onnx"
    model = ir.load(source)
    narrow = sum(node.op_type == "BitShift" for node in model.graph)
    assert narrow  # the Q4_K_M file's Q5_0 and Q6_K codes are stored in their bits
    assert fold_weight_codes(model) > 0
    assert not any(node.op_type in _WIDENING for node in model.graph)
    for node in model.graph:
        if node.op_type in ("MatMulNBits", "GatherBlockQuantized"):
            codes = node.inputs[1] if node.op_type == "MatMulNBits" else node.inputs[0]
            assert codes.const_value is not None, node.name
    ir.save(model, tmp_path / "model.onnx", external_data="model.onnx.data")
    assert fold_weight_codes(ir.load(tmp_path / "model.onnx")) == 0  # nothing left to widen
    np.testing.assert_array_equal(_logits(tmp_path / "model.onnx"), _logits(source))
