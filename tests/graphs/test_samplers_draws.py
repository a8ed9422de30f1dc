"""The draw and the slots: χ² goodness of fit, the support invariant, reproducibility, independence
from the rest of the batch, several slots with different parameters, inactive slots and the
output-count state, and property tests over the parameter space."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnxsample import InvalidParameter, SamplingParams, sampler_feeds
from onnxsample.composer.sampler_model import sampler_session
from onnxsample.graphs import BLOCK, CANDIDATES
from onnxsample.reference import run_chain

FULL = "logit_bias,penalties,temperature,top_k,top_p,min_p,typical_p,dist"
CHI2_LIMIT = 40.5  # df 7, α = 1e-6
DRAWS = 100_000


# One checked, single-threaded session per chain and options, shared by the tests.
_session = functools.cache(sampler_session)


def _run(chain: str, feeds: dict, slots: int, **options) -> dict[str, np.ndarray]:
    session = _session(chain, feeds["logits"].shape[1], slots, **options)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def _uniforms(seed: int, n: int) -> np.ndarray:
    return np.random.Generator(np.random.Philox(seed)).random(n, dtype=np.float32)


PROBS = np.array([0.02, 0.3, 0.05, 0.08, 0.15, 0.1, 0.2, 0.1])


@pytest.mark.parametrize(
    ("chain", "params", "expected"),
    [
        ("dist", SamplingParams(), PROBS),
        ("temperature,dist", SamplingParams(temperature=1.0), PROBS),
        (
            "temperature,dist",
            SamplingParams(temperature=2.0),
            np.sqrt(PROBS) / np.sqrt(PROBS).sum(),
        ),
        ("top_k,dist", SamplingParams(top_k=0), PROBS),
        ("top_k,dist", SamplingParams(top_k=3), np.where(PROBS >= 0.15, PROBS, 0) / 0.65),
        ("top_p,dist", SamplingParams(top_p=0.6), np.where(PROBS >= 0.15, PROBS, 0) / 0.65),
        ("min_p,dist", SamplingParams(min_p=0.3), np.where(PROBS >= 0.09, PROBS, 0) / 0.85),
        (FULL, SamplingParams(), PROBS),
    ],
)
def test_chi_square_of_draws(chain, params, expected):
    """N = 1e5 seeded draws of one slot, made in one call of a model with 1e5 slots."""
    logits = np.vstack([np.zeros(8), np.log(PROBS)]).astype(np.float32)
    feeds = sampler_feeds(
        chain, logits, [params] * DRAWS, uniform=_uniforms(42, DRAWS), row_index=np.ones(DRAWS)
    )
    tokens = _run(chain, feeds, DRAWS)["sampler.next_token"]
    counts = np.bincount(tokens, minlength=8)
    support = expected > 0
    assert np.all(counts[~support] == 0), "a token outside the kept set was drawn"
    exp_counts = expected[support] * DRAWS
    chi2 = float(np.sum((counts[support] - exp_counts) ** 2 / exp_counts))
    assert chi2 < CHI2_LIMIT, (chi2, counts)


def test_chi_square_detects_a_wrong_distribution():
    """The χ² check above can fail: the draws of PROBS do not fit a uniform distribution."""
    logits = np.vstack([np.zeros(8), np.log(PROBS)]).astype(np.float32)
    feeds = sampler_feeds(
        "dist",
        logits,
        [SamplingParams()] * DRAWS,
        uniform=_uniforms(1, DRAWS),
        row_index=np.ones(DRAWS),
    )
    counts = np.bincount(_run("dist", feeds, DRAWS)["sampler.next_token"], minlength=8)
    assert np.sum((counts - DRAWS / 8) ** 2 / (DRAWS / 8)) > CHI2_LIMIT


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(top_k=5),
        SamplingParams(top_p=0.5),
        SamplingParams(min_p=0.2),
        SamplingParams(typical_p=0.5),
        SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05),
        SamplingParams(temperature=1.5, top_p=0.95, typical_p=0.9),
    ],
)
@pytest.mark.parametrize("vocab", [40, 3 * CANDIDATES + 5])
def test_support_invariant(params, vocab):
    """No draw ever lands outside the kept set (the non-zero entries of ``sampler.probs``)."""
    n = 2000
    rng = np.random.default_rng(vocab)
    logits = (rng.normal(size=(n + 1, vocab)) * 2).astype(np.float32)
    feeds = sampler_feeds(FULL, logits, [params] * n, uniform=_uniforms(3, n))
    out = _run(FULL, feeds, n, output_probs=True)
    kept = np.take_along_axis(out["sampler.probs"], out["sampler.next_token"][:, None], 1)
    assert np.all(kept > 0)
    reference = run_chain(FULL, feeds, output_probs=True)
    np.testing.assert_array_equal(out["sampler.next_token"], reference["sampler.next_token"])


@pytest.mark.parametrize("u", [0.0, 1e-9, 0.5, 0.999999, np.nextafter(np.float32(1), 0)])
def test_uniform_extremes_stay_in_the_kept_set(u):
    logits = np.array([[0] * 6, [-np.inf, 1.0, -np.inf, 2.0, 0.5, -np.inf]], dtype=np.float32)
    feeds = sampler_feeds(FULL, logits, [SamplingParams(top_k=2)], uniform=[u])
    token = _run(FULL, feeds, 1)["sampler.next_token"][0]
    assert token in (1, 3)
    assert token == (1 if u < 0.2 else 3)


def test_same_uniforms_same_tokens_whatever_the_batch():
    """A slot's token depends on its row, its parameters and its uniform only: not on the other
    slots, nor on which internal path (candidates or whole row) they take."""
    rng = np.random.default_rng(9)
    vocab, slots = 3 * CANDIDATES, 6
    logits = (rng.normal(size=(slots + 1, vocab)) * 2).astype(np.float32)
    params = [
        SamplingParams(temperature=0.8, top_k=10),
        SamplingParams(temperature=1.2),  # whole-row draw
        SamplingParams(top_p=0.99, typical_p=0.8),
        SamplingParams(temperature=0.0),
        SamplingParams(min_p=0.1, top_k=vocab + 5),
        SamplingParams(top_k=2 * CANDIDATES, top_p=0.999),  # beyond the candidates
    ]
    for draw in range(5):
        u = _uniforms(draw, slots)
        together = _run(FULL, sampler_feeds(FULL, logits, params, uniform=u), slots)
        again = _run(FULL, sampler_feeds(FULL, logits, params, uniform=u), slots)
        np.testing.assert_array_equal(together["sampler.next_token"], again["sampler.next_token"])
        for s in range(slots):
            alone = [None] * slots
            alone[s] = params[s]
            feeds = sampler_feeds(FULL, logits, alone, uniform=u)
            token = _run(FULL, feeds, slots)["sampler.next_token"][s]
            assert token == together["sampler.next_token"][s], (s, draw)


# (live tokens, blocks they crowd into): a few of the draw's blocks (the ids ≡ j modulo the
# number of blocks) with several kept tokens each, where a block's sum and a running sum over the
# kept tokens could round apart
AGREEING = [(10, 1), (12, 3), (CANDIDATES - 1, 4), (40, 5)]


@pytest.mark.parametrize(("live", "crowded"), AGREEING)
def test_candidate_and_whole_row_draws_agree_at_every_boundary(live, crowded):
    """The same kept set drawn through the candidates (a top-k floor inside them) and through
    the whole row (no floor) gives the same token for the same uniform, also for the uniforms
    that land on the running sum's boundaries: the two draws add the same weights in the same
    order (a running sum per block, then the blocks' sums), so no float rounding tells them
    apart."""
    rng = np.random.default_rng(live * 100 + crowded)
    vocab, rows = 1100, 12
    blocks = -(-vocab // BLOCK)
    order = np.lexsort((np.arange(vocab) // blocks, np.arange(vocab) % blocks))  # the draw's
    logits = np.full((rows, vocab), -np.inf, dtype=np.float32)
    for row in logits:
        crowd = rng.choice(blocks, size=crowded, replace=False)
        pool = np.flatnonzero(np.isin(np.arange(vocab) % blocks, crowd))
        row[rng.choice(pool, size=live, replace=False)] = rng.normal(scale=1.5, size=live)
    # every boundary of the float32 running sum in the draw's order, and a few ulps either side
    uniforms, lines = [], []
    for r, row in enumerate(logits):
        w = np.exp(row[order] - row.max(), dtype=np.float32)
        cum = np.cumsum(w[w > 0], dtype=np.float32)
        for c in cum:
            near = np.float32(c / cum[-1])
            for step in range(-3, 4):
                u = near
                for _ in range(abs(step)):
                    u = np.nextafter(u, np.float32(np.sign(step)), dtype=np.float32)
                if 0 <= u < 1:
                    uniforms.append(u)
                    lines.append(r)
    u = np.asarray(uniforms, dtype=np.float32)
    n = len(u)
    draws = np.concatenate([logits[:1], logits[lines]])  # row 0: the dummy row
    every = [SamplingParams()] * n
    through_row = _run("top_k,dist", sampler_feeds("top_k,dist", draws, every, uniform=u), n)
    capped = [SamplingParams(top_k=live)] * n  # the floor at the last live logit: the candidates
    through_candidates = _run(
        "top_k,dist", sampler_feeds("top_k,dist", draws, capped, uniform=u), n
    )
    tokens = through_row["sampler.next_token"]
    np.testing.assert_array_equal(tokens, through_candidates["sampler.next_token"])
    assert np.isfinite(draws[np.arange(1, n + 1), tokens]).all()


def test_slots_with_different_parameters_in_one_call():
    rng = np.random.default_rng(21)
    vocab = 100
    logits = (rng.normal(size=(6, vocab)) * 3).astype(np.float32)
    params = [
        SamplingParams(temperature=0.0),
        None,
        SamplingParams(top_k=1, temperature=2.0),
        SamplingParams(top_p=1e-6),
        SamplingParams(min_p=1.0),
        SamplingParams(logit_bias={17: 100.0}, temperature=0.0),
    ]
    rows = [1, 0, 2, 3, 4, 5]
    feeds = sampler_feeds(FULL, logits, params, uniform=_uniforms(0, 6), row_index=rows, max_bias=2)
    out = _run(FULL, feeds, 6, max_bias=2)
    best = np.argmax(logits, axis=1)
    token = out["sampler.next_token"].tolist()
    assert token[:1] + token[2:] == [best[1], best[2], best[3], best[4], 17]
    assert 0 <= token[1] < vocab  # the inactive slot samples the dummy row
    expected = run_chain(FULL, feeds, max_bias=2)
    np.testing.assert_array_equal(out["sampler.next_token"], expected["sampler.next_token"])


def test_inactive_slots_and_state_update_over_steps():
    """output_counts_out = counts + one-hot(token) for active slots; inactive slots (row 0) get a
    valid token and leave their state unchanged, step after step."""
    rng = np.random.default_rng(30)
    vocab, slots, steps = 50, 4, 12
    params = [
        SamplingParams(frequency_penalty=0.5),
        None,
        SamplingParams(repetition_penalty=1.5),
        None,
    ]
    counts = np.zeros((slots, vocab), np.int32)
    counts[1, 7] = 3  # state of an inactive slot must survive untouched
    history = [[] for _ in range(slots)]
    for step in range(steps):
        logits = (rng.normal(size=(3, vocab)) * 2).astype(np.float32)
        feeds = sampler_feeds(
            FULL,
            logits,
            params,
            uniform=_uniforms(step, slots),
            output_counts=counts,
            row_index=[1, 0, 2, 0],
        )
        out = _run(FULL, feeds, slots)
        token = out["sampler.next_token"]
        assert np.all((token >= 0) & (token < vocab))
        expected = counts.copy()
        expected[0, token[0]] += 1
        expected[2, token[2]] += 1
        np.testing.assert_array_equal(out["sampler.output_counts_out"], expected)
        np.testing.assert_array_equal(run_chain(FULL, feeds)["sampler.output_counts_out"], expected)
        counts = out["sampler.output_counts_out"]
        for s in range(slots):
            history[s].append(token[s])
    assert counts[1, 7] == 3 and counts[1].sum() == 3 and counts[3].sum() == 0
    assert counts[0].sum() == steps and counts[2].sum() == steps
    np.testing.assert_array_equal(np.bincount(history[0], minlength=vocab), counts[0])


def test_frequency_penalty_changes_the_next_draw():
    """A token generated before is penalised on the next step (state read back)."""
    logits = np.array([[0, 0, 0], [5.0, 4.9, -3.0]], dtype=np.float32)
    params = [SamplingParams(temperature=0.0, frequency_penalty=2.0)]
    counts = np.zeros((1, 3), np.int32)
    first = _run(FULL, sampler_feeds(FULL, logits, params, output_counts=counts), 1)
    assert first["sampler.next_token"][0] == 0
    feeds = sampler_feeds(FULL, logits, params, output_counts=first["sampler.output_counts_out"])
    assert _run(FULL, feeds, 1)["sampler.next_token"][0] == 1


_BAD_FLOATS = st.one_of(
    st.sampled_from([float("nan"), float("inf"), float("-inf"), -1e-9, 1.0000001, 1e30]),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
)


def _maybe_bad(draw, valid, invalid=_BAD_FLOATS):
    """Mostly a value from ``valid``; one time in 16 anything from ``invalid``."""
    return draw(invalid) if draw(st.integers(0, 15)) == 0 else draw(valid)


@st.composite
def _params(draw):
    unit = st.floats(0, 1)
    return SamplingParams(
        temperature=_maybe_bad(draw, st.one_of(st.just(0.0), st.floats(0, 5))),
        top_k=_maybe_bad(draw, st.integers(0, 80), st.integers(-5, -1)),
        top_p=_maybe_bad(draw, st.one_of(st.just(1.0), st.floats(1e-6, 1))),
        min_p=_maybe_bad(draw, unit),
        typical_p=_maybe_bad(draw, st.one_of(st.just(1.0), st.floats(1e-6, 1))),
        repetition_penalty=_maybe_bad(draw, st.floats(0.01, 5)),
        presence_penalty=_maybe_bad(draw, st.floats(-2, 2)),
        frequency_penalty=_maybe_bad(draw, st.floats(-2, 2)),
        logit_bias=_maybe_bad(
            draw,
            st.dictionaries(st.integers(0, 63), st.floats(-100, 100), max_size=2),
            st.dictionaries(st.integers(-2, 70), st.floats(-150, 150), min_size=1, max_size=2),
        ),
        top_logprobs=_maybe_bad(draw, st.integers(0, 20), st.integers(21, 30)),
    )


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=_params(), seed=st.integers(0, 2**16), u=st.floats(0, 1, exclude_max=True))
def test_property_invalid_is_rejected_or_a_valid_token(params, seed, u):
    vocab = 64
    try:
        params.validate(vocab_size=vocab)
    except InvalidParameter as err:
        message = str(err)
        assert " must be " in message and ", got " in message
        return
    rng = np.random.default_rng(seed)
    logits = (rng.normal(size=(3, vocab)) * rng.uniform(0.1, 10)).astype(np.float32)
    logits[2, rng.random(vocab) < 0.3] = -np.inf
    counts = (rng.random((2, vocab)) < 0.1).astype(np.int32)
    feeds = sampler_feeds(
        FULL, logits, [params, params], uniform=[u, 1 - u], output_counts=counts, max_bias=2
    )
    out = _run(FULL, feeds, 2, max_bias=2, output_probs=True, top_logprobs=20)
    token = out["sampler.next_token"]
    assert np.all((token >= 0) & (token < vocab))
    assert not np.isnan(out["sampler.logprob"]).any()
    assert not np.isnan(out["sampler.probs"]).any()
    assert np.all(np.take_along_axis(out["sampler.probs"], token[:, None], 1) > 0)
    np.testing.assert_allclose(out["sampler.probs"].sum(axis=1), 1, rtol=1e-5)


def test_neutral_slot_is_exact_no_op_next_to_active_slots():
    """A slot with every parameter neutral gets bit for bit the distribution and token of the bare
    ``dist`` chain, while its neighbours switch every sampler on (so every branch runs)."""
    rng = np.random.default_rng(44)
    vocab, slots = 3 * CANDIDATES, 4
    logits = (rng.normal(size=(slots + 1, vocab)) * 3).astype(np.float32)
    active = SamplingParams(
        temperature=0.7,
        top_k=20,
        top_p=0.8,
        min_p=0.05,
        typical_p=0.9,
        repetition_penalty=1.3,
        presence_penalty=0.5,
        frequency_penalty=0.2,
        logit_bias={3: 5.0},
    )
    params = [active, SamplingParams(), active, SamplingParams()]
    counts = (rng.random((slots, vocab)) < 0.2).astype(np.int32)
    prompt = rng.random((slots, vocab)) < 0.2
    u = _uniforms(8, slots)
    full = _run(
        FULL,
        sampler_feeds(
            FULL, logits, params, uniform=u, output_counts=counts, prompt_mask=prompt, max_bias=2
        ),
        slots,
        max_bias=2,
        output_probs=True,
    )
    bare = _run(
        "dist",
        sampler_feeds("dist", logits, [SamplingParams()] * slots, uniform=u),
        slots,
        output_probs=True,
    )
    for s in (1, 3):
        np.testing.assert_array_equal(full["sampler.probs"][s], bare["sampler.probs"][s])
        assert full["sampler.next_token"][s] == bare["sampler.next_token"][s]
    for s in (0, 2):
        assert np.count_nonzero(full["sampler.probs"][s]) <= 20


@pytest.mark.parametrize("vocab", [7, 256, 257, 50257, 151936])
@pytest.mark.parametrize("known", [False, True], ids=["generic", "known"])
def test_the_drawn_id_is_the_draws_order_at_every_place(vocab: int, known: bool) -> None:
    """``DrawnId``: place k of block j (j · BLOCK + k) is id k · B + j, B = ⌈V / BLOCK⌉; a known
    vocabulary makes it one lookup in a table of those ids (``drawn_id_for``), the same ids."""
    import onnxruntime as ort
    from _function_model import function_model
    from onnx import TensorProto, helper

    from onnxsample.graphs.dist import DrawnId, drawn_id_for

    blocks = -(-vocab // BLOCK)
    places = np.arange(blocks * BLOCK, dtype=np.int64).reshape(-1, 1)
    model = function_model(
        DrawnId,
        [
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, vocab]),
            helper.make_tensor_value_info("place", TensorProto.INT64, ["S", 1]),
        ],
        [helper.make_tensor_value_info("id", TensorProto.INT64, ["S", 1])],
        vocab=vocab if known else 0,
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (ids,) = session.run(None, {"z": np.zeros((1, vocab), np.float32), "place": places})
    k, j = places[:, 0] % BLOCK, places[:, 0] // BLOCK
    np.testing.assert_array_equal(ids[:, 0], k * blocks + j)
    assert sorted(ids[ids < vocab]) == list(range(vocab))  # every id once, padding past V
    if known:
        kinds = [n.op_type for n in drawn_id_for(vocab).node]
        assert kinds == ["Constant", "Gather"]
