"""The composer on the tiny model: greedy parity, slots, the moved gather, the chain as a local
function, a greedy-only chain, and prompt logprobs. Bad models and options: test_compose_errors.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common
import onnxruntime as ort
import pytest

from onnxsample.chain import SamplerChain
from onnxsample.composer import compose, composed_metadata
from onnxsample.params import SamplingParams, pack_sampling_params

SLOTS = 4
BATCH, SEQ = 2, 5


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _model_feeds(session: ort.InferenceSession, ids: np.ndarray) -> dict[str, np.ndarray]:
    """Prefill feeds for an optimum-layout decoder: the prompt, an empty KV cache."""
    batch, seq = ids.shape
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones((batch, seq), np.int64),
        "position_ids": np.tile(np.arange(seq, dtype=np.int64), (batch, 1)),
    }
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            feeds[i.name] = np.zeros((batch, i.shape[1], 0, i.shape[3]), np.float32)
    return feeds


def _sampler_feeds(session, params, rows, vocab, *, counts=None, max_bias=0, seed=0):
    chain = SamplerChain(
        composed_metadata(onnx.load(session._model_path, load_external_data=False)).chain
    )
    feeds = pack_sampling_params(params, chain, SLOTS, max_bias=max_bias, vocab_size=vocab)
    feeds["sampler.row_index"] = np.asarray(rows, np.int64)
    feeds["sampler.uniform"] = np.random.default_rng(seed).random(SLOTS, dtype=np.float32)
    names = {i.name for i in session.get_inputs()}
    if "sampler.prompt_mask" in names:
        feeds["sampler.prompt_mask"] = np.zeros((SLOTS, vocab), bool)
        feeds["sampler.output_counts"] = (
            np.zeros((SLOTS, vocab), np.int32) if counts is None else counts
        )
    return {k: v for k, v in feeds.items() if k in names}


@pytest.fixture(scope="session")
def prompt_ids() -> np.ndarray:
    return np.random.default_rng(7).integers(3, 49152, (BATCH, SEQ), dtype=np.int64)


@pytest.fixture(scope="session")
def plain_logits(tiny_export, prompt_ids) -> np.ndarray:
    session = _session(tiny_export.model_path)
    logits = session.run(["logits"], _model_feeds(session, prompt_ids))[0]
    return logits.reshape(BATCH * SEQ, -1)


def _tiny_composed(export, folder: Path, gather: str, **options) -> Path:
    """The tiny model with the full chain: SLOTS slots, 3 top logprobs, 2 logit-bias entries."""
    out = folder / f"{gather}.onnx"
    return compose(
        export.output,
        None,
        out,
        max_slots=SLOTS,
        top_logprobs=3,
        max_bias=2,
        gather=gather,
        **options,
    )


@pytest.fixture(scope="session", params=["lm_head", "logits"])
def composed(request, tiny_export, tmp_path_factory) -> Path:
    return _tiny_composed(tiny_export, tmp_path_factory.mktemp("composed"), request.param)


def _run(path: Path, ids, params, rows, *, counts=None, outputs=None, logprobs=None):
    session = _session(path)
    session._model_path = str(path)
    feeds = _model_feeds(session, ids) | _sampler_feeds(
        session, params, rows, 49152, counts=counts, max_bias=2
    )
    if logprobs is not None:  # else the input's default: every slot asks for all of them
        feeds["sampler.logprobs"] = np.asarray(logprobs, np.int64)
    names = outputs or [o.name for o in session.get_outputs() if o.name.startswith("sampler.")]
    return dict(zip(names, session.run(names, feeds), strict=True))


def _log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    shifted = row - row.max()
    return shifted - np.log(np.exp(shifted).sum())


def test_composed_model_passes_the_checker(composed):
    onnx.checker.check_model(str(composed), full_check=True)


def test_gather_layout_is_recorded(composed):
    meta = composed_metadata(onnx.load(str(composed), load_external_data=False))
    assert meta.gather == composed.stem
    assert meta.max_slots == SLOTS and meta.top_logprobs == 3 and meta.max_bias == 2
    assert meta.chain == SamplerChain.full()
    assert meta.contract == "1"


def test_the_row_blocks_are_the_vocabularys(composed):
    """The composed functions know the vocabulary: RowBlocks is one Reshape by its sizes."""
    model = onnx.load(str(composed), load_external_data=False)
    (function,) = [f for f in model.functions if f.name == "RowBlocks"]
    assert [n.op_type for n in function.node if n.op_type != "Constant"] == ["Reshape"]
    assert function.doc_string == "RowBlocks for V = 49152: w = 256."


@pytest.mark.parametrize("rows", [[5, 10, 1, 6], [1, 2, 3, 4], [10, 0, 0, 7]])
def test_greedy_slots_return_the_plain_models_argmax(composed, prompt_ids, plain_logits, rows):
    greedy = [SamplingParams(temperature=0.0) if r else None for r in rows]
    out = _run(composed, prompt_ids, greedy, rows)
    for slot, row in enumerate(rows):
        if row == 0:
            continue
        expected = plain_logits[row - 1]
        assert out["sampler.next_token"][slot] == int(np.argmax(expected))
        ref = _log_softmax(expected)
        np.testing.assert_allclose(out["sampler.logprob"][slot], ref.max(), atol=1e-4)
        top = np.argsort(-ref, kind="stable")[:3]
        np.testing.assert_array_equal(out["sampler.top_logprob_ids"][slot], top)
        np.testing.assert_allclose(out["sampler.top_logprobs"][slot], ref[top], atol=1e-4)


def test_every_slot_asks_for_every_logprob_by_default_with_the_temperature_first(composed):
    """The inputs with a default: a host that binds neither gets every logprob, and the
    temperature before the cuts."""
    session = _session(composed)
    defaults = {d.name: (d.type, d.shape) for d in session.get_overridable_initializers()}
    assert defaults == {
        "sampler.logprobs": ("tensor(int64)", [SLOTS]),
        "sampler.temperature_last": ("tensor(bool)", [SLOTS]),
    }
    model = onnx.load(str(composed), load_external_data=False)
    values = {t.name: onnx.numpy_helper.to_array(t).tolist() for t in model.graph.initializer}
    assert values["sampler.logprobs"] == [3] * SLOTS
    assert values["sampler.temperature_last"] == [False] * SLOTS


@pytest.mark.parametrize(
    "asked",
    [[-1, -1, -1, -1], [0, 0, -1, 0], [3, -1, 0, 2], [1, 1, 1, 1]],
    ids=["none", "chosen-only", "mixed", "all"],
)
def test_logprobs_are_computed_when_a_slot_asks(composed, prompt_ids, asked):
    """``sampler.logprobs`` (−1 none, n the chosen token's and the n most likely): a slot that
    asks gets the numbers it gets by default, whatever the others ask; every slot keeps its token;
    a step in which no slot asks for logprobs, or for top ones, returns zeros in their place."""
    rows = [5, 10, 1, 6]
    params = [SamplingParams(temperature=t) for t in (0.0, 0.7, 0.0, 1.0)]
    default = _run(composed, prompt_ids, params, rows)
    out = _run(composed, prompt_ids, params, rows, logprobs=asked)
    np.testing.assert_array_equal(out["sampler.next_token"], default["sampler.next_token"])
    tops = ["sampler.top_logprob_ids", "sampler.top_logprobs"]
    for slot, n in enumerate(asked):
        if n >= 0:
            assert out["sampler.logprob"][slot] == default["sampler.logprob"][slot]
        if n >= 1:
            for name in tops:
                np.testing.assert_array_equal(out[name][slot], default[name][slot])
    if max(asked) < 0:
        assert not out["sampler.logprob"].any()
    if max(asked) < 1:
        assert not any(out[name].any() for name in tops)


def test_slots_with_different_parameters_in_one_batch(composed, prompt_ids, plain_logits):
    rows = [5, 10, 3, 0]
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, top_k=5, seed=1),
        SamplingParams(temperature=1.0, logit_bias={123: 100.0}),
        None,
    ]
    for seed in range(5):
        session = _session(composed)
        session._model_path = str(composed)
        feeds = _model_feeds(session, prompt_ids) | _sampler_feeds(
            session, params, rows, 49152, max_bias=2, seed=seed
        )
        tokens = session.run(["sampler.next_token"], feeds)[0]
        assert tokens[0] == np.argmax(plain_logits[4])
        assert tokens[1] in np.argsort(-plain_logits[9])[:5]
        assert tokens[2] == 123  # a +100 bias dominates a random model's logits
        assert 0 <= tokens[3] < 49152


def test_inactive_slot_keeps_its_state(composed, prompt_ids):
    counts = np.zeros((SLOTS, 49152), np.int32)
    counts[3, [5, 9]] = [2, 1]
    counts[0, 7] = 4
    rows = [2, 4, 6, 0]
    params = [SamplingParams(temperature=0.0)] * 3 + [None]
    out = _run(composed, prompt_ids, params, rows, counts=counts)
    new = out["sampler.output_counts_out"]
    np.testing.assert_array_equal(new[3], counts[3])
    for slot in range(3):
        expected = counts[slot].copy()
        expected[out["sampler.next_token"][slot]] += 1
        np.testing.assert_array_equal(new[slot], expected)


def test_moved_gather_matches_the_full_logits(tiny_export, tmp_path, prompt_ids):
    kwargs = dict(max_slots=SLOTS, top_logprobs=3, output_probs=True)
    moved = compose(
        tiny_export.output,
        "temperature,top_k,dist",
        tmp_path / "m.onnx",
        gather="lm_head",
        **kwargs,
    )
    full = compose(
        tiny_export.output, "temperature,top_k,dist", tmp_path / "f.onnx", gather="logits", **kwargs
    )
    rows = [10, 1, 6, 3]
    params = [SamplingParams(temperature=0.7, top_k=50, seed=s) for s in range(SLOTS)]
    a = _run(moved, prompt_ids, params, rows)
    b = _run(full, prompt_ids, params, rows)
    np.testing.assert_array_equal(a["sampler.next_token"], b["sampler.next_token"])
    np.testing.assert_allclose(a["sampler.probs"], b["sampler.probs"], atol=1e-6)
    np.testing.assert_allclose(a["sampler.top_logprobs"], b["sampler.top_logprobs"], atol=1e-5)


def test_moved_gather_drops_the_full_logits(tiny_export, tmp_path):
    moved = onnx.load(str(compose(tiny_export.output, None, tmp_path / "m.onnx", gather="lm_head")))
    assert "logits" not in [o.name for o in moved.graph.output]
    matmuls = [n for n in moved.graph.node if n.op_type == "MatMul" and n.output[0] == "logits"]
    assert not matmuls, "the [B, T, V] LM head should be gone"


def test_chain_is_a_local_function_and_inline_removes_it(tiny_export, tmp_path, prompt_ids):
    functions = onnx.load(
        str(compose(tiny_export.output, None, tmp_path / "f.onnx", max_slots=SLOTS))
    )
    assert any(
        n.op_type == "SamplerChain" and n.domain == "onnxsample" for n in functions.graph.node
    )
    assert {f.domain for f in functions.functions} == {"onnxsample"}
    inlined_path = compose(
        tiny_export.output, None, tmp_path / "i.onnx", max_slots=SLOTS, inline=True
    )
    inlined = onnx.load(str(inlined_path))
    assert not inlined.functions
    assert all(n.domain in ("", "ai.onnx") for n in inlined.graph.node)
    pruned = ir.load(inlined_path)
    nodes = sum(1 for _ in pruned.graph.all_nodes())
    ir.passes.common.RemoveUnusedNodesPass()(pruned)
    assert sum(1 for _ in pruned.graph.all_nodes()) == nodes, "nodes nothing reads"
    rows = [5, 10, 0, 0]
    params = [SamplingParams(temperature=0.0)] * 2 + [None, None]
    a = _run(tmp_path / "f.onnx", prompt_ids, params, rows)
    b = _run(inlined_path, prompt_ids, params, rows)
    np.testing.assert_array_equal(a["sampler.next_token"], b["sampler.next_token"])


@pytest.mark.parametrize(
    "options",
    [
        {"top_logprobs": 3, "prompt_logprobs": True, "draft_tokens": 2, "allowed_tokens": True},
        {"static": True, "output_candidates": 4, "draft_tokens": 0},
        {"output_probs": True, "draft_tokens": 0},
    ],
    ids=["drafts-prompt-logprobs", "static-candidates", "probs"],
)
def test_added_inputs_and_outputs_carry_doc_strings(tiny_gqa_export, tmp_path, options):
    """Every sampler input and output says what it holds (inspect and Netron show it)."""
    path = compose(tiny_gqa_export.output, None, tmp_path / "c.onnx", max_slots=2, **options)
    model = onnx.load(str(path), load_external_data=False)
    values = [*model.graph.input, *model.graph.output]
    docs = {v.name: v.doc_string for v in values if v.name.startswith("sampler.")}
    assert len(docs) > 10 and all(docs.values()), [name for name, doc in docs.items() if not doc]


def test_greedy_only_chain_composes_and_returns_the_argmax(
    tiny_export, tmp_path, prompt_ids, plain_logits
):
    path = compose(tiny_export.output, "", tmp_path / "greedy.onnx", max_slots=SLOTS)
    assert composed_metadata(onnx.load(str(path), load_external_data=False)).gather == "lm_head"
    rows = [5, 10, 0, 1]
    out = _run(path, prompt_ids, [None] * SLOTS, rows)  # a greedy chain has no parameters
    for slot, row in enumerate(rows):
        if row:
            assert out["sampler.next_token"][slot] == int(np.argmax(plain_logits[row - 1]))


@pytest.fixture(scope="session", params=["lm_head", "logits"])
def with_prompt_logprobs(request, tiny_export, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("prompt")
    return _tiny_composed(tiny_export, folder, request.param, prompt_logprobs=True)


@pytest.mark.parametrize(
    "prompt_rows",
    [
        list(range(1, BATCH * SEQ + 1)),  # every position of both rows
        [3, 1, 7],
        [],  # a decode step: nothing asked, nothing computed
    ],
)
def test_prompt_logprobs_are_the_plain_models_log_softmax(
    with_prompt_logprobs, composed, prompt_ids, plain_logits, prompt_rows
):
    meta = composed_metadata(with_prompt_logprobs)
    assert meta.prompt_logprobs
    onnx.checker.check_model(str(with_prompt_logprobs), full_check=True)
    rng = np.random.default_rng(len(prompt_rows))
    targets = rng.integers(0, 49152, len(prompt_rows))
    rows = [5, 0, 10, 1]
    params = [SamplingParams(temperature=0.0) if r else None for r in rows]
    session = _session(with_prompt_logprobs)
    session._model_path = str(with_prompt_logprobs)
    feeds = _model_feeds(session, prompt_ids) | _sampler_feeds(
        session, params, rows, 49152, max_bias=2
    )
    feeds["sampler.prompt_rows"] = np.asarray(prompt_rows, np.int64)
    feeds["sampler.prompt_targets"] = targets.astype(np.int64)
    names = [o.name for o in session.get_outputs() if o.name.startswith("sampler.")]
    out = dict(zip(names, session.run(names, feeds), strict=True))
    assert out["sampler.prompt_logprob"].shape == (len(prompt_rows),)
    assert out["sampler.prompt_top_logprob_ids"].shape == (len(prompt_rows), 3)
    for i, (row, target) in enumerate(zip(prompt_rows, targets, strict=True)):
        ref = _log_softmax(plain_logits[row - 1])
        np.testing.assert_allclose(out["sampler.prompt_logprob"][i], ref[target], atol=1e-4)
        top = np.argsort(-ref, kind="stable")[:3]
        np.testing.assert_array_equal(out["sampler.prompt_top_logprob_ids"][i], top)
        np.testing.assert_allclose(out["sampler.prompt_top_logprobs"][i], ref[top], atol=1e-4)
    # The slots' outputs are what the graph without prompt logprobs gives.
    plain = _run(composed, prompt_ids, params, rows) if composed.stem == meta.gather else None
    if plain is not None:
        for name, value in plain.items():
            np.testing.assert_array_equal(out[name], value, err_msg=name)
