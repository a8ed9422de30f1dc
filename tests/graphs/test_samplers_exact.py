"""Exact semantics: llama.cpp's filter tables, parity with transformers' logits processors, the
OpenAI penalty formula, and rows with non-finite logits."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from transformers.generation import logits_process as hf

from onnxsample import SamplingParams, sampler_feeds
from onnxsample.composer.sampler_model import sampler_session
from onnxsample.reference import run_chain

FULL = "logit_bias,penalties,temperature,top_k,top_p,min_p,typical_p,dist"


# One checked, single-threaded session per chain and options, shared by the tests.
_session = functools.cache(sampler_session)


def _run(chain: str, logits: np.ndarray, slots, **kwargs) -> dict[str, np.ndarray]:
    options = {
        k: kwargs.pop(k)
        for k in ("output_probs", "output_candidates", "top_logprobs", "max_bias")
        if k in kwargs
    }
    session = _session(chain, logits.shape[1], len(slots), **options)
    feeds = sampler_feeds(chain, logits, slots, max_bias=options.get("max_bias", 0), **kwargs)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def _probs(chain: str, rows: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The final distribution of every row of ``rows`` (one slot per row)."""
    padded = np.vstack([np.zeros((1, rows.shape[1]), np.float32), rows]).astype(np.float32)
    return _run(chain, padded, [params] * len(rows), output_probs=True)["sampler.probs"]


LLAMA = np.log(np.array([[0.1, 0.2, 0.3, 0.4]], dtype=np.float32))


@pytest.mark.parametrize(
    ("chain", "params", "expected"),
    [
        ("top_k,dist", SamplingParams(top_k=1), [1.0]),
        ("top_k,dist", SamplingParams(top_k=3), [0.44444, 0.33333, 0.22222]),
        ("top_k,dist", SamplingParams(top_k=4), [0.4, 0.3, 0.2, 0.1]),
        ("top_k,dist", SamplingParams(top_k=0), [0.4, 0.3, 0.2, 0.1]),
        ("top_p,dist", SamplingParams(top_p=1e-6), [1.0]),
        ("top_p,dist", SamplingParams(top_p=0.7), [0.571429, 0.428571]),
        ("top_p,dist", SamplingParams(top_p=0.8), [0.44444, 0.33333, 0.22222]),
        ("top_p,dist", SamplingParams(top_p=1.0), [0.4, 0.3, 0.2, 0.1]),
        ("min_p,dist", SamplingParams(min_p=0.0), [0.4, 0.3, 0.2, 0.1]),
        ("min_p,dist", SamplingParams(min_p=0.24), [0.4, 0.3, 0.2, 0.1]),
        ("min_p,dist", SamplingParams(min_p=0.26), [0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9]),
        ("min_p,dist", SamplingParams(min_p=0.49), [0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9]),
        ("min_p,dist", SamplingParams(min_p=0.51), [0.4 / 0.7, 0.3 / 0.7]),
        ("min_p,dist", SamplingParams(min_p=0.74), [0.4 / 0.7, 0.3 / 0.7]),
        ("min_p,dist", SamplingParams(min_p=0.76), [1.0]),
        ("min_p,dist", SamplingParams(min_p=1.0), [1.0]),
        ("top_k,top_p,min_p,dist", SamplingParams(top_k=3, top_p=0.7), [0.4 / 0.7, 0.3 / 0.7]),
    ],
)
def test_llama_cpp_filter_tables(chain, params, expected):
    for rows in (LLAMA, LLAMA[:, ::-1].copy()):  # and in the reverse vocabulary order
        probs = _probs(chain, rows, params)[0]
        kept = np.sort(probs[probs > 0])[::-1]
        np.testing.assert_allclose(kept, expected, atol=1e-5)
        padded = np.vstack([np.zeros((1, 4), np.float32), rows])
        feeds = sampler_feeds(chain, padded, [params])
        reference = run_chain(chain, feeds, output_probs=True)["sampler.probs"][0]
        np.testing.assert_allclose(reference, probs, atol=1e-6)


@pytest.mark.parametrize(
    ("probs", "mass", "expected"),
    [
        ([0.97, 0.01, 0.01, 0.01], 0.5, [1.0]),
        ([0.4, 0.2, 0.2, 0.2], 0.5, [1 / 3, 1 / 3, 1 / 3]),
    ],
)
def test_llama_cpp_typical_tables(probs, mass, expected):
    rows = np.log(np.array([probs], dtype=np.float32))
    got = _probs("typical_p,dist", rows, SamplingParams(typical_p=mass))[0]
    np.testing.assert_allclose(np.sort(got[got > 0])[::-1], expected, atol=1e-5)


def _hf_probs(processor, logits: np.ndarray, input_ids=None) -> np.ndarray:
    scores = processor(input_ids, torch.from_numpy(logits.copy()))
    return torch.softmax(scores, dim=-1).numpy()


def _logits(seed: int, rows: int, vocab: int, ties: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = (rng.normal(size=(rows, vocab)) * rng.uniform(1, 4, size=(rows, 1))).astype(np.float32)
    return np.round(logits, 1) if ties else logits


WARPERS = [
    ("temperature,dist", SamplingParams(temperature=0.7), hf.TemperatureLogitsWarper(0.7)),
    ("temperature,dist", SamplingParams(temperature=1.8), hf.TemperatureLogitsWarper(1.8)),
    ("top_k,dist", SamplingParams(top_k=1), hf.TopKLogitsWarper(1)),
    ("top_k,dist", SamplingParams(top_k=40), hf.TopKLogitsWarper(40)),
    ("top_k,dist", SamplingParams(top_k=1000), hf.TopKLogitsWarper(1000)),
    ("top_p,dist", SamplingParams(top_p=0.9), hf.TopPLogitsWarper(0.9)),
    ("top_p,dist", SamplingParams(top_p=0.3), hf.TopPLogitsWarper(0.3)),
    ("top_p,dist", SamplingParams(top_p=0.999), hf.TopPLogitsWarper(0.999)),
    ("min_p,dist", SamplingParams(min_p=0.05), hf.MinPLogitsWarper(0.05)),
    ("min_p,dist", SamplingParams(min_p=0.5), hf.MinPLogitsWarper(0.5)),
    ("typical_p,dist", SamplingParams(typical_p=0.9), hf.TypicalLogitsWarper(0.9)),
    ("typical_p,dist", SamplingParams(typical_p=0.2), hf.TypicalLogitsWarper(0.2)),
]


def _mass_before(logits: np.ndarray, key: str) -> np.ndarray:
    """Exact (float64) mass of the tokens ranked before each token, in top-p or typical order."""
    logp = np.float64(logits) - logits.max()
    logp -= np.log(np.exp(logp).sum())
    p = np.exp(logp)
    rank_key = -p if key == "top_p" else np.abs(-logp - -(p * logp).sum())
    order = np.argsort(rank_key, kind="stable")
    before = np.empty_like(p)
    before[order] = np.cumsum(p[order]) - p[order]
    return before, p


def _assert_same_distribution(
    ours: np.ndarray, theirs: np.ndarray, logits: np.ndarray, ties: bool, mass: tuple = ()
):
    for row in range(len(ours)):
        a, b = ours[row] > 0, theirs[row] > 0
        if not np.array_equal(a, b) and ties:
            # transformers sorts ties in arbitrary order and may split them at the boundary; we keep
            # the tokens tied with the crossing one. Every difference must be such a tie.
            boundary = logits[row][b].min()
            assert np.all(logits[row][a ^ b] == boundary)
            continue
        if not np.array_equal(a, b) and mass:
            # Over ~10^5 tokens, float32 prefix sums in descending (ours, llama.cpp) and ascending
            # (transformers) order differ in the 5th digit; a differing token must then sit where
            # the exact (float64) cumulative mass crosses the target.
            key, target = mass
            before, p = _mass_before(logits[row], key)
            differ = a ^ b
            assert np.all(before[differ] - 3e-4 < target), before[differ]
            assert np.all(before[differ] + p[differ] + 3e-4 > target), before[differ]
            both = a & b
            np.testing.assert_allclose(ours[row][both], theirs[row][both], rtol=1e-3)
            continue
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(ours[row], theirs[row], rtol=2e-5, atol=1e-7)


def _warper_cases():
    for i, (chain, params, warper) in enumerate(WARPERS):
        for ties in (False, True):
            # With tied surprisals transformers' typical-p order is arbitrary: no tie cases there.
            if not (ties and "typical" in chain):
                yield pytest.param(chain, params, warper, ties, id=f"{chain}-{i}-ties{int(ties)}")


@pytest.mark.parametrize(("chain", "params", "warper", "ties"), list(_warper_cases()))
def test_parity_with_transformers_warpers(chain, params, warper, ties):
    logits = _logits(7, 4, 2000, ties)
    ours = _probs(chain, logits, params)
    _assert_same_distribution(ours, _hf_probs(warper, logits), logits, ties)


@pytest.mark.parametrize("vocab", [49152, 128256])
@pytest.mark.parametrize(
    ("chain", "params", "warper"),
    [WARPERS[i] for i in (1, 3, 5, 7, 8, 10)],
    ids=[f"{WARPERS[i][0]}-{i}" for i in (1, 3, 5, 7, 8, 10)],
)
def test_parity_with_transformers_large_vocabularies(vocab, chain, params, warper):
    logits = _logits(vocab, 2, vocab, ties=False)
    ours, theirs = _probs(chain, logits, params), _hf_probs(warper, logits)
    mass = ("top_p", params.top_p) if "top_p" in chain else ("typical", params.typical_p)
    _assert_same_distribution(ours, theirs, logits, False, mass)


def test_parity_with_transformers_chain_order():
    """temperature → top-k → top-p → min-p, each on what the previous left, renormalised."""
    logits = _logits(3, 3, 5000, ties=False)
    warpers = hf.LogitsProcessorList(
        [
            hf.TemperatureLogitsWarper(0.8),
            hf.TopKLogitsWarper(300),
            hf.TopPLogitsWarper(0.8),
            hf.MinPLogitsWarper(0.02),
        ]
    )
    params = SamplingParams(temperature=0.8, top_k=300, top_p=0.8, min_p=0.02)
    ours = _probs("temperature,top_k,top_p,min_p,dist", logits, params)
    _assert_same_distribution(ours, _hf_probs(warpers, logits), logits, False)


@pytest.mark.parametrize("penalty", [1.3, 0.7, 1.0])
def test_parity_with_transformers_repetition_penalty(penalty):
    logits = _logits(11, 3, 500, ties=False)
    rng = np.random.default_rng(5)
    input_ids = torch.from_numpy(rng.integers(0, 500, size=(3, 40)))
    prompt_mask = np.zeros((3, 500), dtype=bool)
    np.put_along_axis(prompt_mask, input_ids.numpy(), True, axis=1)
    padded = np.vstack([np.zeros((1, 500), np.float32), logits])
    params = [SamplingParams(repetition_penalty=penalty)] * 3
    ours = _run("penalties,dist", padded, params, output_probs=True, prompt_mask=prompt_mask)
    theirs = _hf_probs(hf.RepetitionPenaltyLogitsProcessor(penalty), logits, input_ids)
    np.testing.assert_allclose(ours["sampler.probs"], theirs, rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("repetition", "presence", "frequency"),
    [(1.0, 0.5, 0.0), (1.0, 0.0, 0.7), (1.0, -1.0, -0.5), (1.2, 0.4, 0.3), (1.0, 0.0, 0.0)],
)
def test_openai_penalty_formula(repetition, presence, frequency):
    vocab = 64
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(1, vocab)) * 3).astype(np.float32)
    counts = rng.integers(0, 4, size=(1, vocab)) * (rng.random((1, vocab)) < 0.3)
    prompt = rng.random((1, vocab)) < 0.2
    params = SamplingParams(
        repetition_penalty=repetition, presence_penalty=presence, frequency_penalty=frequency
    )
    padded = np.vstack([np.zeros((1, vocab), np.float32), x])
    out = _run(
        "penalties,dist",
        padded,
        [params],
        output_candidates=vocab,
        prompt_mask=prompt,
        output_counts=counts,
    )
    got = np.empty(vocab, np.float32)
    got[out["sampler.candidate_ids"][0]] = out["sampler.candidate_logits"][0]
    seen = prompt[0] | (counts[0] > 0)
    expected = np.where(seen, np.where(x[0] > 0, x[0] / repetition, x[0] * repetition), x[0])
    expected = expected - counts[0] * frequency - (counts[0] > 0) * presence
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    if (repetition, presence, frequency) == (1.0, 0.0, 0.0):
        np.testing.assert_array_equal(got, x[0])  # neutral values: bit for bit


EDGE_PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.3, top_k=2, top_p=0.5, min_p=0.1, typical_p=0.5),
    SamplingParams(temperature=0.01, repetition_penalty=0.5, frequency_penalty=-2.0),
]


def _restrict(params: SamplingParams, chain: str) -> SamplingParams | None:
    names = [n for n in chain.split(",") if n]
    defaults = SamplingParams()
    for name, owner in (
        ("top_k", "top_k"),
        ("top_p", "top_p"),
        ("min_p", "min_p"),
        ("typical_p", "typical_p"),
        ("repetition_penalty", "penalties"),
        ("frequency_penalty", "penalties"),
    ):
        if owner not in names and getattr(params, name) != getattr(defaults, name):
            return None
    if "dist" not in names:
        return SamplingParams(temperature=0.0) if params.temperature == 0.0 else None
    if "temperature" not in names and params.temperature != 1.0:
        return None
    return params


def _edge_cases():
    for chain in (FULL, "", "temperature,dist", "top_k,dist"):
        for i, params in enumerate(EDGE_PARAMS):
            if _restrict(params, chain) is not None:
                yield pytest.param(chain, params, id=f"{chain or 'greedy'}-{i}")


_NAN, _INF = np.nan, np.inf
# Rows of 6 logits that no model should give and a sampler must survive (row 0: the dummy row).
EDGE_ROWS = np.array(
    [
        [0] * 6,
        [_NAN] * 6,
        [-_INF] * 6,
        [-_INF, -_INF, -_INF, 2.5, -_INF, -_INF],
        [_NAN, -_INF, _NAN, _NAN, -3.0, _NAN],
        [1e30, -1e30, 1e30, -1e30, -1e30, -1e30],
        [0.0, _INF, 1.0, 2.0, 3.0, -_INF],
        [3.4e38, 3.4e38, -3.4e38, 0.0, 0.0, 0.0],
        [1.0, 3.0, 3.0, 0.0, 3.0, -1.0],
    ],
    dtype=np.float32,
)


@pytest.mark.parametrize(("chain", "params"), list(_edge_cases()))
def test_edge_rows(chain, params):
    rows = EDGE_ROWS[:-1]
    vocab = rows.shape[1]
    slots = rows.shape[0] - 1
    restricted = _restrict(params, chain)
    kwargs = {"output_probs": True, "uniform": np.linspace(0.05, 0.95, slots)}
    if "penalties" in chain:
        kwargs["output_counts"] = np.ones((slots, vocab), np.int32)
    out = _run(chain, rows, [restricted] * slots, **kwargs)
    token, logprob, probs = out["sampler.next_token"], out["sampler.logprob"], out["sampler.probs"]
    assert not np.isnan(logprob).any() and not np.isnan(probs).any()
    assert np.all((token >= 0) & (token < vocab))
    assert token[0] == 0 and token[1] == 0  # no finite logit: token 0, logprob −inf, zero probs
    assert logprob[0] == -np.inf and logprob[1] == -np.inf
    assert not probs[0].any() and not probs[1].any()
    assert token[2] == 3 and logprob[2] == 0  # one finite logit
    assert token[3] == 4 and logprob[3] == 0
    assert token[4] in (0, 2)  # ±1e30
    np.testing.assert_allclose(logprob[4], np.log(0.5), rtol=1e-6)
    assert token[5] == 1 and logprob[5] == 0  # +inf is the largest float, so it wins
    assert token[6] in (0, 1)
    for s in range(2, slots):
        assert probs[s, token[s]] > 0 and abs(probs[s].sum() - 1) < 1e-5


@pytest.mark.parametrize("chain", [FULL, "", "dist", "top_k,top_p,dist"])
def test_single_token_vocabulary(chain):
    params = SamplingParams(temperature=0.0) if "dist" not in chain else SamplingParams()
    rows = np.array([[0.0], [5.0], [np.nan]], dtype=np.float32)
    out = _run(chain, rows, [params, params], output_probs=True, top_logprobs=1)
    assert out["sampler.next_token"].tolist() == [0, 0]
    assert out["sampler.logprob"].tolist() == [0.0, -np.inf]
    assert out["sampler.top_logprob_ids"].tolist() == [[0], [0]]
    assert out["sampler.probs"].tolist() == [[1.0], [0.0]]


def test_logprobs_are_raw_log_softmax():
    rng = np.random.default_rng(4)
    rows = rng.normal(size=(3, 100)).astype(np.float32) * 2
    params = SamplingParams(temperature=0.5, top_k=3, logit_bias={7: 50.0})
    out = _run(FULL, rows, [params, params], top_logprobs=5, max_bias=2, uniform=[0.2, 0.8])
    raw = torch.log_softmax(torch.from_numpy(rows[1:]), dim=-1).numpy()
    assert out["sampler.next_token"].tolist() == [7, 7]  # the bias decides the token ...
    np.testing.assert_allclose(out["sampler.logprob"], raw[:, 7], rtol=1e-5)  # ... not the logprob
    top = np.argsort(-raw, axis=1)[:, :5]
    np.testing.assert_array_equal(out["sampler.top_logprob_ids"], top)
    np.testing.assert_allclose(
        out["sampler.top_logprobs"], np.take_along_axis(raw, top, 1), rtol=1e-5
    )


@pytest.mark.parametrize("slots", [2, 4, 5, 9])
def test_a_rows_logprobs_do_not_depend_on_the_batch(slots):
    """A slot's logprob and top logprobs are the same bits whatever the number of rows computed
    beside it (the log-softmax works row by row), as its token is."""
    rng = np.random.default_rng(6)
    rows = (rng.normal(size=(slots + 1, 300)) * 3).astype(np.float32)
    params = SamplingParams(temperature=0.7, top_p=0.9)
    uniform = [0.3] + [0.6] * (slots - 1)
    alone = _run(FULL, rows[:2], [params], top_logprobs=4, uniform=uniform[:1])
    batch = _run(FULL, rows, [params] * slots, top_logprobs=4, uniform=uniform)
    for name in ("sampler.next_token", "sampler.logprob", "sampler.top_logprobs"):
        np.testing.assert_array_equal(batch[name][:1], alone[name], err_msg=name)


@pytest.mark.parametrize("chain", [FULL, "temperature,dist", "temperature,top_k,top_p,dist"])
@pytest.mark.parametrize(
    ("temperature", "greedy"),
    [(0.0, True), (1e-30, True), (1e-7, True), (9.9e-6, True), (1e-5, False), (0.5, False)],
)
def test_tiny_temperatures_are_greedy(chain, temperature, greedy):
    """vLLM's rule: t < 1e-5 is greedy. Dividing by it would overflow several logits to +inf, and
    the draw would pick uniformly among them instead of taking the argmax."""
    rows = np.array([[0, 0, 0, 0, 0], [40.0, 39.0, 38.5, 1.0, -2.0]], dtype=np.float32)
    params = SamplingParams(temperature=temperature)
    for u in (0.01, 0.5, 0.99):
        out = _run(chain, rows, [params], output_probs=True, uniform=[u])
        reference = run_chain(chain, sampler_feeds(chain, rows, [params], uniform=[u]))
        assert out["sampler.next_token"][0] == reference["sampler.next_token"][0]
        if greedy:
            assert out["sampler.next_token"][0] == 0
            assert out["sampler.probs"][0].tolist() == [1, 0, 0, 0, 0]
        assert not np.isnan(out["sampler.probs"]).any()


_GREEDY = SamplingParams(temperature=0.0)
# The slots' parameters (the last slot's row, a tie, stays plainly greedy) and the sampler they
# need; in the last case only the first slot has them, and draws.
_GREEDY_STEPS = {
    "greedy": (_GREEDY, ""),
    "greedy-biased": (SamplingParams(temperature=0.0, logit_bias={4: 5.0}), "logit_bias"),
    # x / 0.5 overflows the 3.4e38 row to +inf: FiniteRows clamps it
    "greedy-penalised": (SamplingParams(temperature=0.0, repetition_penalty=0.5), "penalties"),
    "greedy-presence": (SamplingParams(temperature=0.0, presence_penalty=0.5), "penalties"),
    "one-drawing": (SamplingParams(temperature=0.7), "dist"),
}


def _greedy_step_cases():
    for chain in (FULL, "temperature,dist", "penalties,temperature,dist", "logit_bias"):
        for name, (params, needs) in _GREEDY_STEPS.items():
            if needs in {*chain.split(","), ""}:
                yield pytest.param(chain, name, params, id=f"{chain}-{name}")


@pytest.mark.parametrize(("chain", "case", "params"), list(_greedy_step_cases()))
def test_a_greedy_step_takes_the_selections_token(chain, case, params):
    """A step whose rows are all greedy skips the selection's temperature, filters and draw for
    the argmax of the transformed logits (bias, penalties); one row that draws runs the selection
    for all. The token and logprob of every row are the selection's (a chain with probs always
    selects), on rows with NaN, ±inf, ±1e30, overflow to +inf, no finite logit and ties."""
    # and the largest float before a token that overflows to +inf: clamped, the first one wins
    rows = np.vstack([EDGE_ROWS[:-1], [[3.4028235e38, 3e38, 0, 0, 0, 0]], EDGE_ROWS[-1:]])
    rows = rows.astype(np.float32)
    slots = len(rows) - 1
    given = 1 if case == "one-drawing" else slots - 1  # the rest: plainly greedy
    every = [params] * given + [_GREEDY] * (slots - given)
    kwargs = {"uniform": np.linspace(0.05, 0.95, slots)}
    if "logit_bias" in chain:
        kwargs["max_bias"] = 2
    if "penalties" in chain:
        kwargs["output_counts"] = np.ones((slots, rows.shape[1]), np.int32)
        kwargs["output_counts"][-2] = [0, 1, 0, 0, 0, 0]  # only 3e38 is penalised
    plain = _run(chain, rows, every, **kwargs)
    selected = _run(chain, rows, every, output_probs=True, **kwargs)
    for name in ("sampler.next_token", "sampler.logprob"):
        np.testing.assert_array_equal(plain[name], selected[name])
    assert plain["sampler.next_token"][-1] == 1  # ties go to the lowest id
    assert plain["sampler.next_token"][-2] == 0


_FILTERED_GREEDY = SamplingParams(temperature=0.0, top_k=3, top_p=0.2, min_p=0.3, typical_p=0.2)
_DRAWING = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, min_p=0.02, typical_p=0.95)


@pytest.mark.parametrize(
    "slots",
    [
        [_FILTERED_GREEDY],
        [_FILTERED_GREEDY, SamplingParams(temperature=0.0)],
        [_FILTERED_GREEDY, _DRAWING, SamplingParams(temperature=0.0, top_p=0.5)],
        [_DRAWING, _DRAWING],
    ],
    ids=["greedy-filtered", "all-greedy", "greedy-beside-drawing", "all-drawing"],
)
@pytest.mark.parametrize("vocab", [300, 49152])
def test_greedy_rows_take_the_argmax_whatever_their_filters(slots, vocab):
    """A greedy row's filters are off in the branching chain (its work thrown away), and a batch
    of greedy rows takes no candidates: every row's token and logprob stay the reference's,
    alone or beside rows that draw."""
    rng = np.random.default_rng(vocab + len(slots))
    logits = rng.normal(0, 3, (len(slots) + 1, vocab)).astype(np.float32)
    uniform = rng.random(len(slots))
    out = _run(FULL, logits, slots, uniform=uniform)
    reference = run_chain(FULL, sampler_feeds(FULL, logits, slots, uniform=uniform))
    np.testing.assert_array_equal(out["sampler.next_token"], reference["sampler.next_token"])
    np.testing.assert_allclose(out["sampler.logprob"], reference["sampler.logprob"], rtol=1e-5)
    for s, params in enumerate(slots):
        if params.temperature == 0.0:
            assert out["sampler.next_token"][s] == np.argmax(logits[s + 1])
