"""Log-probabilities under the model's raw distribution, as OpenAI and vLLM report them."""

from onnxscript import FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._common import onnxsample
from onnxsample.graphs.sanitize import NaNToNegInf


@script(onnxsample)
def Logprob(x: FLOAT["S", "V"], token: INT64["S"]) -> tuple[FLOAT["S"], FLOAT["S", "V"]]:
    """logp = x − m − log Σ exp(x − m), m = max x: the raw log-softmax, one pass (ONNX Runtime's
    ``LogSoftmax``, which subtracts m first, so rows such as ±1e30 stay exact); logprob =
    logp[token], −inf (never NaN) for a row with no finite logit, whose logp is NaN.

    x: FLOAT["S", "V"] (sanitized, unprocessed logits); token: INT64["S"] → (FLOAT["S"], logp).
    """
    axis = op.Constant(value_ints=[1])
    logp = op.LogSoftmax(x, axis=1)
    chosen = op.Squeeze(op.GatherElements(logp, op.Unsqueeze(token, axis), axis=1), axis)
    return NaNToNegInf(chosen), logp


@script(onnxsample)
def TopLogprobs(
    x: FLOAT["S", "V"], logp: FLOAT["S", "V"], count: INT64[1]
) -> tuple[INT64["S", "L"], FLOAT["S", "L"]]:
    """The L = count most likely tokens of the raw distribution (ties to the lowest id: ranked by
    x, which the log-softmax's rounding cannot tie) and their logprobs logp (from ``Logprob``),
    most likely first; −inf for a row with no finite logit.

    x, logp: FLOAT["S", "V"]; count: INT64[1] → (INT64["S", "L"], FLOAT["S", "L"]).
    """
    _, ids = op.TopK(x, count, axis=1, largest=1, sorted=1)
    return ids, NaNToNegInf(op.GatherElements(logp, ids, axis=1))
