"""Post-sampling probabilities (llama-server's ``post_sampling_probs``): each token's probability and
the most likely tokens' under the distribution the draw used, read from the graph's candidates.
Held to the numpy reference chain run over the model's own top logprobs of the same steps, alone
and in a batch."""

from __future__ import annotations

import numpy as np
import pytest

from onnxsample import Engine, InvalidParameter, SamplingParams
from onnxsample import reference as ref
from onnxsample.composer import compose

K = 8
F32 = np.float32


@pytest.fixture(scope="module")
def paths(tiny_gqa_export, tmp_path_factory):
    folder = tmp_path_factory.mktemp("post")
    common = {"max_slots": 4, "top_logprobs": K}
    with_candidates = compose(
        tiny_gqa_export.output, None, folder / "candidates.onnx", output_candidates=K, **common
    )
    plain = compose(tiny_gqa_export.output, None, folder / "plain.onnx", **common)
    return with_candidates, plain


@pytest.fixture(scope="module")
def engine(paths, tiny_gqa_export):
    with Engine(paths[0], tokenizer=tiny_gqa_export.output, threads=1) as e:
        yield e


def _final(raw: list[tuple[int, float]], p: SamplingParams) -> dict[int, float]:
    """The reference chain's final distribution over a row that holds the model's top logprobs
    (every token the filters can keep: top-k is at most their number)."""
    ids = np.array([t for t, _ in raw])
    row = np.full((1, int(ids.max()) + 1), -np.inf, F32)
    row[0, ids] = [v for _, v in raw]
    z = ref.temperature(row, np.array([p.temperature], F32))
    z = ref.top_k(z, np.array([p.top_k]))
    z = ref.top_p(z, np.array([p.top_p], F32))
    z = ref.min_p(z, np.array([p.min_p], F32))
    probs = ref.softmax(z)[0]
    return {int(t): float(probs[t]) for t in ids if probs[t] > 0}


CASES = {
    "top_k": SamplingParams(temperature=0.7, top_k=4, seed=1),
    "top_k, top_p": SamplingParams(temperature=1.3, top_k=6, top_p=0.8, seed=2),
    "top_k, min_p": SamplingParams(top_k=7, min_p=0.1, seed=3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_probabilities_are_the_reference_chains_final_distribution(engine, name):
    p = CASES[name]
    raw = engine.submit("Once upon", _with(p, top_logprobs=K), max_new_tokens=10, chat=False)
    post = engine.submit("Once upon", _with(p, post_sampling_probs=K), max_new_tokens=10,
                         chat=False)  # fmt: skip
    raw, post = raw.result(60), post.result(60)
    assert post.token_ids == raw.token_ids  # the same draws: only what is reported differs
    for step, token in enumerate(post.token_ids):
        expected = _final(raw.top_logprobs[step], p)
        mine = {t: float(np.exp(v)) for t, v in post.top_logprobs[step]}
        assert mine.keys() == expected.keys(), (step, mine, expected)
        assert list(mine) == sorted(mine, key=mine.get, reverse=True)  # most likely first
        for t, value in expected.items():
            assert mine[t] == pytest.approx(value, rel=1e-5, abs=1e-7), (step, t)
        assert np.exp(post.logprobs[step]) == pytest.approx(expected[token], rel=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1e-6])  # the graph decodes both greedily
def test_greedy_decoding_gives_the_token_all_of_it(paths, tiny_gqa_export, temperature):
    """No candidates needed: the one token greedy decoding leaves has probability 1."""
    greedy = SamplingParams(temperature=temperature, post_sampling_probs=5)
    with Engine(paths[1], tokenizer=tiny_gqa_export.output, threads=1) as e:
        done = e.submit("Hello", greedy, max_new_tokens=6, chat=False).result(60)
    assert done.logprobs == [0.0] * len(done.token_ids)
    assert done.top_logprobs == [[(t, 0.0)] for t in done.token_ids]


def test_no_cut_at_all_is_refused_before_any_work(engine):
    """With no filter every step keeps the whole vocabulary, past any candidates: refused at
    submit, not at the first step."""
    with pytest.raises(InvalidParameter, match="with no filter the distribution keeps every"):
        engine.submit("Once", SamplingParams(seed=4, post_sampling_probs=2), max_new_tokens=4)
    with pytest.raises(InvalidParameter, match="with no filter"):  # a top-k past them cuts none
        engine.submit("Once", SamplingParams(top_k=K, post_sampling_probs=2), max_new_tokens=4)


def test_a_kept_set_past_the_candidates_fails_the_request_alone(engine):
    """A cut that keeps more than the candidates at a step (top-p 0.999 over the tiny model's
    flat distribution): they cannot show its distribution, and that request fails with a typed
    error while the other one finishes."""
    p = SamplingParams(seed=4, top_p=0.999, post_sampling_probs=2)
    wide = engine.submit("Once", p, max_new_tokens=4, chat=False)
    fine = engine.submit("Once", SamplingParams(seed=4, top_k=3), max_new_tokens=4, chat=False)
    with pytest.raises(InvalidParameter, match="kept 8 tokens or more, past the model's 8"):
        wide.result(60)
    assert len(fine.result(60).token_ids) >= 1


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (dict(post_sampling_probs=2, logprobs=True), "replaces logprobs and top_logprobs"),
        (dict(post_sampling_probs=-1), "post_sampling_probs must be None or an integer >= 0"),
        (dict(post_sampling_probs=True), "post_sampling_probs must be None or an integer"),
        (dict(post_sampling_probs=2, host_sampler=lambda i, z: 0), "host sampler"),
    ],
)
def test_invalid_requests_are_refused(params, message):
    with pytest.raises(InvalidParameter, match=message):
        SamplingParams(**params).validate()


@pytest.mark.parametrize(
    ("which", "n", "message"),
    [
        (
            1,
            2,
            r"post_sampling_probs=2 needs a model composed with the final distribution "
            r"of a branching chain \(onnxsample compose --output-probs, or serve --output-probs\) or "
            r"at least 2 candidates",
        ),
        (0, K + 1, rf"at least {K + 1} candidates \(this one: {K}"),
    ],
)
def test_the_graph_must_have_the_candidates(paths, tiny_gqa_export, which, n, message):
    engine = Engine(paths[which], tokenizer=tiny_gqa_export.output, threads=1)
    with engine as e, pytest.raises(InvalidParameter, match=message):
        e.submit("Hi", SamplingParams(top_k=2, post_sampling_probs=n), max_new_tokens=2)


def _with(p: SamplingParams, **changes) -> SamplingParams:
    from dataclasses import replace

    return replace(p, **changes)


# ---- the whole final distribution (compose --output-probs): any kept set ----------------------

WIDE = {  # no top-k: kept sets of hundreds or thousands of tokens, past any candidates
    "top_p": SamplingParams(temperature=0.9, top_p=0.9, seed=5),
    "min_p": SamplingParams(temperature=1.2, min_p=0.02, seed=6),
    "top_p, min_p, top_k": SamplingParams(top_k=300, top_p=0.95, min_p=0.01, seed=7),
    "no cut": SamplingParams(temperature=0.8, seed=9),
}


@pytest.fixture(scope="module")
def probs_paths(tiny_gqa_export, tmp_path_factory):
    """The tiny model composed with sampler.probs, and with as many candidates as its vocabulary
    (where the candidates always show the whole kept set): the two sources, one chain."""
    folder = tmp_path_factory.mktemp("post-probs")
    common = {"max_slots": 4, "top_logprobs": K}
    probs = compose(tiny_gqa_export.output, None, folder / "probs.onnx", output_probs=True,
                    **common)  # fmt: skip
    vocab = compose(tiny_gqa_export.output, None, folder / "vocab.onnx",
                    output_candidates=49152, **common)  # fmt: skip
    return probs, vocab


@pytest.fixture(scope="module")
def probs_engine(probs_paths, tiny_gqa_export):
    with Engine(probs_paths[0], tokenizer=tiny_gqa_export.output, threads=1) as e:
        yield e


@pytest.mark.parametrize("name", list(WIDE))
def test_the_whole_distribution_gives_the_reference_chains_first_step(
    probs_engine, tiny_gqa_export, name
):
    """The first token's distribution, against the reference chain over the model's whole row
    (its prefill logits, computed apart)."""
    from tests._family_models import export_logits

    p = _with(WIDE[name], post_sampling_probs=20)
    done = probs_engine.submit("Once upon", p, max_new_tokens=1, chat=False).result(60)
    ids = done.prompt_token_ids
    row = export_logits(tiny_gqa_export.output / "model.onnx", ids)[-1:].astype(F32)
    z = ref.temperature(row, np.array([p.temperature], F32))
    z = ref.top_k(z, np.array([p.top_k]))
    z = ref.top_p(z, np.array([p.top_p], F32))
    z = ref.min_p(z, np.array([p.min_p], F32))
    expected = ref.softmax(z)[0]
    kept = np.flatnonzero(expected > 0)
    assert kept.size > K  # past what the candidates of the model above would show
    tops = done.top_logprobs[0]
    assert [t for t, _ in tops] == list(kept[np.lexsort((kept, -expected[kept]))][:20])
    for t, v in tops:
        assert np.exp(v) == pytest.approx(expected[t], rel=1e-4), t
    token = done.token_ids[0]
    assert np.exp(done.logprobs[0]) == pytest.approx(expected[token], rel=1e-4)


@pytest.mark.parametrize("name", list(WIDE))
def test_the_whole_distribution_agrees_with_candidates_that_show_every_token(
    probs_engine, probs_paths, tiny_gqa_export, name
):
    """Step after step, the same draws and the same probabilities as candidates as many as the
    vocabulary (computed on the host as llama.cpp's dist sampler computes them)."""
    p = _with(WIDE[name], post_sampling_probs=12)
    mine = probs_engine.submit("The weather", p, max_new_tokens=8, chat=False).result(60)
    with Engine(probs_paths[1], tokenizer=tiny_gqa_export.output, threads=1) as e:
        theirs = e.submit("The weather", p, max_new_tokens=8, chat=False).result(60)
    assert mine.token_ids == theirs.token_ids
    for step, (a, b) in enumerate(zip(mine.top_logprobs, theirs.top_logprobs, strict=True)):
        assert [t for t, _ in a] == [t for t, _ in b], step
        np.testing.assert_allclose([v for _, v in a], [v for _, v in b], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mine.logprobs, theirs.logprobs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("source", "cases"),
    [
        ("engine", (CASES["top_k"], CASES["top_k, top_p"])),
        ("probs_engine", (WIDE["top_p"], WIDE["no cut"])),
    ],
)
def test_a_batch_gives_each_row_what_it_gets_alone(request, source, cases):
    """From the candidates and from the whole distribution: the same tokens and probabilities
    in a mixed batch as alone, bit for bit."""
    engine = request.getfixturevalue(source)
    requests = [
        ("Once upon", _with(cases[0], post_sampling_probs=3)),
        ("The weather", SamplingParams(temperature=0, post_sampling_probs=2)),
        ("Hello", SamplingParams(temperature=0.9, seed=8, top_logprobs=2)),
        ("Pick:", _with(cases[1], post_sampling_probs=K)),
    ]
    together = [engine.submit(t, p, max_new_tokens=8, chat=False) for t, p in requests]
    together = [r.result(60) for r in together]
    for (text, p), done in zip(requests, together, strict=True):
        alone = engine.submit(text, p, max_new_tokens=8, chat=False).result(60)
        assert (alone.token_ids, alone.logprobs, alone.top_logprobs) == (
            done.token_ids,
            done.logprobs,
            done.top_logprobs,
        ), text


@pytest.mark.parametrize(
    ("row", "token", "n", "expected"),
    [
        ([0.1, 0.4, 0.0, 0.4, 0.1], 3, 3, (0.4, [(1, 0.4), (3, 0.4), (0, 0.1)])),  # ties by id
        ([0.0, 0.5, 0.0, 0.5, 0.0], 1, 5, (0.5, [(1, 0.5), (3, 0.5)])),  # n past the kept set
        ([0.0, 0.0, 1.0, 0.0, 0.0], 2, 0, (1.0, [])),
        ([0.0] * 5, 0, 3, (1.0, [(0, 1.0)])),  # no finite logit: token 0, as from candidates
    ],
)
def test_the_whole_distributions_row_is_read_most_likely_first(row, token, n, expected):
    from onnxsample.engine._post_sampling import _from_probs

    logprob, tops = _from_probs(np.array(row, F32), token, n)
    assert np.exp(logprob) == pytest.approx(expected[0])
    assert [t for t, _ in tops] == [t for t, _ in expected[1]]
    np.testing.assert_allclose([np.exp(v) for _, v in tops], [p for _, p in expected[1]])


def test_a_static_chains_probs_are_refused_by_name(tiny_gqa_export, tmp_path):
    """A static chain draws its rows past the candidates again on the host, which its
    sampler.probs does not follow: a request that would read them is told why."""
    path = compose(tiny_gqa_export.output, None, tmp_path / "static.onnx", max_slots=2,
                   static=True, output_probs=True)  # fmt: skip
    refused = pytest.raises(InvalidParameter, match=r"a static chain's.*without --static")
    with Engine(path, tokenizer=tiny_gqa_export.output, threads=1) as e, refused:
        e.submit("Hi", SamplingParams(top_k=2, post_sampling_probs=2), max_new_tokens=2)
