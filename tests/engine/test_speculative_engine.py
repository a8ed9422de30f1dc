"""Speculative decoding in the engine: the n-gram drafter (drafts, back-off, settings) and the
engine with it (greedy output token for token as without speculation, seeds, stops, limits, cancel,
mixed batches, errors)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from onnxsample import Constraint, Engine, InvalidParameter, ModelError, SamplingParams, compose
from onnxsample.engine._drafter import DraftStats, NgramDrafter

GREEDY = SamplingParams(temperature=0)


# ---- the drafter ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("history", "ngram", "limit", "draft"),
    [
        ([5, 6, 7, 8, 9, 5, 6, 7], 3, 4, [8, 9, 5, 6]),  # the 3-gram 5 6 7 recurs: what followed it
        ([5, 6, 7, 8, 9, 5, 6, 7], 3, 2, [8, 9]),  # limit
        ([1, 2, 3, 1, 2, 4, 1, 2], 2, 3, [4, 1, 2]),  # the most recent occurrence wins
        ([1, 2, 3, 4, 9, 3, 7, 4], 3, 3, [9, 3, 7]),  # no 3- or 2-gram: the 1-gram 4
        ([1, 2, 3, 4], 3, 3, []),  # nothing recurs
        ([7], 3, 3, []),
        ([7, 7], 3, 3, [7]),
        ([5, 6, 7, 8, 9, 5, 6, 7], 3, 0, []),
    ],
)
def test_ngram_drafts(history, ngram, limit, draft):
    drafter = NgramDrafter(draft_tokens=4, ngram=ngram)
    assert drafter.propose(np.asarray(history, np.int64), limit) == draft


@pytest.mark.parametrize(("batched", "kept"), [(False, 1), (True, 2)])
def test_drafts_back_off_after_misses(batched, kept):
    drafter = NgramDrafter(4)
    drafter.batched = batched
    stats = DraftStats()
    allowed = []
    for accepted in (0, kept - 1, 0, kept):
        drafter.record(stats, 4, accepted)
        steps = 0
        while not NgramDrafter.allowed(stats):
            steps += 1
        allowed.append(steps)
    assert allowed == [1, 2, 4, 0]
    assert (stats.drafted, stats.accepted) == (16, 2 * kept - 1)


@pytest.mark.parametrize(("draft_tokens", "ngram"), [(0, 3), (4, 0), (4, True)])
def test_drafter_rejects_bad_settings(draft_tokens, ngram):
    with pytest.raises(InvalidParameter, match="must be an integer >= 1"):
        NgramDrafter(draft_tokens, ngram)


# ---- the engine -----------------------------------------------------------------------------------

PROMPTS = {
    "code edit": "Here is a function:\n\ndef area(width, height):\n    if width < 0 or height < 0:\n"
    "        raise ValueError('negative size')\n    return width * height\n\n"
    "Write it again with the function renamed to rectangle_area.",
    "summarise": "The river Loire is the longest river in France. The Loire rises in the Massif "
    "Central and flows north and then west to the Atlantic. Summarise: the Loire is",
    "chat": [{"role": "user", "content": "List three colours of the rainbow, one per line."}],
    "no repetition": "Tell me a short story about a lighthouse keeper.",
}


def _engine_pair(export, path, **compose_options):
    """`export` composed into `path`; engines on it without and with speculation, closed after."""
    path = compose(export, None, path, **compose_options)
    plain = Engine(path, tokenizer=export, threads=1)
    fast = Engine(path, tokenizer=export, threads=1, speculative="ngram")
    yield plain, fast
    plain.close()
    fast.close()


@pytest.fixture(scope="module")
def tiny_pair(tiny_gqa_export, tmp_path_factory):
    """The tiny GQA model composed with 4 slots and 4 draft tokens; engines with and without
    speculation."""
    path = tmp_path_factory.mktemp("spec") / "tiny.onnx"
    options = dict(max_slots=4, top_logprobs=2, max_bias=4, draft_tokens=4, allowed_tokens=True)
    yield from _engine_pair(tiny_gqa_export.output, path, **options)


@pytest.fixture(scope="module")
def embedded_pair(embedded_exact_export, tmp_path_factory):
    """The embedded SmolLM2 as `onnxsample run` computes it (its own GGUF blocks, int8 activations)
    with exact attention, composed with 8 draft tokens and prompt logprobs. (With
    GroupQueryAttention a verification call's logits differ from a one-token step's in their
    last bits, which int8 activations make visible: see tests/exporters/test_exact_attention.py.)"""
    path = tmp_path_factory.mktemp("spec-embedded") / "composed.onnx"
    options = dict(
        max_slots=4, top_logprobs=2, draft_tokens=8, prompt_logprobs=True, allowed_tokens=True
    )
    # the rows gathered before the LM head (its dummy row included), as compose does by default:
    # here a failed check is an error, not a quiet fallback to gathering after the logits
    options["gather"] = "lm_head"
    yield from _engine_pair(embedded_exact_export.output, path, **options)


@pytest.fixture(scope="module")
def embedded_default_pair(embedded_gqa_exports, tmp_path_factory):
    """The embedded SmolLM2's default export (GroupQueryAttention, its own GGUF blocks, int8
    activations), composed as embedded_pair is."""
    path = tmp_path_factory.mktemp("spec-default") / "composed.onnx"
    options = dict(max_slots=4, draft_tokens=8, prompt_logprobs=True, gather="lm_head")
    yield from _engine_pair(embedded_gqa_exports["gguf-a4"].output, path, **options)


@pytest.mark.parametrize("name", list(PROMPTS))
def test_default_export_alone_every_call_has_several_positions_so_echo_agrees_to_the_bit(
    embedded_default_pair, name
):
    """Decoding alone with speculation, every step carries a draft (a free guess where the
    n-gram lookup has none), so each call computes several positions, as an echo's prefill
    does: a continuation scored as a prompt gets the logprobs reported while it was generated,
    to float rounding (at most 1.2e-7 measured). Plain decoding's one-position steps take other
    kernels (GroupQueryAttention's and 4-bit MatMulNBits'), and their logprobs differ from the
    echo's by up to 0.24 on these prompts."""
    _, fast = embedded_default_pair
    params = SamplingParams(temperature=0, logprobs=True)
    before = fast.stats()
    made = fast.submit(PROMPTS[name], params, max_new_tokens=48).result(timeout=300)
    after = fast.stats()
    steps = after.decode_steps - before.decode_steps
    assert after.drafted_tokens - before.drafted_tokens >= steps, "a draft in every step"
    ids = [*made.prompt_token_ids, *made.token_ids]
    echo = SamplingParams(temperature=0, prompt_logprobs=0)
    scored = fast.submit(ids, echo, max_new_tokens=1).result(timeout=300)
    n = len(made.prompt_token_ids)
    np.testing.assert_allclose(scored.prompt_logprobs[n:], made.logprobs, rtol=0, atol=1e-6)


def _together(engine, prompts, params, n):
    """The prompts queued at once (tokenised first, so that the engine thread admits them in one
    step rather than starting on the first while the next is tokenised)."""
    prepared = [engine.prepare(p, params, n, None, None, None, i) for i, p in enumerate(prompts)]
    return [r.result(timeout=300) for r in engine.enqueue(prepared)]


def test_embedded_greedy_is_unchanged_token_for_token(embedded_pair):
    """Each prompt alone, then all four in one batch (slots drafting and not, side by side)."""
    plain, fast = embedded_pair
    prompts = list(PROMPTS.values())
    base = [plain.submit(p, GREEDY, max_new_tokens=64).result(timeout=300) for p in prompts]
    before = fast.stats()
    alone = [fast.submit(p, GREEDY, max_new_tokens=64).result(timeout=300) for p in prompts]
    batch = _together(fast, prompts, GREEDY, 64)
    for name, a, b, c in zip(PROMPTS, base, alone, batch, strict=True):
        assert b.token_ids == a.token_ids, name
        assert c.token_ids == a.token_ids, name
        assert b.text == a.text
    after = fast.stats()
    drafted = after.drafted_tokens - before.drafted_tokens
    accepted = after.accepted_tokens - before.accepted_tokens
    assert 0 < accepted < drafted
    assert after.decode_steps - before.decode_steps < sum(len(c.token_ids) for c in alone + batch)
    code = alone[0].timings
    assert code.draft_tokens > 0 and code.accepted_tokens > 0


def test_embedded_sampling_with_penalties_keeps_the_seeded_stream(embedded_pair):
    """One uniform per emitted token, from the request's own generator: the same seed gives the
    same tokens with and without speculation (the logits agree to the last bit)."""
    plain, fast = embedded_pair
    params = SamplingParams(
        temperature=0.8, top_p=0.95, repetition_penalty=1.1, frequency_penalty=0.3, seed=7
    )
    prompt = PROMPTS["code edit"]
    a = plain.submit(prompt, params, max_new_tokens=48).result(timeout=300)
    b = fast.submit(prompt, params, max_new_tokens=48).result(timeout=300)
    c = fast.submit(prompt, params, max_new_tokens=48).result(timeout=300)
    assert b.token_ids == c.token_ids, "same seed, different text run to run"
    assert b.token_ids == a.token_ids


@pytest.mark.parametrize("name", list(PROMPTS))
def test_embedded_echo_scores_what_generation_reported(embedded_pair, name):
    """A generated continuation scored as a prompt (echo: chunked prefill calls) gets the logprobs
    reported while it was generated one token per call."""
    plain, _ = embedded_pair
    params = SamplingParams(temperature=0, logprobs=True)
    made = plain.submit(PROMPTS[name], params, max_new_tokens=48).result(timeout=300)
    ids = [*made.prompt_token_ids, *made.token_ids]
    echo = SamplingParams(temperature=0, prompt_logprobs=0)
    scored = plain.submit(ids, echo, max_new_tokens=1).result(timeout=300)
    n = len(made.prompt_token_ids)
    np.testing.assert_allclose(scored.prompt_logprobs[n:], made.logprobs, rtol=0, atol=1e-5)


def test_tiny_model_mixed_batch_logprobs_and_limits(tiny_pair):
    plain, fast = tiny_pair
    params = SamplingParams(temperature=0, logprobs=True, top_logprobs=2)
    prompts = ["Once upon a time", "a b c a b c a b", "def f(x):", "1 2 3 1 2 3"]
    base = _together(plain, prompts, params, 40)
    spec = _together(fast, prompts, params, 40)
    for a, b in zip(base, spec, strict=True):
        assert b.token_ids == a.token_ids
        assert b.finish_reason == a.finish_reason
        assert len(b.token_ids) <= 40
        np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-4)
        assert [[t for t, _ in top] for top in b.top_logprobs] == [
            [t for t, _ in top] for top in a.top_logprobs
        ]
    assert sum(c.timings.accepted_tokens for c in spec) > 0


def test_gqa_sequences_decoding_together_decode_in_one_call(tiny_pair):
    """GroupQueryAttention takes several new positions of one row per call only, so sequences
    decoding together do not draft (a verification call of its own per sequence cost more than
    it gave): speculation never makes more model calls than plain decoding."""
    plain, fast = tiny_pair
    prompts = ["a b c a b c a b", "1 2 3 1 2 3 1 2", "x y x y x y x y"]
    params = SamplingParams(temperature=0, ignore_eos=True)

    def calls(engine) -> int:
        before = engine.stats()
        _together(engine, prompts, params, 32)
        return engine.stats().decode_steps - before.decode_steps

    assert calls(fast) <= calls(plain)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_token_limit_is_exact(tiny_pair, n):
    _, fast = tiny_pair
    done = fast.submit("a b c a b c a b c a b", GREEDY, max_new_tokens=n, chat=False).result()
    assert len(done.token_ids) == n and done.finish_reason in ("length", "eos")
    # drafts kept past the limit were never emitted, so they are not counted as accepted
    assert done.timings.accepted_tokens <= max(n - 2, 0)


class _Rows:
    """A stand-in for the shared KV buffers: only their length matters to the call's shape."""

    length = 512
    generation = 0


def test_a_full_draft_leaves_its_row_a_free_position():
    """A verified draft may fill a row only up to one position before the buffer's end: a later
    call over several rows writes its pad token just past what each row holds."""
    from types import SimpleNamespace

    from onnxsample.engine._kv_shared import SharedLayout

    layout = SharedLayout(_Rows(), slots=3, pad=0, limit=None)
    layout.tokens[1] = [7] * 503
    seq = SimpleNamespace(slot=1, ids=[7])
    call = layout.decode([seq], {1: [7] * 8})
    assert call.drafts[1] == [7] * 7  # trimmed: 503 held + 8 fed stays below 512
    call.accepted = {1: 7}
    layout.commit(call, {})
    assert len(layout.tokens[1]) == 511
    others = [SimpleNamespace(slot=0, ids=[1]), SimpleNamespace(slot=2, ids=[1])]
    assert layout.decode(others).mask.shape[1] <= _Rows.length


def test_stop_strings_and_streaming_events(tiny_pair):
    plain, fast = tiny_pair
    params = SamplingParams(temperature=0, ignore_eos=True)
    base = plain.submit("a b c a b c", params, max_new_tokens=40, chat=False).result()
    stop = base.text[len(base.text) // 2 :][:3]
    a = plain.submit("a b c a b c", params, max_new_tokens=40, stop=stop, chat=False).result()
    request = fast.submit("a b c a b c", params, max_new_tokens=40, stop=stop, chat=False)
    events = list(request)
    b = events[-1].completion
    assert b.text == a.text and b.finish_reason == a.finish_reason == "stop"
    assert "".join(e.text for e in events) == b.text
    # one event per emitted token, in order (a verified run emits several)
    assert [e.token_id for e in events if e.token_id is not None] == b.token_ids


def test_cancel_while_drafting(tiny_pair):
    _, fast = tiny_pair
    long = SamplingParams(temperature=0, ignore_eos=True)
    request = fast.submit("a b c a b c a b c", long, max_new_tokens=400, chat=False)
    next(iter(request))
    request.cancel()
    done = request.result(timeout=60)
    assert done.finish_reason == "cancelled" and len(done.token_ids) < 400
    assert fast.submit("x y", GREEDY, max_new_tokens=3, chat=False).result().token_ids


def test_engine_errors(tiny_pair, tiny_gqa_export, tiny_export, tmp_path):
    plain, _ = tiny_pair
    with pytest.raises(InvalidParameter, match=r"draft_tokens must be in \[1, 4\]"):
        Engine(plain.path, tokenizer=tiny_gqa_export.output, speculative="ngram", draft_tokens=5)
    with pytest.raises(InvalidParameter, match="speculative must be 'ngram'"):
        Engine(plain.path, tokenizer=tiny_gqa_export.output, speculative="draft-model")
    with pytest.raises(InvalidParameter, match="ngram must be an integer >= 1"):
        Engine(plain.path, tokenizer=tiny_gqa_export.output, speculative="ngram", ngram=0)
    for given in ({"draft_tokens": 4}, {"ngram": 5}):  # without a method: they change nothing
        with pytest.raises(InvalidParameter, match="needs speculative='ngram'"):
            Engine(plain.path, tokenizer=tiny_gqa_export.output, **given)
    bare = compose(tiny_gqa_export.output, None, tmp_path / "bare.onnx", max_slots=2)
    with pytest.raises(InvalidParameter, match="compose --draft-tokens"):
        Engine(bare, tokenizer=tiny_gqa_export.output, speculative="ngram")
    with pytest.raises(ModelError, match="GroupQueryAttention"):
        compose(tiny_export.output, None, tmp_path / "concat.onnx", draft_tokens=4)
    with pytest.raises(InvalidParameter, match="output_probs"):
        compose(
            tiny_gqa_export.output, None, tmp_path / "p.onnx", draft_tokens=4, output_probs=True
        )
    with pytest.raises(InvalidParameter, match=r"draft_tokens must be in \[0, 16\]"):
        compose(tiny_gqa_export.output, None, tmp_path / "k.onnx", draft_tokens=17)


def test_speculation_says_when_its_output_may_differ(
    tiny_gqa_export, embedded_pair, tmp_path, caplog
):
    """With GroupQueryAttention a warning says that greedy text can change and how to avoid it;
    with exact attention there is nothing to say."""
    path = compose(tiny_gqa_export.output, None, tmp_path / "m.onnx", max_slots=2, draft_tokens=4)
    with caplog.at_level(logging.WARNING, logger="onnxsample.engine._engine"):
        Engine(path, tokenizer=tiny_gqa_export.output, speculative="ngram").close()
    assert "--attention exact" in caplog.text
    _, fast = embedded_pair
    assert fast.meta.exact_positions and fast.speculative == "ngram"


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "programming_languages": {
            "type": "array",
            "items": {"enum": ["Python", "Rust", "C"]},
            "maxItems": 3,
        },
        "years_of_experience": {"type": "integer", "minimum": 0, "maximum": 60},
    },
    "required": ["name", "programming_languages", "years_of_experience"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, constraint=Constraint.json_schema(SCHEMA)),
        SamplingParams(temperature=0.9, seed=4, constraint=Constraint.json_schema(SCHEMA)),
        SamplingParams(
            temperature=0, constraint=Constraint.regex("(one two three ){2,6}[a-z]{1,5}")
        ),
    ],
    ids=["greedy-schema", "sampled-schema", "regex"],
)
def test_tiny_constrained_drafts_are_verified_under_their_masks(tiny_pair, params):
    """A constrained sequence drafts what its grammar forces (or its n-gram draft, cut where the
    grammar rejects it); every position is verified under its own mask, so the tokens are plain
    decoding's, alone and beside unconstrained drafting sequences."""
    plain, fast = tiny_pair
    prompt = "one two three one two three one two three"
    free = SamplingParams(temperature=0)
    base = plain.submit(prompt, params, max_new_tokens=48, chat=False).result(timeout=300)
    alone = fast.submit(prompt, params, max_new_tokens=48, chat=False).result(timeout=300)
    both = [
        fast.submit(p, sp, max_new_tokens=48, chat=False)
        for p, sp in ((prompt, params), ("a b c a b c a b c", free))
    ]
    mixed = both[0].result(timeout=300)
    both[1].result(timeout=300)
    assert alone.token_ids == base.token_ids and mixed.token_ids == base.token_ids
    assert alone.finish_reason == base.finish_reason
    assert alone.timings.draft_tokens > 0 and alone.timings.accepted_tokens > 0


def test_constrained_drafts_with_buffers_of_their_own_memory(
    tiny_pair, tiny_gqa_export, own_memory_buffers
):
    """Constrained sequences drafting beside each other and a free one: with device buffers of
    their own memory (as on a GPU: each call writes only the mask rows that changed, a reset
    draft row waits for the next drafting call) the tokens are those of buffers that share the
    host's arrays."""
    _, fast = tiny_pair
    cases = [
        ("one two three one two three one two three", Constraint.regex("(one two three ){2,6}")),
        ("a b c a b c a b c", None),
        ("two three one two three one", Constraint.json_schema(SCHEMA)),
        ("one one one one one", Constraint.regex("(one ){1,9}[a-z]{1,5}")),
    ]

    def tokens(engine) -> list[list[int]]:
        done = []
        for first in (cases, cases[1:], cases[::-1]):  # slots freed and taken again
            requests = [
                engine.submit(
                    p, SamplingParams(temperature=0, constraint=c), max_new_tokens=24, chat=False
                )
                for p, c in first
            ]
            done += [r.result(timeout=300).token_ids for r in requests]
        return done

    shared = tokens(fast)
    assert fast.stats().drafted_tokens > 0
    own_memory_buffers()
    source = tiny_gqa_export.output
    with Engine(fast.path, tokenizer=source, threads=1, speculative="ngram") as own:
        assert tokens(own) == shared


def test_embedded_constrained_greedy_is_unchanged_with_speculation(embedded_pair):
    """On the real model (exact attention): a JSON schema's forced keys are drafted and verified
    in one call, and the text is token for token plain decoding's."""
    plain, fast = embedded_pair
    params = SamplingParams(temperature=0, constraint=Constraint.json_schema(SCHEMA))
    chat = [{"role": "user", "content": "Describe a senior developer called Ada as JSON."}]
    base = plain.submit(chat, params, max_new_tokens=80).result(timeout=300)
    spec = fast.submit(chat, params, max_new_tokens=80).result(timeout=300)
    assert spec.token_ids == base.token_ids
    assert set(json.loads(base.text)) == set(SCHEMA["properties"])
    assert spec.timings.accepted_tokens > 0
    assert spec.timings.decode_s > 0
