"""The serving engine on the tiny model, in both KV layouts: requests from many threads at any time,
chunked prefill, prefix reuse, prompt logprobs, cancel and the queue bound (bad requests, limits,
faults and shutdown: test_engine_limits.py).

Every equality below is exact: a request's tokens do not depend on what else runs, on how its prompt
was chunked, or on a reused prefix.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import onnxruntime as ort
import pytest
from _engine_cases import GREEDY, LONG, PROMPTS, alone, seeded

from onnxsample.engine.generator import Generator
from onnxsample.errors import InvalidParameter, QueueFull
from onnxsample.params import SamplingParams


def test_the_layout_is_what_the_graph_says(engine, layout):
    assert engine.kv_layout == layout and engine.max_slots == 4


def test_two_threads_get_what_each_gets_alone(engine):
    """Two threads stream at once; each gets exactly its tokens alone, with the same seed."""
    jobs = [(PROMPTS[i], seeded(10 + i)) for i in range(4)] + [(LONG, seeded(7))]
    solo = [alone(engine, p, s, 24).token_ids for p, s in jobs]
    got: dict[int, list[int]] = {}

    def client(indices):
        for i in indices:
            events = list(engine.submit(jobs[i][0], jobs[i][1], max_new_tokens=24, chat=False))
            got[i] = events[-1].completion.token_ids

    threads = [threading.Thread(target=client, args=(ix,)) for ix in ([0, 2, 4], [1, 3])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [got[i] for i in range(5)] == solo


def test_a_paused_stream_is_not_disturbed_by_another_request(models, layout):
    """The bug of the closed-batch Generator: pause stream A, run generate(), resume A."""
    path, folder = models[layout, 4]
    with Generator(path, tokenizer=folder, threads=1) as gen:
        [expected] = gen.generate(PROMPTS[0], seeded(5), max_new_tokens=20, chat=False)
        stream = gen.stream(PROMPTS[0], seeded(5), max_new_tokens=20, chat=False)
        head = [next(stream) for _ in range(4)]
        [other] = gen.generate(PROMPTS[1], seeded(6), max_new_tokens=20, chat=False)
        rest = list(stream)
    tokens = [e.token_id for e in head + rest if e.token_id is not None]
    assert tokens[: len(expected.token_ids)] == expected.token_ids
    assert rest[-1].completion.token_ids == expected.token_ids
    assert other.token_ids


def test_two_threads_on_one_generator(models, layout):
    """The batch API is as safe: two threads calling generate() on one Generator at once."""
    path, folder = models[layout, 4]
    with Generator(path, tokenizer=folder, threads=1) as gen:
        solo = {
            i: gen.generate(PROMPTS[i], seeded(40 + i), max_new_tokens=16, chat=False)[0].token_ids
            for i in range(4)
        }
        got: dict[int, list[int]] = {}

        def client(indices):
            for i in indices:
                [done] = gen.generate(PROMPTS[i], seeded(40 + i), max_new_tokens=16, chat=False)
                got[i] = done.token_ids

        threads = [threading.Thread(target=client, args=(ix,)) for ix in ([0, 1], [2, 3])]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    assert got == solo


def test_a_late_request_starts_while_an_early_one_decodes(engine):
    early = engine.submit(PROMPTS[0], seeded(1, ignore_eos=True), max_new_tokens=120, chat=False)
    stream = iter(early)
    for _ in range(3):
        next(stream)
    late = engine.submit(PROMPTS[1], GREEDY, max_new_tokens=2, chat=False)
    first = next(iter(late))
    assert first.token_id is not None
    assert not early.done, "the late request waited for the early one to finish"
    done = early.result(timeout=120)
    assert len(done.token_ids) == 120 and done.finish_reason == "length"
    assert late.result(timeout=60).timings.ttft_s < done.timings.decode_s


def test_cancel_frees_the_slot(fresh):
    engine = fresh(slots=2)
    long = SamplingParams(temperature=0.8, seed=3, ignore_eos=True)
    a = engine.submit(PROMPTS[0], long, max_new_tokens=400, chat=False)
    b = engine.submit(PROMPTS[1], long, max_new_tokens=400, chat=False)
    next(iter(a)), next(iter(b))
    waiting = engine.submit(PROMPTS[2], GREEDY, max_new_tokens=3, chat=False)
    a.cancel()
    done = a.result(timeout=60)
    assert done.finish_reason == "cancelled" and 0 < len(done.token_ids) < 400
    assert waiting.result(timeout=60).finish_reason in ("length", "eos")
    assert not b.done, "the freed slot went to the waiting request while b still decodes"
    b.cancel()
    assert b.result(timeout=60).finish_reason == "cancelled"
    assert engine.load()["slots_busy"] == 0


def test_queue_full_is_a_typed_error_at_once(fresh):
    engine = fresh(slots=2, max_queue=1)
    long = SamplingParams(temperature=0.8, seed=4, ignore_eos=True)
    running = [engine.submit(p, long, max_new_tokens=400, chat=False) for p in PROMPTS[:2]]
    queued = engine.submit(PROMPTS[2], long, max_new_tokens=400, chat=False)
    with pytest.raises(QueueFull, match="max_queue=1"):
        engine.submit(PROMPTS[3], GREEDY, max_new_tokens=2, chat=False)
    for r in [*running, queued]:
        r.cancel()
    assert [r.result(timeout=60).finish_reason for r in [*running, queued]] == ["cancelled"] * 3
    assert engine.submit(PROMPTS[3], GREEDY, max_new_tokens=2, chat=False).result(timeout=60)


def test_async_iteration_and_result(engine):
    expected = alone(engine, PROMPTS[2], seeded(9), 12)

    async def main():
        pieces = []
        seq = engine.prepare(PROMPTS[2], seeded(9), 12, None, False, None)
        seq.report_timings = True  # each event with the timings when its token came
        [request] = engine.enqueue([seq])
        async for event in request:
            pieces.append(event)
        other = await engine.submit(PROMPTS[2], seeded(9), max_new_tokens=12, chat=False).aresult()
        return pieces, other

    pieces, other = asyncio.run(main())
    assert pieces[-1].completion.token_ids == expected.token_ids == other.token_ids
    assert "".join(e.text for e in pieces) == expected.text
    # each event has the request's timings when its token came: copies, not the live object
    timings = [e.timings for e in pieces]
    assert [t.generated_tokens for t in timings] == list(range(1, len(pieces) + 1))
    assert [t.decode_s for t in timings] == sorted(t.decode_s for t in timings)
    assert timings[-1] == pieces[-1].completion.timings and timings[0] is not timings[-1]
    # a request that did not ask gets none: no copy on every token
    plain = engine.submit(PROMPTS[2], seeded(9), max_new_tokens=4, chat=False)
    assert [e.timings for e in plain] == [None] * 4


@pytest.mark.parametrize("chunk", [None, 7, 32, 64])
def test_chunked_prefill_gives_the_same_tokens_and_prompt_logprobs(fresh, layout, chunk):
    """GroupQueryAttention computes a chunk's keys and values bit for bit as a whole prompt's, so
    the generated tokens and their logprobs are identical; optimum's attention (MatMuls over
    [chunk, total]) agrees to float rounding. A prompt row's logits come from an LM-head MatMul
    over more or fewer rows, so prompt logprobs agree to float rounding in both."""
    reference = fresh(prefill_chunk=None, prefix_reuse=False)
    engine = fresh(prefill_chunk=chunk, prefix_reuse=False)
    params = seeded(21, prompt_logprobs=2, logprobs=True)
    a = alone(reference, LONG, params, 12)
    b = alone(engine, LONG, params, 12)
    assert b.token_ids == a.token_ids
    assert [[t for t, _ in top] for top in b.prompt_top_logprobs[1:]] == [
        [t for t, _ in top] for top in a.prompt_top_logprobs[1:]
    ]
    if layout == "gqa":
        assert b.logprobs == a.logprobs
    else:
        np.testing.assert_allclose(b.logprobs, a.logprobs, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(b.prompt_logprobs[1:], a.prompt_logprobs[1:], atol=1e-5)


def test_streams_keep_decoding_while_a_long_prompt_is_admitted(fresh):
    """With chunks of 16, a 180-token prompt takes several steps, and the running stream gets a
    token in each of them."""
    engine = fresh(prefill_chunk=16)
    running = engine.submit(PROMPTS[0], seeded(2, ignore_eos=True), max_new_tokens=60, chat=False)
    stream = iter(running)
    next(stream)
    before = engine.stats()
    late = engine.submit(LONG, GREEDY, max_new_tokens=1, chat=False)
    late.result(timeout=120)
    after = engine.stats()
    calls = after.prefill_calls - before.prefill_calls
    assert calls >= len(late.result().prompt_token_ids) // 16
    assert after.decode_steps - before.decode_steps >= calls - 1
    running.cancel()


def test_a_short_prompt_is_not_held_behind_a_long_prompts_chunks(fresh):
    """With chunks of 16, a short prompt that arrives beside a 180-token one is prefilled first,
    so its first token comes before the long prompt's; their tokens are those they get alone."""
    engine = fresh(prefill_chunk=16, prefix_reuse=False)
    long_alone = engine.submit(LONG, GREEDY, max_new_tokens=2, chat=False).result(timeout=120)
    short_alone = engine.submit(PROMPTS[1], GREEDY, max_new_tokens=2, chat=False).result()
    long = engine.submit(LONG, GREEDY, max_new_tokens=2, chat=False)
    short = engine.submit(PROMPTS[1], GREEDY, max_new_tokens=2, chat=False)
    a, b = long.result(timeout=120), short.result(timeout=120)
    assert b.timings.prompt_tokens < 16 < a.timings.prompt_tokens
    assert short.submitted + b.timings.ttft_s < long.submitted + a.timings.ttft_s
    assert (a.token_ids, b.token_ids) == (long_alone.token_ids, short_alone.token_ids)


def test_prompt_logprobs_are_the_plain_models(engine, tiny_export):
    """Echo: each prompt token's logprob under the raw distribution, computed in the graph."""
    params = SamplingParams(temperature=0, prompt_logprobs=3)
    done = alone(engine, LONG, params, 1)
    ids = done.prompt_token_ids
    session = ort.InferenceSession(str(tiny_export.model_path), providers=["CPUExecutionProvider"])
    feeds = {
        "input_ids": np.asarray([ids], np.int64),
        "attention_mask": np.ones((1, len(ids)), np.int64),
        "position_ids": np.arange(len(ids), dtype=np.int64)[None],
    }
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            feeds[i.name] = np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
    logits = session.run(["logits"], feeds)[0][0].astype(np.float64)
    logp = logits - logits.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    assert done.prompt_logprobs[0] is None and done.prompt_top_logprobs[0] is None
    assert len(done.prompt_logprobs) == len(ids)
    expected = [logp[i - 1, ids[i]] for i in range(1, len(ids))]
    np.testing.assert_allclose(done.prompt_logprobs[1:], expected, atol=2e-4)
    for i in (1, len(ids) // 2, len(ids) - 1):
        top = done.prompt_top_logprobs[i]
        assert [t for t, _ in top] == list(np.argsort(-logp[i - 1], kind="stable")[:3])


def test_a_request_without_prompt_logprobs_gets_none(engine):
    done = alone(engine, PROMPTS[0], GREEDY, 2)
    assert done.prompt_logprobs is None and done.prompt_top_logprobs is None


def test_prefix_reuse_computes_only_the_new_tokens(fresh):
    """A chat's second turn reuses the first turn's cache: same tokens as without reuse."""
    reuse, plain = fresh(prefill_chunk=32), fresh(prefill_chunk=32, prefix_reuse=False)
    chat = [{"role": "user", "content": LONG}]
    turns = {}
    for name, engine in (("reuse", reuse), ("plain", plain)):
        first = engine.submit(chat, seeded(31), max_new_tokens=10).result(timeout=120)
        follow = [
            *chat,
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "And then?"},
        ]
        second = engine.submit(follow, seeded(32), max_new_tokens=10).result(timeout=120)
        turns[name] = (first, second)
    first, second = turns["reuse"]
    assert first.timings.cached_tokens == 0
    assert second.timings.cached_tokens >= len(first.prompt_token_ids) - 2
    assert turns["plain"][1].timings.cached_tokens == 0
    if hasattr(plain._scheduler.layout, "keep_seconds"):  # nothing reuses what it would keep
        assert plain._scheduler.layout.keep_seconds == 0
    assert second.token_ids == turns["plain"][1].token_ids
    again = reuse.submit(chat, seeded(31), max_new_tokens=10).result(timeout=120)
    assert again.token_ids == first.token_ids  # the same prompt again: all but 2 tokens reused
    assert again.timings.cached_tokens == len(again.prompt_token_ids) - 2
    anew = reuse.submit(chat, seeded(31), max_new_tokens=10, prefix_reuse=False)
    assert anew.result(timeout=120).timings.cached_tokens == 0  # cache_prompt: false
    with pytest.raises(InvalidParameter, match="prefix_reuse must be True or False"):
        reuse.submit(chat, seeded(31), prefix_reuse=0)
