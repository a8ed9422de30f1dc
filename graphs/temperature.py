"""Temperature and greedy decoding (temperature 0)."""

from onnxscript import FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._common import T_BOOL, T_INT64, onnxsample


@script(onnxsample)
def Temperature(z: FLOAT["S", "V"], temperature: FLOAT["S"]) -> FLOAT["S", "V"]:
    """z / t per slot, as transformers' ``TemperatureLogitsWarper``; rows with t = 0 (greedy) are left
    as they are and later take the argmax.

    z: FLOAT["S", "V"]; temperature: FLOAT["S"] (≥ 0, validated on the host) → FLOAT["S", "V"].
    """
    axis = op.Constant(value_ints=[1])
    zero_f = op.Constant(value_float=0.0)
    one_f = op.Constant(value_float=1.0)
    t = op.Unsqueeze(temperature, axis)
    return op.Div(z, op.Where(op.Equal(t, zero_f), one_f, t))


@script(onnxsample)
def Greedy(z: FLOAT["S", "V"]) -> INT64["S"]:
    """argmax over the vocabulary, ties to the lowest id.

    z: FLOAT["S", "V"] (biased and penalised logits) → INT64["S"].
    """
    return op.ArgMax(z, axis=1, keepdims=0, select_last_index=0)


@script(onnxsample)
def GreedyRows(z: FLOAT["S", "V"], temperature: FLOAT["S"]) -> INT64["S"]:
    """argmax of the rows whose temperature is 0 (computed only when there is one), else 0.

    z: FLOAT["S", "V"]; temperature: FLOAT["S"] → INT64["S"].
    """
    zero_f = op.Constant(value_float=0.0)
    greedy = op.Cast(op.Equal(temperature, zero_f), to=T_INT64)
    if op.Cast(op.ReduceMax(greedy, keepdims=0), to=T_BOOL):
        token = Greedy(z)
    else:
        token = op.Cast(op.Mul(temperature, zero_f), to=T_INT64)
    return token


@script(onnxsample)
def SelectGreedy(temperature: FLOAT["S"], greedy: INT64["S"], drawn: INT64["S"]) -> INT64["S"]:
    """token = greedy where temperature = 0, else the drawn token. All INT64["S"] / FLOAT["S"]."""
    zero_f = op.Constant(value_float=0.0)
    return op.Where(op.Equal(temperature, zero_f), greedy, drawn)
