"""Speculative decoding, the verifying graph on logits given as an input: its contract, greedy
acceptance, slots with and without drafts, logprobs and penalties at draft positions, agreement with
``onnx.reference``, and χ² of the emitted tokens against non-speculative sampling."""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.ops import op_gather_elements

from onnxsample import SamplingParams
from onnxsample.chain import SamplerChain
from onnxsample.composer._splice import reconcile_versions, splice
from onnxsample.composer.sampler_model import sampler_feeds, sampler_session
from onnxsample.params import pack_sampling_params

FULL = "logit_bias,penalties,temperature,top_k,top_p,min_p,typical_p,dist"


# ---- the verifying graph, on logits given as an input ------------------------------------------


@functools.cache
def _draft_model(chain: str, vocab: int, slots: int, drafts: int, top: int = 0) -> bytes:
    """A composed graph whose "model" returns its input as the logits [B, T, V]."""
    x = helper.make_tensor_value_info("logits_in", TensorProto.FLOAT, ["B", "T", vocab])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "T", vocab])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["logits_in"], ["logits"])], "m", [x], [y]
    )
    base = ir.from_proto(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    )
    bias = 2 if "logit_bias" in chain else 0
    options = dict(top_logprobs=top, max_bias=bias, output_probs=False, output_candidates=0)
    model = splice(base, SamplerChain(chain), vocab, slots, options, head=None, draft_tokens=drafts)
    model.graph.outputs[:] = [v for v in model.graph.outputs if v.name != "logits"]
    reconcile_versions(model)
    proto = ir.to_proto(model)
    onnx.checker.check_model(proto, full_check=True)
    return proto.SerializeToString()


@functools.cache
def _session(chain: str, vocab: int, slots: int, drafts: int, top: int = 0):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(
        _draft_model(chain, vocab, slots, drafts, top), options, providers=["CPUExecutionProvider"]
    )


def _verify(logits, params, drafts, *, chain=FULL, top=0, **options):
    """Run the verifying graph in ONNX Runtime (see :func:`_feeds`); its outputs by name."""
    logits = np.asarray(logits, np.float32)
    session = _session(chain, logits.shape[2], len(params), logits.shape[1] - 1, top)
    feeds = _feeds(logits, params, drafts, chain=chain, top=top, **options)
    outputs = [o.name for o in session.get_outputs()]
    return dict(zip(outputs, session.run(None, feeds), strict=True))


def _feeds(logits, params, drafts, *, chain=FULL, rows=None, uniform=None, counts=None, top=0):
    """The verifying graph's inputs: logits [B, T, V]; one SamplingParams (or None) and one draft
    (list, [] for none) per slot; slot s reads batch row s unless `rows` says otherwise."""
    logits = np.asarray(logits, np.float32)
    _, t, vocab = logits.shape
    slots, width = len(params), t - 1
    session = _session(chain, vocab, slots, width, top)
    names = {i.name for i in session.get_inputs()}
    bias = 2 if "logit_bias" in chain else 0
    feeds = pack_sampling_params(
        params, SamplerChain(chain), slots, max_bias=bias, vocab_size=vocab, top_logprobs=top
    )
    feeds = {k: v for k, v in feeds.items() if k in names}
    feeds["logits_in"] = logits
    if rows is None:
        rows = [0 if p is None else 1 + s * t for s, p in enumerate(params)]
    feeds["sampler.row_index"] = np.asarray(rows, np.int64)
    table = np.full((slots, width), -1, np.int64)
    for s, draft in enumerate(drafts):
        table[s, : len(draft)] = draft
    feeds["sampler.draft_tokens"] = table
    u = np.full((slots, t), 0.5, np.float32) if uniform is None else np.asarray(uniform, np.float32)
    if "sampler.uniform" in names:
        feeds["sampler.uniform"], feeds["sampler.draft_uniform"] = u[:, 0], u[:, 1:]
    if "sampler.output_counts" in names:
        feeds["sampler.prompt_mask"] = np.zeros((slots, vocab), bool)
        feeds["sampler.output_counts"] = (
            np.zeros((slots, vocab), np.int32) if counts is None else counts.astype(np.int32)
        )
    return feeds


def test_contract_inputs_and_outputs():
    model = onnx.load_from_string(_draft_model(FULL, 12, 3, 4, 2))
    shapes = {
        v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
        for v in [*model.graph.input, *model.graph.output]
    }
    assert shapes["sampler.draft_tokens"] == [3, 4]
    assert shapes["sampler.draft_uniform"] == [3, 4]
    assert shapes["sampler.accepted"] == [3]
    assert shapes["sampler.draft_next_token"] == [3, 4]
    assert shapes["sampler.draft_logprob"] == [3, 4]
    assert shapes["sampler.draft_top_logprob_ids"] == [3, 4, 2]
    assert shapes["sampler.next_token"] == [3]
    greedy = onnx.load_from_string(_draft_model("", 12, 3, 4))
    assert "sampler.draft_uniform" not in {i.name for i in greedy.graph.input}


GREEDY = SamplingParams(temperature=0)
# Argmax per position of batch row 0: 3, 1, 4, 1, 5.
ROW = np.full((5, 8), -1.0)
ROW[[0, 1, 2, 3, 4], [3, 1, 4, 1, 5]] = 2.0


@pytest.mark.parametrize(
    ("draft", "accepted", "emitted"),
    [
        ([], 0, [3]),
        ([3, 1, 4, 1], 4, [3, 1, 4, 1, 5]),  # every draft kept, and the token after them
        ([3, 1, 0, 1], 2, [3, 1, 4]),  # the first mismatch emits the argmax there
        ([0, 1, 4, 1], 0, [3]),
        ([3, 1], 2, [3, 1, 4]),
        ([3], 1, [3, 1]),
    ],
)
def test_greedy_acceptance(draft, accepted, emitted):
    found = _verify(ROW[None], [GREEDY], [draft])
    assert found["sampler.accepted"][0] == accepted
    tokens = [found["sampler.next_token"][0], *found["sampler.draft_next_token"][0][:accepted]]
    assert tokens == emitted
    counts = np.bincount(emitted, minlength=8)
    assert found["sampler.output_counts_out"][0].tolist() == counts.tolist()


def test_slots_with_and_without_drafts_and_inactive_ones():
    """Slot 0 drafts, slot 1 decodes plainly, slot 2 is inactive (its stale draft is ignored),
    slot 3 samples a row near the end of the logits and has no draft (no row past the end)."""
    logits = np.stack([ROW, ROW[::-1], ROW, ROW])
    params = [GREEDY, GREEDY, None, GREEDY]
    rows = [1, 6, 0, 20]
    found = _verify(logits, params, [[3, 1, 4], [], [3, 1], []], rows=rows)
    assert found["sampler.accepted"].tolist() == [3, 0, 0, 0]
    assert found["sampler.next_token"].tolist() == [3, 5, 0, 5]
    assert found["sampler.draft_next_token"][0].tolist() == [1, 4, 1, -1]
    assert found["sampler.output_counts_out"][2].sum() == 0  # inactive: no state change


@pytest.mark.parametrize(
    "second",
    [
        SamplingParams(temperature=0, repetition_penalty=1.3),
        SamplingParams(temperature=0.8, top_k=3),
    ],
    ids=["greedy-penalised", "drawing"],
)
def test_a_slot_without_a_draft_gets_the_same_outputs_whether_the_step_verifies_or_not(second):
    """A step in which no slot drafts skips the verification; a slot without a draft gets the
    same outputs as when another slot drafts and the step verifies: its token, logprob, top
    logprobs and counts, draft positions unscored (−1, logprobs 0), nothing accepted."""
    logits = np.stack([ROW, ROW[::-1]])
    params = [GREEDY, second]
    uniform = np.full((2, 5), 0.3)
    counts = np.zeros((2, 8), np.int32)
    counts[1, 5] = 2
    skipped = _verify(logits, params, [[], []], top=2, uniform=uniform, counts=counts)
    verified = _verify(logits, params, [[3, 1], []], top=2, uniform=uniform, counts=counts)
    assert skipped["sampler.accepted"].tolist() == [0, 0]
    assert verified["sampler.accepted"].tolist() == [2, 0]
    for name, value in skipped.items():
        np.testing.assert_array_equal(value[1], verified[name][1], err_msg=name)
    assert skipped["sampler.draft_next_token"].tolist() == [[-1] * 4] * 2
    assert not skipped["sampler.draft_logprob"].any()
    assert skipped["sampler.draft_top_logprobs"].shape == (2, 4, 2)


def test_logprobs_of_draft_positions_are_the_raw_distribution():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(1, 4, 8)).astype(np.float32)
    drafts = [int(t) for t in logits[0, :3].argmax(-1)]
    found = _verify(logits, [GREEDY], [drafts], top=2)
    raw = logits[0] - np.log(np.exp(logits[0]).sum(-1, keepdims=True))
    tokens = [found["sampler.next_token"][0], *found["sampler.draft_next_token"][0]]
    lps = [found["sampler.logprob"][0], *found["sampler.draft_logprob"][0]]
    for i, (token, lp) in enumerate(zip(tokens, lps, strict=True)):
        assert lp == pytest.approx(raw[i, token], abs=1e-5)
    assert found["sampler.draft_top_logprob_ids"][0, 0].tolist() == np.argsort(-raw[1])[:2].tolist()


def test_penalties_see_the_drafts_before_each_position():
    """Position i's penalty counts are the slot's counts plus drafts 0..i−1: with a strong
    frequency penalty, a repeated draft token stops being the argmax."""
    logits = np.zeros((1, 3, 6), np.float32)
    logits[0, :, 2] = 3.0  # token 2 is the argmax everywhere, 1 the runner-up
    logits[0, :, 1] = 2.0
    params = SamplingParams(temperature=0, frequency_penalty=2.0)
    found = _verify(logits, [params], [[2, 2]])
    # position 0: 2 (no counts); position 1 sees one 2 (3 − 2 = 1 < 2): token 1 ≠ draft 2.
    assert found["sampler.next_token"][0] == 2
    assert found["sampler.accepted"][0] == 1
    assert found["sampler.draft_next_token"][0, 0] == 1
    assert found["sampler.output_counts_out"][0].tolist() == [0, 1, 1, 0, 0, 0]  # 2, then 1


def _take_along_axis(self, data, indices, axis=None):
    return (np.take_along_axis(data, indices.astype(np.int64), axis=axis),)


def test_onnx_reference_evaluator_agrees(monkeypatch):
    """The same verification in ``onnx.reference.ReferenceEvaluator``: sampled and greedy slots,
    penalties, a draft, a plain slot and an inactive one."""
    # The evaluator's GatherElements uses np.choose (at most 32/64 choices along the axis).
    monkeypatch.setattr(op_gather_elements.GatherElements, "_run", _take_along_axis)
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(3, 4, 12)).astype(np.float32)
    drafts = [[int(t) for t in logits[0, :3].argmax(-1)], [], [5, 6]]
    params = [
        SamplingParams(temperature=0, frequency_penalty=0.5),
        SamplingParams(temperature=0.8, top_k=5, top_p=0.9, repetition_penalty=1.2),
        None,
    ]
    u = rng.random((3, 4)).astype(np.float32)
    feeds = _feeds(logits, params, drafts, uniform=u, top=2)
    found = _verify(logits, params, drafts, uniform=u, top=2)
    model = onnx.load_from_string(_draft_model(FULL, 12, 3, 3, 2))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        names = [o.name for o in model.graph.output]
        reference = dict(zip(names, ReferenceEvaluator(model).run(None, feeds), strict=True))
    assert found["sampler.accepted"][0] == 3
    for name, value in found.items():
        np.testing.assert_allclose(reference[name], value, rtol=1e-5, atol=1e-5, err_msg=name)


def _chi2_limit(df: int) -> float:
    """χ² quantile at α = 1e-6 (Wilson–Hilferty)."""
    z = 4.7534
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _final_probs(logits_row, params, counts) -> np.ndarray:
    """The non-speculative chain's final distribution for one row (the standalone sampler)."""
    vocab = len(logits_row)
    session = sampler_session(FULL, vocab, 1, max_bias=2, output_probs=True)
    rows = np.vstack([np.zeros(vocab), logits_row]).astype(np.float32)
    feeds = sampler_feeds(FULL, rows, [params], max_bias=2, output_counts=counts[None])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))["sampler.probs"][0]


DRAWS = 100_000


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.9, top_p=0.95),
        SamplingParams(
            temperature=1.1,
            top_k=6,
            min_p=0.02,
            repetition_penalty=1.3,
            presence_penalty=0.4,
            frequency_penalty=0.8,
        ),
    ],
)
def test_emitted_tokens_follow_the_non_speculative_distribution(params):
    """DRAWS slots verify the same one-token draft with their own uniforms. The outcomes — t0 ≠ d
    alone, or d then t1 — must follow sequential sampling: t0 ~ p0 (the slot's counts), and after
    d, t1 ~ p1 with d counted (penalties exact)."""
    rng = np.random.default_rng(11)
    vocab, draft = 8, 2
    logits = rng.normal(size=(1, 2, vocab)).astype(np.float32)
    logits[0, :, draft] += 1.0  # a likely draft, so both outcomes are frequent
    counts = np.zeros(vocab, np.int32)
    counts[[1, draft]] = [1, 2]
    u = np.random.Generator(np.random.Philox(5)).random((DRAWS, 2), dtype=np.float32)
    found = _verify(
        logits,
        [params] * DRAWS,
        [[draft]] * DRAWS,
        rows=np.ones(DRAWS, np.int64),
        uniform=u,
        counts=np.tile(counts, (DRAWS, 1)),
    )
    accepted = found["sampler.accepted"].astype(bool)
    first, second = found["sampler.next_token"], found["sampler.draft_next_token"][:, 0]
    observed = np.concatenate(
        [
            np.bincount(first[~accepted], minlength=vocab),
            np.bincount(second[accepted], minlength=vocab),
        ]
    )
    after = counts.copy()
    after[draft] += 1
    p0 = _final_probs(logits[0, 0], params, counts)
    p1 = _final_probs(logits[0, 1], params, after)
    expected = np.concatenate([np.where(np.arange(vocab) == draft, 0, p0), p0[draft] * p1]) * DRAWS
    support = expected > 0
    assert observed[~support].sum() == 0
    chi2 = float(((observed[support] - expected[support]) ** 2 / expected[support]).sum())
    assert chi2 < _chi2_limit(support.sum() - 1), (chi2, observed, expected.round())
    if params.frequency_penalty:
        # The check can fail: the same draws do not fit p1 without the draft counted.
        wrong = p0[draft] * _final_probs(logits[0, 1], params, counts) * DRAWS
        keep = wrong > 0
        miss = ((observed[vocab:][keep] - wrong[keep]) ** 2 / wrong[keep]).sum()
        assert miss > _chi2_limit(keep.sum() - 1)
