"""Log-probabilities under the model's raw distribution, as OpenAI and vLLM report them."""

from onnxscript import FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._common import FLT_MAX, onnxsample
from onnxsample.graphs._rows import RowLogAtLeastOne


@script(onnxsample)
def Logprob(
    x: FLOAT["S", "V"], x_max: FLOAT["S", 1], token: INT64["S"]
) -> tuple[FLOAT["S"], FLOAT["S", 1], FLOAT["S", 1]]:
    """m = max x (−FLT_MAX for a row with no finite logit); log_total = log Σ exp(x − m) (0 for such a
    row); logprob = (x[token] − m) − log_total, so −inf for such a row and never NaN. Subtracting m
    first keeps rows such as ±1e30 exact.

    x: FLOAT["S", "V"] (sanitized, unprocessed logits); token: INT64["S"] → (FLOAT["S"], m, log_total).
    """
    axis = op.Constant(value_ints=[1])
    lowest = op.Constant(value_float=-FLT_MAX)
    row_max = op.Max(x_max, lowest)
    shifted = op.Sub(x, row_max)
    total = op.ReduceSum(op.Exp(shifted), axis, keepdims=1)
    log_total = RowLogAtLeastOne(total)
    # x[token] − m is read where the row was shifted (the same subtraction)
    chosen = op.GatherElements(shifted, op.Unsqueeze(token, axis), axis=1)
    logprob = op.Sub(chosen, log_total)
    return op.Squeeze(logprob, axis), row_max, log_total


@script(onnxsample)
def TopLogprobs(
    x: FLOAT["S", "V"], row_max: FLOAT["S", 1], log_total: FLOAT["S", 1], count: INT64[1]
) -> tuple[INT64["S", "L"], FLOAT["S", "L"]]:
    """The L = count most likely tokens of the raw distribution (ties to the lowest id) and their
    logprobs (x − m) − log_total, most likely first.

    x: FLOAT["S", "V"]; row_max, log_total: FLOAT["S", 1] (from ``Logprob``); count: INT64[1]
    → (INT64["S", "L"], FLOAT["S", "L"]).
    """
    values, ids = op.TopK(x, count, axis=1, largest=1, sorted=1)
    return ids, op.Sub(op.Sub(values, row_max), log_total)
