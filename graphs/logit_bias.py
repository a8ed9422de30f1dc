"""Logit bias (OpenAI / vLLM ``logit_bias``): add a per-slot table of (token id, value) pairs."""

from onnxscript import FLOAT, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._common import onnxsample


@script(onnxsample)
def LogitBias(
    x: FLOAT["S", "V"], bias_ids: INT64["S", "NB"], bias_values: FLOAT["S", "NB"]
) -> FLOAT["S", "V"]:
    """x[s, bias_ids[s, j]] += bias_values[s, j] for every entry whose id is not the padding id −1.

    x: FLOAT["S", "V"]; bias_ids: INT64["S", "NB"] (−1 = padding); bias_values: FLOAT["S", "NB"].
    Padding entries add 0 to token 0, an exact no-op. Ids are validated to [0, V) on the host.
    """
    zero_i = op.Constant(value_int=0)
    zero_f = op.Constant(value_float=0.0)
    used = op.GreaterOrEqual(bias_ids, zero_i)
    ids = op.Where(used, bias_ids, zero_i)
    values = op.Where(used, bias_values, zero_f)
    return op.ScatterElements(x, ids, values, axis=1, reduction="add")
