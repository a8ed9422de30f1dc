"""Repetition, frequency and presence penalties, and the output-count state they read.

Repetition follows transformers' ``RepetitionPenaltyLogitsProcessor`` and vLLM: over every token seen
in the prompt or the output, a positive logit is divided by the penalty and a non-positive one
multiplied by it. Frequency and presence follow the OpenAI rule over output tokens only:
``logit −= count · frequency_penalty + (count > 0) · presence_penalty``.
"""

from onnxscript import BOOL, FLOAT, INT32, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._batch import AnyRow
from onnxsample.graphs._common import T_BOOL, T_FLOAT, T_INT32, onnxsample


@script(onnxsample)
def Repeated(x: FLOAT["S", "V"], repetition_penalty: FLOAT["S"]) -> FLOAT["S", "V"]:
    """x > 0 ? x / r : x · r, every token (``RepetitionRule`` keeps it on the seen ones).
    x: FLOAT["S", "V"]; repetition_penalty: FLOAT["S"] → FLOAT["S", "V"]."""
    zero_f = op.Constant(value_float=0.0)
    r = op.Unsqueeze(repetition_penalty, op.Constant(value_ints=[1]))
    return op.Where(op.Greater(x, zero_f), op.Div(x, r), op.Mul(x, r))


@script(onnxsample)
def AdditivePenalty(
    output_counts: INT32["S", "V"], presence_penalty: FLOAT["S"], frequency_penalty: FLOAT["S"]
) -> FLOAT["S", "V"]:
    """count · f + p, every token (``AdditiveRule`` subtracts it where count > 0).
    output_counts: INT32["S", "V"]; the penalties FLOAT["S"] → FLOAT["S", "V"]."""
    axis = op.Constant(value_ints=[1])
    f = op.Unsqueeze(frequency_penalty, axis)
    p = op.Unsqueeze(presence_penalty, axis)
    return op.Add(op.Mul(op.Cast(output_counts, to=T_FLOAT), f), p)


@script(onnxsample)
def RepetitionRule(
    x: FLOAT["S", "V"],
    prompt_mask: BOOL["S", "V"],
    output_counts: INT32["S", "V"],
    repetition_penalty: FLOAT["S"],
) -> FLOAT["S", "V"]:
    """seen = prompt_mask ∨ (count > 0); x' = seen ? (x > 0 ? x / r : x · r) : x.

    x: FLOAT["S", "V"]; prompt_mask: BOOL["S", "V"]; output_counts: INT32["S", "V"];
    repetition_penalty: FLOAT["S"] → FLOAT["S", "V"]. r = 1 leaves x bit for bit.
    """
    seen = op.Or(prompt_mask, op.Cast(output_counts, to=T_BOOL))
    return op.Where(seen, Repeated(x, repetition_penalty), x)


@script(onnxsample)
def AdditiveRule(
    x: FLOAT["S", "V"],
    output_counts: INT32["S", "V"],
    presence_penalty: FLOAT["S"],
    frequency_penalty: FLOAT["S"],
) -> FLOAT["S", "V"]:
    """x' = x − (count · f + (count > 0) · p): x − (count · f + p) where count > 0, else x − 0
    (the same numbers as count · f + 1 · p and 0 · f + 0 · p, but for the sign of a zero).

    x: FLOAT["S", "V"]; output_counts: INT32["S", "V"]; the penalties FLOAT["S"] → FLOAT["S", "V"].
    p = f = 0 leaves x bit for bit. ``RepetitionRule`` asks count > 0 with the same ``Cast``.
    """
    zero_f = op.Constant(value_float=0.0)
    penalty = AdditivePenalty(output_counts, presence_penalty, frequency_penalty)
    return op.Sub(x, op.Where(op.Cast(output_counts, to=T_BOOL), penalty, zero_f))


@script(onnxsample)
def Penalising(
    repetition_penalty: FLOAT["S"], presence_penalty: FLOAT["S"], frequency_penalty: FLOAT["S"]
) -> BOOL[1]:
    """Whether some slot sets a penalty (r ≠ 1, p ≠ 0 or f ≠ 0).

    The three penalties FLOAT["S"] → BOOL[1] (an ``If`` condition).
    """
    zero_f = op.Constant(value_float=0.0)
    one_f = op.Constant(value_float=1.0)
    additive = op.Or(
        op.Not(op.Equal(presence_penalty, zero_f)), op.Not(op.Equal(frequency_penalty, zero_f))
    )
    return AnyRow(op.Or(op.Not(op.Equal(repetition_penalty, one_f)), additive))


@script(onnxsample)
def Penalties(
    x: FLOAT["S", "V"],
    prompt_mask: BOOL["S", "V"],
    output_counts: INT32["S", "V"],
    repetition_penalty: FLOAT["S"],
    presence_penalty: FLOAT["S"],
    frequency_penalty: FLOAT["S"],
) -> FLOAT["S", "V"]:
    """seen = prompt_mask ∨ (count > 0);
    x' = seen ? (x > 0 ? x / r : x · r) : x;  x'' = x' − (count · f + (count > 0) · p).

    x: FLOAT["S", "V"]; prompt_mask: BOOL["S", "V"]; output_counts: INT32["S", "V"] (≥ 0); the three penalties
    FLOAT["S"]. Each rule runs only when some slot sets it; neutral values r = 1, p = f = 0 leave x
    bit for bit.
    """
    zero_f = op.Constant(value_float=0.0)
    one_f = op.Constant(value_float=1.0)
    repetition = op.Not(op.Equal(repetition_penalty, one_f))
    additive = op.Or(
        op.Not(op.Equal(presence_penalty, zero_f)), op.Not(op.Equal(frequency_penalty, zero_f))
    )
    # One pass-through when no slot penalises (an If's skipped branch copies the row), not two.
    if Penalising(repetition_penalty, presence_penalty, frequency_penalty):
        if AnyRow(repetition):
            x1 = RepetitionRule(x, prompt_mask, output_counts, repetition_penalty)
        else:
            x1 = op.Identity(x)
        if AnyRow(additive):
            x2 = AdditiveRule(x1, output_counts, presence_penalty, frequency_penalty)
        else:
            x2 = op.Identity(x1)
    else:
        x2 = op.Identity(x)
    return x2


@script(onnxsample)
def PenaltiesStatic(
    x: FLOAT["S", "V"],
    prompt_mask: BOOL["S", "V"],
    output_counts: INT32["S", "V"],
    repetition_penalty: FLOAT["S"],
    presence_penalty: FLOAT["S"],
    frequency_penalty: FLOAT["S"],
) -> FLOAT["S", "V"]:
    """``Penalties`` without control flow: both rules on every row (neutral values are exact
    no-ops), in one selection: a token the output holds (count > 0) is seen and penalised by
    both rules, one only the prompt holds by the repetition rule, any other left as it is. The
    numbers of ``RepetitionRule`` then ``AdditiveRule`` (which subtracts +0 from the rest), one
    ``Or`` and one ``Where`` fewer. Same inputs and output."""
    repeated = Repeated(x, repetition_penalty)
    penalty = AdditivePenalty(output_counts, presence_penalty, frequency_penalty)
    prompt_only = op.Where(prompt_mask, repeated, x)
    return op.Where(op.Cast(output_counts, to=T_BOOL), op.Sub(repeated, penalty), prompt_only)


@script(onnxsample)
def UpdateCounts(
    output_counts: INT32["S", "V"], token: INT64["S"], row_index: INT64["S"]
) -> INT32["S", "V"]:
    """State update: counts_out[s, token[s]] += 1 for active slots (row_index ≠ 0) only.

    output_counts: INT32["S", "V"]; token, row_index: INT64["S"] → INT32["S", "V"].
    """
    axis = op.Constant(value_ints=[1])
    # row_index ≠ 0 as a cast to bool, then 1 or 0
    active = op.Cast(op.Cast(op.Unsqueeze(row_index, axis), to=T_BOOL), to=T_INT32)
    return op.ScatterElements(
        output_counts, op.Unsqueeze(token, axis), active, axis=1, reduction="add"
    )
