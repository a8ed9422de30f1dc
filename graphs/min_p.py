"""Min-p: drop tokens much less likely than the most likely one."""

from onnxscript import FLOAT, script
from onnxscript import opset18 as op

from onnxsample.graphs._common import onnxsample
from onnxsample.graphs._rows import RowLog


@script(onnxsample)
def MinP(top: FLOAT["S", 1], floor: FLOAT["S", 1], min_p: FLOAT["S"]) -> FLOAT["S", 1]:
    """Keep p ≥ min_p · max(p), computed in logit space as llama.cpp does: z ≥ max(z) + log(min_p).
    The most likely token is always kept and min_p = 0 keeps everything; the ratio p / max(p) does
    not depend on what the earlier filters dropped.

    top: FLOAT["S", 1] (row maximum); floor: FLOAT["S", 1]; min_p: FLOAT["S"] in [0, 1] → new floor.
    """
    axis = op.Constant(value_ints=[1])
    return op.Max(floor, op.Add(top, RowLog(op.Unsqueeze(min_p, axis))))
