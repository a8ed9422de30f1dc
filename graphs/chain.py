"""Assemble the sampler functions into one ``SamplerChain`` function for a given configuration.

The chain function takes the logits (padded rows, or rows already gathered per slot) and the
``sampler.*`` inputs without their ``sampler.`` prefix, and returns the contract's outputs. Only the
inputs the configured samplers read are present. A graph without ``dist`` decodes greedily.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnxsample.graphs._common import (
    DOMAIN,
    GREEDY_BELOW,
    T_BOOL,
    T_FLOAT,
    T_INT64,
)
from onnxsample.graphs._greedy_steps import (
    drawn_filters,
    greedy_rows_skip_draw,
    plain_condition,
    scalar,
    select_unless_plain,
)
from onnxsample.graphs.chain_config import (
    ALLOWED,
    FALLBACK,
    FALLBACK_LOGITS,
    LOGPROBS,
    PREFIX,
    ChainConfig,
    chain_inputs,
)
from onnxsample.graphs.library import FunctionBody, opsets

CHAIN_FUNCTION = "SamplerChain"


def _fallback(body: FunctionBody, config: ChainConfig, beyond: list[str], every: list[str]) -> None:
    """``fallback`` BOOL[S]: the slots that draw (not greedy) with some flag of `beyond` set,
    and those with a flag of `every` set, drawing or not; ``fallback_logits``: the rows the
    chain read, for the host to draw them again."""

    def any_of(flags: list[str], tag: str) -> str:
        flagged = flags[0]
        for i, name in enumerate(flags[1:]):
            body.op("Or", [flagged, name], [f"{tag}_{i}"])
            flagged = f"{tag}_{i}"
        return flagged

    columns = helper.make_tensor("c", T_INT64, [1], [1])
    body.op("Constant", [], ["fallback_columns"], value=columns)
    drawn = "fallback_drawn_flags" if every else FALLBACK
    if beyond:
        body.op("Squeeze", [any_of(beyond, "beyond"), "fallback_columns"], ["beyond_rows"])
        if config.has("temperature"):
            below = scalar("fallback_greedy_below", GREEDY_BELOW)
            body.op("Constant", [], ["fallback_greedy_below"], value=below)
            body.op("GreaterOrEqual", ["temperature", "fallback_greedy_below"], ["fallback_drawn"])
            body.op("And", ["beyond_rows", "fallback_drawn"], [drawn])
        else:
            body.op("Identity", ["beyond_rows"], [drawn])
    if every:
        body.op("Squeeze", [any_of(every, "every"), "fallback_columns"], ["every_rows"])
        if beyond:
            body.op("Or", [drawn, "every_rows"], [FALLBACK])
        else:
            body.op("Identity", ["every_rows"], [FALLBACK])
    if not (beyond or every):  # only the slots the engine flags: those with the temperature last
        _zeros(body, FALLBACK, T_BOOL, 0)
    body.op("Identity", ["rows"], [FALLBACK_LOGITS])


_PENALTIES = ["repetition_penalty", "presence_penalty", "frequency_penalty"]


def _transforms(body: FunctionBody, config: ChainConfig) -> str:
    """The logit bias, the allowed-tokens mask and the penalties applied to ``x``, in that order:
    the name of the transformed logits (``x`` itself when the chain has none).

    An ``If``'s skipped branch copies the row it passes through, so the branching chain asks
    once whether the mask constrains or some slot penalises (``Constraining``, ``Penalising``),
    and a step where neither does takes the logit bias alone: one pass over the rows, where the
    mask's and the penalties' own checks took one each. Either way, the same numbers."""
    static, penalties = config.static, config.has("penalties")

    def apply(into: FunctionBody, tag: str, allowed: bool, penalised: bool) -> str:
        z = "x"
        if config.has("logit_bias"):
            into.call("LogitBias", [z, "bias_ids", "bias_values"], [f"biased{tag}"])
            z = f"biased{tag}"
        if allowed:
            into.call("AllowedStatic" if static else "Allowed", [z, ALLOWED], [f"allowed_z{tag}"])
            z = f"allowed_z{tag}"
        if penalised:
            penalties_fn = "PenaltiesStatic" if static else "Penalties"
            into.call(
                penalties_fn, [z, "prompt_mask", "output_counts", *_PENALTIES], [f"penalised{tag}"]
            )
            z = f"penalised{tag}"
        return z

    if static or not (config.allowed_tokens or penalties):
        return apply(body, "", config.allowed_tokens, penalties)
    checks = []
    if config.allowed_tokens:
        body.call("Constraining", ["x", ALLOWED], ["constraining"])
        checks.append("constraining")
    if penalties:
        body.call("Penalising", _PENALTIES, ["penalising"])
        checks.append("penalising")
    if len(checks) == 2:
        body.op("Or", checks, ["transforming"])
        checks = ["transforming"]
    branches = []
    for tag, on in (("_all", True), ("_none", False)):
        branch = FunctionBody()
        z = apply(branch, tag, config.allowed_tokens and on, penalties and on)
        if z == "x":
            branch.op("Identity", ["x"], [f"untransformed{tag}"])
            z = f"untransformed{tag}"
        branches.append((branch, [z]))
    _branches(body, checks[0], branches[0], branches[1], ["transformed"], [T_FLOAT])
    return "transformed"


def _logprob(body: FunctionBody, out: str) -> None:
    """`out`: each row's chosen token's logprob; ``logp``, the rows' log-softmax, for the top ones."""
    body.call("Logprob", ["x", "token"], [out, "logp"])


def _top_logprobs(body: FunctionBody, top: int, outs: list[str]) -> None:
    """`outs` (ids, logprobs): each row's `top` most likely tokens, after :func:`_logprob`."""
    body.constant_int64("top_count", top)
    body.call("TopLogprobs", ["x", "logp", "top_count"], outs)


def _zeros(body: FunctionBody, name: str, kind: int, columns: int) -> str:
    """`name`: zeros of type `kind`, a row per slot (``token``'s rows), `columns` wide if > 0."""
    body.op("Shape", ["token"], [f"{name}_rows"])
    shape = f"{name}_rows"
    if columns:
        width = helper.make_tensor("c", T_INT64, [1], [columns])
        body.op("Constant", [], [f"{name}_columns"], value=width)
        body.op("Concat", [shape, f"{name}_columns"], [f"{name}_shape"], axis=0)
        shape = f"{name}_shape"
    body.op("ConstantOfShape", [shape], [name], value=helper.make_tensor("z", kind, [1], [0]))
    return name


def _some_slot_asks(body: FunctionBody, least: int, name: str) -> str:
    """BOOL[1] `name`: some slot asks for `least` logprobs or more (``logprobs`` ≥ `least`)."""
    body.constant_int64(f"{name}_least", least)
    body.op("GreaterOrEqual", [LOGPROBS, f"{name}_least"], [f"{name}_rows"])
    body.call("AnyRow", [f"{name}_rows"], [name])
    return name


def _branches(
    body: FunctionBody,
    cond: str,
    then: tuple[FunctionBody, list[str]],
    other: tuple[FunctionBody, list[str]],
    outputs: list[str],
    kinds: list[int],
) -> None:
    """`outputs` (of types `kinds`): `then`'s (branch, outputs) where `cond`, else `other`'s."""
    graphs = [
        helper.make_graph(
            branch.nodes,
            f"{outputs[0]}_{tag}",
            [],
            [helper.make_tensor_value_info(n, k, None) for n, k in zip(names, kinds, strict=True)],
        )
        for tag, (branch, names) in (("then", then), ("else", other))
    ]
    body.op("If", [cond], outputs, then_branch=graphs[0], else_branch=graphs[1])


def _logprobs_on_request(body: FunctionBody, top: int) -> None:
    """The logprobs where some slot asks for them (``logprobs`` ≥ 0), zeros else, and the top
    logprobs where some slot asks for one or more: a step where no request asks makes no pass
    over the rows for the normaliser and no ``TopK`` over them."""
    tops = ["top_logprob_ids", "top_logprobs"] if top else []
    top_kinds = [T_INT64, T_FLOAT] if top else []
    asked, asked_out = FunctionBody(), ["logprob_asked"]
    _logprob(asked, "logprob_asked")
    if top:
        wide, wide_out = FunctionBody(), [f"{n}_wide" for n in tops]
        _top_logprobs(wide, top, wide_out)
        narrow = FunctionBody()
        narrow_out = [
            _zeros(narrow, f"{n}_narrow", k, top) for n, k in zip(tops, top_kinds, strict=True)
        ]
        asked_out += [f"{n}_asked" for n in tops]
        cond = _some_slot_asks(asked, 1, "tops_asked")
        _branches(asked, cond, (wide, wide_out), (narrow, narrow_out), asked_out[1:], top_kinds)
    none = FunctionBody()
    none_out = [_zeros(none, "logprob_none", T_FLOAT, 0)]
    none_out += [_zeros(none, f"{n}_none", k, top) for n, k in zip(tops, top_kinds, strict=True)]
    cond = _some_slot_asks(body, 0, "logprobs_asked")
    kinds = [T_FLOAT, *top_kinds]
    _branches(body, cond, (asked, asked_out), (none, none_out), ["logprob", *tops], kinds)


def _finite_rows_static(body: FunctionBody, z: str) -> None:
    """The static chain's ``processed`` rows and ``finite`` flags (``FiniteRowsStatic``) and every
    row's ``greedy_token``: the argmax the row maximum is read at (``SanitizeStatic``'s when `z`
    is x, which has no +inf, else ``ClampedTopStatic``'s), which is the argmax of the processed
    row. ``SelectGreedy`` keeps it on the greedy rows only."""
    z_max, z_argmax = "x_max", "x_argmax"
    if z != "x":
        body.call("ClampedTopStatic", [z], ["clamped", "z_max", "z_argmax"])
        z, z_max, z_argmax = "clamped", "z_max", "z_argmax"
    body.call("FiniteRowsStatic", [z, z_max], ["processed", "finite"])
    body.op("Constant", [], ["greedy_columns"], value=helper.make_tensor("c", T_INT64, [1], [1]))
    body.op("Squeeze", [z_argmax, "greedy_columns"], ["greedy_token"])


def build_chain_function(config: ChainConfig) -> onnx.FunctionProto:
    """The ``onnxsample.SamplerChain`` function for ``config`` (inputs/outputs without prefix)."""
    body = FunctionBody()
    if config.gather_rows:
        body.op("Gather", ["logits", "row_index"], ["rows"], axis=0)
    else:
        body.op("Identity", ["logits"], ["rows"])
    static = config.static
    if static:
        body.call("SanitizeStatic", ["rows"], ["x", "x_max", "x_argmax"])
    else:
        body.call("Sanitize", ["rows"], ["x", "x_max"])
    z = _transforms(body, config)
    plain = plain_condition(body, config)
    chain, body = body, (FunctionBody() if plain else body)  # the selection: an If's else branch
    transformed, selected = z, ("selected" if plain else "token")
    if config.has("temperature"):
        cut_temperature = "temperature"
        if config.temperature_last:  # the cuts read the row at temperature 1 on those slots
            outs = ["cut_temperature", "draw_scale"]
            body.call("TemperatureLast", ["temperature", "temperature_last"], outs)
            cut_temperature = "cut_temperature"
        body.call("Temperature", [z, cut_temperature], ["scaled"])
        z = "scaled"
    sampling = config.has("dist")
    if static:
        _finite_rows_static(body, z)
    else:
        z_max = "x_max"
        if z != "x":
            body.call("RowMax", [z], ["z_max"])
            z_max = "z_max"
        body.call("FiniteRows", [z, z_max], ["processed", "finite"])
        if not sampling:
            body.call("RowArgMax", ["processed"], ["greedy_token"])
        elif config.has("temperature"):
            body.call("GreedyRows", ["processed", "temperature"], ["greedy_token"])
    z = "processed"
    floors = [n for n in ("top_k", "top_p", "min_p") if config.has(n)]
    floor = "no_floor"
    body.op("Constant", [], [floor], value=helper.make_tensor(floor, T_FLOAT, [1, 1], [-np.inf]))
    beyond: list[str] = []  # a static chain's per-slot flags: the kept set is past its candidates
    every: list[str] = []  # and those that hold for a greedy slot too
    param = drawn_filters(body, config)  # the filters' parameters, off on the greedy rows
    if floors and static:
        candidates_out = ["candidates", "candidate_ids_all", "top", "wide", "wide_ids"]
        body.call("CandidatesStatic", [z], candidates_out)
        if sampling or config.has("top_p"):
            # exp(z − max z) once, over the row: top-p's mass and the draw read it
            body.op("Sub", [z, "top"], ["shifted_row"])
            body.op("Exp", ["shifted_row"], ["exp_row"])
    elif floors:
        candidates_fn, inputs = (
            ("CandidatesDrawn", [z, "temperature"]) if param else ("Candidates", [z])
        )
        body.call(candidates_fn, inputs, ["candidates", "candidate_ids_all", "top"])
    param = param or {n: n for n in ("top_k", "top_p", "min_p", "typical_p")}
    if config.has("top_k"):
        if static:
            body.call("TopKStatic", [z, "wide", "top_k"], ["floor_top_k", "beyond_top_k"])
            beyond.append("beyond_top_k")
        else:
            body.call("TopK", [z, "candidates", param["top_k"]], ["floor_top_k"])
        floor = "floor_top_k"
    if config.has("top_p"):
        if static:
            top_p_inputs = [z, "candidates", "wide", "wide_ids", "exp_row", floor, "top_p"]
            body.call("TopPStatic", top_p_inputs, ["floor_top_p", "beyond_top_p"])
            beyond.append("beyond_top_p")
        else:
            body.call("TopP", [z, "candidates", "top", floor, param["top_p"]], ["floor_top_p"])
        floor = "floor_top_p"
    if config.has("min_p"):
        body.call("MinP", ["top", floor, param["min_p"]], ["floor_min_p"])
        floor = "floor_min_p"
    draw_z = z
    if config.has("typical_p") and static:  # its slots are drawn on the host
        body.call("TypicalPStatic", ["typical_p"], ["beyond_typical"])
        (every if config.typical_candidates else beyond).append("beyond_typical")
    if config.has("typical_p") and not static:
        body.call("TypicalP", [z, floor, param["typical_p"]], ["typical", "typical_rows"])
        draw_z, whole_rows = "typical", "typical_rows"
    else:
        whole_rows = "no_whole_rows"
        flag = helper.make_tensor(whole_rows, T_BOOL, [1, 1], [False])
        body.op("Constant", [], [whole_rows], value=flag)
    kept = draw_z  # the kept set as logits (dropped tokens −inf), for the optional outputs
    if floors and (config.output_probs or config.output_candidates):
        body.call("Truncate", [draw_z, floor], ["kept"])
        kept = "kept"
    if config.temperature_last and (config.output_probs or config.output_candidates):
        body.call("Retemper", [kept, "draw_scale"], ["kept_tempered"])
        kept = "kept_tempered"
    if sampling:
        if floors and static:
            # RowDraw's token is the candidates' (CandidateDraw adds the same weights in the same
            # order): the static chain draws every slot from its row cut at the floor
            body.call("DistCutStatic", [z, "exp_row", floor, "uniform"], ["drawn_token"])
        elif floors:
            draw_floor, draw_whole = floor, whole_rows
            if config.has("temperature"):
                # A greedy row's draw is thrown away (SelectGreedy): make it the cheap candidate
                # draw (a floor of +inf is inside the candidates), so that a batch of greedy rows
                # never draws from the whole vocabulary.
                draw_floor, draw_whole = greedy_rows_skip_draw(body, floor, whole_rows)
            if not config.temperature_last:  # every slot draws at the cuts' temperature
                one = helper.make_tensor("draw_scale", T_FLOAT, [1, 1], [1.0])
                body.op("Constant", [], ["draw_scale"], value=one)
            draw_inputs = [draw_z, "candidates", "candidate_ids_all", "top", draw_floor, draw_whole]
            body.call("Dist", [*draw_inputs, "draw_scale", "uniform"], ["drawn_token"])
        else:
            if config.temperature_last:  # typical-p alone: its kept row at the draw's temperature
                body.call("Retemper", [draw_z, "draw_scale"], ["draw_tempered"])
                draw_z = "draw_tempered"
            rows_fn = "DistRowsStatic" if static else "DistRows"
            body.call(rows_fn, [draw_z, "uniform"], ["drawn_token"])
        if config.has("temperature"):
            body.call("SelectGreedy", ["temperature", "greedy_token", "drawn_token"], [selected])
        else:
            body.op("Identity", ["drawn_token"], [selected])
    else:
        body.op("Identity", ["greedy_token"], [selected])
    if plain:
        body = select_unless_plain(chain, plain, body, selected, transformed)
    outputs = ["next_token", "logprob"]
    body.op("Identity", ["token"], ["next_token"])
    tops = ["top_logprob_ids", "top_logprobs"] if config.top_logprobs > 0 else []
    if config.logprobs_on_request and not static:
        _logprobs_on_request(body, config.top_logprobs)
    else:
        _logprob(body, "logprob")
        if tops:
            _top_logprobs(body, config.top_logprobs, tops)
    outputs += tops
    if config.has("penalties") and config.counts_out:
        body.call("UpdateCounts", ["output_counts", "token", "row_index"], ["output_counts_out"])
        outputs.append("output_counts_out")
    if config.output_probs:
        if sampling and config.has("temperature"):
            eps = helper.make_tensor("greedy_below", T_FLOAT, [], [GREEDY_BELOW])
            body.op("Constant", [], ["greedy_below"], value=eps)
            body.op("Less", ["temperature", "greedy_below"], ["greedy_rows"])
        else:
            flag = helper.make_tensor("greedy_rows", T_BOOL, [], [not sampling])
            body.op("Constant", [], ["greedy_rows"], value=flag)
        body.call("FinalProbs", [kept, "token", "greedy_rows", "finite"], ["probs"])
        outputs.append("probs")
    if config.output_candidates > 0:
        body.constant_int64("candidate_count", config.output_candidates)
        body.op(
            "TopK",
            [kept, "candidate_count"],
            ["candidate_logits", "candidate_ids"],
            axis=1,
            largest=1,
            sorted=1,
        )
        outputs += ["candidate_ids", "candidate_logits"]
    if config.flags_fallback:
        _fallback(body, config, beyond, every)
        outputs += [FALLBACK, FALLBACK_LOGITS]
    inputs = ["logits"] + [name[len(PREFIX) :] for name, _, _ in chain_inputs(config)]
    return helper.make_function(
        DOMAIN,
        CHAIN_FUNCTION,
        inputs,
        outputs,
        body.nodes,
        opsets(),
        doc_string=f"Sampler chain: {','.join(config.samplers) or 'greedy'}"
        + (" (static: no control flow)" if static else ""),
    )
