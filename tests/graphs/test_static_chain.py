"""The static chain (no control flow, no data-dependent shape) against the branching chain: the same
outputs bit for bit on llama.cpp's tables, random rows of every parameter mix and the edge rows, and
a graph a CUDA graph can capture."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx.inliner
import pytest
from _host_fallback import host_fallback, read_by, redraw

from onnxsample import SamplingParams, sampler_feeds
from onnxsample.composer.sampler_model import build_sampler_model, sampler_session
from onnxsample.engine._fallback import FALLBACK_FLAGS, FALLBACK_ROWS
from onnxsample.graphs import STATIC_CANDIDATES

FULL = "logit_bias,penalties,temperature,top_k,top_p,min_p,typical_p,dist"
OPTIONS = dict(top_logprobs=3, max_bias=4, output_probs=True, prompt_logprobs=True)
_session = functools.cache(sampler_session)


def _both(chain: str, feeds: dict, slots: int, **options) -> tuple[dict, dict, list[int]]:
    """Both chains' outputs by name, the static one's flagged slots redrawn on the host (its
    fallback outputs dropped), and those slots."""
    vocab = feeds["logits"].shape[1]
    branching = _session(chain, vocab, slots, **options)
    static = _session(chain, vocab, slots, static=True, **options)
    names = [o.name for o in branching.get_outputs()]
    static_names = [o.name for o in static.get_outputs()]
    extra = [n for n in static_names if n not in names]
    assert [n for n in static_names if n in names] == names
    a = dict(zip(names, branching.run(None, feeds), strict=True))
    b = dict(zip(static_names, static.run(None, read_by(static, feeds)), strict=True))
    flagged = []
    if extra:
        assert extra == [FALLBACK_FLAGS, FALLBACK_ROWS]
        np.testing.assert_array_equal(b[FALLBACK_ROWS], feeds["logits"][feeds["sampler.row_index"]])
        flagged = redraw(host_fallback(chain, vocab, slots, **options), b, feeds)
        del b[FALLBACK_FLAGS], b[FALLBACK_ROWS]
    return a, b, flagged


def _assert_same(chain: str, feeds: dict, slots: int, **options) -> dict[str, np.ndarray]:
    a, b, flagged = _both(chain, feeds, slots, **options)
    for name, x in a.items():
        np.testing.assert_array_equal(x, b[name], err_msg=name)
    b["flagged"] = flagged
    return b


@pytest.mark.parametrize("static", [False, True])
def test_a_host_loop_runs_either_chain_with_the_packed_parameters(static):
    # A host that packs parameters as before the temperature could move: the static chain
    # reads no ``sampler.temperature_last`` and the branching one defaults it to false.
    chain, logits = (
        "temperature,top_p,dist",
        np.log(np.array([[1.0, 1.0, 2.0, 4.0]] * 3, np.float32)),
    )
    feeds = sampler_feeds(chain, logits, [SamplingParams(temperature=0.7, top_p=0.9)] * 2)
    session = _session(chain, 4, 2, static=static)
    names = [o.name for o in session.get_outputs()]
    tokens = dict(zip(names, session.run(None, feeds), strict=True))["sampler.next_token"]
    assert tokens.tolist() == [3, 3]


LLAMA = np.log(np.array([[0.1, 0.2, 0.3, 0.4]], dtype=np.float32))


@pytest.mark.parametrize(
    ("chain", "params", "kept"),
    [
        ("top_k,dist", SamplingParams(top_k=3), 3),
        ("top_p,dist", SamplingParams(top_p=0.7), 2),  # an exact float32 tie: 2 tokens
        ("top_p,dist", SamplingParams(top_p=0.8), 3),
        ("min_p,dist", SamplingParams(min_p=0.26), 3),
        ("typical_p,dist", SamplingParams(typical_p=0.5), None),
        ("top_k,top_p,min_p,dist", SamplingParams(top_k=3, top_p=0.7), 2),
        (FULL, SamplingParams(top_k=3, top_p=0.8, min_p=0.05), 3),
        # p ∝ p² at temperature 0.5: the nucleus of 0.8 is 2 tokens; of the untempered row, 3
        ("temperature,top_p,dist", SamplingParams(temperature=0.5, top_p=0.8), 2),
        (
            "temperature,top_p,dist",
            SamplingParams(temperature=0.5, top_p=0.8, temperature_last=True),
            3,
        ),
    ],
)
def test_llama_cpp_tables(chain, params, kept):
    for rows in (LLAMA, LLAMA[:, ::-1].copy()):
        padded = np.vstack([np.zeros((1, 4), np.float32), rows])
        for u in (0.0, 0.3, 0.6, 0.99):
            feeds = sampler_feeds(chain, padded, [params], uniform=[u])
            out = _assert_same(chain, feeds, 1, output_probs=True)
            if kept is not None:
                assert np.count_nonzero(out["sampler.probs"][0]) == kept


def _random_params(rng: np.random.Generator, vocab: int) -> SamplingParams | None:
    if rng.random() < 0.15:
        return None
    return SamplingParams(
        temperature=float(rng.choice([0.0, 0.5, 1.0, 1.7])),
        top_k=int(rng.choice([0, 1, 5, 63, 64, 65, 200, vocab - 1, vocab + 10])),
        top_p=float(rng.choice([1.0, 0.9, 0.5, 0.99, 0.9999])),
        min_p=float(rng.choice([0.0, 0.0, 0.05])),
        typical_p=float(rng.choice([1.0, 1.0, 0.9])),
        repetition_penalty=float(rng.choice([1.0, 1.3])),
        presence_penalty=float(rng.choice([0.0, 0.5])),
        frequency_penalty=float(rng.choice([0.0, -0.4])),
        logit_bias={int(rng.integers(vocab)): float(rng.uniform(-5, 5))},
    )


@pytest.mark.parametrize("vocab", [300, 2000, 6000])
@pytest.mark.parametrize("seed", range(6))
def test_random_rows_every_parameter_mix(vocab, seed):
    """Flat rows (the nucleus beyond the candidates, then beyond the wider set) and peaked ones."""
    rng, order = np.random.default_rng(seed), np.random.default_rng(100 + seed)
    slots = 6
    flagged = 0
    for _ in range(8):
        scale = rng.choice([0.3, 1.0, 4.0])
        logits = rng.normal(0, scale, (slots + 1, vocab)).astype(np.float32)
        params = [_random_params(rng, vocab) for _ in range(slots)]
        for p in filter(None, params):  # from a generator of their own: the rows stay as they were
            p.temperature_last = bool(order.random() < 0.4)
        mask = rng.random((slots, vocab)) < 0.05
        counts = ((rng.random((slots, vocab)) < 0.05) * rng.integers(1, 4, (slots, vocab))).astype(
            np.int32
        )
        feeds = sampler_feeds(
            FULL,
            logits,
            params,
            uniform=rng.random(slots),
            prompt_mask=mask,
            output_counts=counts,
            max_bias=4,
            prompt_rows=rng.integers(0, slots + 1, 3),
            prompt_targets=rng.integers(0, vocab, 3),
        )
        out = _assert_same(FULL, feeds, slots, **OPTIONS)
        # past the candidates: top-k's or top-p's flag, not typical-p's (always the host's)
        flagged += sum(params[s].typical_p == 1.0 for s in out["flagged"])
    assert flagged or vocab < STATIC_CANDIDATES  # the host's fallback took some slot


FLAT = np.zeros((1, 10000), np.float32)
PEAKED = -np.arange(10000, dtype=np.float32)[None] / 64


@pytest.mark.parametrize(
    ("rows", "params", "flagged"),
    [
        (FLAT, SamplingParams(top_k=STATIC_CANDIDATES), False),
        (FLAT, SamplingParams(top_k=STATIC_CANDIDATES + 1), True),
        (FLAT, SamplingParams(top_k=STATIC_CANDIDATES + 1, temperature=0.0), False),  # greedy
        (PEAKED, SamplingParams(top_k=9999), True),  # V − 1: on, past the candidates
        (PEAKED, SamplingParams(top_k=10000), False),  # V: off
        (PEAKED, SamplingParams(top_k=12345, top_p=0.9), False),  # past V: off
        (FLAT, SamplingParams(top_p=0.4), False),  # 4000 of 10000 equal tokens
        (FLAT, SamplingParams(top_p=0.6), True),  # 6000
        (PEAKED, SamplingParams(top_p=0.999), False),
        (FLAT, SamplingParams(min_p=0.5), False),  # a floor: the whole row draws it
        # typical-p on: its set follows another order than the logits', drawn on the host
        (FLAT, SamplingParams(typical_p=0.02), True),
        (PEAKED, SamplingParams(typical_p=0.5), True),
        (PEAKED, SamplingParams(typical_p=0.5, temperature=0.0), False),  # greedy
        (PEAKED, SamplingParams(typical_p=1.0), False),  # off
        (FLAT, SamplingParams(), False),
    ],
)
def test_the_static_chain_flags_the_slots_past_its_candidates(rows, params, flagged):
    chain = "temperature,top_k,top_p,min_p,typical_p,dist"
    padded = np.vstack([np.zeros_like(rows), rows])
    feeds = sampler_feeds(chain, padded, [params, None], uniform=[0.37, 0.5])
    out = _assert_same(chain, feeds, 2, output_probs=True)
    assert out["flagged"] == ([0] if flagged else [])


@pytest.mark.parametrize(
    ("chain", "slots", "flagged"),
    [
        (
            FULL,
            [
                SamplingParams(temperature=0.0, typical_p=0.5),
                SamplingParams(typical_p=0.5, seed=1),
                SamplingParams(temperature=0.0),
                SamplingParams(top_k=7, seed=2),
            ],
            [0, 1],
        ),
        (  # a chain that never draws
            "temperature,top_k,min_p,typical_p",
            [
                SamplingParams(temperature=0.0, typical_p=0.5),
                SamplingParams(temperature=0.0, top_k=3),
                SamplingParams(temperature=0.0, typical_p=0.9, min_p=0.1),
                SamplingParams(temperature=0.0),
            ],
            [0, 2],
        ),
    ],
    ids=["drawing", "greedy-chain"],
)
def test_the_candidates_output_shows_typical_ps_kept_set_for_greedy_slots_too(
    chain, slots, flagged
):
    """The candidates output is the kept set, typical-p's cut included, greedy slots' too: a static
    chain that shows it hands the host every slot with typical-p on, drawing or not."""
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 2, (5, 300)).astype(np.float32)
    feeds = sampler_feeds(chain, logits, slots, uniform=[0.3, 0.6, 0.1, 0.9])
    out = _assert_same(chain, feeds, 4, output_candidates=8)
    assert out["flagged"] == flagged


def test_a_callers_own_top_k_past_the_vocabulary_is_drawn_on_the_host():
    """The engine packs a top_k ≥ V as 0; a caller feeding one itself gets its slot flagged, and
    the host's draw keeps every token, as the branching chain does."""
    chain = "temperature,top_k,top_p,min_p,typical_p,dist"
    padded = np.vstack([np.zeros_like(PEAKED), PEAKED])
    feeds = sampler_feeds(chain, padded, [SamplingParams(top_p=0.9), None], uniform=[0.37, 0.5])
    feeds["sampler.top_k"] = np.array([PEAKED.shape[1] + 5, 0], np.int64)
    assert _assert_same(chain, feeds, 2)["flagged"] == [0]


def _edge_rows(vocab: int) -> np.ndarray:
    rows = np.zeros((7, vocab), np.float32)
    rows[1] = np.nan
    rows[2] = -np.inf
    rows[3] = -np.inf
    rows[3, vocab // 2] = 0.5  # one finite logit
    rows[4, ::2], rows[4, 1::2] = 1e30, -1e30
    rows[5, min(3, vocab - 1)] = np.inf
    rows[6] = np.linspace(-3, 3, vocab)
    return rows


@pytest.mark.parametrize("vocab", [1, 5, 300])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=2, top_p=0.9, min_p=0.1, typical_p=0.8),
        SamplingParams(repetition_penalty=1.5, presence_penalty=1.0, frequency_penalty=1.0),
    ],
    ids=["neutral", "greedy", "filters", "penalties"],
)
def test_edge_rows(vocab, params):
    rows = _edge_rows(vocab)
    slots = rows.shape[0] - 1
    counts = np.ones((slots, vocab), np.int32)
    feeds = sampler_feeds(
        FULL,
        rows,
        [params] * slots,
        uniform=np.linspace(0, 0.99, slots),
        output_counts=counts,
        max_bias=4,
        prompt_rows=[1, 2, 3],
        prompt_targets=[0, 0, 0],
    )
    options = {**OPTIONS, "top_logprobs": min(3, vocab)}
    out = _assert_same(FULL, feeds, slots, **options)
    assert not np.isnan(out["sampler.logprob"]).any()


def test_empty_prompt_rows_and_inactive_slots():
    """Zero prompt rows and no active slot: the reductions the CUDA provider refuses on an empty
    axis (keepdims=0) are gone from both chains, and both agree."""
    logits = np.random.default_rng(0).normal(size=(1, 50)).astype(np.float32)
    feeds = sampler_feeds(FULL, logits, [None] * 3, max_bias=4, prompt_rows=[], prompt_targets=[])
    out = _assert_same(FULL, feeds, 3, **OPTIONS)
    assert out["sampler.prompt_logprob"].shape == (0,)


def _all_nodes(model: onnx.ModelProto):
    inlined = onnx.inliner.inline_local_functions(model)
    stack = [inlined.graph]
    while stack:
        graph = stack.pop()
        for node in graph.node:
            yield node
            stack += [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]


@pytest.mark.parametrize("chain", [FULL, "temperature,top_k,top_p,dist", "", "penalties"])
def test_static_graph_has_no_control_flow(chain):
    options = {**OPTIONS, "max_bias": 4 if "logit_bias" in chain else 0}
    model = build_sampler_model(chain, 1000, 4, static=True, **options)
    onnx.checker.check_model(model, full_check=True)
    ops = {node.op_type for node in _all_nodes(model)}
    assert not ops & {"If", "Loop", "Scan", "NonZero"}, ops
    branching = {
        node.op_type for node in _all_nodes(build_sampler_model(chain, 1000, 4, **options))
    }
    if chain:
        assert "If" in branching  # the branching chain skips work no slot needs
