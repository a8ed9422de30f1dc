"""Temperature and greedy decoding (temperature 0).

A temperature below ``GREEDY_BELOW`` (1e-5, vLLM's threshold) is greedy: dividing by it would
overflow the logits to ±inf and turn the draw into a uniform pick among the overflowed tokens.

The temperature comes before the cuts (top-k, top-p, min-p, typical-p), as in transformers and
vLLM, or, for a slot with ``temperature_last`` (llama.cpp's order), after them: the cuts read the
untempered row (``TemperatureLast``'s cut temperature is 1 there) and the draw divides the kept
logits by the temperature (``Retemper``). Division by a positive number keeps the order of the
logits, so the kept tokens are the same whichever of the two rows they are read from.
"""

from onnxscript import BOOL, FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._batch import AnyRow
from onnxsample.graphs._common import FLT_MAX, GREEDY_BELOW, T_INT64, onnxsample
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
def TemperatureLast(temperature: FLOAT["S"], last: BOOL["S"]) -> tuple[FLOAT["S"], FLOAT["S", 1]]:
    """The temperature the cuts read (1 where the slot puts it last) and the divisor of the
    kept logits for the draw (the temperature where the slot puts it last and draws, else 1).

    temperature: FLOAT["S"]; last: BOOL["S"] → (FLOAT["S"], FLOAT["S", 1]).
    """
    axis = op.Constant(value_ints=[1])
    eps = op.Constant(value_float=GREEDY_BELOW)
    one_f = op.Constant(value_float=1.0)
    cut = op.Where(last, one_f, temperature)
    drawn_last = op.And(last, op.GreaterOrEqual(temperature, eps))
    return cut, op.Unsqueeze(op.Where(drawn_last, temperature, one_f), axis)


@script(onnxsample)
def Retemper(z: FLOAT["S", "N"], scale: FLOAT["S", 1]) -> FLOAT["S", "N"]:
    """z / scale, +inf clamped to the largest float as ``FiniteRows`` clamps it: the kept
    logits at the temperature of a slot that puts it last (scale 1 leaves a row as it is).

    z: FLOAT["S", "N"] (−inf for dropped tokens); scale: FLOAT["S", 1] (> 0) → FLOAT["S", "N"].
    """
    return op.Min(op.Div(z, scale), op.Constant(value_float=FLT_MAX))


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
