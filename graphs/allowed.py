"""Allowed tokens (structured output): a per-slot mask that forbids every token a grammar rejects.

The mask comes from the host each step (a grammar matcher per constrained sequence). It applies
right after the logit bias, so no bias, penalty or temperature can re-open a forbidden token, and
the draw, greedy and top-k/top-p/min-p/typical see only allowed tokens. A batch without any
constrained slot binds the mask with one column (``[S, 1]``, all true) and the branching chain
skips it: unconstrained rows cost a shape check.
"""

from onnxscript import BOOL, FLOAT, script
from onnxscript import opset18 as op

from onnxsample.graphs._common import NEG_INF, onnxsample


@script(onnxsample)
def Constraining(x: FLOAT["S", "V"], allowed: BOOL["S", "A"]) -> BOOL[1]:
    """Whether the mask constrains the batch: it has a column per token (A = V), not one.

    x: FLOAT[S, V]; allowed: BOOL[S, V] or BOOL[S, 1] → BOOL[1] (an ``If`` condition).
    """
    width = op.Shape(allowed, start=1, end=2)
    vocab = op.Shape(x, start=1, end=2)
    return op.Equal(width, vocab)


@script(onnxsample)
def Allowed(x: FLOAT["S", "V"], allowed: BOOL["S", "A"]) -> FLOAT["S", "V"]:
    """x where allowed, −inf where not; x itself when the mask has one column (A = 1: nothing is
    constrained in this batch).

    x: FLOAT[S, V]; allowed: BOOL[S, V] (true = the grammar allows the token) or BOOL[S, 1] →
    FLOAT[S, V].
    """
    ninf = op.Constant(value_float=NEG_INF)
    if Constraining(x, allowed):
        out = op.Where(allowed, x, ninf)
    else:
        out = op.Identity(x)
    return out


@script(onnxsample)
def AllowedStatic(x: FLOAT["S", "V"], allowed: BOOL["S", "A"]) -> FLOAT["S", "V"]:
    """``Allowed`` without control flow: always the Where (a static graph binds [S, V]).

    x: FLOAT[S, V]; allowed: BOOL[S, V] or BOOL[S, 1] → FLOAT[S, V].
    """
    return op.Where(allowed, x, op.Constant(value_float=NEG_INF))
