"""The sampler model as a graph: contract names, local functions, checker, and ONNX Runtime against
``onnx.reference.ReferenceEvaluator`` against the numpy reference."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator
from onnx.reference.ops import op_gather_elements, op_log_softmax

from onnxsample import SamplingParams, build_sampler_model, sampler_feeds
from onnxsample.graphs import CANDIDATES, DOMAIN
from onnxsample.reference import run_chain

FULL = "logit_bias,penalties,temperature,top_k,top_p,min_p,typical_p,dist"


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _ort(model, feeds):
    session = _session(model)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def _take_along_axis(self, data, indices, axis=None):
    return (np.take_along_axis(data, indices.astype(np.int64), axis=axis),)


def _shifted_log_softmax(self, x, axis=None):
    axis = self.axis if axis is None else axis
    shifted = x - x.max(axis=axis, keepdims=True)
    return ((shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))).astype(x.dtype),)


@pytest.fixture(autouse=True)
def _evaluator_fixes(monkeypatch):
    """The evaluator's GatherElements goes through ``np.choose``, which cannot take more than 32/64
    choices along the axis (onnx 1.23); run the same op with ``np.take_along_axis`` instead. Its
    LogSoftmax is the log of a softmax, −inf wherever the softmax underflowed; take (x − m) −
    log Σ exp(x − m) as ONNX Runtime and torch do."""
    monkeypatch.setattr(op_gather_elements.GatherElements, "_run", _take_along_axis)
    monkeypatch.setattr(op_log_softmax.LogSoftmax, "_run", _shifted_log_softmax)


def _evaluator(model, feeds):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        names = [o.name for o in model.graph.output]
        evaluator = ReferenceEvaluator(model)
        return dict(zip(names, evaluator.run(None, feeds), strict=True))


@pytest.mark.parametrize(
    ("chain", "kwargs", "inputs", "outputs"),
    [
        ("", {}, ["logits", "sampler.row_index"], ["sampler.next_token", "sampler.logprob"]),
        (
            "top_k,dist",
            {"top_logprobs": 3},
            ["logits", "sampler.row_index", "sampler.uniform", "sampler.top_k"],
            [
                "sampler.next_token",
                "sampler.logprob",
                "sampler.top_logprob_ids",
                "sampler.top_logprobs",
            ],
        ),
        (
            FULL,
            {"max_bias": 4, "output_probs": True, "output_candidates": 5},
            [
                "logits",
                "sampler.row_index",
                "sampler.uniform",
                "sampler.temperature",
                "sampler.temperature_last",
                "sampler.top_k",
                "sampler.top_p",
                "sampler.min_p",
                "sampler.typical_p",
                "sampler.repetition_penalty",
                "sampler.presence_penalty",
                "sampler.frequency_penalty",
                "sampler.bias_ids",
                "sampler.bias_values",
                "sampler.prompt_mask",
                "sampler.output_counts",
            ],
            [
                "sampler.next_token",
                "sampler.logprob",
                "sampler.output_counts_out",
                "sampler.probs",
                "sampler.candidate_ids",
                "sampler.candidate_logits",
            ],
        ),
        # max_bias=0: the logit_bias sampler has no table and no inputs
        (FULL, {}, None, None),
    ],
)
def test_contract_names_and_structure(chain, kwargs, inputs, outputs):
    model = build_sampler_model(chain, 50, 3, **kwargs)
    onnx.checker.check_model(model, full_check=True)
    got_inputs = [i.name for i in model.graph.input]
    got_outputs = [o.name for o in model.graph.output]
    if inputs is not None:
        assert got_inputs == inputs
        assert got_outputs == outputs
    else:
        assert "sampler.bias_ids" not in got_inputs
        assert "sampler.output_counts_out" in got_outputs
    assert {f.domain for f in model.functions} == {DOMAIN}
    assert [n.op_type for n in model.graph.node] == ["SamplerChain"]
    assert model.graph.node[0].domain == DOMAIN
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 18), (DOMAIN, 1)}
    assert model.ir_version <= 11
    logits = model.graph.input[0].type.tensor_type.shape.dim
    assert logits[0].dim_param == "rows" and logits[1].dim_value == 50


def _calls(nodes) -> list[str]:
    """The sampler functions `nodes` call, in order, those of an ``If``'s branches included."""
    called = []
    for node in nodes:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                called += _calls(attr.g.node)
        if node.domain == DOMAIN:
            called.append(node.op_type)
    return called


def test_full_chain_calls_every_sampler_function():
    model = build_sampler_model(FULL, 50, 2, max_bias=2)
    chain = next(f for f in model.functions if f.name == "SamplerChain")
    called = _calls(chain.node)
    for name in ["Sanitize", "LogitBias", "Penalties", "Temperature", "TopK", "TopP", "MinP"]:
        assert name in called
    assert called.index("LogitBias") < called.index("Penalties") < called.index("Temperature")
    assert called.index("TopK") < called.index("TopP") < called.index("MinP")
    assert called.index("MinP") < called.index("TypicalP") < called.index("Dist")
    assert all(f.doc_string for f in model.functions)


def test_gather_rows_false_takes_slot_rows():
    rng = np.random.default_rng(1)
    slots = [SamplingParams(top_k=5), None, SamplingParams(temperature=0.0)]
    padded = rng.normal(size=(4, 30)).astype(np.float32)
    feeds = sampler_feeds("temperature,top_k,dist", padded, slots, uniform=[0.3, 0.6, 0.9])
    gathered_model = build_sampler_model("temperature,top_k,dist", 30, 3, gather_rows=False)
    assert gathered_model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 3
    padded_out = _ort(build_sampler_model("temperature,top_k,dist", 30, 3), feeds)
    gathered_out = _ort(gathered_model, {**feeds, "logits": padded[feeds["sampler.row_index"]]})
    for name, value in padded_out.items():
        np.testing.assert_array_equal(gathered_out[name], value)


def _random_case(seed: int, chain: str, vocab: int, slots: int, max_bias: int):
    rng = np.random.default_rng(seed)
    logits = (rng.normal(size=(slots + 1, vocab)) * rng.uniform(0.5, 4)).astype(np.float32)
    logits[1:, rng.integers(0, vocab, size=3)] = np.round(logits[1:, :3], 1)  # a few ties
    params = []
    for s in range(slots):
        if s == slots - 1:
            params.append(None)
            continue
        p = SamplingParams(
            temperature=float(rng.choice([0.0, 0.7, 1.0, 1.5])),
            top_k=int(rng.choice([0, 1, 3, 10, vocab])),
            top_p=float(rng.choice([1.0, 0.9, 0.5, 0.2])),
            min_p=float(rng.choice([0.0, 0.05, 0.3])),
            typical_p=float(rng.choice([1.0, 0.9, 0.5])),
            repetition_penalty=float(rng.choice([1.0, 1.3, 0.8])),
            presence_penalty=float(rng.choice([0.0, 0.5, -1.0])),
            frequency_penalty=float(rng.choice([0.0, 0.3])),
            logit_bias={int(rng.integers(vocab)): float(rng.uniform(-5, 5))} if max_bias else {},
            temperature_last=bool(rng.random() < 0.5),
        )
        params.append(_restrict(p, chain))
    prompt = rng.random((slots, vocab)) < 0.1
    counts = rng.integers(0, 3, size=(slots, vocab)) * (rng.random((slots, vocab)) < 0.1)
    feeds = sampler_feeds(
        chain,
        logits,
        params,
        uniform=rng.random(slots),
        prompt_mask=prompt,
        output_counts=counts,
        max_bias=max_bias,
    )
    return feeds


def _restrict(params: SamplingParams, chain: str) -> SamplingParams:
    """Neutralise what the chain lacks."""
    names = chain.split(",")
    if "temperature" not in names:
        params.temperature = 1.0 if "dist" in names else 0.0
    if "dist" not in names:
        params.temperature = 0.0
    for name, neutral in (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0), ("typical_p", 1.0)):
        if name not in names:
            setattr(params, name, neutral)
    if "penalties" not in names:
        params.repetition_penalty, params.presence_penalty, params.frequency_penalty = 1.0, 0.0, 0.0
    return params


CASES = [
    ("", 40, 0),
    ("dist", 40, 0),
    ("temperature,dist", 300, 0),
    ("top_k,dist", 40, 0),
    ("temperature,top_p,dist", 200, 0),
    ("temperature,min_p,dist", 100, 0),
    ("temperature,typical_p,dist", 100, 0),
    ("penalties,temperature,dist", 60, 0),
    ("penalties,temperature,top_k,top_p,min_p,dist", 90, 0),
    (FULL, 90, 3),
    (FULL, 2 * CANDIDATES + 7, 2),
]


@pytest.mark.parametrize(("chain", "vocab", "max_bias"), CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_ort_matches_reference_evaluator_and_numpy(chain, vocab, max_bias, seed):
    slots = 5
    options = {
        "top_logprobs": 3,
        "max_bias": max_bias,
        "output_probs": True,
        "output_candidates": 4,
    }
    model = build_sampler_model(chain, vocab, slots, **options)
    onnx.checker.check_model(model, full_check=True)
    feeds = _random_case(seed, chain, vocab, slots, max_bias)
    got = _ort(model, feeds)
    evaluated = _evaluator(model, feeds)
    expected = run_chain(chain, feeds, **options)
    assert sorted(got) == sorted(expected) == sorted(evaluated)
    for name in got:
        for other in (evaluated, expected):
            if got[name].dtype.kind == "f":
                np.testing.assert_allclose(
                    got[name], other[name], rtol=2e-5, atol=2e-6, err_msg=name
                )
            else:
                np.testing.assert_array_equal(got[name], other[name], err_msg=name)
    assert not np.isnan(got["sampler.logprob"]).any()


def test_merges_after_a_models_logits():
    """The composer's path: the sampler graph merged after a model whose output is ``logits``."""
    from onnx import compose, helper

    vocab, slots = 20, 2
    hidden = helper.make_tensor_value_info("hidden", onnx.TensorProto.FLOAT, ["rows", vocab])
    logits = helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["rows", vocab])
    scale = helper.make_tensor("scale", onnx.TensorProto.FLOAT, [], [2.0])
    lm = helper.make_model(
        helper.make_graph(
            [helper.make_node("Mul", ["hidden", "scale"], ["logits"])],
            "lm",
            [hidden],
            [logits],
            [scale],
        ),
        opset_imports=[helper.make_opsetid("", 18)],
        ir_version=build_sampler_model("", vocab, slots).ir_version,
    )
    sampler = build_sampler_model("temperature,top_k,dist", vocab, slots)
    merged = compose.merge_models(lm, sampler, io_map=[("logits", "logits")])
    onnx.checker.check_model(merged, full_check=True)
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(3, vocab)).astype(np.float32)
    feeds = sampler_feeds("temperature,top_k,dist", rows * 2, [SamplingParams(top_k=3)] * slots)
    alone = _ort(sampler, feeds)
    composed = _ort(merged, {**{k: v for k, v in feeds.items() if k != "logits"}, "hidden": rows})
    for name in alone:
        np.testing.assert_array_equal(composed[name], alone[name])


PROMPT_CASES = [
    # (rows of the padded logits, top_logprobs): empty (a decode step: the If's branch of empty
    # outputs), one row, many with repeats, and rows without a finite logit (row 1 is all NaN).
    ([], 3),
    ([], 0),
    ([2], 0),
    ([2, 3, 4, 2, 5, 1], 3),
    ([1, 1, 6], 2),
]


@pytest.mark.parametrize(("prompt_rows", "top"), PROMPT_CASES)
def test_prompt_logprobs_match_the_evaluator_and_numpy(prompt_rows, top):
    """Echo: the logprob of each prompt token under the raw distribution, and its top alternatives."""
    chain, vocab, slots = "temperature,top_k,dist", 70, 2
    rng = np.random.default_rng(len(prompt_rows))
    logits = (rng.normal(size=(7, vocab)) * 3).astype(np.float32)
    logits[1] = np.nan
    logits[6, :5] = [np.inf, -np.inf, 1e30, np.nan, 0]
    targets = rng.integers(0, vocab, size=len(prompt_rows))
    model = build_sampler_model(chain, vocab, slots, top_logprobs=top, prompt_logprobs=True)
    onnx.checker.check_model(model, full_check=True)
    names = [i.name for i in model.graph.input][-2:] + [o.name for o in model.graph.output][-3:]
    assert names[:2] == ["sampler.prompt_rows", "sampler.prompt_targets"]
    assert "sampler.prompt_logprob" in names
    params = [SamplingParams(top_k=3), SamplingParams(temperature=0)]
    feeds = sampler_feeds(
        chain, logits, params, prompt_rows=prompt_rows, prompt_targets=targets, uniform=[0.2, 0.7]
    )
    got = _ort(model, feeds)
    expected = run_chain(chain, feeds, top_logprobs=top, prompt=True)
    evaluated = _evaluator(model, feeds) if prompt_rows else expected
    assert sorted(got) == sorted(expected)
    for name in got:
        for other in (evaluated, expected):
            np.testing.assert_allclose(got[name], other[name], rtol=2e-5, atol=2e-6, err_msg=name)
    lp = got["sampler.prompt_logprob"]
    assert lp.shape == (len(prompt_rows),) and not np.isnan(lp).any()
    # The sampled token's logprob and a prompt row's logprob come from the same functions.
    plain = _ort(build_sampler_model(chain, vocab, slots, top_logprobs=top), feeds_without(feeds))
    for name in plain:
        np.testing.assert_array_equal(got[name], plain[name], err_msg=name)


def feeds_without(feeds: dict) -> dict:
    return {k: v for k, v in feeds.items() if not k.startswith("sampler.prompt_")}


def test_prompt_logprobs_need_the_padded_logits():
    with pytest.raises(ValueError, match="gather_rows"):
        build_sampler_model("dist", 10, 2, gather_rows=False, prompt_logprobs=True)
