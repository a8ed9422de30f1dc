"""Temperature and greedy decoding (temperature 0).

A temperature below ``GREEDY_BELOW`` (1e-5, vLLM's threshold) is greedy: dividing by it would
overflow the logits to ±inf and turn the draw into a uniform pick among the overflowed tokens.
"""

from onnxscript import BOOL, FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._batch import AnyRow
from onnxsample.graphs._common import GREEDY_BELOW, T_INT64, onnxsample
from onnxsample.graphs._rows import RowArgMax


@script(onnxsample)
def Temperature(z: FLOAT["S", "V"], temperature: FLOAT["S"]) -> FLOAT["S", "V"]:
    """z / t per slot, as transformers' ``TemperatureLogitsWarper``; greedy rows (t < 1e-5) are left
    as they are and later take the argmax.

    z: FLOAT["S", "V"]; temperature: FLOAT["S"] (≥ 0, validated on the host) → FLOAT["S", "V"].
    """
    axis = op.Constant(value_ints=[1])
    eps = op.Constant(value_float=GREEDY_BELOW)
    one_f = op.Constant(value_float=1.0)
    # compared as SelectGreedy compares it (the same node once ONNX Runtime merges them)
    greedy = op.Unsqueeze(op.Less(temperature, eps), axis)
    return op.Div(z, op.Where(greedy, one_f, op.Unsqueeze(temperature, axis)))


@script(onnxsample)
def Greedy(z: FLOAT["S", "V"]) -> INT64["S"]:
    """argmax over the vocabulary, ties to the lowest id.

    z: FLOAT["S", "V"] (biased and penalised logits) → INT64["S"].
    """
    return op.ArgMax(z, axis=1, keepdims=0, select_last_index=0)


@script(onnxsample)
def GreedyRows(z: FLOAT["S", "V"], temperature: FLOAT["S"]) -> INT64["S"]:
    """argmax of the greedy rows (t < 1e-5; computed only when there is one), else 0.

    z: FLOAT["S", "V"]; temperature: FLOAT["S"] → INT64["S"].
    """
    zero_f = op.Constant(value_float=0.0)
    eps = op.Constant(value_float=GREEDY_BELOW)
    if AnyRow(op.Less(temperature, eps)):
        token = RowArgMax(z)
    else:
        token = op.Cast(op.Mul(temperature, zero_f), to=T_INT64)
    return token


@script(onnxsample)
def AllGreedy(temperature: FLOAT["S"]) -> BOOL[1]:
    """Whether every row is greedy (t < 1e-5); true for no rows.

    temperature: FLOAT["S"] → BOOL[1] (an ``If`` condition).
    """
    eps = op.Constant(value_float=GREEDY_BELOW)
    return op.Not(AnyRow(op.GreaterOrEqual(temperature, eps)))


@script(onnxsample)
def SelectGreedy(temperature: FLOAT["S"], greedy: INT64["S"], drawn: INT64["S"]) -> INT64["S"]:
    """token = greedy where temperature < 1e-5, else the drawn token. All INT64["S"] / FLOAT["S"]."""
    eps = op.Constant(value_float=GREEDY_BELOW)
    return op.Where(op.Less(temperature, eps), greedy, drawn)
