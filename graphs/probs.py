"""The distribution the draw used, as llama.cpp returns its sampled probs."""

from onnxscript import BOOL, FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._common import T_FLOAT, T_INT64, onnxsample


@script(onnxsample)
def FinalProbs(
    z: FLOAT["S", "V"], token: INT64["S"], greedy_rows: BOOL, finite: BOOL["S"]
) -> FLOAT["S", "V"]:
    """probs = softmax(z) (zeros outside the kept set), one-hot(token) on greedy rows, and all zeros
    on rows with no finite logit.

    z: FLOAT["S", "V"] (the draw's input); token: INT64["S"]; greedy_rows: BOOL["S"] or a scalar;
    finite: BOOL["S"] → FLOAT["S", "V"].
    """
    axis = op.Constant(value_ints=[1])
    zero_i = op.Constant(value_int=0)
    one_i = op.Constant(value_int=1)
    zero_f = op.Constant(value_float=0.0)
    vocab = op.Cast(op.Squeeze(op.Shape(z, start=1, end=2)), to=T_INT64)
    ids = op.Range(zero_i, vocab, one_i)
    one_hot = op.Cast(op.Equal(ids, op.Unsqueeze(token, axis)), to=T_FLOAT)
    greedy = op.Unsqueeze(op.Expand(greedy_rows, op.Shape(token)), axis)
    probs = op.Where(greedy, one_hot, op.Softmax(z, axis=1))
    return op.Where(op.Unsqueeze(finite, axis), probs, zero_f)
