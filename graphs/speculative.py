"""Speculative decoding inside the graph: which positions to score, and which drafts to keep.

A drafting slot feeds the model its last token and then its draft tokens d_0..d_{k-1}; position i's
logits predict the token after d_{i-1}. Every position runs the full sampler chain with the slot's
parameters, its own uniform, and penalty counts that include the drafts before it, so position i
samples exactly what non-speculative decoding would sample there had it emitted d_0..d_{i-1}.

Acceptance, for a deterministic (one-token) draft: draft d_i is kept while the token sampled at
position i equals it. For greedy slots that is "the draft equals the argmax". For sampled slots it
is the standard speculative-sampling rule: with q the point mass on d_i, the rule accepts d_i with
probability min(1, p(d_i) / q(d_i)) = p(d_i) and otherwise draws from the residual
max(0, p − q), renormalised, which is p with d_i removed; drawing y ~ p and accepting iff y = d_i
accepts with probability p(d_i), and on a mismatch y is distributed as p restricted to y ≠ d_i,
the same residual. The first mismatch emits the sampled token; when all k drafts are accepted,
position k's token comes as a bonus, so a step emits between 1 and k + 1 tokens.
"""

from onnxscript import BOOL, INT32, INT64, script
from onnxscript import opset18 as op

from onnxsample.graphs._common import T_BOOL, T_INT32, T_INT64, onnxsample


@script(onnxsample)
def DraftPositions(draft_tokens: INT64["A", "K"], row_index: INT64["A"]) -> INT64["R", 2]:
    """The (slot, position) pairs to score, row-major: position 0 of every slot, and position i ≥ 1
    of an active slot (row_index > 0) whose drafts 0..i−1 are all ≥ 0 (−1 ends a draft).

    draft_tokens: INT64["A", "K"]; row_index: INT64["A"] → INT64["R", 2] with R = Σ (k_a + 1).
    """
    axis = op.Constant(value_ints=[1])
    zero = op.Constant(value_int=0)
    missing = op.Cast(op.Less(draft_tokens, zero), to=T_INT64)
    leading = op.Equal(op.CumSum(missing, op.Constant(value_int=1)), zero)
    active = op.Unsqueeze(op.Greater(row_index, zero), axis)
    drafted = op.And(leading, active)
    none = op.Cast(op.ConstantOfShape(op.Concat(op.Shape(row_index), axis, axis=0)), to=T_BOOL)
    valid = op.Concat(op.Not(none), drafted, axis=1)
    return op.Transpose(op.NonZero(valid), perm=[1, 0])


@script(onnxsample)
def PositionRows(
    pairs: INT64["R", 2], row_index: INT64["A"]
) -> (INT64["R"], INT64["R"], INT64["R"]):
    """For each scored pair (a, i): its slot a, its position i, and its padded logits row
    row_index[a] + i (a slot's positions are consecutive rows of one batch row).

    pairs: INT64["R", 2]; row_index: INT64["A"] → (slot, position, row): INT64["R"] each.
    """
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    two = op.Constant(value_ints=[2])
    axis = op.Constant(value_ints=[1])
    slot = op.Squeeze(op.Slice(pairs, zero, one, axis), axis)
    position = op.Squeeze(op.Slice(pairs, one, two, axis), axis)
    row = op.Add(op.Gather(row_index, slot, axis=0), position)
    return slot, position, row


@script(onnxsample)
def AddTokens(
    counts: INT32["N", "V"], ids: INT64["N", "M"], take: BOOL["N", "M"]
) -> INT32["N", "V"]:
    """counts_out[n, ids[n, m]] += 1 wherever take[n, m] (repeated ids count every time).

    counts: INT32["N", "V"]; ids: INT64["N", "M"] (any value where take is false); take: BOOL["N", "M"].
    An id not taken adds 0 to token 0, an exact no-op (no widened copy of the counts).
    """
    zero = op.Constant(value_int=0)
    where = op.Where(take, ids, zero)
    return op.ScatterElements(counts, where, op.Cast(take, to=T_INT32), axis=1, reduction="add")


@script(onnxsample)
def DraftCounts(
    output_counts: INT32["A", "V"],
    draft_tokens: INT64["A", "K"],
    slot: INT64["R"],
    position: INT64["R"],
) -> INT32["R", "V"]:
    """The penalty counts position i of a slot sees: the slot's counts plus its drafts 0..i−1.

    output_counts: INT32["A", "V"]; draft_tokens: INT64["A", "K"]; slot, position: INT64["R"]
    → INT32["R", "V"].
    """
    axis = op.Constant(value_ints=[1])
    drafts = op.Gather(draft_tokens, slot, axis=0)
    k = op.Shape(draft_tokens, start=1, end=2)
    j = op.Range(op.Constant(value_int=0), op.Squeeze(k), op.Constant(value_int=1))
    before = op.Less(op.Unsqueeze(j, op.Constant(value_ints=[0])), op.Unsqueeze(position, axis))
    return AddTokens(op.Gather(output_counts, slot, axis=0), drafts, before)


@script(onnxsample)
def Accept(
    sampled: INT64["A", "P"], draft_tokens: INT64["A", "K"], row_index: INT64["A"]
) -> (INT64["A"], BOOL["A", "P"]):
    """How many drafts each slot keeps, and which positions it emits (P = K + 1).

    sampled: INT64["A", "P"] (the token each scored position sampled, −1 where unscored);
    draft_tokens: INT64["A", "K"]; row_index: INT64["A"] → (accepted: INT64["A"],
    emitted: BOOL["A", "P"]). accepted = the length of the leading run where sampled[:, i] equals
    draft_tokens[:, i]; an active slot emits positions 0..accepted, an inactive one nothing.
    """
    axis = op.Constant(value_ints=[1])
    zero = op.Constant(value_int=0)
    k = op.Shape(draft_tokens, start=1, end=2)
    guessed = op.Slice(sampled, op.Constant(value_ints=[0]), k, axis)
    match = op.And(op.Equal(guessed, draft_tokens), op.GreaterOrEqual(draft_tokens, zero))
    misses = op.CumSum(op.Cast(op.Not(match), to=T_INT64), op.Constant(value_int=1))
    accepted = op.ReduceSum(op.Cast(op.Equal(misses, zero), to=T_INT64), axis, keepdims=0)
    p = op.Squeeze(op.Add(k, op.Constant(value_ints=[1])))
    i = op.Range(zero, p, op.Constant(value_int=1))
    upto = op.LessOrEqual(
        op.Unsqueeze(i, op.Constant(value_ints=[0])), op.Unsqueeze(accepted, axis)
    )
    active = op.Unsqueeze(op.Greater(row_index, zero), axis)
    return accepted, op.And(upto, active)
